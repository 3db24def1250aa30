"""Notebooks 01-13: reproduce a pitfall live in a notebook without leaving a crashed cell behind.

This module imports nothing beyond the standard library, so that a ``spawn`` or ``forkserver`` child that imports it
(:func:`fork_with_a_held_lock`) starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Iterator

__all__ = ["capture_stderr_fd", "expect_error", "fork_with_a_held_lock"]


class PitfallDidNotHappen(AssertionError):
    """The code that should fail did not: the lesson no longer matches the library."""


@contextlib.contextmanager
def expect_error(*kinds: type[BaseException], lines: int = 1) -> Iterator[None]:
    """Notebook 01, section 1: run a block that is *meant* to fail, and print the error as a learner would meet it.

    Prints ``TypeError: <first line of the message>`` (``lines`` lines of it). If the block does not raise one of
    ``kinds`` (default: any ``Exception``), this raises :class:`PitfallDidNotHappen`, so a notebook run in CI notices
    when a pitfall it teaches has gone away (for example after a library upgrade).
    """
    kinds = kinds or (Exception,)
    try:
        yield
    except kinds as exc:
        message = "\n".join(str(exc).strip().splitlines()[:lines])
        print(f"{type(exc).__name__}: {message}")
        # The traceback's frames hold what the block made: a DataLoader's iterator, say. Freed here, it stops its
        # workers at once; left to the garbage collector, it would wait 5 s for each (the collector closes the
        # queues it tells them to stop through before the iterator's own clean-up runs).
        traceback.clear_frames(exc.__traceback__)
    else:
        names = " or ".join(k.__name__ for k in kinds)
        raise PitfallDidNotHappen(f"expected {names}, but the code ran without error")
    # A failed DataLoader's iterator lives on in the traceback's reference cycle, its dead workers still registered
    # with torch's SIGCHLD handler, which then blames the next cell whose child process exits: collect it now.
    gc.collect()


class CapturedStderr:
    """What child processes wrote to standard error inside :func:`capture_stderr_fd`."""

    text: str = ""

    def last_line(self) -> str:
        lines = [line for line in self.text.splitlines() if line.strip()]
        return lines[-1] if lines else ""


@contextlib.contextmanager
def capture_stderr_fd() -> Iterator[CapturedStderr]:
    """Notebook 05, section 3: collect what is written to file descriptor 2 (also by child processes) in the block.

    A worker process that crashes while starting writes its traceback to the operating system's standard error, not to
    Python's ``sys.stderr``: in Jupyter it lands in the terminal that started the server, or, with a recent ipykernel,
    in the cell output with machine-specific paths. This puts it in a temporary file instead, so a notebook can show
    the line that matters.
    """
    captured = CapturedStderr()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace")


# --- fork with threads (notebook 05, section 3) -------------------------------------------------------------------
#: Stands for a library's internal lock: an allocator's, a thread pool's (OpenMP, a tokenizer's), a logger's, an
#: HTTP client's. Each process that imports this module fresh (spawn, forkserver) makes its own, unlocked; a forked
#: child gets a copy of the parent's, in whatever state it was at the moment of the fork.
_LIBRARY_LOCK = threading.Lock()


@dataclass(frozen=True)
class ForkOutcome:
    """What :func:`fork_with_a_held_lock` saw: whether the child took the lock, or hung until it was killed."""

    method: str
    hung: bool
    timeout: float
    #: What Python said about starting the child, if anything: from 3.12, os.fork() in a process with other threads
    #: warns "This process ... is multi-threaded, use of fork() may lead to deadlocks in the child" (Python 3.11 is
    #: silent).
    warning: str | None = None

    def __str__(self) -> str:
        if self.hung:
            return (
                f"the child hung on the lock (its copy was locked, with no thread of its own to release it): "
                f"killed after {self.timeout:g} s"
            )
        return "the child took the lock at once (its own lock, new and unlocked)"


def _child_takes_the_lock(answer: Connection) -> None:
    """Runs in the child: say it is about to take the lock, take it, say it did."""
    answer.send("about to take the lock")
    with _LIBRARY_LOCK:
        answer.send("took the lock")


def fork_with_a_held_lock(method: str = "fork", timeout: float = 1.0, start_timeout: float = 60.0) -> ForkOutcome:
    """Notebook 05, section 3: start a child process while another thread of this one holds a lock; the child takes it.

    A thread takes :data:`_LIBRARY_LOCK` and holds it while the child starts with the start method ``method``
    (``"fork"``, ``"spawn"`` or ``"forkserver"``); the lock is then released here, in the parent, and the child, once
    it says it has reached the lock, gets ``timeout`` seconds to take it. A forked child has a copy of the lock as it
    was at the fork, locked, and none of the parent's other threads (only the one that forked), so no one can ever
    release it: it waits forever, and is killed. A ``spawn`` or ``forkserver`` child imports this module afresh and
    takes its own lock at once. ``start_timeout`` bounds the child's start (a spawned Python imports what it runs).
    """
    if method not in mp.get_all_start_methods():
        raise ValueError(
            f"start method {method!r} is not available here; this platform has {', '.join(mp.get_all_start_methods())}"
        )
    if not timeout > 0 or not start_timeout > 0:
        raise ValueError(f"timeout and start_timeout must be > 0 seconds, got {timeout} and {start_timeout}")
    context = mp.get_context(method)
    receive, send = context.Pipe(duplex=False)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # the other thread: a pin-memory thread, an OpenMP pool, an S3 client's event loop
        with _LIBRARY_LOCK:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold_the_lock, name="holds-the-lock", daemon=True)
    holder.start()
    held.wait()
    child = context.Process(target=_child_takes_the_lock, args=(send,), daemon=True)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", DeprecationWarning)
            child.start()
        send.close()
        release.set()  # released here, in the parent: a forked child's copy stays locked
        holder.join()
        if not receive.poll(start_timeout):
            raise RuntimeError(f"the {method} child did not start within {start_timeout:g} s")
        receive.recv()  # "about to take the lock"
        hung = not receive.poll(timeout)
        return ForkOutcome(method, hung, timeout, str(said[0].message) if said else None)
    except EOFError:  # the child ended without a word: its error went to the terminal's standard error
        raise RuntimeError(f"the {method} child ended without taking the lock (exit code {child.exitcode})") from None
    finally:
        release.set()
        holder.join()
        if child.pid is not None:
            child.kill()
            child.join()
        receive.close()
