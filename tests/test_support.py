"""course_lib.support: what a killed process leaves behind is removed by its watcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.quick

OWNER = """
import subprocess, sys, time
from pathlib import Path
from course_lib.support import when_this_process_dies
folder = Path(sys.argv[1])
(folder / "keys").mkdir(parents=True)
(folder / "keys" / "s3.json").write_text("secret")
when_this_process_dies(remove=folder)
# a job: a leader in a session of its own and a child of it, as torchrun and a rank
job = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"],
    start_new_session=True)
when_this_process_dies(kill=job.pid)
time.sleep(1)
print(job.pid, flush=True)
time.sleep(120)
"""


def _until(done, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    return done()


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_process_leaves_no_folder_and_no_job(tmp_path: Path, sig: signal.Signals) -> None:
    folder = tmp_path / "scratch"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder)], stdout=subprocess.PIPE, text=True)
    job = int(owner.stdout.readline())
    tree = [job, *(c.pid for c in psutil.Process(job).children(recursive=True))]
    assert len(tree) == 2 and folder.exists()
    os.kill(owner.pid, sig)  # SIGKILL: nothing runs; SIGTERM: Python's default, no atexit either
    owner.wait(timeout=10)
    assert _until(lambda: not folder.exists() and not _alive(tree)), (folder.exists(), _alive(tree))


def test_a_process_that_ends_normally_keeps_what_it_no_longer_owns(tmp_path: Path) -> None:
    """The watcher kills a process only if it is the one registered (a pid reused later is left alone), and removes
    only the folders it was given."""
    keep = tmp_path / "keep"
    keep.mkdir()
    code = (
        "import subprocess, sys\n"
        "from course_lib.support import when_this_process_dies\n"
        "p = subprocess.Popen([sys.executable, '-c', 'pass']); p.wait()\n"
        "when_this_process_dies(kill=p.pid)  # gone already: nothing to kill, nothing registered\n"
        f"when_this_process_dies(remove={str(tmp_path / 'gone')!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    time.sleep(1.0)
    assert keep.exists()
