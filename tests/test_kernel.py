"""course_lib.kernel.let_the_kernel_exit: a real Jupyter kernel that made a shared-memory segment (which starts
multiprocessing's resource tracker, as a spawn worker does), started a forkserver and kept a DataLoader's persistent
workers alive exits by itself when asked to shut down, and runs its atexit handlers. Where this Python's resource
tracker lacks the private attributes the hook needs, it says so once and hooks nothing."""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import pytest

from course_lib import kernel

KERNEL_CELL = """
import atexit, multiprocessing, os, pathlib
from multiprocessing import shared_memory
from course_lib import kernel
from torch.utils.data import DataLoader

assert kernel.let_the_kernel_exit()  # every notebook's first cell
# the resource tracker starts with the first shared-memory segment (or spawn worker), and ignores SIGTERM
segment = shared_memory.SharedMemory(create=True, size=64)
# a forkserver, alive until the kernel exits (a DataLoader with forkserver workers starts one too)
started = multiprocessing.get_context("forkserver").Process(target=os.getpid)
started.start(), started.join()
# persistent workers, alive at the shutdown request, holding copies of the tracker's pipe
loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True)
atexit.register(pathlib.Path({ran!r}).write_text, "atexit ran")
print(len(list(loader)), segment.name)
"""


@pytest.mark.quick
def test_outside_a_kernel_nothing_is_hooked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "_HOOKED", [])
    assert kernel.let_the_kernel_exit() is False
    assert not kernel._HOOKED


class FakeShell:
    """What the hook reads of IPython's shell in a kernel: a kernel, and traitlets' observe."""

    kernel = object()

    def __init__(self) -> None:
        self.observed: list[str] = []

    def observe(self, handler: object, names: str) -> None:
        self.observed.append(names)


