"""Notebook 08: a dataset that grows from epoch to epoch (section 7).

Producer processes write samples (one ``.npy`` file each, atomically) into a local cache folder, once
per epoch when asked; each epoch trains on what the cache holds when it starts; past a size budget the
oldest samples are evicted, between epochs only. Every epoch is exact and repeatable. A producer that
dies is named with its exit code; one that is late times out.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import queue
import re
import time
import traceback
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .support import check_int, fork_context, write_atomic
from .data import CLASSES, draw_shape
from .datasets import check_index

__all__ = [
    "CacheSnapshot",
    "GrowingCache",
    "ProducerError",
    "evict_oldest",
    "plot_growth",
    "reuse_counts",
    "sample_nbytes",
]

_NAME = re.compile(r"^r(\d{5})-p(\d{2})-(\d{4})-c(\d+)\.npy$")
EvictionPolicy = Callable[[Sequence[tuple[str, int]], int], Sequence[str]]


class CacheError(RuntimeError):
    """Notebook 08, section 7: the cache cannot work as asked; the message says why and what to do."""


class ProducerError(CacheError):
    """Notebook 08, section 7: a producer process died; ``producer`` is its number, ``exitcode`` its exit code."""

    def __init__(self, message: str, producer: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.producer, self.exitcode = producer, exitcode


class ProducerTimeout(ProducerError, TimeoutError):
    """Notebook 08, section 7: a producer is alive but did not finish its request in time."""


def _sample_name(request: int, producer: int, number: int, label: int) -> str:
    """A sample's file name, ``r00003-p01-0002-c7.npy``; sorted by name = oldest first."""
    return f"r{request:05d}-p{producer:02d}-{number:04d}-c{label}.npy"


def _parse_name(name: str) -> tuple[int, int, int, int]:
    """``(request, producer, number, label)`` of a sample file name."""
    if (m := _NAME.match(name)) is None:
        raise ValueError(f"{name!r} is not a cache sample name (like {_sample_name(3, 1, 2, 7)!r})")
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def _make_sample(seed: int, producer: int, request: int, number: int, image_size: int = 32) -> tuple[np.ndarray, int]:
    """One sample ``(uint8 H×W×3 image, label)``, always the same for the same four numbers."""
    rng = np.random.default_rng([seed, producer, request, number])
    label = int(rng.integers(len(CLASSES)))
    return np.asarray(draw_shape(label, rng, image_size)), label


def _npy_bytes(array: np.ndarray) -> bytes:
    np.save(buf := io.BytesIO(), array)
    return buf.getvalue()


def sample_nbytes(image_size: int) -> int:
    """Notebook 08, section 7: the size in bytes of one sample file (the same for all samples of one image size)."""
    return len(_npy_bytes(np.zeros((image_size, image_size, 3), dtype=np.uint8)))


def _producer_main(
    producer: int, folder: str, seed: int, image_size: int, commands: Any, done: Any, fail_at: int | None
) -> None:
    """A producer process: write ``count`` samples per command ``(request, count)`` and report; ``None`` stops it."""
    request = -1
    try:
        while True:
            try:
                command = commands.get(timeout=1.0)
            except queue.Empty:
                if not mp.parent_process().is_alive():
                    return  # the consumer died without stopping us: do not linger
                continue
            if command is None:
                return
            request, count = command
            for number in range(count):
                if request == fail_at and number == count // 2:  # a simulated failure, like a lost connection
                    raise ConnectionError(f"producer {producer}: the remote store went away (simulated)")
                array, label = _make_sample(seed, producer, request, number, image_size)
                write_atomic(Path(folder) / _sample_name(request, producer, number, label), _npy_bytes(array))
            done.put((producer, request, None))
    except Exception as exc:  # noqa: BLE001 - reported to the consumer, which raises it
        done.put((producer, request, f"{type(exc).__name__}: {exc}"))
        text = f"Process cache-producer-{producer} failed:\n{traceback.format_exc()}"
        os.write(2, text.encode(errors="replace"))  # the descriptor: Jupyter may redirect sys.stderr
        raise SystemExit(1) from None


def evict_oldest(entries: Sequence[tuple[str, int]], budget_bytes: int) -> list[str]:
    """Notebook 08, section 7: the fewest names to delete, oldest first, so the rest of ``entries`` ``(name, bytes)`` fits."""
    total, chosen = sum(size for _, size in entries), []
    for name, size in entries:
        if total <= budget_bytes:
            break
        chosen.append(name)
        total -= size
    return chosen


