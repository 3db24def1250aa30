"""Reproduce a pitfall live in a notebook without leaving a crashed cell behind."""

from __future__ import annotations

import contextlib
from typing import Iterator


class PitfallDidNotHappen(AssertionError):
    """The code that should fail did not: the lesson no longer matches the library."""


@contextlib.contextmanager
def expect_error(*kinds: type[BaseException], lines: int = 1) -> Iterator[None]:
    """Run a block that is *meant* to fail, and print the error as a learner would meet it.

    Prints ``TypeError: <first line of the message>`` (``lines`` lines of it). If the block
    does not raise one of ``kinds`` (default: any ``Exception``), this raises
    :class:`PitfallDidNotHappen`, so a notebook run in CI notices when a pitfall it teaches
    has gone away (for example after a library upgrade).
    """
    kinds = kinds or (Exception,)
    try:
        yield
    except kinds as exc:
        message = "\n".join(str(exc).strip().splitlines()[:lines])
        print(f"{type(exc).__name__}: {message}")
    else:
        names = " or ".join(k.__name__ for k in kinds)
        raise PitfallDidNotHappen(f"expected {names}, but the code ran without error")
