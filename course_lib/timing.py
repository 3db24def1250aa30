"""Measure how long things take, robustly enough to print ratios in a notebook.

Absolute times depend on the machine; ratios measured in the same run mostly do not, so the
notebooks print ratios (and CI's sanitize file masks the digits).
"""

from __future__ import annotations

import time
from typing import Any, Callable


def seconds_per_call(fn: Callable[[], Any], repeat: int = 5, min_time: float = 0.05) -> float:
    """Best-of-``repeat`` seconds per call of ``fn()``, each round lasting at least ``min_time``.

    The minimum over rounds is the least disturbed by other work on the machine.
    """
    number = 1
    while True:  # find how many calls make one round long enough to time
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time or number >= 1_000_000:
            break
        number *= 2 if elapsed == 0 else max(2, min(10, int(min_time / elapsed) + 1))
    best = elapsed / number
    for _ in range(repeat - 1):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def format_seconds(s: float) -> str:
    """``0.00042`` -> ``'420 µs'``: a human-readable duration."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