class CacheSnapshot(Dataset):
    """Notebook 08, section 7: the cache's samples at one moment: a map-style dataset over a fixed list of files.
    ``dataset[i]`` is ``(float image C×H×W in 0..1, label)``, or ``(transform(uint8 image H×W×3), label)``."""

    def __init__(self, folder: str | os.PathLike[str], names: Sequence[str], transform: Callable | None = None) -> None:
        self.folder, self.transform = Path(folder), transform
        self.names = np.array(sorted(names), dtype=str)  # a NumPy array: forked workers share it without copies

    def __len__(self) -> int:
        return len(self.names)

    @property
    def requests(self) -> np.ndarray:
        """The request each sample was produced in (its age)."""
        return np.array([_parse_name(n)[0] for n in self.names], dtype=np.int64)

    @property
    def labels(self) -> np.ndarray:
        return np.array([_parse_name(n)[3] for n in self.names], dtype=np.int64)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        name = str(self.names[check_index(index, len(self))])
        try:
            array = np.load(self.folder / name)
        except FileNotFoundError:
            raise CacheError(
                f"{name} is in this epoch's snapshot but no longer in the cache: something deleted it "
                "during the epoch. Evict only between epochs (GrowingCache.next_epoch does)."
            ) from None
        if self.transform is not None:
            return self.transform(array), _parse_name(name)[3]
        return torch.from_numpy(array).permute(2, 0, 1).float() / 255, _parse_name(name)[3]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(samples={len(self)})"


@dataclass
class EpochStats:
    """What one epoch of a :class:`GrowingCache` starts with."""

    epoch: int
    added: int  # samples written since the previous epoch started
    evicted: int  # samples deleted before this epoch
    samples: int  # samples in the cache, and in this epoch's snapshot
    nbytes: int  # their size
    dataset: CacheSnapshot = field(repr=False)

    def __str__(self) -> str:
        return (
            f"epoch {self.epoch}: +{self.added} new, -{self.evicted} evicted, "
            f"{self.samples} samples ({self.nbytes / 1024:.1f} KiB) to train on"
        )


def _stop(procs: list[Any], commands: list[Any], done: Any, timeout: float) -> None:
    """Ask the producers to stop, then terminate and kill what is left; every join has a timeout."""
    for q in commands:
        q.put(None)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        for end in (p.terminate, p.kill):
            if p.is_alive():
                end()
                p.join(2.0)
    for q in [*commands, done]:  # never write to done: a killed producer may hold its lock
        q.close()
        q.join_thread()


