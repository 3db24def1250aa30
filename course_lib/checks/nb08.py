"""Checks for notebook 08 (iterable datasets).

08.1 runs the learner's ``IterableDataset`` in the main process, as each worker of 1 to 4 (with
torch's worker information set in this process, which is quick), and finally in real DataLoader
worker processes; 08.2 runs the learner's stream for ranks x workers the same way. 08.3 compares a formula with what the DataLoader does (``course_lib.iterable``,
which the tests hold to real DataLoaders). 08.4 runs the learner's stream in persistent worker processes over three epochs; 08.5 compares an eviction policy with the rule
"as few as possible, oldest first, until the rest fits".
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import warnings
from typing import Any, Callable, Iterator, Sequence

from torch.utils.data import DataLoader, IterableDataset

from .. import iterable
from ._core import Hint, attempted, drain, exercise, require, stop_workers, whole_number


@contextlib.contextmanager
def as_worker(worker_id: int, num_workers: int, dataset: Any) -> Iterator[None]:
    """Make ``get_worker_info()`` in this process answer as worker ``worker_id`` of ``num_workers``.

    It sets what ``get_worker_info()`` returns, the private ``torch.utils.data._utils.worker._worker_info``
    (checked with torch 2.14 and 2.15), so that a check can run the learner's class as each of 1-4
    workers in milliseconds; the real DataLoader runs that follow confirm it with worker processes.
    """
    from torch.utils.data._utils import worker as _worker

    saved = _worker._worker_info
    _worker._worker_info = _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=worker_id, dataset=dataset)
    try:
        yield
    finally:
        _worker._worker_info = saved


def _ints(items: Any, what: str) -> list[int]:
    out = []
    for x in items:
        try:
            value = int(x)
        except (TypeError, ValueError):
            raise Hint(f"{what} yielded {x!r}; it should yield the sample numbers themselves (ints 0..n-1).") from None
        out.append(value)
    return out


def _judge(got: list[int], n: int, setting: str, shares: list[list[int]] | None = None) -> None:
    counts = [got.count(i) for i in range(n)]
    outside = sorted({i for i in got if not 0 <= i < n})
    require(not outside, f"{setting}: it yielded {outside[:5]}, outside 0..{n - 1}.")
    if shares is not None and n >= 1 and len(shares) > 1 and all(sorted(s) == list(range(n)) for s in shares):
        raise Hint(
            f"{setting}: every worker yielded all {n} samples, so each arrived {len(shares)} times. "
            "Call get_worker_info() inside __iter__ and yield only this worker's share (info.id, info.num_workers)."
        )
    repeated = [i for i, c in enumerate(counts) if c > 1]
    missing = [i for i, c in enumerate(counts) if c == 0]
    if repeated:
        raise Hint(f"{setting}: samples {repeated[:5]} arrived more than once. The workers' shares must not overlap.")
    if missing:
        raise Hint(
            f"{setting}: samples {missing[:5]} never arrived. The shares must cover 0..{n - 1} "
            "(blocks of n // num_workers leave the remainder out; range(info.id, n, info.num_workers) covers everything)."
        )


@exercise("08.1", "each worker yields only its share: every sample exactly once with 0, 1, 2, 3 (and 4) workers.")
def sharded_stream(cls: Any) -> None:
    """``cls(n)`` is an ``IterableDataset`` that yields each of ``0..n-1`` once over all DataLoader workers."""
    attempted(cls)
    require(
        isinstance(cls, type) and issubclass(cls, IterableDataset),
        f"pass the class itself (e.g. `ShardedRange`), a subclass of IterableDataset; got {cls!r}.",
    )
    for n in (0, 1, 7, 10):
        setting = f"{cls.__name__}({n}) with num_workers=0"
        try:
            got = _ints(iter(cls(n)), setting)
        except AttributeError as exc:
            if "NoneType" in str(exc):
                raise Hint(
                    f"{setting}: {exc}. In the main process get_worker_info() returns None: "
                    "then this process is the only one, and it yields everything."
                ) from None
            raise
        _judge(got, n, setting)
    for k in (1, 2, 3, 4):
        for n in (0, 1, 2, 3, 5, 7, 10, 13):
            shares = []
            for w in range(k):
                ds = cls(n)
                with as_worker(w, k, ds):
                    shares.append(_ints(iter(ds), f"{cls.__name__}({n}) in worker {w} of {k}"))
            _judge([i for s in shares for i in s], n, f"{cls.__name__}({n}) with {k} workers", shares)
    if "fork" not in mp.get_all_start_methods():  # Windows: a class from a notebook cannot reach spawned workers
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        for n, k in ((10, 2), (7, 3)):
            loader = DataLoader(cls(n), batch_size=None, num_workers=k, multiprocessing_context="fork", timeout=60)
            _judge(
                _ints(loader, f"{cls.__name__}({n})"), n, f"{cls.__name__}({n}) in a real DataLoader with {k} workers"
            )


CASES = [(n, b, w) for n in (1, 5, 7, 10, 16, 25, 100) for b in (1, 3, 4, 8, 32) for w in (0, 1, 2, 3, 4)]


def _call(fn: Callable[..., Any], n: int, b: int, w: int, drop_last: bool) -> int:
    call = f"batches_per_epoch({n}, batch_size={b}, num_workers={w}, drop_last={drop_last})"
    try:
        value = fn(n, b, w, drop_last)
    except ZeroDivisionError:
        raise Hint(
            f"{call} divided by zero. num_workers=0 means no worker processes: the main process takes all {n} samples."
        ) from None
    return whole_number(value, call, "a count of batches is a whole number (math.ceil, //).")


def _batches_per_epoch(n: int, batch_size: int | None, num_workers: int, drop_last: bool = False) -> int:
    """The reference: each worker batches its own share (``iterable.epoch_batch_sizes`` lists the sizes)."""
    return len(iterable.epoch_batch_sizes(n, batch_size, num_workers, drop_last))


@exercise(
    "08.3", "each worker batches its own share: sum over workers of ceil(share / batch_size) (floor with drop_last)."
)
def batches_per_epoch(fn: Callable[[int, int, int, bool], Any]) -> None:
    """``fn(n, batch_size, num_workers, drop_last)``: batches in one epoch over a sharded ``n``-sample stream."""
    attempted(fn)
    for drop_last in (False, True):
        for n, b, w in CASES:
            got = _call(fn, n, b, w, drop_last)
            truth = _batches_per_epoch(n, b, w, drop_last)
            if got == truth:
                continue
            call = f"batches_per_epoch({n}, batch_size={b}, num_workers={w}, drop_last={drop_last})"
            sizes = iterable.epoch_batch_sizes(n, b, w, drop_last)
            shares = iterable.worker_shares(n, w)
            whole = n // b if drop_last else math.ceil(n / b)
            if got == whole:
                raise Hint(
                    f"{call} = {got}: that is len(loader), as if one process made every batch. Each of the {w} "
                    f"workers batches its own share {shares}, and each share can end with a short batch: "
                    f"the loader yields batches of {sizes}."
                )
            if w and got == w * (math.ceil(n / w) // b if drop_last else math.ceil(math.ceil(n / w) / b)):
                raise Hint(
                    f"{call} = {got}: not every share has ceil(n / num_workers) samples; here they are {shares}."
                )
            if drop_last and got == _batches_per_epoch(n, b, w, False):
                raise Hint(f"{call} = {got}: with drop_last=True every worker drops its own short last batch.")
            raise Hint(
                f"{call} = {got}, but the loader yields {truth} batches, of sizes {sizes} (shares per worker: {shares})."
            )


def _entries(sizes: Sequence[int]) -> list[tuple[str, int]]:
    return [(f"r{i:05d}.npy", s) for i, s in enumerate(sizes)]


POLICY_CASES = [
    ([100] * 10, 700),  # three too many
    ([100] * 10, 1000),  # exactly full: nothing to do
    ([100] * 4, 1000),  # room to spare
    ([300, 50, 50, 50, 200, 100], 400),  # sizes differ: count bytes, not files
    ([50, 50, 400, 100, 100], 450),
    ([100, 100, 100], 0),  # a budget of nothing: everything goes
    ([], 100),
]


@exercise("08.5", "as few deletions as possible, oldest first, until the rest fits the budget.")
def eviction_policy(fn: Callable[[list[tuple[str, int]], int], Any]) -> None:
    """``fn(entries, budget_bytes)`` returns the names to evict; ``entries`` are ``(name, bytes)``, oldest first."""
    attempted(fn)
    for sizes, budget in POLICY_CASES:
        entries = _entries(sizes)
        call = f"policy({len(entries)} entries of sizes {sizes}, budget_bytes={budget})"
        result = fn(list(entries), budget)
        require(
            result is not None, f"{call} returned None: return a list of names (an empty list when nothing must go)."
        )
        chosen = list(result)
        names = [name for name, _ in entries]
        if chosen and all(isinstance(c, tuple) for c in chosen):
            raise Hint(f"{call} returned entries like {chosen[0]!r}: return only the names (the first item of each).")
        require(all(c in names for c in chosen), f"{call} returned {chosen[:3]}, which are not names from entries.")
        require(len(set(chosen)) == len(chosen), f"{call} names a file twice.")
        left = sum(s for (name, s) in entries if name not in chosen)
        total = sum(sizes)
        truth = iterable_evict(entries, budget)
        require(
            left <= budget,
            f"{call}: after deleting {len(chosen)} files {left} bytes remain, over the budget. Keep deleting, oldest first, and add up bytes, not files: sizes differ.",
        )
        if set(chosen) == set(truth):
            continue
        if not truth:
            raise Hint(f"{call}: the cache holds {total} bytes, within the budget: delete nothing.")
        if len(chosen) > len(truth):
            raise Hint(
                f"{call} deleted {len(chosen)} files, but deleting the {len(truth)} oldest is enough. "
                "Stop as soon as the rest fits (count bytes, not files: sizes differ)."
            )
        newest_first = [name for name, _ in reversed(entries)]
        if chosen and set(chosen) == set(newest_first[: len(chosen)]):
            raise Hint(f"{call} deleted the newest files. entries come oldest first: evict from the front.")
        raise Hint(f"{call} deleted {sorted(chosen)}; the oldest-first choice is {truth}.")


def iterable_evict(entries: Sequence[tuple[str, int]], budget: int) -> list[str]:
    """The reference answer (``course_lib.growing.evict_oldest``)."""
    from ..growing import evict_oldest

    return evict_oldest(entries, budget)


# ----------------------------------------------------------------- 08.2: a stream for ranks x workers


def _ranked_run(cls: Any, n: int, world: int, workers: int, seed: int, epoch: int) -> list[list[tuple[int, float]]]:
    """One epoch of ``cls(n, rank, world, seed)`` on every rank, each as ``workers`` workers (0: the main process):
    one list of ``(index, noise)`` per (rank, worker) stream."""
    streams = []
    for rank in range(world):
        ds = cls(n, rank, world, seed)
        require(hasattr(ds, "set_epoch"), "give the class a set_epoch(epoch) method that stores the epoch.")
        ds.set_epoch(epoch)
        for worker in range(max(workers, 1)):
            with as_worker(worker, workers, ds) if workers else contextlib.nullcontext():
                items = list(ds)
            for item in items:
                require(isinstance(item, tuple) and len(item) == 2, f"yield pairs (index, noise), got {item!r}.")
            streams.append([(int(i), float(x)) for i, x in items])
    return streams


@exercise(
    "08.2",
    "every sample once per epoch over ranks x workers, a new order each epoch, and each stream's own "
    "noise, reproducible from (seed, epoch, rank, worker).",
)
def ranked_stream(cls: Any) -> None:
    """``cls(n, rank, world_size, seed)`` with ``set_epoch``: an IterableDataset of ``(index, noise)`` pairs."""
    attempted(cls)
    require(
        isinstance(cls, type) and issubclass(cls, IterableDataset),
        f"pass the class itself, a subclass of IterableDataset; got {cls!r}.",
    )
    n = 24
    for world, workers in ((1, 0), (2, 0), (1, 3), (2, 2), (3, 2)):
        streams = _ranked_run(cls, n, world, workers, seed=0, epoch=0)
        setting = f"{world} rank(s) x {workers} worker(s)"
        got = [i for s in streams for i, _ in s]
        per_rank = [
            sorted(i for s in streams[r * max(workers, 1) : (r + 1) * max(workers, 1)] for i, _ in s)
            for r in range(world)
        ]
        require(
            world == 1 or len({tuple(p) for p in per_rank}) == world,
            f"{setting}: every rank yielded the same "
            "samples: divide the permutation into world_size x num_workers shares, rank r's worker w taking "
            "share r * num_workers + w.",
        )
        require(
            len(got) != n or len(set(got)) == n,
            f"{setting}: some samples came twice and others never, though the "
            "shares add up to the data set: the ranks or workers cut their shares from different permutations. "
            "Seed the permutation with (seed, epoch) only, the same on every rank and worker.",
        )
        _judge(got, n, setting, shares=[[i for i, _ in s] for s in streams] if world == 1 else None)
    a = _ranked_run(cls, n, 2, 2, seed=0, epoch=0)
    require(
        a == _ranked_run(cls, n, 2, 2, seed=0, epoch=0),
        "the same seed and epoch gave different streams: draw "
        "every random number from generators seeded by (seed, epoch, ...), not from the global ones.",
    )
    order = [i for s in _ranked_run(cls, n, 1, 0, seed=0, epoch=0) for i, _ in s]
    require(
        order != sorted(order),
        "the samples come in order 0, 1, 2, ...: shuffle them with a permutation drawn "
        "from np.random.default_rng([seed, epoch]).",
    )
    require(
        a != _ranked_run(cls, n, 2, 2, seed=0, epoch=1),
        "epochs 0 and 1 gave the same streams: put the epoch into the seed of the permutation (and of the noise).",
    )
    require(a != _ranked_run(cls, n, 2, 2, seed=1, epoch=0), "seeds 0 and 1 gave the same streams: use the seed.")
    firsts = [s[0][1] for s in a if s]
    require(
        len(set(firsts)) == len(firsts),
        "two streams drew the same noise: seed each stream's noise generator "
        "with all of (seed, epoch, rank, worker), e.g. np.random.default_rng([seed, epoch, rank, worker]).",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = [
            list(
                drain(
                    DataLoader(
                        cls(n, rank, 2, 0),
                        batch_size=None,
                        num_workers=2,
                        multiprocessing_context=mp.get_context("fork"),
                    )
                )
            )
            for rank in range(2)
        ]
    _judge([int(i) for r in real for i, _ in r], n, "2 ranks x 2 real worker processes")


def _epochs_of(cls: Any, n: int, seed: int, num_workers: int, epochs: int = 3) -> list[list[int]]:
    """The indices a DataLoader with ``num_workers`` persistent workers yields in each of ``epochs`` epochs."""
    stream = cls(n, seed)
    attempted(stream)
    require(isinstance(stream, IterableDataset), f"{type(stream).__name__} should subclass IterableDataset.")
    loader = DataLoader(
        stream,
        batch_size=None,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        multiprocessing_context=mp.get_context("fork") if num_workers else None,
    )
    out = []
    try:
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            out.append(_ints(list(loader), type(stream).__name__))
    finally:  # the persistent workers stop here, not at some later garbage collection (see drain)
        stop_workers(loader._iterator)
    return out


@exercise(
    "08.4",
    "the epoch in shared memory: persistent workers reshuffle every epoch, each sample once, "
    "the same orders on a rerun.",
)
def persistent_stream(cls: Any) -> None:
    """``cls(n, seed)``: an IterableDataset with ``set_epoch``, split by worker, reshuffled per epoch even in persistent workers."""
    attempted(cls)
    n, seed = 12, 3
    for workers in (0, 2):
        setting = f"with {workers} persistent workers" if workers else "with 0 workers"
        orders = _epochs_of(cls, n, seed, workers)
        for epoch, got in enumerate(orders):
            _judge(got, n, f"{setting}, epoch {epoch}")
        require(
            orders[0] != sorted(orders[0]),
            f"{setting} epoch 0 came in order 0..{n - 1}: shuffle it, from np.random.default_rng([seed, epoch]).",
        )
        if workers and orders[0] == orders[1] == orders[2]:
            raise Hint(
                "with persistent workers all three epochs came in the same order: each worker kept the copy of "
                "the epoch it was started with. Keep the epoch in a tensor moved to shared memory "
                "(torch.zeros((), dtype=torch.int64).share_memory_()) and write it with fill_ in set_epoch."
            )
        require(
            len({tuple(o) for o in orders}) == 3,
            f"{setting} two of three epochs came in the same order: "
            "seed the permutation with the epoch, np.random.default_rng([seed, epoch]).",
        )
        again = _epochs_of(cls, n, seed, workers)
        require(
            again == orders,
            f"{setting} a second stream with the same seed gave other orders: draw them from "
            "np.random.default_rng([seed, epoch]), not from the global random state.",
        )