@pytest.mark.quick
@pytest.mark.parametrize("missing", ["_fd", "_pid", "_resource_tracker"])
def test_without_the_trackers_private_attributes_it_says_so_once_and_hooks_nothing(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    import IPython
    from multiprocessing import resource_tracker

    class Tracker:  # the resource tracker of a Python that renamed one of them
        _fd, _pid = 3, 4

    if missing == "_resource_tracker":
        monkeypatch.delattr(resource_tracker, "_resource_tracker")
    else:
        monkeypatch.delattr(Tracker, missing)
        monkeypatch.setattr(resource_tracker, "_resource_tracker", Tracker())
    shell = FakeShell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(kernel, "_HOOKED", [])
    with pytest.warns(RuntimeWarning, match=f"has no {missing} in this Python.*may take 2.5 s to stop"):
        assert kernel.let_the_kernel_exit() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second call is silent
        assert kernel.let_the_kernel_exit() is False
    assert shell.observed == []


@pytest.mark.quick
def test_with_them_it_watches_the_shutdown_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython

    shell = FakeShell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(kernel, "_HOOKED", [])
    assert kernel.let_the_kernel_exit() is True
    assert kernel.let_the_kernel_exit() is True
    assert shell.observed == ["exit_now"]


@pytest.mark.full
@pytest.mark.timeout(120)
def test_a_kernel_with_workers_and_shared_memory_exits_by_itself_when_asked(tmp_path: Path) -> None:
    from jupyter_client.manager import start_new_kernel

    ran = tmp_path / "atexit.txt"
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        printed: list[str] = []
        reply = kc.execute_interactive(
            KERNEL_CELL.format(ran=str(ran)),
            timeout=90,
            output_hook=lambda msg: (
                printed.append(msg["content"].get("text", "")) if msg["msg_type"] == "stream" else None
            ),
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        words = "".join(printed).split()
        assert words[0] == "4", printed
        segment = Path("/dev/shm") / words[1].lstrip("/")
        assert segment.exists()
        kernel = km.provisioner.process
        # Jupyter's own wait is 2.5 s before SIGTERM; 10 s here, so that a slow exit on a busy machine is not
        # taken for a kernel that would never have exited (ipykernel waits 14 s on a child that ignores SIGTERM)
        km.shutdown_wait_time = 20.0
        started = time.monotonic()
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        seconds = time.monotonic() - started
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    assert kernel.returncode == 0, f"the kernel was ended by signal {-kernel.returncode} after {seconds:.1f} s"
    assert ran.read_text() == "atexit ran"
    assert not segment.exists(), "the resource tracker did not unlink the segment the kernel left"


KILLED_CELL = """
import sys, time
from course_lib import kernel
from course_lib.data import scratch_folder
from course_lib.jobs import launch
from course_lib.s3server import local_server

kernel.let_the_kernel_exit()
server = local_server()  # notebook 10: a SeaweedFS server, its keys in its folder
folder = scratch_folder("10")
script = folder / "sleeper.py"
script.write_text("import time\\ntime.sleep(300)\\n")
print("server", server.pid, server.folder, "scratch", folder, flush=True)
launch(str(script), nproc=2, timeout=300)  # a 2-rank torchrun job, still running when the kernel is ended
"""


@pytest.mark.full
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_kernel_ended_mid_job_leaves_no_process_folder_or_key(tmp_path: Path, how: str) -> None:
    """Notebook 10's kernel, with its S3 server and a 2-rank torchrun job running, ended as Jupyter ends a kernel that
    does not exit (SIGTERM: no atexit handler runs) or as an out-of-memory killer does (SIGKILL): within seconds no
    process it started runs, and no folder it made (the server's, with its keys, and the notebook's scratch) is left."""
    import os
    import signal

    import psutil
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        kc.execute(KILLED_CELL)
        kernel_process = psutil.Process(km.provisioner.process.pid)
        printed = ""
        deadline = time.monotonic() + 120
        ranks: list[psutil.Process] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                msg = kc.get_iopub_msg(timeout=0.2)
                if msg["msg_type"] == "stream":
                    printed += msg["content"]["text"]
                if msg["msg_type"] == "error":
                    pytest.fail("\n".join(msg["content"]["traceback"]))
            started = kernel_process.children(recursive=True)
            ranks = [p for p in started if _command(p).endswith("sleeper.py") and "distributed.run" not in _command(p)]
            if len(ranks) == 2 and "scratch" in printed:
                break
        words = printed.split()
        assert len(ranks) == 2, (printed, [_command(p) for p in kernel_process.children(recursive=True)])
        everything = kernel_process.children(recursive=True)
        folders = [Path(words[2]), Path(words[4])]
        assert all(f.exists() for f in folders) and any(folders[0].glob("*")), folders
        os.kill(kernel_process.pid, getattr(signal, how))
        kernel_process.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            # the watcher removes the folders one after another: torchrun's log folder may go after the two named
            if not left and not any(f.exists() for f in folders) and not list(tmp_path.glob("course*-*")):
                break
            time.sleep(0.2)
        assert not left, [(p.pid, _command(p)) for p in left]
        assert not any(f.exists() for f in folders), [f for f in folders if f.exists()]
        assert not list(tmp_path.glob("course*-*")), list(tmp_path.glob("course*-*"))
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def _command(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


MDS_AT_SHUTDOWN = """
import sys
from streaming import MDSWriter, StreamingDataset
from course_lib import alternatives as alt, kernel

folder, release = sys.argv[1], sys.argv[2] == "release"
with MDSWriter(out=folder, columns={"index": "int"}, size_limit=256, progress_bar=False) as out:
    for i in range(32):
        out.write({"index": i})
made = alt.mds_dataset(local=folder, remote=None, batch_size=4)  # released by release_mds
direct = StreamingDataset(local=folder, remote=None, batch_size=4)  # made without the course: found alive
assert sum(1 for _ in direct) == 32
if not release:  # the control: the kernel's shut-down hook as it was, without the release
    kernel._release_mds_segments = lambda: None
kernel._before_the_kernel_exits({"new": True})  # what a kernel asked to shut down runs, before atexit
"""


@pytest.mark.quick
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("mds")  # conftest.py's MDS group: MDS picks /dev/shm numbers machine-wide
def test_mds_segments_are_released_before_the_tracker_pipe_closes(tmp_path: Path) -> None:
    """Notebooks 11 and 14 left "leaked shared_memory" warnings on the kernel's stderr at shutdown: the hook closed
    the resource tracker's pipe while MDS's segments were still registered (their atexit clean-up comes later).
    The hook releases every live MDS dataset first, made by alt.mds_dataset or not; the control shows the warnings."""
    import os
    import subprocess
    import sys

    def run(how: str) -> str:
        folder = tmp_path / how
        folder.mkdir()
        job = subprocess.run(
            [sys.executable, "-c", MDS_AT_SHUTDOWN, str(folder / "mds"), how],
            capture_output=True,
            text=True,
            timeout=100,
            env=dict(os.environ, TMPDIR=str(folder)),
            cwd=Path(__file__).resolve().parents[1],
        )
        assert job.returncode == 0, job.stderr[-3000:]
        return job.stderr

    released = run("release")
    assert "leaked shared_memory" not in released, released[-3000:]
    left = run("control")
    assert "leaked shared_memory" in left, left[-3000:]
