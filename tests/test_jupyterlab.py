"""The README's JupyterLab command, started for real and checked over its REST API.

``jupyter lab notebooks/01_map_style_datasets.ipynb`` from the repository root, listening on
127.0.0.1 only with a random token: the server must answer, refuse requests without the token,
list every course notebook (the server's root is notebooks/, the opened file's folder), open notebook 01, serve the JupyterLab page, and shut down on request.
Standard library only (urllib).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST = "notebooks/01_map_style_datasets.ipynb"  # what the README's Quick start opens
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, token: str | None, method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of one request; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str, token: str) -> Any:
    status, body = request(url, token)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server's process group if it is still running: never leave it behind."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.timeout(180)
def test_readme_jupyterlab_command_serves_the_course(tmp_path: Path) -> None:
    jupyter = Path(sys.executable).parent / "jupyter"
    assert jupyter.exists(), "jupyter is not installed in this environment: pip install -r requirements.txt"
    port, token = free_port(), secrets.token_hex(16)
    command = [
        str(jupyter), "lab", FIRST,
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ]
    if os.geteuid() == 0:  # containers run as root; JupyterLab refuses that without the flag
        command.append("--allow-root")
    # Runtime files (connection info, kernel files) in the test's folder, not the user's.
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log_path = tmp_path / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        status = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                status = get_json(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert status is not None, f"no answer within {START_TIMEOUT:.0f} s:\n{log_path.read_text()[-3000:]}"
        assert "started" in status

        # The token is kept: without it the API refuses.
        refused, _ = request(f"{base}/api/contents/notebooks", None)
        assert refused in (401, 403)
        wrong, _ = request(f"{base}/api/contents/notebooks", "not-the-token")
        assert wrong in (401, 403)

        # Given a file, the server's root is that file's folder: notebooks/ (what Lab's file browser shows).
        listing = get_json(f"{base}/api/contents?content=1", token)
        served = {item["name"]: item["type"] for item in listing["content"]}
        expected = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        assert expected and all(served.get(name) == "notebook" for name in expected), (expected, served)
        assert served.get("solutions") == "directory"
        solutions = get_json(f"{base}/api/contents/solutions?content=1", token)
        assert set(expected) <= {item["name"] for item in solutions["content"]}

        first = get_json(f"{base}/api/contents/{Path(FIRST).name}", token)
        assert first["type"] == "notebook" and first["content"]["cells"]

        page_status, page = request(f"{base}/lab", token)
        assert page_status == 200 and b"jupyter-config-data" in page  # the JupyterLab application page

        shut, _ = request(f"{base}/api/shutdown", token, method="POST")
        assert shut in (200, 204)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
    assert proc.poll() is not None
