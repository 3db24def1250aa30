"""course_lib.checks.nb04: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader

from course_lib import workers
from course_lib.checks import Status, nb04
from course_lib.instrument import BatchRecord, EpochRecord
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


# ----------------------------------------------------------------- 04.1: the data stall, measured by hand


def measure_stall(loader, step):
    """The notebook's solution."""
    start = time.perf_counter()
    waited = 0.0
    t0 = time.perf_counter()
    batches = iter(loader)
    waited += time.perf_counter() - t0
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - t0
        if batch is None:
            break
        step(batch)
    return waited / (time.perf_counter() - start)


def counts_the_step(loader, step):
    start, waited = time.perf_counter(), 0.0
    for batch in loader:
        t0 = time.perf_counter()
        step(batch)
        waited += time.perf_counter() - t0
    return 1 - waited / (time.perf_counter() - start) + waited / (time.perf_counter() - start)


def includes_the_step(loader, step):
    start, waited = time.perf_counter(), 0.0
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        step(batch)
        waited += time.perf_counter() - t0
    return waited / (time.perf_counter() - start)


def forgets_iter(loader, step):
    batches = iter(loader)  # before the stopwatch starts: the start-up is not counted
    start, waited = time.perf_counter(), 0.0
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - t0
        if batch is None:
            break
        step(batch)
    return waited / (time.perf_counter() - start)


def seconds(loader, step):
    waited = 0.0
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - t0
        if batch is None:
            break
        step(batch)
    return waited * 10  # the time itself (here scaled past 1 s), not a share


def first_batch_only(loader, step):
    start = time.perf_counter()
    batches = iter(loader)
    first = next(batches)
    waited = time.perf_counter() - start
    step(first)
    for batch in batches:
        step(batch)
    return waited / (time.perf_counter() - start)


def skips_the_step(loader, step):
    return measure_stall(loader, lambda batch: None)


def test_04_measure_stall() -> None:
    check = nb04.measure_stall
    assert status(check, measure_stall)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert "only the time inside next()" in status(check, includes_the_step)[1]
    assert "time iter(loader) too" in status(check, forgets_iter)[1]
    assert "not seconds" in status(check, seconds)[1]
    assert "add up the time of every next()" in status(check, first_batch_only)[1]
    assert "step(batch) should run once per batch" in status(check, skips_the_step)[1]
    assert status(check, counts_the_step)[0] is Status.WRONG
    assert "returned None" in status(check, lambda loader, step: None)[1]


# ----------------------------------------------------------------- 04.2: the same stall, from torch.profiler


