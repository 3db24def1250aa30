"""Checks for notebook 04 (DataLoader performance)."""

from __future__ import annotations

import numbers
import time
from typing import Any, Callable, Iterator

import torch

from .. import workers
from ..instrument import EpochRecord
from ._core import Hint, attempted, exercise, require

STEP = 0.040  # the training step of exercise 04.4, in seconds
TARGET = 0.10  # exercise 04.4: the stall to get under, after the first batch
NOISE = 0.05  # one epoch's stall scatters by a few points: fewer workers within this of TARGET count as reaching it


# ----------------------------------------------------------------- 04.1: the data stall, measured by hand


class _TimedBatches:
    """``n`` batches, each ready ``load_s`` after it is asked for; ``iter()`` itself takes ``start_s`` (as starting
    workers does). It records how long its consumer really waited, measured from inside."""

    def __init__(self, n: int, load_s: float, start_s: float = 0.0) -> None:
        self.n, self.load_s, self.start_s, self.waited = n, load_s, start_s, 0.0
        self.span = (0.0, 0.0)  # from iter() to the end of the batches: the epoch as the loop sees it

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        t0 = time.perf_counter()
        self.span = (t0, t0)
        time.sleep(self.start_s)  # at iter(), as a DataLoader starts its workers there
        self.waited += time.perf_counter() - t0
        return self._batches()

    def _batches(self) -> Iterator[torch.Tensor]:
        t0 = time.perf_counter()
        for k in range(self.n):
            time.sleep(self.load_s)
            self.waited += time.perf_counter() - t0
            yield torch.full((2,), k)
            t0 = time.perf_counter()
        self.waited += time.perf_counter() - t0
        self.span = (self.span[0], time.perf_counter())

    def true_stall(self) -> float:
        """The share of the epoch its consumer spent waiting, measured from inside."""
        return self.waited / max(self.span[1] - self.span[0], 1e-9)


def _run_stall(fn: Callable[..., Any], batches: _TimedBatches, step_s: float) -> tuple[float, float, list[int]]:
    """(the learner's stall, the true one, the batches their loop stepped on)."""
    stepped: list[int] = []

    def step(batch: Any) -> None:
        stepped.append(int(torch.as_tensor(batch).flatten()[0]))
        time.sleep(step_s)

    start = time.perf_counter()
    result = fn(batches, step)
    wall = time.perf_counter() - start
    require(
        result is not None, "measure_stall returned None: return the share of the time spent waiting, waited / total."
    )
    try:
        share = float(result)
    except (TypeError, ValueError):
        raise Hint(
            f"measure_stall should return one number (a share between 0 and 1), got {type(result).__name__}."
        ) from None
    return share, batches.waited / wall, stepped


@exercise(
    "04.1", "your stopwatch agrees with the truth: time spent in iter() and next() over the wall time of the epoch."
)
def measure_stall(fn: Callable[..., Any]) -> None:
    """``fn(loader, step)`` runs one epoch, calls ``step(batch)`` per batch, and returns the share of time spent waiting."""
    attempted(fn)
    require(callable(fn), "measure_stall should be a function of (loader, step).")
    share, truth, stepped = _run_stall(fn, _TimedBatches(8, load_s=0.015), step_s=0.005)
    require(
        stepped == list(range(8)), f"step(batch) should run once per batch, in order: it ran for batches {stepped}."
    )
    require(
        share <= 1.0,
        f"measure_stall returned {share:.3g}: return a share of the wall time (between 0 and 1), not seconds.",
    )
    require(
        not share > truth + 0.15,
        f"you measured {share:.0%} waiting where the loop waited {truth:.0%}: only the time "
        "inside next() (and iter()) is waiting; the step is work. Stop the stopwatch before step(batch).",
    )
    require(
        abs(share - truth) < 0.1,
        f"you measured {share:.0%} waiting where the loop waited {truth:.0%}: add up the "
        "time of every next(), and divide by the wall time of the whole epoch.",
    )
    share, truth, _ = _run_stall(fn, _TimedBatches(4, load_s=0.0, start_s=0.08), step_s=0.01)
    require(
        abs(share - truth) < 0.1,
        f"with a slow start (iter() took 0.08 s, as starting workers does) you measured "
        f"{share:.0%} waiting, the truth is {truth:.0%}: time iter(loader) too, the loop waits for it.",
    )
    share, truth, _ = _run_stall(fn, _TimedBatches(6, load_s=0.0), step_s=0.01)
    require(
        abs(share - truth) < 0.1,
        f"a loader that never makes the loop wait got {share:.0%} from you (truth "
        f"{truth:.0%}): count only the time spent getting batches.",
    )


