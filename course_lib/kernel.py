"""Every notebook's first cell: a Jupyter kernel that exits by itself when it is asked to shut down or restart.

At a shutdown request, ipykernel sends SIGTERM to the kernel's child processes and waits until none is left, for up
to 14 s; Jupyter waits 2.5 s, then ends the kernel with SIGTERM, and no ``atexit`` handler runs (a DataLoader's
clean-up, the course's scratch folders). Two kinds of child outlive that SIGTERM:

* multiprocessing's resource tracker, which the kernel starts with its first ``spawn`` or ``forkserver`` worker or
  its first shared-memory segment (an MDS ``StreamingDataset``): it ignores SIGTERM. Closing the kernel's end of its
  pipe ends it instead (once the workers, which hold copies, are gone): it unlinks what is still registered, as it
  would have after the kernel died, and exits;
* children that die of the SIGTERM (a DataLoader's persistent workers, the forkserver): they stay as zombies, which
  ipykernel counts as alive, until the kernel reaps them, and it does not. A thread reaps them here.

The first needs two private attributes of ``multiprocessing.resource_tracker`` (present in Python 3.11, 3.12 and 3.13):
where they are missing, :func:`let_the_kernel_exit` says so once and changes nothing; the kernel then stops as
Jupyter stops it, 2.5 s later.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
import time
import warnings
from typing import Any

__all__ = ["let_the_kernel_exit"]

_HOOKED: list[Any] = []  # the kernel's shell, once let_the_kernel_exit has hooked it


def _tracker_pipe() -> tuple[Any, str | None]:
    """The resource tracker and the names of its private attributes this module needs, or ``(None, why not)``."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    missing = [name for name in ("_fd", "_pid") if tracker is None or not hasattr(tracker, name)]
    if tracker is None or missing:
        return None, (
            "multiprocessing.resource_tracker has no "
            + ("_resource_tracker" if tracker is None else " or ".join(missing))
            + " in this Python"
        )
    return tracker, None


def let_the_kernel_exit() -> bool:
    """Notebooks 01-15, first cell: when this Jupyter kernel is asked to shut down or restart, let it exit by itself,
    so that its ``atexit`` handlers run and a restart takes no extra seconds, after ``spawn`` workers and shared
    memory too. True when the hook is in place; outside a kernel, or where this Python lacks what it needs (said once,
    as a warning), nothing is changed and it returns False."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    if _HOOKED:  # hooked, or said why not, already
        return _HOOKED[0] is not None
    tracker, why_not = _tracker_pipe()
    if tracker is None:
        warnings.warn(
            f"course_lib.kernel: {why_not}, so a shut-down or restarted kernel that started worker "
            "processes may take 2.5 s to stop, and its atexit clean-up may not run; the notebook itself "
            "is not affected",
            RuntimeWarning,
            stacklevel=2,
        )
        _HOOKED.append(None)  # said once
        return False
    _HOOKED.append(shell)
    shell.observe(_before_the_kernel_exits, names="exit_now")  # ipykernel's do_shutdown sets it before it waits
    return True


def _before_the_kernel_exits(change: dict[str, Any]) -> None:
    """Close this process's end of the resource tracker's pipe, without waiting, and reap the children as they end."""
    if not change["new"]:
        return
    _release_mds_segments()
    tracker, _ = _tracker_pipe()
    fd, pid = (tracker._fd, tracker._pid) if tracker is not None else (None, None)
    if fd is not None and pid is not None:
        tracker._fd = tracker._pid = None  # a later register() starts a new tracker rather than write to a closed pipe
        os.close(fd)
    threading.Thread(target=_reap_children, name="course_lib: reap ended children", daemon=True).start()


def _release_mds_segments() -> None:
    """Unlink, and unregister, the shared memory of every MDS dataset of this kernel while the tracker's pipe is
    open: once it is closed, the tracker reports each segment still registered as "leaked shared_memory" on the
    kernel's stderr, although MDS's own exit-time clean-up would unlink it a moment later (notebooks 11 and 14).
    Only where the course's alternatives were imported: nothing is imported here."""
    alternatives = sys.modules.get("course_lib.alternatives")
    if alternatives is None:
        return
    try:
        alternatives.release_mds(all_live=True)
    except Exception as exc:  # noqa: BLE001 - a shutdown must go on: the tracker then unlinks the segments itself
        warnings.warn(
            f"course_lib.kernel: MDS segments not released before exit: {exc!r}", RuntimeWarning, stacklevel=1
        )


def _reap_children() -> None:
    """Until the kernel exits: join the workers that ended (multiprocessing's own bookkeeping), then reap every
    other child that ended (the resource tracker, the forkserver)."""
    import psutil

    me = psutil.Process()
    while True:
        mp.active_children()
        for child in me.children():
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
        time.sleep(0.05)
