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

from course_lib import support

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


# --------------------------------------------------------------------------- a hub's or a container's limits


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_cgroup_v2_limits_take_the_tightest_on_the_way_up(tmp_path: Path) -> None:
    cg = _tree(
        tmp_path / "cg",
        {
            "cgroup.controllers": "cpu memory pids\n",
            "user.slice/cpu.max": "max 100000\n",
            "user.slice/memory.max": "3221225472\n",  # 3 GiB for all users
            "user.slice/jupyter-ada/cpu.max": "150000 100000\n",
            "user.slice/jupyter-ada/memory.max": "max\n",
        },
    )
    proc = _tree(tmp_path, {"cgroup": "0::/user.slice/jupyter-ada\n"}) / "cgroup"
    assert support.cgroup_limits(cg, proc) == ("v2", 1.5, 3072.0)
    (cg / "user.slice/memory.max").write_text("max\n")
    (cg / "user.slice/jupyter-ada/cpu.max").write_text("max 100000\n")
    assert support.cgroup_limits(cg, proc) == ("v2", None, None)


def test_cgroup_v1_limits_and_a_container_namespace(tmp_path: Path) -> None:
    cg = _tree(
        tmp_path / "cg",
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
            "memory/memory.limit_in_bytes": "1073741824\n",  # the namespace's root: /docker/abc is not visible inside
        },
    )
    proc = _tree(tmp_path, {"cgroup": "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"}) / "cgroup"
    assert support.cgroup_limits(cg, proc) == ("v1", 2.0, 1024.0)
    (cg / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert support.cgroup_limits(cg, proc) == ("v1", 2.0, None)
    assert support.cgroup_limits(cg, tmp_path / "no-such-file") == ("none", None, None)
