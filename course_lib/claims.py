"""Notebooks 01-15: a measured claim that holds, or says that this machine cannot tell.

A notebook that prints "2 workers beat 0 workers: True" from one timing prints False when a browser or another
learner takes a core. So every claim a notebook prints from a measurement goes through one rule:

1. **Interleave the variants** round by round (A B, then B A, ...), so that whatever else the machine does
   hits all of them alike: :func:`interleave`.
2. **Take the median over the rounds**, and the spread between rounds: the median absolute deviation.
3. **A claim is conclusive only when the median lies beyond its threshold by more than twice the spread**
   (the spread is taken as at least 2.5 % of the threshold, so an effect under 5 % is never claimed).
4. **A claim that fails while other processes took CPU time** (half a core or more, measured by
   :class:`LoadWatch`) is inconclusive too: the machine, not the recipe, may have decided it.

:func:`claim` applies the rule and prints one line::

    2 workers give more throughput than 0 → holds: 1.9× (median of 5 rounds, spread ±0.1×)
    2 workers give more throughput than 0 → inconclusive on this machine: 1.1× (median of 5 rounds) is within
        twice the rounds' spread (±0.2×) of 1×
    2 workers give more throughput than 0 → does not hold: 0.6× (median of 5 rounds, spread ±0.0×)

A notebook states each claim the way its prose expects it, so the stored (idle) output says "holds"; the tests'
sanitize file lets "inconclusive on this machine" stand for "holds", and "does not hold" fails.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import psutil

__all__ = ["LoadWatch", "claim", "interleave"]

BUSY_CORES = 0.5  # other processes' CPU, in cores, above which a failed claim is not the recipe's fault
MIN_SPREAD = 0.025  # the least spread assumed, as a share of the threshold: effects under 5 % are never claimed


def _cores() -> list[int]:
    """The CPUs this process may run on (a Slurm or container allocation, not the whole node)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(psutil.cpu_count() or 1))


def _busy_seconds(cores: list[int]) -> float:
    """CPU seconds spent on ``cores`` by anything (idle and I/O wait excluded), since boot."""
    per_cpu = psutil.cpu_times(percpu=True)
    total = 0.0
    for i in cores:
        if i >= len(per_cpu):
            continue
        t = per_cpu[i]
        idle = t.idle + getattr(t, "iowait", 0.0)
        guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)  # Linux counts these in user too
        total += sum(t) - idle - guest
    return total


def _our_seconds() -> float:
    """CPU seconds used by this process, its threads, its live children and the children it waited for."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:  # it ended in between: its time is in children_* once it is waited for
            pass
    return total


class LoadWatch:
    """Notebooks 04-14: measures, while a ``with`` block runs, how much CPU *other* processes used, in cores.

    ``others_cores`` is 0 on an idle machine, about 1 while another program keeps a core busy. The count is this
    process's CPUs only (``sched_getaffinity``), so a busy neighbour on a core this job may not use does not count.
    """

    def __init__(self) -> None:
        self.cores = len(_cores())
        self.others_cores = 0.0
        self._start: tuple[float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float]:
        return time.monotonic(), _busy_seconds(_cores()), _our_seconds()

    def __enter__(self) -> LoadWatch:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None, "LoadWatch is used as `with LoadWatch() as load:`"
        t0, busy0, ours0 = self._start
        t1, busy1, ours1 = self._sample()
        others = (busy1 - busy0) - (ours1 - ours0)
        self.others_cores = max(0.0, others / (t1 - t0)) if t1 > t0 else 0.0


@dataclass(frozen=True)
class Rounds:
    """What :func:`interleave` measured: one value per round for each variant, and the others' CPU meanwhile."""

    values: dict[str, list[float]]
    others_cores: float
    cores: int

    def ratio(self, numerator: str, denominator: str) -> list[float]:
        """Per round, ``numerator`` / ``denominator``: e.g. ``ratio("0 workers", "2 workers")`` of epoch times is
        the speed-up of 2 workers, round by round."""
        for name in (numerator, denominator):
            if name not in self.values:
                raise KeyError(f"no variant {name!r}: the variants measured are {sorted(self.values)}")
        return [a / b for a, b in zip(self.values[numerator], self.values[denominator])]

    def median(self, name: str) -> float:
        """The median of one variant's rounds."""
        return statistics.median(self.values[name])


