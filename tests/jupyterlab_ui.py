"""Drive the course's JupyterLab as a learner does, for tests/test_jupyterlab.py.

:func:`readme_jupyter_command` reads the ``jupyter lab ...`` part of the README's command 1, and
:class:`LabServer` starts it on a copy of the course folder (:func:`copy_course`), from that copy's root as
the README's runs from the repository root (127.0.0.1, a random port and token, private Jupyter folders),
and stops it, its kernels included, by process id. Paths of notebooks are from the course folder, the
server's root (``notebooks/01_map_style_datasets.ipynb``), as the README names them.
:class:`Notebook` is one notebook open in its own page of a headless chromium (Playwright,
Debian's browser: nothing is downloaded) and does what a person does there: menus, clicks and
keys, never the application's JavaScript objects. It reads the page's DOM to tell what the person
would see: prompts (``[*]`` while a cell runs), error outputs, images, widgets.

Waiting: what the page shows is waited for with Playwright's own auto-waiting assertions
(``expect(locator).to_...``), or ``page.wait_for_function`` where only the page's JavaScript can
say it; only a process and the server's HTTP API, which no browser sees, are polled
(:func:`poll_until`).
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import psutil

from course_lib.jobs import free_ports

try:  # the README's command is tested without a browser: only the stage needs Playwright
    from playwright.sync_api import expect
except ImportError:  # the stage skips (or, under CI, fails) before any page is opened
    expect = None  # type: ignore[assignment]

# Flags for a quiet, offline browser (as tests/tools/test_slides.py uses): there is no network
# here, and chromium's own background connections would only be refused.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
]
VIEWPORT = {"width": 1366, "height": 900}  # a laptop screen
STDERR = "application/vnd.jupyter.stderr"  # JupyterLab shows error outputs (tracebacks) with this type too
# A line of an error output: "ZeroDivisionError    Traceback (most recent call last)", "SyntaxError: ...".
ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b", re.M)
# What a copy of the course folder leaves out of the repository, so that it holds what a learner's clone does
# (notebooks/, hpc/, the READMEs, ...): anywhere, hidden files and folders (.git, .venv, checkpoints: Lab's file
# browser shows none), bytecode, and what notebooks write beside themselves (runs/, the learners' scratch/); at the
# top, the other outputs .gitignore names there (the data, builds, the package's metadata, Slurm logs).
LEFT_BEHIND = shutil.ignore_patterns(".*", "__pycache__", "runs", "scratch")
TOP_LEVEL_OUTPUTS = shutil.ignore_patterns("data", "build", "dist", "*.egg-info", "course-train-*.out")


class LabError(AssertionError):
    """Something a learner would see go wrong in JupyterLab (the message says what, and where)."""


class StuckCell(LabError):
    """A cell still shows ``[*]`` when it should have finished."""


def readme_command_1(repo: Path) -> str:
    """The README's command 1: the line after ``# 1. ...`` in its Quick start."""
    found = re.search(r"^# 1\. .*\n(.+)$", (repo / "README.md").read_text(encoding="utf-8"), re.M)
    if found is None:
        raise LookupError("README.md has no command 1 (the line after `# 1. ...` in its Quick start)")
    return found.group(1).strip()


def readme_jupyter_command(repo: Path) -> list[str]:
    """The ``jupyter lab ...`` part of the README's command 1, as arguments (``["jupyter", "lab", ...]``):
    what a learner runs, from the repository root, to open the course."""
    command = readme_command_1(repo)
    found = [shlex.split(part) for part in command.split("&&") if part.split()[:2] == ["jupyter", "lab"]]
    if len(found) != 1:
        raise LookupError(
            f"README.md's command 1 has {len(found)} `jupyter lab ...` parts (the tests need one): {command}"
        )
    return found[0]


def opened_notebook(command: list[str]) -> str:
    """The notebook a ``jupyter lab`` command opens (its path from the repository root, the course folder)."""
    found = [arg for arg in command if arg.endswith(".ipynb")]
    if len(found) != 1:
        raise LookupError(f"{shlex.join(command)} opens {len(found)} notebooks (the tests need one)")
    return found[0]


