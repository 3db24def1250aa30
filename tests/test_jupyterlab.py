"""The README's JupyterLab command, started for real: its REST API, then the course as a learner meets it.

1. The ``jupyter lab ...`` part of the README's command 1, read from README.md (``jupyter lab --allow-root
   --ServerApp.root_dir=. notebooks/01_map_style_datasets.ipynb``), from the repository root, on 127.0.0.1
   with a random token, run twice: as root (most containers) and as an ordinary user (a laptop, a
   hub; as root, a throwaway user the test adds and removes, on their own copy of the course folder).
   The server answers, refuses requests without the token, serves the course folder from its root
   (``notebooks/`` with every course notebook, ``hpc/``, ``README.md``), would open notebook 01 in the
   browser, serves the JupyterLab page and shuts down on request (standard library only).
2. The JupyterLab stage: the same command on a temporary copy of the course folder (one server and one
   headless chromium for the module, driven by Playwright). The page command 1 opens is notebook 01, its
   kernel runs in ``notebooks/``, and the file browser reaches ``hpc/`` and the README. Each notebook of
   ``RUN_ALL`` and ``RUN_ABOVE`` opened in
   its page and run with Run > Run All Cells. No cell may show an error or stay at ``[*]``;
   figures are images; a progress bar is a widget, not text; notebook 04's explorer is a live
   widget. Then the learner's paths of ``LEARNER_PATHS``: a wrong answer typed into an exercise cell
   gets ❌, the right one ✅, and the next section re-runs without a kernel restart.

Screenshots go to ``$JUPYTERLAB_SCREENSHOTS`` (else a temporary folder); every failure names the
folder. Without Playwright or chromium the stage is skipped, except under CI, where it fails; so is
the ordinary user where this machine cannot make one (tests/ordinary_user.py says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import posixpath
import shlex
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from course_lib.jobs import free_ports

from jupyterlab_ui import (
    CHROMIUM_FLAGS,
    VIEWPORT,
    LabError,
    LabServer,
    Notebook,
    StuckCell,
    browser_open_file,
    copy_course,
    end_group,
    expect,
    find_chromium,
    opened_notebook,
    opened_url,
    readme_jupyter_command,
    request,
    wait_for_server,
)
from ordinary_user import CannotRunAsUser, User, current_user, throwaway_user

pytestmark = [pytest.mark.full, pytest.mark.stage]  # a stage of the suite: `pytest -m "not stage"` leaves it out

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0


def get_json(url: str, token: str) -> Any:
    status, body = request(url, token)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


def skip_unless_ci(reason: str) -> None:
    """Skip the test; under CI (``CI`` set) fail it instead: there, every check must run."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}, and CI must run this check")
    pytest.skip(reason)


@pytest.fixture(params=["root", "user"])
def learner(request: pytest.FixtureRequest) -> Iterator[User]:
    """Who runs the README's command: root (as in most containers) and an ordinary user.

    As root, the ordinary user is a throwaway one (tests/ordinary_user.py), who can run this
    environment's Python; not root, it is this process's user, and there is no root to be."""
    if request.param == "root":
        if os.geteuid() != 0:
            pytest.skip("not root: the README's command is run as root only where the tests run as root")
        yield current_user()
    elif os.geteuid() != 0:
        yield current_user()
    else:
        with contextlib.ExitStack() as stack:
            try:
                user = stack.enter_context(throwaway_user(needs=[Path(sys.executable).parent, Path(sys.prefix)]))
            except CannotRunAsUser as exc:
                skip_unless_ci(f"cannot run the README's command as an ordinary user here: {exc}")
            yield user