# ----------------------------------------------------------------- 04.2: the same stall, from torch.profiler


def _profiler_running() -> bool:
    """Whether a torch.profiler session records this thread right now (private; checked with torch 2.14 and 2.15)."""
    return bool(torch.autograd._profiler_enabled())


@exercise(
    "04.2", "your profiler trace gives the stall the loop really had: the 'waiting' ranges over the 'epoch' range."
)
def profile_stall(fn: Callable[..., Any]) -> None:
    """``fn(loader, step)``: one epoch under ``torch.profiler``, the stall read from its recorded ranges."""
    from ..pitfalls import capture_stderr_fd

    attempted(fn)
    require(callable(fn), "profile_stall should be a function of (loader, step).")
    profiled: list[bool] = []

    def run(batches: _TimedBatches, step_s: float) -> tuple[float, float]:
        def step(batch: Any) -> None:
            profiled.append(_profiler_running())
            time.sleep(step_s)

        with capture_stderr_fd():  # torch 2.14's profiler logs its start and stop to file descriptor 2
            result = fn(batches, step)
        require(
            isinstance(result, numbers.Real),
            f"profile_stall should return one number (a share between 0 and 1), got {type(result).__name__}.",
        )
        return float(result), batches.true_stall()  # the profiler's own start-up is not part of the epoch

    # On a busy machine one short epoch's ranges can be off by scheduling delays: a right answer agrees with the truth
    # in one of three epochs, a wrong one in none of them.
    for attempt in range(3):
        share, truth = run(_TimedBatches(8, load_s=0.015), step_s=0.005)
        require(
            profiled and all(profiled),
            "the steps did not run under torch.profiler: run the whole epoch inside "
            "`with profile(activities=[ProfilerActivity.CPU]) as prof:`, and read the times from prof.",
        )
        require(
            share <= 1.0,
            f"profile_stall returned {share:.3g}, more than the whole epoch: divide the 'waiting' total "
            "by the epoch's cpu_time_total (its whole duration), not by its self time or in other units.",
        )
        if abs(share - truth) < 0.1:
            break
    require(
        abs(share - truth) < 0.1,
        f"your trace says {share:.0%} waiting where the loop waited {truth:.0%}: wrap every "
        'next() in record_function("waiting") and the whole epoch in record_function("epoch"), then divide '
        "the two ranges' cpu_time_total from prof.key_averages().",
    )
    for attempt in range(3):
        share, truth = run(_TimedBatches(4, load_s=0.0, start_s=0.08), step_s=0.01)
        if abs(share - truth) < 0.1:
            break
    require(
        abs(share - truth) < 0.1,
        f"with a slow start (iter() took 0.08 s, as starting workers does) your trace says "
        f"{share:.0%} waiting, the truth is {truth:.0%}: put iter(loader) inside a 'waiting' range too.",
    )


