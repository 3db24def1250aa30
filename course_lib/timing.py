"""Notebooks 02-13: measure how long things take, robustly enough to print ratios in a notebook.

Absolute times depend on the machine; ratios measured in the same run mostly do not, so the
notebooks print ratios (and CI's sanitize file masks their digits).
"""

from __future__ import annotations

import math
import statistics
import timeit
from typing import Any, Callable

__all__ = ["format_seconds", "medians", "seconds_per_call"]


def seconds_per_call(fn: Callable[[], Any], repeat: int = 5, min_seconds: float = 0.05) -> float:
    """Notebook 02, section 4: best-of-``repeat`` seconds per call of ``fn()``.

    One call first says how long a call takes; each round then calls ``fn`` as many times as last about ``min_seconds``
    (once, for a slow call). The minimum over rounds is the measurement least disturbed by other work on the machine.
    """
    timer = timeit.Timer(fn)
    once = timer.timeit(1)
    number = max(1, math.ceil(min_seconds / once)) if once > 0 else 1000
    return min(timer.repeat(repeat=repeat, number=number)) / number


def format_seconds(s: float) -> str:
    """Notebook 02, section 4: ``0.00042`` -> ``'420 µs'``, a human-readable duration."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    """Notebook 11, section 4: the median of each list of measurements (one per round), by name."""
    return {name: statistics.median(values) for name, values in results.items()}
