"""Notebooks 01-13: reproduce a pitfall live in a notebook without leaving a crashed cell behind."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import traceback
from typing import Iterator

__all__ = ["capture_stderr_fd", "expect_error"]


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