@pytest.mark.timeout(180)
def test_readme_jupyterlab_command_serves_the_course(learner: User, tmp_path: Path) -> None:
    command = readme_jupyter_command(REPO)  # e.g. ["jupyter", "lab", "--allow-root", ..., "notebooks/01_....ipynb"]
    first = opened_notebook(command)  # its path from the course folder
    bin_dir = Path(sys.executable).parent  # the venv's bin/, first on PATH as after `. .venv/bin/activate`
    assert (bin_dir / command[0]).exists(), (
        f"{command[0]} is not installed in this environment: pip install -r requirements.txt"
    )
    port, token = free_ports()[0], secrets.token_hex(16)
    env = {"PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]), "VIRTUAL_ENV": sys.prefix}
    if learner.uid == os.geteuid():
        root = REPO  # from the repository root, as the README says
        runtime = tmp_path / "runtime"  # connection files in the test's folder, not the user's
    else:  # another user runs from their own copy (a clone is its owner's), with their own Jupyter folders
        root = copy_course(REPO, learner.home / "course")
        learner.give(root)
        runtime = learner.home / "jupyter-runtime"  # theirs, named here to find the page for their browser
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    started = [
        *learner.prefix,
        *command,
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ]
    log_path = tmp_path / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    who = f"{shlex.join(command)} as {learner.name} ({learner.how})"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            started,
            cwd=root,
            env=learner.env(**env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            status = wait_for_server(
                base, token, proc, START_TIMEOUT, lambda: log_path.read_text(errors="replace")[-3000:]
            )
        except LabError as exc:
            pytest.fail(f"{who}: {exc}")
        assert "started" in status
        server_uid = Path(f"/proc/{proc.pid}").stat().st_uid  # who the server runs as, from the kernel
        assert server_uid == learner.uid, f"{who}: the server runs as uid {server_uid}, not {learner.uid}"

        # The token is kept: without it the API refuses.
        refused, _ = request(f"{base}/api/contents/notebooks", None)
        assert refused in (401, 403)
        wrong, _ = request(f"{base}/api/contents/notebooks", "not-the-token")
        assert wrong in (401, 403)

        # The server's root is the course folder, where the command runs (what Lab's file browser shows at its
        # root): notebooks/, and beside them hpc/ and the READMEs that hpc/README.md sends learners to.
        listing = get_json(f"{base}/api/contents?content=1", token)
        served = {item["name"]: item["type"] for item in listing["content"]}
        assert {"notebooks": "directory", "hpc": "directory", "README.md": "file"}.items() <= served.items(), (
            f"{who}: the server's root is not the course folder: {served}"
        )
        hpc = {item["name"] for item in get_json(f"{base}/api/contents/hpc?content=1", token)["content"]}
        assert {"README.md", *(p.name for p in (REPO / "hpc").glob("*.sbatch"))} <= hpc, hpc
        guide = get_json(f"{base}/api/contents/hpc/README.md", token)["content"]
        for link in re.findall(r"\]\((?![a-z]+:|#)([^)#\s]+)", guide):  # hpc/README.md's links to the course's files
            target = posixpath.normpath(f"hpc/{urllib.parse.unquote(link)}")
            found, _ = request(f"{base}/api/contents/{urllib.parse.quote(target)}?content=0", token)
            assert found == 200, f"{who}: hpc/README.md links to {link}, which the server does not serve ({found})"
        notebooks = get_json(f"{base}/api/contents/notebooks?content=1", token)
        served = {item["name"]: item["type"] for item in notebooks["content"]}
        expected = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        assert expected and all(served.get(name) == "notebook" for name in expected), (expected, served)
        assert served.get("solutions") == "directory"
        solutions = get_json(f"{base}/api/contents/notebooks/solutions?content=1", token)
        assert set(expected) <= {item["name"] for item in solutions["content"]}

        opened = get_json(f"{base}/api/contents/{first}", token)
        assert opened["type"] == "notebook" and opened["content"]["cells"]
        # ... and the page the command opens in the browser (here, with --no-browser, only writes for it) is that
        # notebook, by its path from the course folder.
        url = urllib.parse.urlsplit(opened_url(browser_open_file(runtime)))
        assert (url.netloc, urllib.parse.unquote(url.path)) == (f"127.0.0.1:{port}", f"/lab/tree/{first}"), (who, url)

        page_status, page = request(f"{base}/lab", token)
        assert page_status == 200 and b"jupyter-config-data" in page  # the JupyterLab application page

        shut, _ = request(f"{base}/api/shutdown", token, method="POST")
        assert shut in (200, 204)
        assert proc.wait(timeout=30) == 0, f"{who}: exit status {proc.returncode}:\n{log_path.read_text()[-3000:]}"
    finally:
        if proc.poll() is None:
            end_group(proc.pid, proc)
    assert proc.poll() is not None


# ---------------------------------------------------------------------------------------------
# The JupyterLab stage: what the course's learners see.

RUN_ALL = ["01", "04", "15"]  # learner notebooks run with Run All Cells, once each: 01 prepares the data (its progress
# bar), 04 ends with the explorer widget, 15 trains its tokenizer and runs its torchrun jobs from a JupyterLab kernel
RUN_ABOVE = {"05": "## 4 · ", "10": "## 4 · ", "13": "## 4 · ", "14": "## 2 · "}  # notebooks run with Run All Above
# Selected Cell, the markdown cell holding this text selected: up to the end of the section whose exercise a later cell
# uses (05: the module spawn workers import; 13: the tuned number of workers, which section 4's torchrun job uses: its
# learner path runs that job from the JupyterLab kernel once the answer is right; 14: the count of samples trained
# twice), or, for 10, through what a browser adds to the notebook: its S3 server started from a JupyterLab kernel, the
# bucket read by forkserver workers and by s3torchconnector, and the proxy's latency. nbval runs all of their cells in
# both versions; here they are run as far as their learner paths need.
OPENED = RUN_ALL + list(RUN_ABOVE)
SIDE_BY_SIDE = ["04", "13"]  # run at the same time, each in its page and kernel, as a learner with two tabs would
# (notebook 01 runs alone, first: it prepares the data and shows the progress bar)
RUN_ALL_TIMEOUT = 300.0  # seconds for one notebook's Run All (notebook 04 needs ~70 s here, ~200 s under heavy load);
# then a cell at [*] is stuck
# Any test of the stage may be the one that runs a notebook first (e.g. run alone with -k).
STAGE_TIMEOUT = int(RUN_ALL_TIMEOUT) * len(SIDE_BY_SIDE) + 240


class SectionBroke(LabError):
    """Re-running a section after Run All showed an error (the learner's real path)."""


class LooksWrong(AssertionError):
    """The page shows something a person would find broken (a cut label, a raw repr)."""


@dataclass(frozen=True)
class LearnerPath:
    """What a learner does in a notebook after Run All: solve an exercise, then re-run a section.

    The exercise (``code``, e.g. "01.1"; ``None``: none, only the re-run): ``cell`` is a text only
    its answer cell contains. The test types into that cell its text with ``stub`` (a part of it;
    ``None``: all of it) replaced by ``wrong``, runs it (and the check cell, marked by ``check``,
    when the answer cell does not check itself) and expects ``❌ Exercise <code>``; then the same
    with ``right``, expecting ``✅``. Then the cells from the markdown cell containing ``rerun[0]``
    up to (not including) the one containing ``rerun[1]`` (``None``: to the end) run again, in the
    same kernel, without a restart: none may show an error.
    """

    notebook: str
    rerun: tuple[str, str | None]
    code: str | None = None
    cell: str = ""
    wrong: str = ""
    right: str = ""
    stub: str | None = None
    check: str | None = None


SQUARES = """class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
{guard}        return i, i ** 2
"""
WORKER_MODULE = """%%writefile scratch/my_workers.py
import numpy as np
import torch
from torch.utils.data import get_worker_info


class GaussianNoise:
    def __init__(self, std=0.1):
        if std < 0:
            raise ValueError(f"std must be >= 0, got {{std}}")
        self.std = std

    def __call__(self, image):
        if not isinstance(image, torch.Tensor):
            raise TypeError("put v2.ToImage() and v2.ToDtype(torch.float32, scale=True) before GaussianNoise")
        return (image + torch.randn_like(image) * self.std).clamp(0, 1)

    def __repr__(self):
        return f"GaussianNoise(std={{self.std}})"


def seed_worker(worker_id):
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng({seed})
"""
SEEN = """    counts = collections.Counter()
    for rank_steps in steps.values():
        for step in rank_steps:
{only_epoch}            counts.update(step["indices"])
    return sorted(i for i, c in counts.items() if c > 1), sorted(set(range(n)) - set(counts))"""
LEARNER_PATHS = [
    # 01.1: the wrong class forgets IndexError past the end (a plausible slip: the check says so).
    pytest.param(
        LearnerPath(
            "01",
            ("## 2 · ", "## 3 · "),
            "01.1",
            cell="class Squares(Dataset):",
            check="check.squares_dataset(Squares)",
            wrong=SQUARES.format(guard=""),
            right=SQUARES.format(
                guard="        if i < 0:\n            i += self.n\n"
                "        if not 0 <= i < self.n:\n            raise IndexError(i)\n"
            ),
        ),
        id="01.1",
    ),
    pytest.param(
        LearnerPath(
            "04",
            ("### Exercise 04.4", "## 5 · "),
            "04.3",
            cell="def workers_needed(",
            stub="    raise NotImplementedError  # the fewest workers that keep up with the loop",
            wrong="    return int(load_s / step_s)",
            right="    return math.ceil(load_s / step_s)",
        ),
        id="04.3",
    ),
    # 13.2: no workers at all is the plausible wrong answer (the loop waits most of the time).
    pytest.param(
        LearnerPath(
            "13",
            ("## 4 · ", "### Pitfall: fewer shards"),
            "13.2",
            cell="tuned = ...",
            stub="tuned = ...",
            wrong="tuned = 0",
            right="tuned = min(w for w, r in results.items() if r.steady_stall_fraction < capstone.STALL_TARGET)",
        ),
        id="13.2",
    ),
    # 05.2: the module's seed_worker seeds every worker alike (a constant seed); once the check passes, the section
    # after it imports the module and runs it in spawn workers (with the stub, that cell only says to solve 05.2).
    pytest.param(
        LearnerPath(
            "05",
            ("### Exercise 05.2", "## 4 · "),
            "05.2",
            cell="%%writefile scratch/my_workers.py",
            check='check.worker_module(scratch / "my_workers.py")',
            wrong=WORKER_MODULE.format(seed="0"),
            right=WORKER_MODULE.format(seed="info.seed"),
        ),
        id="05.2",
    ),
    # 14.1: counting over every epoch is the plausible slip (the restarted epoch is the one asked about).
    pytest.param(
        LearnerPath(
            "14",
            ("### Exercise 14.1", "## 2 · "),
            "14.1",
            cell="def seen_twice_and_never(",
            stub="    raise NotImplementedError",
            wrong=SEEN.format(only_epoch=""),
            right=SEEN.format(only_epoch='            if step["epoch"] != epoch:\n                continue\n'),
        ),
        id="14.1",
    ),
]


def _ran_cells(notebook: Notebook, number: str) -> list[int]:
    """The code cells the stage runs in notebook ``number``: all of them, or those above its ``RUN_ABOVE`` cell."""
    stop = notebook.index(RUN_ABOVE[number], "markdown") if number in RUN_ABOVE else len(notebook.cells)
    return [i for i, c in enumerate(notebook.cells[:stop]) if c["cell_type"] == "code"]


def _notebook_file(number: str) -> str:
    """Notebook ``number``'s path from the course folder: ``notebooks/NN_....ipynb``."""
    found = sorted(p.name for p in (REPO / "notebooks").glob(f"{number}_*.ipynb"))
    assert len(found) == 1, f"notebooks/{number}_*.ipynb: {found}"
    return f"notebooks/{found[0]}"


class Stage:
    """The module's JupyterLab server and browser, and each notebook's page once run."""

    def __init__(self, lab: LabServer, context: Any, shots: Path, data: Path) -> None:
        self.lab, self.context, self.shots, self.data = lab, context, shots, data
        self.pages: dict[str, Notebook] = {}
        self.failed: dict[str, str] = {}
        self.seconds: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, Any] = {}  # what a person would notice; written to observations.json

    def open(self, name: str, label: str) -> Notebook:
        notebook = Notebook(self.lab, self.context, name, self.shots, label)
        start = time.monotonic()
        notebook.open()
        self.seconds.setdefault(label, {})["open"] = round(time.monotonic() - start, 1)
        return notebook

    def ran(self, number: str) -> Notebook:
        """Notebook ``number`` after Run All (run once; a failed run fails every test that needs it)."""
        if number not in self.pages and number not in self.failed:
            together = [n for n in SIDE_BY_SIDE if n not in self.pages and n not in self.failed]
            self._run_all(together if number in together else [number])
        if number in self.failed:
            raise LabError(f"Run All of notebook {number} failed: {self.failed[number][:2000]}")
        self.pages[number].activate()
        return self.pages[number]

    def _run_all(self, numbers: list[str]) -> None:
        """Run All in each notebook's page, all started before any is waited for; failures go to ``failed``."""
        started = {}
        for number in numbers:
            try:
                notebook = self.open(_notebook_file(number), number)
                self.before_run(number, notebook)
                started[number] = (notebook, notebook.start_run_all(above=RUN_ABOVE.get(number)))
            except Exception as exc:
                self.failed[number] = str(exc)
        for number, (notebook, start) in reversed(started.items()):  # the last started is in front
            try:
                notebook.finish_run(RUN_ALL_TIMEOUT)
                self.seconds[number]["run_all"] = round(time.monotonic() - start, 1)
                notebook.screenshot("after-run-all")
                notebook.check_ran(_ran_cells(notebook, number))
                self.seen.setdefault(number, {})["stderr"] = [
                    (notebook.describe(i), text[-300:]) for i, text in notebook.stderr()
                ]
                self.pages[number] = notebook
            except Exception as exc:
                self.failed[number] = str(exc)

    def before_run(self, number: str, notebook: Notebook) -> None:
        """What a learner sees on opening the notebook: its widget outputs before any cell runs."""
        seen = self.seen.setdefault(number, {})
        data_ready = any(self.data.glob("*/manifest.json"))
        seen["data_ready_before_run"] = data_ready
        for i, cell in enumerate(notebook.cells):
            if any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.get("outputs", [])):
                shown = notebook.outputs(i)
                seen.setdefault("widgets_before_run", []).append(
                    {
                        "cell": notebook.describe(i),
                        "rendered_as_widget": any(o["widget"] for o in shown),
                        "text": " ".join(o["text"] for o in shown)[:200],
                    }
                )
                notebook.screenshot("widget-before-run", i)

    def write_report(self) -> None:
        for number, notebook in self.pages.items():  # errors logged by the page's JavaScript, for a person to read
            self.seen.setdefault(number, {})["console_errors"] = notebook.console_errors[:20]
        (self.shots / "observations.json").write_text(
            json.dumps({"seconds": self.seconds, "seen": self.seen}, indent=1, ensure_ascii=False)
        )


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(
                "playwright is not installed, and CI must check the notebooks in JupyterLab: pip install -r requirements.txt"
            )
        pytest.skip("no playwright: `pip install -r requirements.txt` to check the notebooks in JupyterLab")
    chromium = find_chromium()
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail(
                "chromium is not installed, and CI must check the notebooks in JupyterLab: apt-get install chromium"
            )
        pytest.skip("no chromium on PATH: `apt-get install chromium` (Debian) to check the notebooks in JupyterLab")
    shots = Path(os.environ.get("JUPYTERLAB_SCREENSHOTS") or tmp_path_factory.mktemp("jupyterlab-screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("jupyterlab-course")
    data = home / "course-data"  # empty: the first notebook prepares the data, with its progress bar
    env = {
        "COURSE_DATA_DIR": str(data),
        # the kernels import this checkout's course_lib and course_tools, whatever is installed
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    lab = LabServer(REPO, home, env=env)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
            try:
                context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
                the_stage = Stage(lab, context, shots, data)
                try:
                    yield the_stage
                finally:
                    the_stage.write_report()
                    for notebook in the_stage.pages.values():
                        notebook.close()
                    context.close()
            finally:
                browser.close()
    finally:
        lab.stop()


def _item(page: Any, name: str) -> Any:
    """The file browser's entry ``name`` in the folder it shows."""
    text = page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$"))
    return page.locator("#filebrowser .jp-DirListing-item", has=text)


@pytest.mark.timeout(180)
def test_command_1_opens_notebook_01_in_the_course_folder(stage: Stage) -> None:
    """The page command 1 opens, reached as the learner's browser reaches it (the file the server writes for it, which
    leads to the server): notebook 01 in front, its kernel in ``notebooks/`` (the notebooks' relative paths start
    there), and the file browser's root the course folder: ``hpc/``, its scripts and README, and the README a click
    away."""
    lab = stage.lab
    notebook = Notebook(lab, stage.context, lab.first, stage.shots, label="command-1")
    try:
        notebook.open(url=browser_open_file(lab.runtime).as_uri())  # every cell shown, the kernel idle
        page = notebook.page
        arrived = urllib.parse.urlsplit(page.url)
        assert urllib.parse.unquote(arrived.path) == f"/lab/tree/{lab.first}", page.url
        expect(page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")).to_have_text(Path(lab.first).name)
        folders = lab.kernel_folders()
        assert folders.get(lab.first) == lab.notebooks, f"the kernel of {lab.first} runs in {folders}"
        # The file browser starts in the notebook's folder, notebooks/; its home is the course folder.
        expect(page.locator("#filebrowser .jp-BreadCrumbs-item")).to_have_text(["notebooks"])
        expect(_item(page, Path(lab.first).name)).to_have_count(1)
        notebook.screenshot("first-page")
        page.locator("#filebrowser .jp-BreadCrumbs-home").click()
        expect(page.locator("#filebrowser .jp-BreadCrumbs-item")).to_have_count(0)
        for name in ("hpc", "notebooks", "README.md"):
            expect(_item(page, name), f"the course folder shows no {name}").to_have_count(1)
        notebook.screenshot("course-folder")
        _item(page, "hpc").dblclick()
        expect(page.locator("#filebrowser .jp-BreadCrumbs-item")).to_have_text(["hpc"])
        for name in ["README.md", *sorted(p.name for p in (REPO / "hpc").glob("*.sbatch"))]:
            expect(_item(page, name), f"hpc/ shows no {name}").to_have_count(1)
        _item(page, "README.md").dblclick()  # opens hpc/README.md in a tab of its own
        expect(page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")).to_have_text("README.md")
        first_line = (REPO / "hpc" / "README.md").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        expect(page.locator("#jp-main-dock-panel .jp-Document:not(.lm-mod-hidden)")).to_contain_text(first_line)
        notebook.screenshot("hpc-readme")
    except LabError:  # it says what and where already
        raise
    except AssertionError as exc:
        raise notebook.fail("\n".join(str(exc).strip().splitlines()[:6])) from None
    finally:
        notebook.close()


@pytest.mark.timeout(STAGE_TIMEOUT)
@pytest.mark.parametrize("number", OPENED)
def test_run_all_shows_no_error(number: str, stage: Stage) -> None:
    """Run > Run All Cells (or Run All Above, for ``RUN_ABOVE``): every code cell run finishes and none shows an error
    output."""
    stage.ran(number)


@pytest.mark.timeout(STAGE_TIMEOUT)
@pytest.mark.parametrize("number", OPENED)
def test_kernel_runs_in_the_notebooks_folder(number: str, stage: Stage) -> None:
    """Each notebook's kernel runs in ``notebooks/``, the notebook's own folder (its relative paths, ``scratch/``
    and ``runs/``, start there), though the server's root is the course folder."""
    notebook = stage.ran(number)
    folders = stage.lab.kernel_folders()
    assert folders.get(notebook.name) == stage.lab.notebooks, f"the kernel of {notebook.name} runs in {folders}"


@pytest.mark.timeout(STAGE_TIMEOUT)
@pytest.mark.parametrize("number", ["01", "04", "05", "13"])  # those with a figure in the cells the stage runs
def test_figures_are_images(number: str, stage: Stage) -> None:
    """Every cell run whose committed outputs have a picture shows one: an image that decoded."""
    notebook = stage.ran(number)
    ran = set(_ran_cells(notebook, number))
    cells = [
        i
        for i, c in enumerate(notebook.cells)
        if i in ran and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
    ]
    assert cells, f"{notebook.name} has no figure in its committed outputs"
    broken = {}
    for i in cells:
        images = [img for o in notebook.outputs(i) for img in o["images"]]
        if not images or not all(done and width > 0 for done, width, _ in images):
            broken[i] = f"{notebook.describe(i)}: images (complete, width, height) {images}"
    if broken:
        raise notebook.fail("figures not shown as images:\n" + "\n".join(broken.values()), next(iter(broken)))
    for i in cells if os.environ.get("JUPYTERLAB_SCREENSHOTS") else cells[:1]:  # every figure, for a person to look at
        notebook.screenshot(f"figure-{notebook.cells[i].get('id', i)}", i)


@pytest.mark.timeout(STAGE_TIMEOUT)
def test_progress_bar_is_a_widget(stage: Stage) -> None:
    """The first notebook prepares the data: its tqdm bar is a widget, not lines of text on stderr."""
    notebook = stage.ran("01")
    if stage.seen["01"]["data_ready_before_run"]:
        pytest.skip("the data was prepared before notebook 01 ran: it showed no progress bar")
    i = notebook.index("data.prepare_data(", "code")
    shown = notebook.outputs(i)
    assert not any(o["mime"] == "application/vnd.jupyter.stderr" for o in shown), (
        f"{notebook.describe(i)} shows its progress as text: {[o['text'][:200] for o in shown]}"
    )
    bars = [o for o in shown if o["widget"]]
    if not bars or "100%" not in bars[-1]["text"]:
        raise notebook.fail(f"{notebook.describe(i)}: no finished progress bar widget, outputs {shown}", i)
    bar = notebook.cell(i).locator(".widget-hprogress .progress-bar")
    expect(bar, f"{notebook.describe(i)}: the widget has no progress bar element").to_have_count(1)
    notebook.screenshot("progress-bar", i)


@pytest.mark.timeout(STAGE_TIMEOUT)
def test_explorer_widget_responds(stage: Stage) -> None:
    """Notebook 04's LoaderExplorer: sliders and a button that measure and draw, in the page."""
    notebook = stage.ran("04")
    i = notebook.index("LoaderExplorer(", "code")
    cell = notebook.cell(i)
    text = notebook.output_text(i)
    if "VBox(children=" in text or not any(o["widget"] for o in notebook.outputs(i)):
        raise notebook.fail(f"{notebook.describe(i)} shows no widget after Run All: {text[:200]!r}", i)
    notebook.show(i)
    notebook.screenshot("explorer-after-run-all", i)
    sliders = cell.locator(".widget-hslider")
    expect(sliders, f"{notebook.describe(i)}: not 4 sliders").to_have_count(4)
    workers, prefetch = sliders.nth(0), sliders.nth(2)
    expect(workers).to_contain_text("num_workers")
    expect(prefetch).to_contain_text("prefetch_factor")
    expect(prefetch.locator("[disabled]").first, "prefetch_factor is off with 0 workers").to_be_attached()

    # A slider moved with the keyboard: its value changes, and the kernel answers (prefetch_factor
    # comes on, which only the Python side decides).
    workers.locator(".noUi-handle").focus()
    notebook.page.keyboard.press("ArrowRight")
    try:
        expect(workers.locator(".widget-readout")).to_have_text("1", timeout=10_000)
        expect(prefetch.locator("[disabled]")).to_have_count(0, timeout=10_000)
    except AssertionError:
        raise notebook.fail("moving num_workers to 1 did not reach the kernel (prefetch_factor still off)", i) from None

    # The button measures an epoch with those settings and draws its timeline and summary.
    button = cell.locator("button", has_text="Measure one epoch")
    expect(button).to_be_visible()
    before = notebook.output_text(i)
    button.click()
    output = cell.locator(".widget-output")
    try:
        expect(output).to_contain_text(re.compile(r"busy: .*w0"), timeout=60_000)  # the summary, with worker 0
        # its timeline, an image that decoded (complete, and not a broken one of width 0)
        expect(output.locator("img").last).to_have_js_property("complete", True, timeout=10_000)
        expect(output.locator("img").last).not_to_have_js_property("naturalWidth", 0, timeout=10_000)
    except AssertionError:
        raise notebook.fail(
            f"the explorer's button drew no timeline with 1 worker: {notebook.output_text(i)[-500:]!r}", i
        ) from None
    assert notebook.output_text(i) != before
    notebook.screenshot("explorer-measured", i)
    assert not notebook.errors([i]), notebook.errors([i])


@pytest.mark.timeout(STAGE_TIMEOUT)
def test_explorer_labels_fit(stage: Stage) -> None:
    """No label of 04's explorer is cut: each shows its whole text."""
    notebook = stage.ran("04")
    i = notebook.index("LoaderExplorer(", "code")
    notebook.show(i)
    cut = notebook.cell(i).evaluate("""c => [...c.querySelectorAll('.jupyter-widgets button, .jupyter-widgets label')]
        .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.trim())""")
    if cut:
        raise LooksWrong(f"{notebook.describe(i)}: labels cut short: {cut}")


@pytest.mark.timeout(STAGE_TIMEOUT)
def test_widgets_before_run_are_not_raw_reprs(stage: Stage) -> None:
    """On opening a notebook, a committed widget output shows no Python repr such as ``VBox(children=(...``."""
    stage.ran("04")
    raw = [
        w
        for number in OPENED
        for w in stage.seen.get(number, {}).get("widgets_before_run", [])
        if not w["rendered_as_widget"] and "(children=" in w["text"]
    ]
    if raw:
        raise LooksWrong(f"widget outputs shown as raw text before their cells run: {raw}")


def _verdict(text: str, code: str) -> str:
    """The check's line for exercise ``code`` in a cell's output ('' when it printed none)."""
    lines = [line for line in text.splitlines() if f"Exercise {code} " in line]
    return lines[-1] if lines else ""


def _answer(notebook: Notebook, path: LearnerPath, index: int, answer: str) -> str:
    source = notebook.source(index)
    if path.stub is None:
        return answer
    assert path.stub in source, (
        f"{notebook.describe(index)} no longer contains the stub {path.stub!r}: update LEARNER_PATHS"
    )
    return source.replace(path.stub, answer, 1)


@pytest.mark.timeout(STAGE_TIMEOUT)
@pytest.mark.parametrize("path", LEARNER_PATHS)
def test_learner_path_after_run_all(path: LearnerPath, stage: Stage) -> None:
    """After Run All: a wrong answer gets ❌, the right one ✅, and the next section re-runs cleanly."""
    notebook = stage.ran(path.notebook)
    seconds = stage.seconds[path.notebook].setdefault(f"path {path.code or 'rerun ' + path.rerun[0].strip('# ·')}", {})
    start = time.monotonic()
    if path.code is not None:
        answer = notebook.index(path.cell, "code")
        check = notebook.index(path.check, "code") if path.check else answer
        for typed, mark, kind in ((path.wrong, "❌", "wrong"), (path.right, "✅", "right")):
            notebook.type_source(answer, _answer(notebook, path, answer, typed))
            notebook.run_cells(answer)
            if check != answer:
                notebook.run_cells(check)
            verdict = _verdict(notebook.output_text(check), path.code)
            shot = notebook.screenshot(f"exercise-{path.code}-{kind}", check)
            if not verdict.startswith(f"{mark} Exercise {path.code}"):
                raise notebook.fail(
                    f"after the {kind} answer, {notebook.describe(check)} printed "
                    f"{verdict or notebook.output_text(check)[-300:]!r}, not {mark} (see {shot.name})",
                    check,
                )
        seconds["exercise"] = round(time.monotonic() - start, 1)

    # The learner goes on: the section, again, in the same kernel.
    start = time.monotonic()
    first = notebook.index(path.rerun[0], "markdown")
    stop = notebook.index(path.rerun[1], "markdown") if path.rerun[1] else len(notebook.cells)
    code = [i for i in range(first, stop) if notebook.cells[i]["cell_type"] == "code"]
    # the kernel's count so far, read from the cells this stage ran (the cells below a Run All Above still show the
    # counts saved in the file, which may be higher)
    before = notebook.last_count(_ran_cells(notebook, path.notebook) + ([answer, check] if path.code else []))
    if path.rerun[1] is None:
        notebook.run_from(first, timeout=RUN_ALL_TIMEOUT)
    else:
        notebook.run_cells(code[0], code[-1], timeout=RUN_ALL_TIMEOUT)  # its code cells, selected
    seconds["rerun"] = round(time.monotonic() - start, 1)
    try:
        notebook.check_ran(code, since=before)
    except LabError as exc:
        raise SectionBroke(
            f"re-running {notebook.describe(first)} .. {notebook.describe(stop - 1)} after Run All"
            f"{f' and exercise {path.code}' if path.code else ''}: {exc}"
        ) from None
    notebook.screenshot(f"rerun-{path.code or 'section'}-done", code[-1])


@pytest.mark.timeout(STAGE_TIMEOUT)
def test_the_stage_sees_errors_and_stuck_cells(stage: Stage) -> None:
    """The detectors themselves: a scratch notebook with 1/0 fails Run All; a cell that sleeps is reported stuck."""
    scratch = stage.lab.notebooks / "scratch_fails.ipynb"
    cells = [
        {"cell_type": "code", "execution_count": None, "id": f"s{i}", "metadata": {}, "outputs": [], "source": src}
        for i, src in enumerate(["print('before')", "1 / 0", "print('never')"])
    ]
    scratch.write_text(
        json.dumps(
            {
                "cells": cells,
                "metadata": {
                    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    notebook = stage.open(scratch.relative_to(stage.lab.root).as_posix(), "scratch")
    try:
        notebook.run_all(60)
        with pytest.raises(LabError) as caught:
            notebook.check_ran([0, 1, 2])
        message = str(caught.value)
        assert "cell 1 (id s1, `1 / 0`) shows an error" in message and "ZeroDivisionError" in message, message
        assert "not run" in message and "`print('never')`" in message, message
        assert str(stage.shots) in message, "a failure names the screenshots folder"
        assert notebook.errors([0]) == [] and "before" in notebook.output_text(0)

        notebook.type_source(2, "import time\ntime.sleep(120)")
        with pytest.raises(StuckCell, match=r"cell 2 \(id s2, `import time`\) still shows \[\*\] after 3 s"):
            notebook.run_cells(2, timeout=3)
        notebook.menu("Kernel", "kernelmenu:interrupt")
        notebook.wait_idle(30, None)
        assert "KeyboardInterrupt" in " ".join(text for _, text in notebook.errors([2]))
    finally:
        notebook.close()