def interleave(variants: dict[str, Callable[[], float]], rounds: int = 5) -> Rounds:
    """Notebooks 01-15: calls every variant once per round and returns what each call returned (seconds, a share, a cost).

    The order alternates (A B C, then C B A, ...), so that a machine growing busier or warmer during the
    measurement does not favour the variant that happens to run first. Other processes' CPU is watched meanwhile.
    """
    if len(variants) < 1 or rounds < 3:
        raise ValueError(
            f"interleave needs at least one variant and 3 rounds (a median and a spread), "
            f"got {len(variants)} variants and rounds={rounds}"
        )
    names = list(variants)
    values: dict[str, list[float]] = {name: [] for name in names}
    with LoadWatch() as load:
        for r in range(rounds):
            for name in names if r % 2 == 0 else reversed(names):
                values[name].append(float(variants[name]()))
    return Rounds(values, load.others_cores, load.cores)


@dataclass(frozen=True)
class Claim:
    """A statement about a measured quantity, judged by the module's rule: see :func:`claim`."""

    statement: str
    median: float
    spread: float
    threshold: float
    above: bool  # the statement says the quantity is above the threshold (else below)
    rounds: int
    others_cores: float
    cores: int
    unit: str

    @property
    def margin(self) -> float:
        """How far the median lies beyond the threshold in the claimed direction (negative: the other way)."""
        return self.median - self.threshold if self.above else self.threshold - self.median

    @property
    def verdict(self) -> str:
        """``"holds"``, ``"does not hold"`` or ``"inconclusive"``."""
        if abs(self.margin) <= 2 * self.spread:
            return "inconclusive"
        if self.margin < 0 and self.others_cores >= BUSY_CORES:
            return "inconclusive"
        return "holds" if self.margin > 0 else "does not hold"

    @property
    def holds(self) -> bool | None:
        """True, False, or None when this machine cannot tell."""
        return {"holds": True, "does not hold": False}.get(self.verdict)

    def _fmt(self, value: float) -> str:
        """A value in the claim's unit, with as many decimals as its median needs (``0.53×``, ``1.9×``, ``41×``)."""
        if self.unit == "%":
            return f"{100 * value:.0f}%"
        size = abs(self.median)
        digits = 0 if size >= 100 else 1 if size >= 1 else 2
        return f"{value:.{digits}f}{self.unit}"

    def why(self) -> str:
        """The measurement, and for an inconclusive claim the reason."""
        measured = f"{self._fmt(self.median)} (median of {self.rounds} rounds"
        if self.verdict != "inconclusive":
            return f"{measured}, spread ±{self._fmt(self.spread)})"
        if abs(self.margin) <= 2 * self.spread:
            return (
                f"{measured}) is within twice the rounds' spread (±{self._fmt(self.spread)}) "
                f"of {self._fmt(self.threshold)}"
            )
        return f"{measured}), but other processes used {self.others_cores:.1f} of the {self.cores} cores while it ran"

    def __str__(self) -> str:
        verdict = "inconclusive on this machine" if self.verdict == "inconclusive" else self.verdict
        return f"{self.statement} → {verdict}: {self.why()}"


def claim(
    statement: str,
    values: Sequence[float],
    *,
    above: float | None = None,
    below: float | None = None,
    load: Any = None,
    unit: str = "×",
) -> Claim:
    """Notebooks 01-15: judges ``statement``, which says that the quantity measured in ``values`` (one per round) lies ``above`` or
    ``below`` a threshold, by the rule in this module's docstring.

    ``load`` is what measured the other processes' CPU meanwhile (a :class:`Rounds` or a :class:`LoadWatch`);
    ``unit`` is ``"×"`` for a ratio or ``"%"`` for a share given as a fraction (0.15 prints "15%").
    """
    if (above is None) == (below is None):
        raise ValueError("give exactly one of above= or below=: the threshold the statement says the quantity passes")
    values = [float(v) for v in values]
    if len(values) < 3:
        raise ValueError(
            f"a claim needs at least 3 rounds to know their spread, got {len(values)}: "
            "measure with interleave(..., rounds=5)"
        )
    threshold = above if above is not None else below
    assert threshold is not None
    median = statistics.median(values)
    deviation = statistics.median(abs(v - median) for v in values)
    spread = max(deviation, MIN_SPREAD * abs(threshold or median))
    others = getattr(load, "others_cores", 0.0)
    cores = getattr(load, "cores", len(_cores()))
    return Claim(statement, median, spread, threshold, above is not None, len(values), others, cores, unit)
