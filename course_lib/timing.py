"""Measure how long things take, robustly enough to print ratios in a notebook.

Absolute times depend on the machine; ratios measured in the same run mostly do not, so the
notebooks print ratios (and CI's sanitize file masks the digits).
"""

from __future__ import annotations

import timeit
from typing import Any, Callable


def seconds_per_call(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best-of-``repeat`` seconds per call of ``fn()``.

    ``timeit`` picks how many calls make one round last at least 0.2 s; the minimum over rounds
    is the measurement least disturbed by other work on the machine.
    """
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=repeat, number=number)) / number


def format_seconds(s: float) -> str:
    """``0.00042`` -> ``'420 µs'``: a human-readable duration."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