@exercise(
    "04.3",
    "workers_needed(load_s, step_s) = ceil(load_s / step_s): enough workers that, together, they finish a batch per step.",
)
def workers_needed(fn: Callable[[float, float], Any]) -> None:
    """``fn(load_s, step_s)``: the fewest workers that keep up when one worker needs ``load_s`` per batch."""
    attempted(fn)
    cases = [
        ((0.010, 0.050), 1),
        ((0.033, 0.025), 2),
        ((0.090, 0.020), 5),
        ((0.040, 0.020), 2),
        ((0.150, 0.040), 4),
        ((0.060, 0.020), 3),
    ]
    for (load, step), want in cases:
        got = fn(load, step)
        require(
            isinstance(got, int) and not isinstance(got, bool),
            f"return a whole number of workers (an int), got {got!r} for load_s={load}, step_s={step}: math.ceil gives an int.",
        )
        if got != want:
            if want == 1 and got == 0:
                hint = "one worker is needed even when it is faster than the step"
            elif got > want:
                hint = f"{want} already keep up ({want} workers deliver a batch every load_s / {want} seconds): that is more than needed"
            else:
                hint = "round up: n workers deliver n batches per load_s, the loop takes one per step_s"
            raise Hint(f"for load_s={load}, step_s={step} you return {got}, expected {want}: {hint}.")


@exercise(
    "04.4",
    "your answer agrees with your measurement on this machine: the fewest workers that keep the loop waiting "
    "under 10 % after the first batch, at most one per core but the main process's unless only more get there.",
)
def just_enough_workers(answer: Any, results: Any) -> None:
    """``answer`` agrees with ``results``, a dict ``num_workers -> EpochRecord`` measured with a training step."""
    attempted(answer, results)
    require(
        isinstance(results, dict) and results and all(isinstance(r, EpochRecord) for r in results.values()),
        "results should be the dict that sweep(...) returns (num_workers -> the epoch it measured).",
    )
    require(
        all(isinstance(k, numbers.Integral) for k in results),
        "the keys of results should be numbers of workers, e.g. sweep(train, 'num_workers', [0, 1, 2, 3], ...).",
    )
    require(
        all(r.complete for r in results.values()), "measure whole epochs (no max_batches) so the stall is comparable."
    )
    steps = [r.settings.get("step_s", r.mean_step) for r in results.values()]  # asked of measure(), else as measured
    require(
        all(step >= 0.005 for step in steps),
        "measure with the training step (step_s=STEP): without a step the loop always waits, whatever the workers.",
    )
    require(
        all(abs(step - STEP) < 0.01 for step in steps),
        f"measure with the exercise's step, step_s=STEP ({STEP * 1000:.0f} ms): the answer depends on the step.",
    )
    require(
        len({r.samples for r in results.values()}) == 1,
        "measure every setting on the same data set (the samples differ).",
    )
    require(
        isinstance(answer, numbers.Integral) and not isinstance(answer, bool),
        f"answer should be a number of workers (int), got {answer!r}.",
    )
    require(answer in results, f"you did not measure num_workers={answer}: include it in the sweep.")
    require(
        sorted(w for w in results if w < answer) == list(range(answer)),
        f"measure every smaller setting too (0 .. {answer - 1}) to be sure {answer} is the smallest.",
    )
    cores = workers.cpu_count()
    budget = max(1, cores - 1)  # one core is the main process's
    stall = {w: r.steady_stall_fraction for w, r in results.items()}
    under = sorted(w for w in results if stall[w] < TARGET)
    within = [w for w in under if w <= budget]
    right = (within or under or [min(budget, max(results))])[0]  # the rule the exercise states
    if answer == right:
        return
    if answer < right:  # fewer workers: right only where the stall is within the noise of the target
        require(
            stall[answer] < TARGET + NOISE,
            f"with {answer} workers the loop still waits {stall[answer]:.0%} of the time after the first batch: try more "
            f"(the rule gives {right} on this measurement).",
        )
        return
    if answer > budget:
        require(
            False,
            f"{answer} workers is more than your {cores} cores leave for workers ({budget}: one core is the main "
            f"process's); more workers than that take turns on the same cores, and where they seem to win, the machine was "
            f"busier while the smaller settings ran. By your sweep the smallest answer is {right}"
            + (
                "."
                if stall[right] < TARGET
                else f": no setting within {budget} got under 10 %, so the most with a core of their own."
            ),
        )
    require(False, f"num_workers={right} already stays under 10 % (steady_stall_fraction): pick the smallest.")