class GrowingCache:
    """Notebook 08, section 7: a local cache folder that ``producers`` processes fill while training reads it.

    ``with GrowingCache(folder, budget_bytes=...) as cache:``, then each epoch ``stats = cache.next_epoch()`` and
    a new ``DataLoader(stats.dataset, ...)``. ``per_request``: samples per producer per epoch; ``policy`` picks the
    files to evict; ``fail_at=r`` crashes producer 1 (0 if alone) in request ``r``; ``clear=True`` empties an old cache.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        budget_bytes: int,
        producers: int = 2,
        per_request: int = 4,
        image_size: int = 32,
        seed: int = 0,
        timeout: float = 60.0,
        policy: EvictionPolicy = evict_oldest,
        start_method: str | None = None,
        fail_at: int | None = None,
        clear: bool = False,
    ) -> None:
        self.producers = check_int(producers, "producers", 1)
        self.per_request = check_int(per_request, "per_request", 1)
        self.image_size = check_int(image_size, "image_size", 8)
        if producers > 99 or per_request > 9999:
            raise ValueError("at most 99 producers and 9999 samples per request (file names have fixed widths)")
        self.sample_bytes = sample_nbytes(image_size)
        if budget_bytes < self.sample_bytes:
            raise ValueError(
                f"budget_bytes={budget_bytes} is smaller than one sample ({self.sample_bytes} bytes for "
                f"{image_size}x{image_size} images): the cache could hold nothing. Give at least "
                f"{self.sample_bytes * producers * per_request} bytes to keep one epoch's worth."
            )
        self.folder, self.budget_bytes, self.seed, self.timeout = Path(folder), int(budget_bytes), seed, timeout
        self.policy, self.fail_at, self.closed = policy, fail_at, False
        self._ctx = mp.get_context(start_method) if start_method else fork_context()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache folder {self.folder.name!r}: {exc.strerror or exc}") from None
        probe = self.folder / f".probe-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CacheError(
                f"the cache folder {self.folder.name!r} is not writable ({exc.strerror or exc}); producers "
                "could not store anything there. Choose a folder on local, writable storage."
            ) from None
        old = [name for name, _ in self.entries()]
        if old and not clear:
            raise CacheError(
                f"the cache folder {self.folder.name!r} already holds {len(old)} samples of an earlier "
                "run; pass an empty folder, or clear=True to delete them."
            )
        for name in old:
            (self.folder / name).unlink()
        self._procs, self._commands, self._done, self._finalizer = [], [], None, None  # set by start()
        self._next_request, self._pending, self._broken, self._listed = 0, None, None, set()
        self.history: list[EpochStats] = []

    def start(self) -> GrowingCache:
        """Start the producer processes (``with`` does)."""
        if self.closed:
            raise CacheError("this cache was closed; make a new GrowingCache")
        if not self._procs:
            self._done = self._ctx.Queue()
            for p in range(self.producers):
                self._commands.append(self._ctx.Queue())
                fail = self.fail_at if p == min(1, self.producers - 1) else None
                args = (p, str(self.folder), self.seed, self.image_size, self._commands[p], self._done, fail)
                self._procs.append(
                    self._ctx.Process(target=_producer_main, args=args, name=f"cache-producer-{p}", daemon=True)
                )
                self._procs[p].start()
            self._finalizer = weakref.finalize(self, _stop, self._procs, self._commands, self._done, 5.0)
        return self

    def request(self, count: int | None = None) -> int:
        """Ask every producer for ``count`` (default ``per_request``) new samples; return the request's number."""
        if not self._procs:
            raise CacheError("the producers are not running: use `with GrowingCache(...) as cache:` or call start()")
        if self._broken is not None:
            raise CacheError(f"this cache's producers failed earlier: {self._broken}")
        if self._pending is not None:
            raise CacheError(f"request {self._pending} is still being written; wait() for it first")
        self._pending, self._next_request = self._next_request, self._next_request + 1
        for q in self._commands:
            q.put((self._pending, self.per_request if count is None else count))
        return self._pending

    def wait(self, timeout: float | None = None) -> None:
        """Block until every producer has written the pending request; raise if one died or is late."""
        timeout = self.timeout if timeout is None else timeout
        deadline, waiting = time.monotonic() + timeout, set(range(self.producers))
        while waiting and self._pending is not None:
            try:
                producer, request, error = self._done.get(timeout=0.05)
            except queue.Empty:
                for p in sorted(waiting):
                    if self._procs[p].exitcode is not None:
                        self._failed(p, None)
                if time.monotonic() > deadline:
                    p = min(waiting)
                    raise ProducerTimeout(
                        f"producer {p} did not finish request {self._pending} within {timeout:g} "
                        "seconds (still running: the storage may be slow or full)",
                        p,
                        None,
                    )
                continue
            if error is not None:
                self._failed(producer, error)
            if request == self._pending:
                waiting.discard(producer)
        self._pending = None

    def _failed(self, producer: int, error: str | None) -> None:
        proc = self._procs[producer]
        proc.join(5.0)  # it is on its way out: collect its exit code
        with contextlib.suppress(queue.Empty):  # it may have said why before it exited
            while error is None:
                who, _, said = self._done.get(timeout=0.2)
                error = said if who == producer else None
        cause = f" ({error})" if error else " (its traceback, if any, went to this process's standard error)"
        self._broken = ProducerError(
            f"producer {producer} failed while writing request {self._pending}{cause} and exited with code "
            f"{proc.exitcode}. The samples it finished are in the cache; close() this cache and start a new one.",
            producer,
            proc.exitcode,
        )
        self._pending = None
        raise self._broken

    def entries(self) -> list[tuple[str, int]]:
        """``(name, bytes)`` of every complete sample in the cache, oldest first."""
        with os.scandir(self.folder) as found:
            return sorted((e.name, e.stat().st_size) for e in found if _NAME.match(e.name) and e.is_file())

    def nbytes(self) -> int:
        """The size of the samples in the cache now."""
        return sum(size for _, size in self.entries())

    def evict(self, policy: EvictionPolicy | None = None) -> list[str]:
        """Delete what ``policy`` (default: the cache's) picks; return the names. Call it between epochs only."""
        sizes = dict(self.entries())
        chosen = list((policy or self.policy)(list(sizes.items()), self.budget_bytes))
        unknown = [n for n in chosen if n not in sizes]
        if unknown:
            raise CacheError(f"the policy chose {unknown[:3]}, which the cache does not hold; nothing was deleted")
        if len(set(chosen)) != len(chosen):
            raise CacheError("the eviction policy chose a file twice; nothing was deleted")
        left = sum(sizes.values()) - sum(sizes[n] for n in chosen)
        if left > self.budget_bytes:
            raise CacheError(
                f"after the policy's choice the cache would still hold {left} bytes, over its budget of "
                f"{self.budget_bytes}; nothing was deleted"
            )
        for name in chosen:
            (self.folder / name).unlink()
        return chosen

    def next_epoch(self, transform: Callable | None = None) -> EpochStats:
        """Start an epoch: wait for the samples asked for last time, evict, list, and ask for the next ones."""
        self.start()
        if self._pending is None and not self.history:  # the first epoch: ask, and wait, for something to train on
            self.request()
        self.wait()
        evicted, sizes = self.evict(), dict(self.entries())  # no producer writes until the next request
        added = len(sizes.keys() - self._listed) + len(set(evicted) - self._listed)  # kept, or evicted unlisted
        dataset, self._listed = CacheSnapshot(self.folder, list(sizes), transform), set(sizes)
        stats = EpochStats(len(self.history), added, len(evicted), len(sizes), sum(sizes.values()), dataset)
        self.history.append(stats)
        self.request()  # the producers write while this epoch trains
        return stats

    def close(self, timeout: float = 10.0) -> None:
        """Stop the producers (ask, terminate, kill; joins have timeouts), remove temporary files; the samples stay."""
        if self._finalizer is not None and self._finalizer.detach():  # detach() is None once stopped
            _stop(self._procs, self._commands, self._done, timeout)
        self.closed, self._pending = True, None
        for tmp in self.folder.glob(".*.tmp-*"):  # left by a producer killed while writing
            tmp.unlink(missing_ok=True)

    @property
    def exitcodes(self) -> list[int | None]:
        """Each producer's exit code (``None`` while it runs)."""
        return [p.exitcode for p in self._procs]

    @property
    def pids(self) -> list[int]:
        """Each producer's process id, producer 0 first (empty before :meth:`start`): to watch them, e.g. in ``top``."""
        return [p.pid for p in self._procs]

    def __enter__(self) -> GrowingCache:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("running" if self._procs else "not started")
        return (
            f"{type(self).__name__}(producers={self.producers}, per_request={self.per_request}, "
            f"budget={self.budget_bytes // self.sample_bytes} samples, {state})"
        )