def profile_stall(loader, step, epoch_total="cpu_time_total", wrap_iter=True, waiting_key="waiting"):
    """The notebook's solution, and (through the keywords) three wrong versions of it."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("epoch"):
            if wrap_iter:
                with record_function("waiting"):
                    batches = iter(loader)
            else:
                batches = iter(loader)
            while True:
                with record_function("waiting"):
                    batch = next(batches, None)
                if batch is None:
                    break
                with record_function("step"):
                    step(batch)
    events = {event.key: event for event in prof.key_averages()}
    return getattr(events[waiting_key], "cpu_time_total") / getattr(events["epoch"], epoch_total)


def test_04_profile_stall() -> None:
    check = nb04.profile_stall

    def stub(loader, step):
        raise NotImplementedError

    right_and_stubs(check, profile_stall, stub)
    assert "did not run under torch.profiler" in status(check, measure_stall)[1]
    assert "put iter(loader) inside" in status(check, lambda loader, s: profile_stall(loader, s, wrap_iter=False))[1]
    assert (
        "not by its self time"
        in status(check, lambda loader, s: profile_stall(loader, s, epoch_total="self_cpu_time_total"))[1]
    )
    assert "where the loop waited" in status(check, lambda loader, s: profile_stall(loader, s, waiting_key="step"))[1]
    assert "one number" in status(check, lambda loader, s: str(profile_stall(loader, s)))[1]


def test_04_workers_needed() -> None:
    assert status(nb04.workers_needed, lambda load, step: math.ceil(load / step))[0] is Status.SOLVED
    assert status(nb04.workers_needed, ...)[0] is Status.NOT_ATTEMPTED
    wrong, hint = status(nb04.workers_needed, lambda load, step: max(1, round(load / step)))
    assert wrong is Status.WRONG and "round up" in hint
    assert "more than needed" in status(nb04.workers_needed, lambda load, step: math.ceil(load / step) + 1)[1]
    assert status(nb04.workers_needed, lambda load, step: int(-(-load // step)))[0] is Status.SOLVED
    assert "int" in status(nb04.workers_needed, lambda load, step: load / step)[1]
    assert "even when" in status(nb04.workers_needed, lambda load, step: int(load // step))[1]


def _epoch(stall: float, step: float = 0.04, complete: bool = True) -> EpochRecord:
    """A made-up epoch of 10 batches in which the loop waits ``stall`` of the time after the first."""
    wait = step * stall / (1 - stall)
    batches, t = [], 0.0
    for i in range(10):
        w = 0.01 if i == 0 else wait
        batches.append(BatchRecord(i, 0, t, t + w, t, t + w, t + w + step, 32, 100))
        t += w + step
    return EpochRecord(num_workers=1, t0=0.0, batches=batches, end=t if complete else None)


def test_04_just_enough_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "cpu_count", lambda: 2)
    results = {0: _epoch(0.5), 1: _epoch(0.2), 2: _epoch(0.05), 3: _epoch(0.04)}
    assert status(nb04.just_enough_workers, 2, results)[0] is Status.SOLVED
    assert status(nb04.just_enough_workers, ..., ...)[0] is Status.NOT_ATTEMPTED
    assert "try more" in status(nb04.just_enough_workers, 1, results)[1]
    assert "smallest" in status(nb04.just_enough_workers, 3, results)[1]
    assert "every smaller" in status(nb04.just_enough_workers, 2, {2: _epoch(0.05)})[1]
    assert "did not measure" in status(nb04.just_enough_workers, 5, results)[1]
    assert "training step" in status(nb04.just_enough_workers, 2, {**results, 0: _epoch(0.5, step=0.0)})[1]
    assert "whole epochs" in status(nb04.just_enough_workers, 2, {**results, 1: _epoch(0.2, complete=False)})[1]
    assert "dict" in status(nb04.just_enough_workers, 2, [0.5, 0.2])[1]
    assert (
        "exercise's step"
        in status(nb04.just_enough_workers, 2, {w: _epoch(s, step=0.02) for w, s in [(0, 0.5), (1, 0.2), (2, 0.05)]})[1]
    )
    busy = {
        0: _epoch(0.5),
        1: _epoch(0.4),
        2: _epoch(0.3),
        3: _epoch(0.2),
    }  # a machine too busy for any to get under 10 %
    assert (
        status(nb04.just_enough_workers, 1, busy)[0] is Status.SOLVED
    )  # the most with a core of their own: 2 cores - 1
    assert "more than your 2 cores leave" in status(nb04.just_enough_workers, 3, busy)[1]
    assert (
        status(nb04.just_enough_workers, np.int64(2), {np.int64(k): v for k, v in results.items()})[0] is Status.SOLVED
    )
    # measure() records the step it was asked for: sleeps that overshoot on a loaded machine are still that step
    overshot = {0: _epoch(0.5, step=0.06), 1: _epoch(0.2, step=0.06), 2: _epoch(0.05, step=0.06)}
    for record in overshot.values():
        record.settings["step_s"] = 0.04
    assert status(nb04.just_enough_workers, 2, overshot)[0] is Status.SOLVED
    for record in overshot.values():
        record.settings["step_s"] = 0.02
    assert "exercise's step" in status(nb04.just_enough_workers, 2, overshot)[1]


# ----------------------------------------------------------------- 04.5: a sweep of your own


def my_sweep(dataset, name, values, step, **settings):
    """The notebook's solution."""
    results = {}
    for value in values:
        loader = DataLoader(dataset, **{**settings, name: value})
        start = time.perf_counter()
        stall = measure_stall(loader, step)
        results[value] = (stall, len(dataset) / (time.perf_counter() - start))
    return results


def sweep_with(build=None, rate=None, result=None):
    """A wrong sweep: loaders built otherwise, another rate, or another result per value."""

    def fn(dataset, name, values, step, **settings):
        results = {}
        for value in values:
            loader = (
                build(dataset, name, value, settings) if build else DataLoader(dataset, **{**settings, name: value})
            )
            start = time.perf_counter()
            stall = measure_stall(loader, step)
            seconds = time.perf_counter() - start
            results[value] = (
                result(stall, seconds, loader)
                if result
                else (stall, (rate or (lambda s, loader: len(dataset) / s))(seconds, loader))
            )
        return results

    return fn