def copy_course(repo: Path, folder: Path) -> Path:
    """Copy the course folder (the repository, less :data:`LEFT_BEHIND` and :data:`TOP_LEVEL_OUTPUTS`) to ``folder``,
    a new folder; returns ``folder``."""

    def ignored(path: str, names: list[str]) -> set[str]:
        top = TOP_LEVEL_OUTPUTS(path, names) if Path(path) == repo else set()
        return set(LEFT_BEHIND(path, names)) | set(top)

    shutil.copytree(repo, folder, ignore=ignored)
    return folder


def browser_open_file(runtime: Path) -> Path:
    """The page a ``jupyter lab FILE`` server writes for the learner's browser to open (jupyter_server's
    ``ServerApp.write_browser_open_files``: ``jpserver-file-to-run-<pid>-open.html`` in its runtime folder, written
    with ``--no-browser`` too, removed when the server stops); :func:`opened_url` reads the page it leads to."""
    found = sorted(runtime.glob("jpserver-file-to-run-*-open.html"))
    if len(found) != 1:
        raise LookupError(f"{runtime} holds {len(found)} pages for the browser to open (the tests need one): {found}")
    return found[0]


def opened_url(open_file: Path) -> str:
    """The URL a :func:`browser_open_file` page leads to (its link, with the server's token)."""
    found = re.search(r'<a href="([^"]*)"', open_file.read_text(encoding="utf-8"))
    if found is None:
        raise LookupError(f"{open_file} has no link")
    return html.unescape(found.group(1))


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "/usr/bin/chromium"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def request(url: str, token: str | None, method: str = "GET", timeout: float = 10) -> tuple[int, bytes]:
    """(status, body) of one request; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def poll_until(done: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Call ``done`` until it returns true (then True) or ``timeout`` seconds have passed (then False).

    For what no browser sees: a process, the server's HTTP API. ``done`` may raise to give up early."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def end_group(pgid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM, then SIGKILL, the process group ``pgid`` (a process started in its own session)."""

    def gone() -> bool:
        if proc is not None and proc.poll() is not None:
            return True
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if poll_until(gone, grace, interval=0.1):
            return


def wait_for_server(
    base: str, token: str, proc: subprocess.Popen[bytes], timeout: float, log_tail: Callable[[], str]
) -> dict:
    """The server's ``/api/status`` once it answers; :class:`LabError` (with the log's tail) if the
    process exits first, or nothing answers within ``timeout`` seconds."""
    answer: dict = {}

    def answers() -> bool:
        if proc.poll() is not None:
            raise LabError(f"jupyter lab exited with {proc.returncode}:\n{log_tail()}")
        try:
            status, body = request(f"{base}/api/status", token, timeout=5)
        except (urllib.error.URLError, ConnectionError, OSError):
            return False  # not listening yet
        if status == 200:
            answer.update(json.loads(body))
        return status == 200

    if not poll_until(answers, timeout, interval=0.3):
        raise LabError(f"jupyter lab did not answer within {timeout:.0f} s:\n{log_tail()}")
    return answer


