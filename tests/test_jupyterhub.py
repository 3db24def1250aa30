"""The course on a real JupyterHub: handed out with nbgitpuller, run in a browser, one learner kept out of another's files.

The hub (tests/jupyterhub_stage.py) is set up as the README tells an admin: a shared read-only environment under
/opt, the course data prepared once there (``COURSE_DATA_DIR``), two learners with accounts of their own, and
``LocalProcessSpawner``. In headless chromium each learner logs in, follows the course's nbgitpuller link (made by
``python -m course_lib hub link``), runs notebook 01's learner version (Run All), answers exercise 01.1 and sees ✅.
Then: the second learner cannot read or write the first one's notebooks (through the hub, through the server's
contents API, through a kernel), while a home made with ``useradd -m`` is readable; nor read, upload or delete
through any port or socket of the first one's S3 server (notebook 10's, started in a kernel of the first learner's);
a new commit of the course, pulled by the same link, keeps the learner's answer, and a notebook that needs a newer
``course_lib`` than the shared environment has says so on its first cell; and the doctor, run in a learner's server,
reports the hub's limits. A third learner is on a hub that is not the course's ("a JupyterHub, on your own"): the
server runs from a venv with only JupyterLab and ``jupyterhub-singleuser``; the learner clones the course, registers
the course's venv as a kernel with the README's commands, meets notebook 01's first cell failing in the server's own
kernel, changes the kernel as the README says, runs all and solves exercise 01.1.

Needs root (accounts, /opt), ``configurable-http-proxy`` (``.ci/run`` installs it from the npm registry),
Playwright and Debian's chromium: skipped without them, except under CI, where it fails. Screenshots go to
``$JUPYTERHUB_SCREENSHOTS`` (else a temporary folder).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import stat
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

import course_lib
from course_lib.jobs import free_ports
from course_tools.hub import pull_link

from jupyterhub_stage import Hub, Kernel, chp_command, create_user, http, remove_user, run_code
from jupyterlab_ui import CHROMIUM_FLAGS, VIEWPORT, Notebook, expect, find_chromium, poll_until
from test_s3server import knock

pytestmark = [pytest.mark.full, pytest.mark.stage]

REPO = Path(__file__).resolve().parents[1]
LEARNERS = {"pdcada": "ada-Lovelace-1815", "pdcbob": "bob-Babbage-1791"}  # accounts the test makes and removes
ON_THEIR_OWN = {"pdccat": "cat-Hopper-1906"}  # a learner whose server runs from a hub environment without the course
FIRST = "01_map_style_datasets.ipynb"
SECOND = "02_transforms.ipynb"
ANSWER = """class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i, i ** 2
"""
RUN_ALL_TIMEOUT = 240.0


def skip_unless_ci(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}, and CI must run the JupyterHub stage")
    pytest.skip(reason)


class HubLab:
    """What :class:`jupyterlab_ui.Notebook` needs of a server: here a learner's server on the hub."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub, self.user = hub, user
        self.notebooks = hub.home(user) / "course" / "notebooks"  # where nbgitpuller put the course
        self.log_path = hub.work / "hub.log"

    def url(self, notebook: str, workspace: str) -> str:
        return f"{self.hub.url}/user/{self.user}/lab/workspaces/{workspace}/tree/course/notebooks/{notebook}?reset"

    def remember_kernels(self) -> None:  # the hub stops each server, its kernels with it
        pass