def reuse_counts(history: Sequence[EpochStats]) -> dict[str, int]:
    """Notebook 08, section 7: in how many epochs each sample evicted by the last of ``history`` was trained."""
    seen = Counter(name for stats in history for name in stats.dataset.names.tolist())
    still = set(history[-1].dataset.names.tolist()) if history else set()
    return {name: n for name, n in seen.items() if name not in still}


def plot_growth(history: Sequence[EpochStats], budget_bytes: int, sample_bytes: int) -> Any:
    """Notebook 08, section 7: three panels: samples per epoch; the requests each epoch trained on; reuse per sample."""
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.1), dpi=80, width_ratios=[1.2, 1.1, 0.8])
    epochs, samples, budget = [s.epoch for s in history], [s.samples for s in history], budget_bytes // sample_bytes
    left.bar(epochs, samples, color="tab:blue", label="in the cache = trained on")
    left.bar(epochs, [-s.evicted for s in history], color="tab:red", label="evicted before the epoch")
    left.plot(epochs, [s.added for s in history], "o-", color="tab:green", label="new since the last epoch")
    left.axhline(budget, color="k", ls="--", lw=1, label=f"budget ({budget} samples)")
    left.axhline(0, color="k", lw=0.5)
    left.set(xlabel="epoch", ylabel="samples", ylim=(None, max([*samples, budget]) * 1.55))
    left.legend(fontsize=7, loc="upper left", frameon=False, ncols=2)
    requests = max(int(s.dataset.requests.max()) for s in history if len(s.dataset)) + 1
    grid = np.array([np.bincount(s.dataset.requests, minlength=requests) for s in history])
    fig.colorbar(middle.imshow(grid, cmap="Blues", aspect="auto", vmin=0), ax=middle, label="samples")
    middle.set(xlabel="request (left = oldest)", ylabel="epoch")
    values, counts = np.unique(list(reuse_counts(history).values()), return_counts=True)
    right.bar(values, counts, color="tab:purple")
    right.set(xticks=values, xlabel="epochs trained in", ylabel="evicted samples")
    left.set_title("the cache, epoch by epoch", fontsize=10)
    middle.set_title("samples of each request, per epoch", fontsize=10)
    right.set_title("how often a sample was used", fontsize=10)
    fig.tight_layout()
    return fig
