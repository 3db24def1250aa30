"""course_lib.kernel.let_the_kernel_exit: a real Jupyter kernel that made a shared-memory segment (which starts
multiprocessing's resource tracker, as a spawn worker does), started a forkserver and kept a DataLoader's persistent
workers alive exits by itself when asked to shut down, and runs its atexit handlers. Where this Python's resource
tracker lacks the private attributes the hook needs, it says so once and hooks nothing."""

from __future__ import annotations

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