class Stage:
    def __init__(self, hub: Hub, browser: Any, shots: Path) -> None:
        self.hub, self.browser, self.shots = hub, browser, shots
        self.contexts: dict[str, Any] = {}
        self.pages: dict[str, Any] = {}
        self.solved: dict[str, Notebook] = {}
        self.seconds: dict[str, float] = {}

    def link(self) -> str:
        return pull_link(self.hub.url, self.hub.remote, "main", f"notebooks/{FIRST}")

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path))
        return path

    def login(self, user: str) -> Any:
        """A learner's browser (cookies of their own): the hub's login page, filled in and sent."""
        context = self.browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{self.hub.url}/hub/login")
        page.locator("#username_input").fill(user)
        page.locator("#password_input").fill(self.hub.learners[user])
        self.shot(page, f"{user}-1-login")
        page.locator("#login_submit").click()
        page.wait_for_url(re.compile(rf"/user/{user}/|/hub/spawn"), timeout=120_000)
        self.contexts[user], self.pages[user] = context, page
        return page

    def pull(self, user: str, label: str) -> None:
        """Follow the course's nbgitpuller link; nbgitpuller clones or merges, then opens notebook 01."""
        page = self.pages[user]
        page.goto(self.link())
        page.wait_for_url(re.compile(rf"/user/{user}/lab/tree/course/notebooks/{re.escape(FIRST)}"), timeout=180_000)
        expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=120_000)
        self.shot(page, f"{user}-{label}")


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    if os.geteuid() != 0:
        skip_unless_ci("the hub stage makes system accounts and a shared environment in /opt: it needs root")
    if chp_command() is None:
        skip_unless_ci(
            "configurable-http-proxy is not installed (.ci/run installs it: npm install configurable-http-proxy)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_unless_ci("no playwright: pip install -r requirements.txt")
    chromium = find_chromium()
    if chromium is None:
        skip_unless_ci("no chromium on PATH: apt-get install chromium")
    shots = Path(os.environ.get("JUPYTERHUB_SCREENSHOTS") or tmp_path_factory.mktemp("jupyterhub-screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    work = tmp_path_factory.mktemp("jupyterhub")
    work.chmod(0o700)
    hub = Hub({**LEARNERS, **ON_THEIR_OWN}, work, own_env=ON_THEIR_OWN)
    try:
        start = time.monotonic()
        hub.install()
        hub.add_learners()
        hub.serve_course()
        hub.start()
        set_up = time.monotonic() - start
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
            the_stage = Stage(hub, browser, shots)
            the_stage.seconds["set-up"] = round(set_up, 1)
            try:
                yield the_stage
            finally:
                (shots / "seconds.json").write_text(json.dumps(the_stage.seconds, indent=1))
                for context in the_stage.contexts.values():
                    context.close()
                browser.close()
    finally:
        hub.stop()


@pytest.mark.timeout(900)
def test_each_learner_pulls_the_course_runs_notebook_01_and_solves_an_exercise(stage: Stage) -> None:
    for user in LEARNERS:
        start = time.monotonic()
        stage.login(user)
        stage.pull(user, "2-pulled")
        home = stage.hub.home(user)
        pulled = home / "course" / "notebooks" / FIRST
        assert pulled.is_file() and pulled.stat().st_uid == stage.hub.home(user).stat().st_uid, "cloned as the learner"
        assert stat.S_IMODE(home.stat().st_mode) & 0o007 == 0, f"adduser made {home} readable by others"
        notebook = Notebook(HubLab(stage.hub, user), stage.contexts[user], FIRST, stage.shots, label=f"{user}-01")
        notebook.open()
        notebook.run_all(RUN_ALL_TIMEOUT)
        notebook.check_ran([i for i, c in enumerate(notebook.cells) if c["cell_type"] == "code"])
        answer = notebook.index("class Squares(Dataset):", "code")
        check = notebook.index("check.squares_dataset(Squares)", "code")
        notebook.type_source(answer, ANSWER)
        notebook.run_cells(answer)
        notebook.run_cells(check)
        verdict = notebook.output_text(check)
        notebook.screenshot("3-solved", check)
        assert "✅ Exercise 01.1" in verdict, verdict[-500:]
        notebook.page.keyboard.press("Control+s")  # saved: the answer is in the learner's file now
        assert poll_until(lambda: "raise IndexError(i)" in pulled.read_text(), 30), (
            "the saved notebook holds the answer"
        )
        stage.solved[user] = notebook
        stage.seconds[f"{user}: log in, pull, Run All, solve"] = round(time.monotonic() - start, 1)


def _ada_notebook(stage: Stage) -> Path:
    if "pdcada" not in stage.solved:
        pytest.fail("the first learner's course was not pulled (see the test before)")
    return stage.hub.home("pdcada") / "course" / "notebooks" / FIRST


@pytest.mark.timeout(300)
def test_one_learner_cannot_read_or_write_anothers_notebooks(stage: Stage) -> None:
    ada, bob = list(LEARNERS)
    target = _ada_notebook(stage)
    bob_token = stage.hub.user_token(bob)
    relative = f"course/notebooks/{FIRST}"
    # through the hub: bob's token does not open ada's server
    status, _ = http(f"{stage.hub.url}/user/{ada}/api/contents/{relative}", bob_token)
    assert status == 403, status
    # through bob's own server's contents API: nothing outside bob's home
    for path in (f"../{ada}/{relative}", f"%2E%2E/{ada}/{relative}", str(target)):
        status, body = http(f"{stage.hub.url}/user/{bob}/api/contents/{path}", bob_token)
        assert status in (400, 403, 404), (path, status, str(body)[:200])
    # through a kernel of bob's server: the operating system refuses
    probe = (
        f"import pathlib\np = pathlib.Path({str(target)!r})\n"
        "for what, do in (('read', p.read_text), ('write', lambda: p.write_text('{}')), ('list', lambda: list(p.parent.iterdir()))):\n"
        "    try:\n        do()\n        print(what, 'ALLOWED')\n    except PermissionError:\n        print(what, 'denied')\n"
    )
    out = run_code(stage.hub, bob, bob_token, probe)
    assert out["stdout"].split() == ["read", "denied", "write", "denied", "list", "denied"], out
    assert "raise IndexError(i)" in target.read_text(), "ada's answer is untouched"

    # a home made with `useradd -m` (UMASK 022): every learner can read it, which the same probe shows
    create_user("pdcopen", private=False)
    try:
        open_home = stage.hub.home("pdcopen")
        assert stat.S_IMODE(open_home.stat().st_mode) == 0o755
        notes = open_home / "notes.ipynb"
        notes.write_text("{}")
        os.chown(notes, open_home.stat().st_uid, open_home.stat().st_gid)
        out = run_code(stage.hub, bob, bob_token, probe.replace(repr(str(target)), repr(str(notes))))
        assert out["stdout"].split()[:2] == ["read", "ALLOWED"], out  # the isolation check fails here, as it should
    finally:
        remove_user("pdcopen")


# What a learner's notebook 10 does first (its first cells): its own S3 server, a shard put into the bucket `course`
# as the writer identity, then the learner identity in use. It prints what the test needs: the server's pid, folder
# and the object's key (the listeners are read from the process itself).
S3_SERVER = """
import json, os
from course_lib import data, s3server
server = s3server.local_server()
shard = data.scratch_folder("10") / "shard-000000.tar"
shard.write_bytes(os.urandom(300_000))
s3server.upload(server, [shard], "course", "shards/")
print(json.dumps({"pid": server.pid, "folder": str(server.folder), "key": "shards/shard-000000.tar"}))
"""


@pytest.mark.timeout(300)
def test_no_learner_reaches_anothers_s3_server(stage: Stage) -> None:
    """Notebook 10's S3 server, started in a kernel of ada's server, listens on 127.0.0.1, which bob shares. From a
    kernel of his own server, bob tries to read, upload and delete on every port and Unix socket the live server
    process listens on (read here, as root, from the operating system), without a certificate and with one of his own
    server's kind, and to read ada's server's folder: all fail. Ada's S3, with her keys, still works."""
    import psutil

    ada, bob = list(LEARNERS)
    started = time.monotonic()
    for user in (ada, bob):
        stage.hub.ensure_server(user)
    with Kernel(stage.hub, ada, stage.hub.user_token(ada)) as kernel:
        out = kernel.run(S3_SERVER, timeout=180)
        assert not out["error"], out
        server = json.loads(out["stdout"].strip().splitlines()[-1])
        process = psutil.Process(server["pid"])
        assert process.username() == ada and "mini" in process.cmdline()
        deadline = time.monotonic() + 20  # S3 answers before the admin server and the gRPC ports listen
        while True:
            listening = {
                (c.laddr.ip, c.laddr.port)
                for each in [process, *process.children(recursive=True)]
                for c in each.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
            if len(listening) >= 10 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(listening) >= 10 and {ip for ip, _ in listening} == {"127.0.0.1"}, listening
        unix = sorted({c.laddr for c in process.net_connections(kind="unix") if c.laddr})
        assert len(unix) >= 7, unix  # weed's five gRPC sockets in /tmp, the filer's and S3's in its folder
        doors = [port for _, port in sorted(listening)] + unix
        folder = server["folder"]
        probe = inspect.getsource(knock) + textwrap.dedent(f"""
            import json, tempfile
            from pathlib import Path
            from course_lib import s3server

            doors = {doors!r}
            tried = knock(doors, "course", {server["key"]!r})
            own = Path(tempfile.mkdtemp())
            s3server._write_certificates(own)  # what bob's own notebook 10 server presents
            tried.update({{(door, "with bob's certificate: " + what): outcome for (door, what), outcome in knock(
                doors, "course", {server["key"]!r}, certificate=(str(own / "tls-cert.pem"), str(own / "tls-key.pem"))
            ).items()}})
            for name in ("credentials", "s3.json", "security.toml", "tls-key.pem", "weed.log", "data"):
                try:
                    path = Path({folder!r}) / name
                    list(path.iterdir()) if name == "data" else path.read_bytes()
                    tried[name, "read the file"] = "SERVED"
                except OSError as error:
                    tried[name, "read the file"] = "refused: " + type(error).__name__
            print(json.dumps([[str(door), what, outcome] for (door, what), outcome in tried.items()]))
        """)
        out = run_code(stage.hub, bob, stage.hub.user_token(bob), probe, timeout=180)
        assert not out["error"], out
        tried = json.loads(out["stdout"].strip().splitlines()[-1])
        assert {door for door, _, _ in tried} >= {str(door) for door in doors}
        opened = [f"{door} {what}: {outcome}" for door, what, outcome in tried if outcome.startswith("SERVED")]
        assert not opened, "\n".join(opened)
        every = len(knock(free_ports(1), "course", server["key"]))  # the attempts at one door (here a closed one)
        attempts = Counter(door for door, _, _ in tried)
        assert all(attempts[str(door)] == 2 * every for door in doors), attempts  # each, and with bob's certificate
        # ada's S3, with her keys: the object is whole, and nothing was added or removed
        out = kernel.run(
            "print(sorted(o['Key'] for o in server.client('writer').list_objects_v2(Bucket='course')['Contents']),"
            f" server.client('learner').get_object(Bucket='course', Key={server['key']!r})['Body'].read() =="
            " shard.read_bytes())"
        )
        assert out["stdout"].split("]")[-1].strip() == "True" and f"['{server['key']}']" in out["stdout"], out
    assert poll_until(lambda: not psutil.pid_exists(server["pid"]), 30), "the server outlived ada's kernel"
    stage.seconds["bob knocks on ada's S3 server"] = round(time.monotonic() - started, 1)


@pytest.mark.timeout(300)
def test_an_update_of_the_course_keeps_the_learners_answer(stage: Stage) -> None:
    ada = "pdcada"
    mine = _ada_notebook(stage)
    upstream = json.loads((REPO / "notebooks" / FIRST).read_text())
    # the maintainers change the same exercise cell (a conflicting edit) and publish a new file
    cell = next(c for c in upstream["cells"] if "class Squares(Dataset):" in "".join(c["source"]))
    cell["source"] = [
        "".join(cell["source"]).replace(
            "raise NotImplementedError  # store n on self",
            "raise NotImplementedError  # (updated hint) store n on self",
        )
    ]
    # and notebook 02 now needs a newer course_lib than the hub's environment has
    second = REPO / "notebooks" / SECOND
    newer = second.read_text().replace(
        f'course_lib.require(\\"{course_lib.__version__}\\")', 'course_lib.require(\\"99.0\\")', 1
    )
    assert newer != second.read_text()
    stage.hub.publish(
        {
            f"notebooks/{FIRST}": json.dumps(upstream, indent=1, ensure_ascii=False) + "\n",
            f"notebooks/{SECOND}": newer,
            "notebooks/WHATS_NEW.md": "# What's new\n\nA new commit of the course.\n",
        },
        "A course update: a new file, a conflicting edit of exercise 01.1's cell, notebook 02 for course_lib 99.0",
    )
    stage.pull(ada, "4-updated")
    home = stage.hub.home(ada) / "course"
    assert (home / "notebooks" / "WHATS_NEW.md").is_file(), "the update's new file arrived"
    text = mine.read_text()
    assert "raise IndexError(i)" in text, "the learner's answer survived the merge"
    assert "(updated hint)" not in text, (
        "in a conflicting edit the learner's version wins (nbgitpuller merges with -Xours)"
    )
    # the updated notebook 02, on the environment as the admin installed it: its first cell says what to do
    cells = json.loads((home / "notebooks" / SECOND).read_text())["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    out = run_code(stage.hub, ada, stage.hub.user_token(ada), first)
    assert out["error"].startswith(
        f"CourseLibTooOldError: this notebook needs course_lib 99.0 or newer, and the "
        f"environment has {course_lib.__version__}"
    ), out


@pytest.mark.timeout(300)
def test_the_doctor_in_a_learners_server_reports_the_hubs_limits(stage: Stage) -> None:
    ada = "pdcada"
    token = stage.hub.user_token(ada)
    out = run_code(
        stage.hub,
        ada,
        token,
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-m', 'course_lib', 'doctor', '--json'], capture_output=True,"
        " text=True, timeout=120).stdout)",
        timeout=180,
    )
    report = json.loads(out["stdout"])
    facts, by_name = report["facts"], {r["name"]: r for r in report["results"]}
    assert facts["hub_cpu_limit"] == 2.0 and facts["hub_mem_limit_mb"] == 4096.0, facts
    assert by_name["memory"]["finding"] == "4,096 MB (the hub's MEM_LIMIT)"
    assert "the hub's CPU_LIMIT" in by_name["CPU limit"]["finding"]
    assert facts["data_folder"] == str(stage.hub.prefix / "data") and by_name["course data"]["status"] == "ok", by_name[
        "course data"
    ]


def readme_kernel_block() -> str:
    """The README's commands that register the course's venv as a kernel ("Registering the venv as a kernel")."""
    text = (REPO / "README.md").read_text()
    found = re.search(r"^Registering the venv as a kernel.*?\n```bash\n(.*?)```", text, re.S | re.M)
    assert found, "README.md: no ```bash block after 'Registering the venv as a kernel'"
    return found.group(1)


@pytest.mark.timeout(600)
def test_on_their_own_hub_a_learner_registers_the_course_kernel_and_runs_notebook_01(stage: Stage) -> None:
    """The README's "A JupyterHub, on your own": the server runs from the hub's environment, which lacks the course.
    The learner clones the course in it and runs the README's kernel block in the clone; the course's venv is the
    shared one (a symbolic link ``.venv``, standing for command 1's ``python3 -m venv .venv && pip install ...``)."""
    hub, user = stage.hub, next(iter(ON_THEIR_OWN))
    hub.finish_hub_env()  # installed from PyPI meanwhile
    stage.seconds.update({f"hub env install: {k}": v for k, v in hub.hub_env_install.items() if k != "error"})
    if "error" in hub.hub_env_install:
        reason = "the hub's own environment (pip install jupyterlab jupyterhub) could not be installed"
        if hub.hub_env_install.get("offline"):
            skip_unless_ci(f"{reason}: PyPI is out of reach\n{hub.hub_env_install['error']}")
        pytest.fail(f"{reason}:\n{hub.hub_env_install['error']}")
    start = time.monotonic()
    hub.ensure_server(user)
    server = Path(f"/proc/{hub.server_pid(user)}/cmdline").read_text()
    assert str(hub.hub_env / "bin") in server, f"the server runs from the hub's environment: {server}"
    token = hub.user_token(user)
    block = readme_kernel_block()
    venv = hub.prefix / "venv"
    # what the learner types in a terminal of the server (here: a shell the server's own kernel starts, as the learner,
    # with the server's PATH: the hub's environment first)
    terminal = f"cd ~ && git clone -q {hub.remote} course && cd course && ln -s {venv} .venv\n{block}"
    out = run_code(
        hub,
        user,
        token,
        "import subprocess, sys\n"
        "print(sys.prefix)\n"
        "try:\n    import course_lib\nexcept ImportError as error:\n    print(repr(error))\n"
        f"done = subprocess.run(['bash', '-c', {terminal!r}], capture_output=True, text=True, timeout=240)\n"
        "print(done.stdout, done.stderr)",
        timeout=300,
    )
    said = out["stdout"]
    assert said.splitlines()[0] == str(hub.hub_env), out  # the server's own kernel: the hub's environment
    assert "No module named 'course_lib'" in said, said[:2000]
    assert "Installed kernelspec pytorch-data-course" in said, said[-3000:]
    kernel_row = re.search(r"^ +(?:\[[^]]*\]|\S+) +kernel +(.*)$", said, re.M)  # the doctor's row: mark, name, finding
    assert kernel_row and "pytorch-data-course" in kernel_row[1] and str(venv) in kernel_row[1], said[-3000:]

    stage.login(user)
    notebook = Notebook(HubLab(hub, user), stage.contexts[user], FIRST, stage.shots, label=f"{user}-01")
    notebook.open()
    code = [i for i, c in enumerate(notebook.cells) if c["cell_type"] == "code"]
    notebook.run_cells(code[0])  # in the server's own kernel, as a learner who skipped the README's last step
    errors = notebook.errors([code[0]])
    notebook.screenshot("1-no-course-in-the-hubs-kernel", code[0])
    assert errors and "ModuleNotFoundError: No module named 'course_lib'" in errors[0][1], errors
    notebook.change_kernel("Python (pytorch-data-course)")
    notebook.run_all(RUN_ALL_TIMEOUT)
    notebook.check_ran(code)
    notebook.screenshot("2-ran-in-the-course-kernel", code[0])
    answer = notebook.index("class Squares(Dataset):", "code")
    check = notebook.index("check.squares_dataset(Squares)", "code")
    notebook.type_source(answer, ANSWER)
    notebook.run_cells(answer)
    notebook.run_cells(check)
    verdict = notebook.output_text(check)
    notebook.screenshot("3-solved", check)
    assert "✅ Exercise 01.1" in verdict, verdict[-500:]
    # the doctor, run in that kernel, names the course's environment
    out = run_code(
        hub,
        user,
        token,
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-m', 'course_lib', 'doctor', '--json'], capture_output=True,"
        " text=True, timeout=120).stdout)",
        timeout=180,
        kernel_name="pytorch-data-course",
    )
    report = json.loads(out["stdout"])
    kernel = {r["name"]: r for r in report["results"]}["kernel"]
    assert report["facts"]["environment"] == str(venv), report["facts"]
    assert kernel["status"] == "ok" and str(venv) in kernel["finding"], kernel
    stage.seconds[f"{user}: on their own: clone, register, Run All, solve"] = round(time.monotonic() - start, 1)