def test_04_my_sweep() -> None:
    check = nb04.my_sweep

    def stub(dataset, name, values, step, **settings):
        raise NotImplementedError

    right_and_stubs(check, my_sweep, stub)
    ignores_value = sweep_with(build=lambda d, name, value, settings: DataLoader(d, **settings))
    assert "with the value swept" in status(check, ignores_value)[1]
    drops_settings = sweep_with(build=lambda d, name, value, settings: DataLoader(d, **{name: value}))
    assert "with **settings" in status(check, drops_settings)[1]
    per_batch = sweep_with(rate=lambda seconds, loader: len(loader) / seconds)
    assert "not batches per second" in status(check, per_batch)[1]
    per_step_only = sweep_with(rate=lambda seconds, loader: 10 * len(loader.dataset) / seconds)
    assert "too fast" in status(check, per_step_only)[1]
    assert "a pair of numbers" in status(check, sweep_with(result=lambda stall, seconds, loader: stall))[1]
    assert (
        "a share of the time" in status(check, sweep_with(result=lambda stall, seconds, loader: (100 * stall, 1.0)))[1]
    )

    def as_list(dataset, name, values, step, **settings):
        return list(my_sweep(dataset, name, values, step, **settings).values())

    assert "return a dict" in status(check, as_list)[1]
    assert (
        "about 75 % of the time"
        in status(check, sweep_with(result=lambda stall, seconds, loader: (1 - stall, len(loader.dataset) / seconds)))[
            1
        ]
    )


def test_04_just_enough_workers_counts_cores_and_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """04.4 does not reward oversubscription, and accepts fewer workers within the noise of the target."""
    monkeypatch.setattr(workers, "cpu_count", lambda: 2)
    loaded = {0: _epoch(0.6), 1: _epoch(0.131), 2: _epoch(0.113), 3: _epoch(0.138)}  # the sweep, one core busy
    assert status(nb04.just_enough_workers, 1, loaded)[0] is Status.SOLVED
    for wrong in (2, 3):  # 3 on 2 cores was accepted before
        hint = status(nb04.just_enough_workers, wrong, loaded)[1]
        assert "more than your 2 cores leave for workers (1" in hint and "smallest answer is 1" in hint
    assert "try more" in status(nb04.just_enough_workers, 0, loaded)[1]
    # beyond the cores only if fewer cannot get there: 1 worker far off, 3 under the target
    only_more = {0: _epoch(0.6), 1: _epoch(0.3), 2: _epoch(0.2), 3: _epoch(0.08)}
    assert status(nb04.just_enough_workers, 3, only_more)[0] is Status.SOLVED
    assert "try more" in status(nb04.just_enough_workers, 2, only_more)[1]  # 20 %: not within the noise
    # within the noise: 1 worker at 13 % next to 2 workers at 8 % counts as reaching the target; 3 does not
    near = {0: _epoch(0.6), 1: _epoch(0.13), 2: _epoch(0.08), 3: _epoch(0.05)}
    assert status(nb04.just_enough_workers, 2, near)[0] is Status.SOLVED
    assert status(nb04.just_enough_workers, 1, near)[0] is Status.SOLVED
    assert "more than your 2 cores" in status(nb04.just_enough_workers, 3, near)[1]
    # under the target within the budget: the smallest, nothing more
    idle = {0: _epoch(0.6), 1: _epoch(0.04), 2: _epoch(0.02), 3: _epoch(0.02)}
    assert status(nb04.just_enough_workers, 1, idle)[0] is Status.SOLVED
    assert "more than your 2 cores" in status(nb04.just_enough_workers, 2, idle)[1]
    # on 8 cores, 2 and 3 workers each have a core: more than the smallest is still not the answer
    monkeypatch.setattr(workers, "cpu_count", lambda: 8)
    assert status(nb04.just_enough_workers, 2, near)[0] is Status.SOLVED
    assert "pick the smallest" in status(nb04.just_enough_workers, 3, near)[1]
    assert status(nb04.just_enough_workers, 3, loaded)[0] is Status.SOLVED  # none under 10 %: the most measured, 3 < 7
    assert status(nb04.just_enough_workers, 1, loaded)[0] is Status.SOLVED  # 13 %: within the noise of the target
