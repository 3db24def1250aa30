"""course_lib.claims: one rule decides whether a measured claim holds, fails, or cannot be told on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from course_lib import claims
from course_lib.claims import Rounds, claim, interleave

pytestmark = pytest.mark.quick


def _idle(others: float = 0.0) -> Rounds:
    return Rounds({}, others_cores=others, cores=2)


def test_a_clear_effect_holds_and_its_opposite_does_not() -> None:
    speedups = [1.9, 2.0, 1.8, 2.1, 1.9]
    c = claim("2 workers give more throughput than 0", speedups, above=1, load=_idle())
    assert (c.verdict, c.holds, c.median, c.rounds) == ("holds", True, 1.9, 5)
    assert str(c) == "2 workers give more throughput than 0 → holds: 1.9× (median of 5 rounds, spread ±0.1×)"
    opposite = claim("0 workers give more throughput than 2", [1 / s for s in speedups], above=1, load=_idle())
    assert (opposite.verdict, opposite.holds) == ("does not hold", False)
    assert str(opposite).startswith("0 workers give more throughput than 2 → does not hold: 0.53× (median of 5 rounds")


def test_an_effect_within_twice_the_spread_is_inconclusive_in_both_directions() -> None:
    noisy = [1.3, 0.8, 1.1, 1.5, 0.9]  # median 1.1, median absolute deviation 0.2
    for statement, kwargs in (("faster", {"above": 1}), ("slower", {"below": 1})):
        c = claim(statement, noisy, load=_idle(), **kwargs)
        assert c.verdict == "inconclusive" and c.holds is None
        assert str(c) == (
            f"{statement} → inconclusive on this machine: 1.1× (median of 5 rounds) is within twice "
            "the rounds' spread (±0.2×) of 1.0×"
        )


def test_the_boundary_is_twice_the_spread() -> None:
    assert claim("x", [1.41, 1.21, 1.61], above=1).verdict == "holds"  # margin 0.41 > 2 × 0.20
    assert claim("x", [1.39, 1.19, 1.59], above=1).verdict == "inconclusive"  # margin 0.39 < 2 × 0.20


def test_tiny_effects_are_never_claimed_however_steady() -> None:
    assert claim("4 % faster", [1.04] * 5, above=1).verdict == "inconclusive"  # the spread is at least 2.5 %
    assert claim("6 % faster", [1.06] * 5, above=1).verdict == "holds"


def test_a_failure_while_others_take_the_cpu_is_inconclusive_but_a_success_is_not() -> None:
    slower = [0.6, 0.62, 0.58, 0.61, 0.6]
    assert claim("workers help", slower, above=1, load=_idle(0.1)).verdict == "does not hold"
    busy = claim("workers help", slower, above=1, load=_idle(0.9))
    assert busy.verdict == "inconclusive"
    assert str(busy) == (
        "workers help → inconclusive on this machine: 0.60× (median of 5 rounds), but other processes "
        "used 0.9 of the 2 cores while it ran"
    )
    assert claim("workers help", [1 / s for s in slower], above=1, load=_idle(0.9)).verdict == "holds"


def test_shares_print_as_percentages() -> None:
    c = claim("the loop waits under 15 % of the time", [0.02, 0.03, 0.01, 0.02, 0.02], below=0.15, unit="%")
    assert str(c) == "the loop waits under 15 % of the time → holds: 2% (median of 5 rounds, spread ±0%)"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"above": 1, "below": 2}, "exactly one of above= or below="),
        ({}, "exactly one of above= or below="),
    ],
)
def test_a_claim_needs_one_threshold(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        claim("x", [1, 2, 3], **kwargs)


def test_a_claim_needs_three_rounds() -> None:
    with pytest.raises(ValueError, match="at least 3 rounds.*interleave"):
        claim("x", [1.0, 2.0], above=1)
    with pytest.raises(ValueError, match="3 rounds"):
        interleave({"a": lambda: 1.0}, rounds=2)


def test_interleave_alternates_the_order_and_keeps_each_variants_values() -> None:
    calls: list[str] = []

    def variant(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value

        return run

    r = interleave({"a": variant("a", 1.0), "b": variant("b", 2.0), "c": variant("c", 4.0)}, rounds=4)
    assert calls == list("abccbaabccba")
    assert r.values == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [4.0] * 4}
    assert r.ratio("c", "a") == [4.0] * 4 and r.median("b") == 2.0
    with pytest.raises(KeyError, match="no variant 'd'.*'a', 'b', 'c'"):
        r.ratio("d", "a")


def test_load_watch_counts_what_other_processes_used_in_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """others = (CPU the allowed cores spent - CPU this process tree spent) / wall time."""
    samples = iter([(100.0, 50.0, 10.0), (102.0, 53.5, 11.5)])  # 2 s: 3.5 CPU s on the cores, 1.5 of them ours
    monkeypatch.setattr(claims.LoadWatch, "_sample", lambda self: next(samples))
    with claims.LoadWatch() as load:
        pass
    assert load.others_cores == pytest.approx(1.0)


def _burn(cpu_seconds: float) -> str:
    return f"import time\nwhile time.process_time() < {cpu_seconds}: pass\nprint('done', flush=True)\ntime.sleep(30)"


def test_our_cpu_counts_live_and_finished_children_and_a_stranger_is_another_process() -> None:
    before = claims._our_seconds()
    live = subprocess.Popen([sys.executable, "-c", _burn(0.5)], stdout=subprocess.PIPE, text=True)
    finished = subprocess.Popen(
        [sys.executable, "-c", _burn(0.5).replace("time.sleep(30)", "")], stdout=subprocess.DEVNULL
    )
    try:
        assert live.stdout.readline() == "done\n"
        finished.wait(timeout=60)
        assert claims._our_seconds() - before >= 0.95  # both children's CPU is ours: not another process's
    finally:
        live.kill(), live.wait()
    # a process that is not ours (the shell's background job, re-parented when the shell exits) spins meanwhile
    pid = int(
        subprocess.check_output(
            ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"], text=True
        )
    )
    try:
        with claims.LoadWatch() as others:
            time.sleep(1.0)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert others.others_cores > 0.3, others.others_cores  # at least a share of a core, however busy the machine
    assert others.cores == len(claims._cores())