class LabServer:
    """The README's ``jupyter lab ... <first notebook>`` on a copy of the course folder, run from its root (``root``)
    as the README's runs from the repository root, with private Jupyter folders (beside the copy, in ``home``)."""

    def __init__(self, repo: Path, home: Path, env: dict[str, str] | None = None, start_timeout: float = 90.0) -> None:
        self.home = home
        self.root = copy_course(repo, home / "course")  # the copy: the repository's files are never touched
        self.notebooks = self.root / "notebooks"
        self.port, self.token = free_ports()[0], secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "jupyterlab.log"
        readme = readme_jupyter_command(repo)  # e.g. jupyter lab --allow-root --ServerApp.root_dir=. notebooks/01_...
        self.first = opened_notebook(readme)  # its path from the course folder: notebooks/01_....ipynb
        command = [
            str(Path(sys.executable).parent / readme[0]),
            *readme[1:],  # this environment's jupyter, run from the copy's root as the README's from the repository's
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
        ]
        private = {
            name: home / folder
            for name, folder in (
                ("JUPYTER_CONFIG_DIR", "config"),
                ("JUPYTER_DATA_DIR", "data"),
                ("JUPYTER_RUNTIME_DIR", "runtime"),
                ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
                ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
                ("IPYTHONDIR", "ipython"),
            )
        }
        # No "Would you like to get notified about official Jupyter news?" toast over the notebook,
        # and no update check (it would ask the internet).
        notification = (
            private["JUPYTERLAB_SETTINGS_DIR"]
            / "@jupyterlab"
            / "apputils-extension"
            / "notification.jupyterlab-settings"
        )
        notification.parent.mkdir(parents=True)
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.runtime = private["JUPYTER_RUNTIME_DIR"]  # where the server writes the page for the browser to open
        self.env = {**os.environ, **{k: str(v) for k, v in private.items()}, **(env or {})}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.kernels: set[int] = set()
        try:
            self._wait_started(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_started(self, timeout: float) -> None:
        wait_for_server(self.base, self.token, self.proc, timeout, self.log_tail)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def url(self, notebook: str, workspace: str) -> str:
        """The notebook (its path from the course folder) in a workspace of its own (``?reset``: a fresh layout,
        nothing else reopened)."""
        return f"{self.base}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"

    def kernel_folders(self) -> dict[str, Path]:
        """The working folder of each session's kernel, by the session's path (a notebook's, from the course folder):
        the server's sessions, and its kernel processes found by their connection files (``kernel-<id>.json``)."""
        status, body = request(f"{self.base}/api/sessions", self.token)
        if status != 200:
            raise LabError(f"/api/sessions answered {status}: {body[:300]!r}")
        paths = {session["kernel"]["id"]: session["path"] for session in json.loads(body) if session.get("kernel")}
        found = {}
        for child in psutil.Process(self.proc.pid).children():
            try:
                args, cwd = child.cmdline(), child.cwd()
            except psutil.NoSuchProcess:  # a kernel that ended meanwhile
                continue
            for arg in args:
                kernel = re.search(r"kernel-([0-9a-f-]+)\.json$", arg)
                if kernel and kernel.group(1) in paths:
                    found[paths[kernel.group(1)]] = Path(cwd)
        return found

    def remember_kernels(self) -> None:
        """Note the kernel processes now running (they start in sessions of their own)."""
        if self.proc.poll() is None:
            try:
                self.kernels.update(child.pid for child in psutil.Process(self.proc.pid).children())
            except psutil.NoSuchProcess:  # the server ended meanwhile
                pass

    def stop(self) -> None:
        """Shut down over the API (kernels first), then end whatever is left by process id."""
        self.remember_kernels()
        if self.proc.poll() is None:
            try:
                request(f"{self.base}/api/shutdown", self.token, method="POST", timeout=10)
                self.proc.wait(timeout=30)
            except (OSError, urllib.error.URLError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            end_group(self.proc.pid, self.proc)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.kernels:  # each kernel leads its own session: its DataLoader workers go with it
            end_group(pid)


# The notebook in front (hidden panels are other tabs), its cells, and the state of its kernel.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = f"{PANEL} .jp-Notebook .jp-Cell"
INDICATOR = ".jp-Notebook-ExecutionIndicator"  # in the notebook's toolbar: data-status "idle", "busy", ...
# Done: the kernel idle, and no code cell's prompt shows [*] (running or queued).
SETTLED = f'{PANEL}:has({INDICATOR}[data-status="idle"]):not(:has(.jp-CodeCell .jp-InputPrompt:has-text("*")))'
DIALOG = ".jp-Dialog"  # e.g. "Kernel Restarting: The kernel for ... appears to have died"

# What the page shows of its notebook, read from the DOM (for messages, and prompt numbers). Prompts:
# "[3]:", "[*]:" (running or queued), "[ ]:" (not run); null for markdown and raw cells.
STATE_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const cells = [...panel.querySelectorAll('.jp-Notebook .jp-Cell')];
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const dialog = document.querySelector('.jp-Dialog');
  return {
    status: indicator ? indicator.dataset.status : null,
    prompts: cells.map(c => c.classList.contains('jp-CodeCell') ? (c.querySelector('.jp-InputPrompt') || {}).textContent || '' : null),
    dialog: dialog ? dialog.textContent : null,
  };
}"""
# Notes whether any prompt shows [*] from now on: a short cell may be over before any wait looks,
# so "a run started" is a thing that happened, which only the page's JavaScript can remember.
WATCH_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  window.__labTestSawRunning = false;
  const look = () => {
    if ([...panel.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'))) {
      window.__labTestSawRunning = true;
      window.__labTestWatcher.disconnect();  // seen: no need to look at every later change
    }
  };
  window.__labTestWatcher = new MutationObserver(look);
  window.__labTestWatcher.observe(panel, {subtree: true, childList: true, characterData: true});
}"""
OUTPUTS_JS = """(index) => {
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  const pick = index === null ? cells : [cells[index]];
  return pick.map(c => [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
    mime: o.dataset.mimeType || null,
    text: o.textContent,
    widget: !!o.querySelector('.jupyter-widgets'),
    images: [...o.querySelectorAll('img')].map(i => [i.complete, i.naturalWidth, i.naturalHeight]),
  })));
}"""


class Notebook:
    """One notebook of the server's copy, open in a page of its own.

    ``name`` is its path from the server's root, ``lab.root`` (:class:`LabServer`: the course folder,
    ``notebooks/01_....ipynb``); a server without a ``root`` (tests/test_jupyterhub.py's ``HubLab``) names its
    notebooks from its ``notebooks`` folder. ``lab.url(name, workspace)`` is the notebook's page."""

    def __init__(self, lab: LabServer, context: Any, name: str, shots: Path, label: str | None = None) -> None:
        self.lab, self.name, self.shots = lab, name, shots
        self.label = label or Path(name).name.split("_", 1)[0]
        self.path = getattr(lab, "root", lab.notebooks) / name
        self.cells: list[dict] = json.loads(self.path.read_text(encoding="utf-8"))["cells"]
        self.page = context.new_page()
        self.page.set_default_timeout(30_000)
        self.console_errors: list[str] = []
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console_errors.append(str(e)))
        self._shot = 0
        self.edited: dict[int, str] = {}  # cells whose text the test typed

    # -- finding cells -------------------------------------------------------------------------

    def source(self, index: int) -> str:
        src = self.cells[index]["source"]
        return "".join(src) if isinstance(src, list) else src

    def index(self, marker: str, cell_type: str | None = None) -> int:
        """The one cell (of ``cell_type``: "code", "markdown"; any if None) whose source contains ``marker``."""
        found = [
            i
            for i in range(len(self.cells))
            if marker in self.source(i) and cell_type in (None, self.cells[i]["cell_type"])
        ]
        if len(found) != 1:
            raise LookupError(
                f"{self.name}: {len(found)} {cell_type or ''} cells contain {marker!r} "
                f"(the test's table needs one): {found}"
            )
        return found[0]

    def describe(self, index: int) -> str:
        text = self.edited.get(index, self.source(index))
        first = next((line for line in text.splitlines() if line.strip()), "")
        return f"cell {index} (id {self.cells[index].get('id')}, `{first[:70]}`)"

    def cell(self, index: int) -> Any:
        return self.page.locator(CELLS).nth(index)

    # -- what the page shows -------------------------------------------------------------------

    def state(self) -> dict:
        return self.page.evaluate(STATE_JS) or {"status": None, "prompts": [], "dialog": None}

    def outputs(self, index: int) -> list[dict]:
        return self.page.evaluate(OUTPUTS_JS, index)[0]

    def output_text(self, index: int) -> str:
        return "".join(o["text"] for o in self.outputs(index))

    def errors(self, indices: list[int] | None = None) -> list[tuple[int, str]]:
        """(cell, text) of every error output (a traceback or ``SomeError: ...`` shown as stderr)."""
        every = self.page.evaluate(OUTPUTS_JS, None)
        found = []
        for i, outputs in enumerate(every):
            if indices is not None and i not in indices:
                continue
            for o in outputs:
                if o["mime"] == STDERR and ("Traceback" in o["text"] or ERROR_LINE.search(o["text"])):
                    found.append((i, o["text"]))
        return found

    def stderr(self) -> list[tuple[int, str]]:
        """(cell, text) of stderr outputs that are not errors (warnings, text progress bars)."""
        every = self.page.evaluate(OUTPUTS_JS, None)
        return [
            (i, o["text"])
            for i, outputs in enumerate(every)
            for o in outputs
            if o["mime"] == STDERR and not ("Traceback" in o["text"] or ERROR_LINE.search(o["text"]))
        ]

    @staticmethod
    def prompt_number(prompt: str | None) -> int | None:
        m = re.search(r"\[(\d+)\]", prompt or "")
        return int(m.group(1)) if m else None

    def last_count(self, indices: list[int] | None = None) -> int:
        """The highest execution count shown by cells ``indices`` (all: ``None``). Cells not run since the page
        opened show the counts saved in the file."""
        prompts = self.state()["prompts"]
        return max(
            (self.prompt_number(prompts[i]) or 0 for i in (range(len(prompts)) if indices is None else indices)),
            default=0,
        )

    # -- evidence --------------------------------------------------------------------------------

    def screenshot(self, what: str, index: int | None = None) -> Path:
        """The page (scrolled to cell ``index``, if given) as a PNG in the screenshots folder."""
        self._shot += 1
        path = self.shots / f"{self.label}-{self._shot:02d}-{re.sub(r'[^A-Za-z0-9.]+', '-', what).strip('-')}.png"
        try:
            if index is not None:
                self.show(index)
            self.page.screenshot(path=str(path), timeout=10_000)
        except Exception as exc:  # evidence is best effort: never hide the failure it documents
            path.with_suffix(".txt").write_text(f"no screenshot: {exc}")
        return path

    def show(self, index: int) -> None:
        """Scroll the notebook so that cell ``index`` starts at the top of the window."""
        for _ in range(2):  # cells above take their real height as they render: settle, then again
            self.cell(index).evaluate("e => e.scrollIntoView({block: 'start'})")
            self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    def fail(self, message: str, index: int | None = None, kind: type[LabError] = LabError) -> LabError:
        shot = self.screenshot("failure", index)
        return kind(
            f"{self.name}: {message}\n(screenshot: {shot}; all screenshots in {self.shots}; "
            f"server log: {self.lab.log_path})"
        )

    # -- doing what a learner does ---------------------------------------------------------------

    def open(self, timeout: float = 90.0, url: str | None = None) -> None:
        """Open the notebook and wait until every cell is shown and its kernel is idle. ``url``: where the learner
        goes, which leads to the notebook (``None``: :meth:`LabServer.url`, the notebook in a workspace of its own)."""
        deadline = time.monotonic() + timeout
        self.page.goto(url or self.lab.url(self.name, f"test-{self.label}"), timeout=timeout * 1000)
        try:
            expect(self.page.locator(CELLS)).to_have_count(len(self.cells), timeout=_ms_left(deadline))
            # the kernel started: the status bar says "Python 3 (ipykernel) | Idle", the toolbar's indicator idle
            expect(self.page.locator("#jp-main-statusbar")).to_contain_text(
                re.compile(r"\| Idle"), timeout=_ms_left(deadline)
            )
            expect(self.page.locator(f"{PANEL} {INDICATOR}")).to_have_attribute(
                "data-status", "idle", timeout=_ms_left(deadline)
            )
        except Exception as exc:
            raise self.fail(
                f"not ready within {timeout:.0f} s (cells shown, kernel idle): {self.state()}\n{_first_lines(exc)}"
            ) from None
        self.lab.remember_kernels()

    def menu(self, menu: str, command: str) -> None:
        """Click a menu of the menu bar, then its item for ``command`` (a JupyterLab command id)."""
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{re.escape(menu)}$")).click()
        self.page.locator(f'.lm-Menu-item[data-command="{command}"]').click()

    def change_kernel(self, display_name: str, timeout: float = 90.0) -> None:
        """Kernel > Change Kernel…, pick the kernel shown as ``display_name`` in the dialog's list, Select; wait until
        the status bar shows it idle."""
        self.menu("Kernel", "kernelmenu:change")
        dialog = self.page.locator(DIALOG)
        dialog.locator("select").select_option(label=display_name)
        dialog.locator(".jp-mod-accept").click()
        try:
            expect(self.page.locator("#jp-main-statusbar")).to_contain_text(
                re.compile(rf"{re.escape(display_name)}\s*\| Idle"), timeout=timeout * 1000
            )
        except Exception as exc:
            raise self.fail(
                f"the kernel {display_name!r} is not idle after {timeout:.0f} s\n{_first_lines(exc)}"
            ) from None
        self.lab.remember_kernels()

    def run_all(self, timeout: float) -> float:
        """Run > Run All Cells; wait until every cell has finished. Returns the seconds it took."""
        start = self.start_run_all()
        self.finish_run(timeout)
        return time.monotonic() - start

    def start_run_all(self, above: str | None = None) -> float:
        """Run > Run All Cells, and return once a cell runs (its clock time); :meth:`finish_run` waits for the rest.
        Meanwhile other pages may run theirs: each notebook has its own kernel. ``above``: a text of a markdown cell;
        then Run > Run All Above Selected Cell, with that cell selected."""
        start = time.monotonic()
        if above is None:
            self._start(lambda: self.menu("Run", "runmenu:run-all"))
        else:
            self.select(self.index(above, "markdown"))
            self._start(lambda: self.menu("Run", "notebook:run-all-above"))
        return start

    def wait_idle(self, timeout: float, action: Callable[[], None] | None = None) -> None:
        """Do ``action`` (which runs cells), then wait until a cell ran and no cell runs or waits any more."""
        self._start(action)
        self.finish_run(timeout)

    def _start(self, action: Callable[[], None] | None) -> None:
        self.page.evaluate(WATCH_JS)
        if action is not None:
            action()
        else:  # waiting on cells already running
            self.page.evaluate("() => { window.__labTestSawRunning = true; }")
        try:  # a short cell may be over before we look: the watcher saw its [*] prompt
            self.page.wait_for_function("() => window.__labTestSawRunning", timeout=15_000, polling=100)
        except Exception:
            raise self.fail(f"nothing started running: {self.state()}") from None

    def finish_run(self, timeout: float) -> None:
        """Wait until no cell runs or waits any more (after :meth:`_start`), with this page in front.
        A dialog ends the wait at once: it is reported, not waited out."""
        self.activate()  # a page behind others draws nothing: its prompts would never change
        try:
            expect(self.page.locator(SETTLED).or_(self.page.locator(DIALOG)).first).to_be_attached(
                timeout=timeout * 1000
            )
        except Exception:
            state = self.state()
            running = [i for i, p in enumerate(state["prompts"]) if p and "*" in p]
            if running:
                raise self.fail(
                    f"{self.describe(running[0])} still shows [*] after {timeout:.0f} s "
                    f"({len(running) - 1} more cells wait behind it)",
                    running[0],
                    StuckCell,
                ) from None
            raise self.fail(
                f"the kernel did not become idle within {timeout:.0f} s: {state}", None, StuckCell
            ) from None
        finally:
            self.page.evaluate("() => window.__labTestWatcher && window.__labTestWatcher.disconnect()")
        dialog = self.state()["dialog"]
        if dialog:  # e.g. "Kernel Restarting: The kernel for ... appears to have died"
            raise self.fail(f"JupyterLab shows a dialog: {dialog[:300]}")
        self.lab.remember_kernels()

    def check_ran(self, indices: list[int], since: int = 0) -> None:
        """Fail on an error output among ``indices``, or a code cell there that did not run."""
        problems = [f"{self.describe(i)} shows an error:\n{_tail(text)}" for i, text in self.errors(indices)]
        prompts = self.state()["prompts"]
        skipped = [
            i
            for i in indices
            if prompts[i] is not None and self.source(i).strip() and (self.prompt_number(prompts[i]) or 0) <= since
        ]
        if skipped:
            problems.append(
                "not run (after an error, Run All stops): " + ", ".join(self.describe(i) for i in skipped[:5])
            )
        if problems:
            errors = self.errors(indices)
            raise self.fail("\n".join(problems), errors[0][0] if errors else skipped[0])

    def select(self, first: int, last: int | None = None) -> None:
        """Select cell ``first`` (command mode), or ``first`` to ``last`` with a shift-click."""
        self.page.keyboard.press("Escape")  # leave an editor: clicks then select cells
        self.cell(first).locator(".jp-InputPrompt, .jp-InputArea-prompt").first.click()
        if last is not None and last != first:
            self.cell(last).locator(".jp-InputPrompt, .jp-InputArea-prompt").first.click(modifiers=["Shift"])

    def run_cells(self, first: int, last: int | None = None, timeout: float = 120.0) -> None:
        """Run cells ``first``..``last`` (selected, then Ctrl+Enter); ``last=None``: that cell only."""
        self.select(first, last)
        self.wait_idle(timeout, lambda: self.page.keyboard.press("Control+Enter"))

    def run_from(self, first: int, timeout: float = 240.0) -> None:
        """Run > Run Selected Cell and All Below, from cell ``first``."""
        self.select(first)
        self.wait_idle(timeout, lambda: self.menu("Run", "notebook:run-all-below"))

    def type_source(self, index: int, text: str) -> None:
        """Replace a code cell's text as a person does: click into its editor, select all, type."""
        editor = self.cell(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        self.page.keyboard.insert_text(text)  # as a paste: no auto-indent or bracket closing on top
        # Line by line, exactly: patterns, not strings, which expect() compares with whitespace collapsed
        # (a changed indentation is what to catch).
        lines = [re.compile(f"^{re.escape(line)}$") for line in text.split("\n")]
        try:
            expect(editor.locator(".cm-line")).to_have_text(lines, timeout=10_000)
        except Exception:
            shown = editor.evaluate("e => [...e.querySelectorAll('.cm-line')].map(l => l.textContent).join('\\n')")
            raise self.fail(
                f"the editor of {self.describe(index)} shows\n{shown}\ninstead of what was typed\n{text}", index
            ) from None
        self.edited[index] = text

    def activate(self) -> None:
        """Bring this notebook's page to the front: a page behind others gets no animation frames, and
        JupyterLab (Lumino) draws on animation frames, so there outputs would appear late."""
        self.page.bring_to_front()

    def close(self) -> None:
        try:
            self.page.close()
        except Exception:
            pass


def _ms_left(deadline: float) -> float:
    """Milliseconds until ``deadline`` (time.monotonic()), for a Playwright timeout (never 0: that is "no timeout")."""
    return max(deadline - time.monotonic(), 0.001) * 1000


def _first_lines(exc: BaseException, lines: int = 6) -> str:
    """The start of an exception's message (Playwright's end with a long call log)."""
    return "\n".join(str(exc).strip().splitlines()[:lines])


def _tail(text: str, lines: int = 12) -> str:
    kept = [line for line in text.rstrip().splitlines() if line.strip()]
    return "\n".join(("    " + line) for line in kept[-lines:])