# ----------------------------------------------------------------- 04.5: a sweep of your own


class _WhoMadeIt(torch.utils.data.Dataset):
    """``n`` samples, each ``delay_s`` to make (a sleep: the same on a busy machine); sample ``i`` is
    ``[i, id of the worker that made it]`` (-1 for the main process)."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        info = torch.utils.data.get_worker_info()
        return torch.tensor([index, -1 if info is None else info.id])


def _sweep_groups(
    fn: Callable[..., Any], name: str, values: list[Any], n: int, **settings: Any
) -> tuple[Any, list, float]:
    """Run ``fn`` over a ``_WhoMadeIt`` set; returns its result, the batches its step saw, and the wall time."""
    seen: list[torch.Tensor] = []

    def step(batch: Any) -> None:
        seen.append(batch)
        time.sleep(0.01)

    t0 = time.perf_counter()
    results = fn(_WhoMadeIt(n, 0.004), name, values, step, **settings)
    elapsed = time.perf_counter() - t0
    require(
        isinstance(results, dict),
        f"return a dict {{value: (stall, samples per second)}}, got {type(results).__name__}.",
    )
    require(
        list(results) == list(values),
        f"the dict's keys should be the values swept, in order ({values}), got {list(results)}.",
    )
    for value, pair in results.items():
        require(
            isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(v, numbers.Real) for v in pair),
            f"results[{value!r}] should be a pair of numbers (stall, samples per second), got {pair!r}.",
        )
        require(
            0.0 <= pair[0] <= 1.0,
            f"results[{value!r}]: the stall is a share of the time, between 0 and 1, got {pair[0]!r}.",
        )
    return results, seen, elapsed


@exercise(
    "04.5",
    "my_sweep builds one loader per value with the other settings kept, and measures its stall and samples per second.",
)
def my_sweep(fn: Callable[..., Any]) -> None:
    """``fn(dataset, name, values, step, **settings)`` -> ``{value: (stall, samples per second)}``, one fresh loader per value."""
    attempted(fn)
    _, seen, _ = _sweep_groups(fn, "batch_size", [4, 16], 32, num_workers=0)
    sizes = [len(b) for b in seen]
    require(
        sizes == [4] * 8 + [16] * 2,
        f"swept over batch_size=[4, 16], the step saw batches of sizes {sorted(set(sizes))}: "
        "build each loader with the value swept, DataLoader(dataset, **{**settings, name: value}).",
    )
    n = 48
    results, seen, elapsed = _sweep_groups(fn, "num_workers", [0, 2], n, batch_size=8)
    require(
        [len(b) for b in seen] == [8] * 12,
        "the other settings did not reach the loaders (batch_size=8 was given): pass them on with **settings.",
    )
    makers = [set(b[:, 1].tolist()) for b in seen]
    require(
        set().union(*makers[:6]) == {-1} and set().union(*makers[6:]) == {0, 1},
        "with num_workers=2 the batches should come from two workers: build a fresh loader for each value.",
    )
    spent = sum(n / rate for _, rate in results.values() if rate > 0)
    require(
        spent > 0.5 * elapsed,
        f"{', '.join(f'{r:.0f}' for _, r in results.values())} per second is too fast for "
        f"{n} samples in {elapsed:.2f} s: count samples (len(dataset)), and divide by the time of the whole epoch.",
    )
    require(
        spent < 1.5 * elapsed,
        f"{', '.join(f'{r:.0f}' for _, r in results.values())} per second is too slow for "
        f"{n} samples in {elapsed:.2f} s: samples per second is len(dataset) / the epoch's time, not batches per second.",
    )
    require(
        results[0][0] > 0.4,
        f"with no workers the loop waits for every batch, 32 ms to make, then steps for 10 ms: "
        f"about 75 % of the time, not {results[0][0]:.0%}. Measure each loader with measure_stall(loader, step).",
    )
