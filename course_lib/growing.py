"""A dataset that grows from epoch to epoch: producers fill a local cache, training reads it (notebook 07).

The situation: the full data set lives far away (an object store, a remote archive, a
simulation) and does not fit on the training machine. *Producer* processes fetch samples from
it and write them, one file each, into a local cache folder. Every epoch trains on whatever
the cache holds at that moment, so early epochs see a few samples and later ones many; when the
cache reaches its size budget, the oldest samples are deleted to make room for new ones.

:class:`GrowingCache` runs this with real ``multiprocessing`` processes. Its choices:

* **Atomic files.** A producer writes ``.<name>.tmp-<pid>`` and renames it into place
  (``os.replace``): a reader lists and opens only complete files, never half a file. Names
  starting with ``.`` are never listed.
* **Paced by the consumer.** Producers write only when asked: :meth:`GrowingCache.request`
  asks each for ``per_request`` new samples, :meth:`GrowingCache.wait` waits until all are
  written (with a timeout). A sample's content depends only on ``(seed, producer, request,
  number)``, so what each epoch sees is exact and repeatable, which a notebook checked by CI
  needs. :meth:`GrowingCache.next_epoch` waits for the samples asked for at the start of the
  previous epoch, evicts, lists, and asks for the next ones: the producers write while the
  epoch trains. (A production system lets producers run freely; then the counts vary.)
* **Eviction between epochs, by the consumer.** The epoch's file list (a
  :class:`CacheSnapshot`, a map-style dataset) is fixed when the epoch starts, and files are
  deleted only in :meth:`GrowingCache.next_epoch`, after the previous epoch's loader is done.
  So no file is deleted while a DataLoader worker may still open it. (A separate evictor
  running during the epoch would need to know which files the workers still need; on Linux a
  file already *open* survives deletion, but one listed and not yet opened does not.) Hence:
  a new DataLoader per epoch, no ``persistent_workers`` (their copy of the snapshot is stale
  anyway). The budget holds at every epoch start; during an epoch the cache may exceed it by one
  request.
* **Oldest first** by name (request number, then producer, then number), not by modification
  time, which can tie and depends on the clock. The policy is a function and can be replaced.

Errors are explicit: a budget smaller than one sample, a cache folder that cannot be written,
a producer that dies (named, with its exit code) or does not answer in time.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import re
import sys
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ._support import fork_context, write_atomic
from .data import CLASSES, draw_shape
from .datasets import check_index

__all__ = [
    "CacheError",
    "CacheSnapshot",
    "EpochStats",
    "GrowingCache",
    "ProducerError",
    "ProducerTimeout",
    "evict_oldest",
    "make_sample",
    "plot_growth",
    "reuse_counts",
    "sample_name",
]

SUFFIX = ".npy"
_NAME = re.compile(r"^r(\d{5})-p(\d{2})-(\d{4})-c(\d+)\.npy$")
EvictionPolicy = Callable[[Sequence[tuple[str, int]], int], Sequence[str]]


class CacheError(RuntimeError):
    """The cache cannot work as asked; the message says why and what to do."""


class ProducerError(CacheError):
    """A producer process died. ``producer`` is its number, ``exitcode`` what it exited with."""

    def __init__(self, message: str, producer: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.producer, self.exitcode = producer, exitcode


class ProducerTimeout(ProducerError, TimeoutError):
    """A producer is alive but did not finish its request in time."""


# --------------------------------------------------------------------------- samples


def sample_name(request: int, producer: int, number: int, label: int) -> str:
    """The file name of one sample: ``r00003-p01-0002-c7.npy`` (sorting by name = oldest first)."""
    return f"r{request:05d}-p{producer:02d}-{number:04d}-c{label}{SUFFIX}"


def parse_name(name: str) -> tuple[int, int, int, int]:
    """``(request, producer, number, label)`` of a sample file name."""
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a cache sample name (like {sample_name(3, 1, 2, 7)!r})")
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def make_sample(seed: int, producer: int, request: int, number: int, image_size: int = 32) -> tuple[np.ndarray, int]:
    """One sample ``(image as uint8 H×W×3, label)``: a shape drawn from ``(seed, producer, request, number)``."""
    rng = np.random.default_rng([seed, producer, request, number])
    label = int(rng.integers(len(CLASSES)))
    return np.asarray(draw_shape(label, rng, image_size)), label


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def sample_nbytes(image_size: int) -> int:
    """The size in bytes of one sample file (all samples of one image size have the same)."""
    return len(_npy_bytes(np.zeros((image_size, image_size, 3), dtype=np.uint8)))


def _producer_main(
    producer: int, folder: str, seed: int, image_size: int, commands: Any, done: Any, fail_at: int | None
) -> None:
    """A producer process: write the samples asked for, report, repeat; stop on ``None``.

    Reports ``(producer, request, None)`` when a request is written. On an error it reports
    ``(producer, request, "Type: message")``, writes the traceback to file descriptor 2 (the
    process's standard error, where logs go) and exits with code 1.
    """
    parent = mp.parent_process()
    request = -1
    try:
        while True:
            try:
                command = commands.get(timeout=1.0)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return  # the consumer died without stopping us: do not linger
                continue
            if command is None:
                return
            request, count = command
            for number in range(count):
                if fail_at is not None and request == fail_at and number == count // 2:
                    # a simulated failure halfway through a request, like a lost connection
                    raise ConnectionError(f"producer {producer}: the remote store went away (simulated)")
                array, label = make_sample(seed, producer, request, number, image_size)
                # a temporary name, then a rename: a reader lists and opens complete files only
                write_atomic(Path(folder) / sample_name(request, producer, number, label), _npy_bytes(array))
            done.put((producer, request, None))
    except Exception as exc:
        import traceback

        done.put((producer, request, f"{type(exc).__name__}: {exc}"))
        text = f"Process cache-producer-{producer} failed:\n" + traceback.format_exc()
        os.write(2, text.encode(errors="replace"))  # the descriptor, not sys.stderr, which Jupyter may redirect
        sys.exit(1)


# --------------------------------------------------------------------------- eviction


def evict_oldest(entries: Sequence[tuple[str, int]], budget_bytes: int) -> list[str]:
    """The names to delete so that the rest fits in ``budget_bytes``: as few as possible, oldest first.

    ``entries`` are ``(name, size in bytes)``, oldest first.
    """
    total = sum(size for _, size in entries)
    out = []
    for name, size in entries:
        if total <= budget_bytes:
            break
        out.append(name)
        total -= size
    return out


# --------------------------------------------------------------------------- what one epoch reads


class CacheSnapshot(Dataset):
    """The cache's samples at one moment: a map-style dataset over a fixed list of files.

    ``dataset[i]`` is ``(image as float tensor C×H×W in 0..1, label)`` (or ``transform(image
    as uint8 H×W×3 array)`` with a transform). The file list is a NumPy array: shared by forked
    workers without copies.
    """

    def __init__(self, folder: str | os.PathLike[str], names: Sequence[str], transform: Callable[[np.ndarray], Any] | None = None) -> None:
        self.folder = Path(folder)
        self.names = np.array(sorted(names), dtype=str)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.names)

    @property
    def requests(self) -> np.ndarray:
        """The request number each sample was produced in (its age)."""
        return np.array([parse_name(n)[0] for n in self.names], dtype=np.int64)

    @property
    def labels(self) -> np.ndarray:
        return np.array([parse_name(n)[3] for n in self.names], dtype=np.int64)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        name = str(self.names[check_index(index, len(self))])
        try:
            array = np.load(self.folder / name)
        except FileNotFoundError:
            raise CacheError(
                f"{name} is in this epoch's snapshot but no longer in the cache: something deleted it "
                "during the epoch. Evict only between epochs (GrowingCache.next_epoch does)."
            ) from None
        label = parse_name(name)[3]
        if self.transform is not None:
            return self.transform(array), label
        return torch.from_numpy(array).permute(2, 0, 1).float() / 255, label

    def __repr__(self) -> str:
        return f"{type(self).__name__}(samples={len(self)})"


@dataclass
class EpochStats:
    """What one epoch of a :class:`GrowingCache` started with."""

    epoch: int
    added: int  # samples written since the previous epoch started
    evicted: int  # samples deleted before this epoch
    samples: int  # samples in the cache (and in this epoch's snapshot)
    nbytes: int  # their size
    dataset: CacheSnapshot = field(repr=False)

    def __str__(self) -> str:
        return (f"epoch {self.epoch}: +{self.added} new, -{self.evicted} evicted, "
                f"{self.samples} samples ({self.nbytes / 1024:.1f} KiB) to train on")


# --------------------------------------------------------------------------- the cache


def _stop(procs: list[Any], commands: list[Any], timeout: float) -> None:
    """Ask producers to stop, then terminate and kill what is left; every join has a timeout."""
    for q in commands:
        try:
            q.put(None)
        except (ValueError, OSError):  # queue already closed
            pass
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join(2.0)
    for q in commands:
        q.close()
        q.join_thread()


class GrowingCache:
    """A local cache folder that ``producers`` processes fill while training reads it.

    Use it as a context manager (``with GrowingCache(...) as cache:``), which starts the
    producers and stops them, with timeouts, on the way out. Each epoch::

        stats = cache.next_epoch()     # wait for new samples, evict past the budget, list, ask for more
        loader = DataLoader(stats.dataset, batch_size=..., shuffle=True, num_workers=2)

    ``per_request`` samples per producer per epoch; ``budget_bytes`` the cache's size limit
    (at least one sample); ``policy(entries, budget_bytes)`` picks the files to evict
    (:func:`evict_oldest`). ``timeout`` bounds every wait for producers. ``fail_at=r`` makes
    producer 1 (or 0, if it is the only one) crash halfway through request ``r``: for
    demonstrations and tests. ``clear=True`` empties a folder that already holds samples.
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
        for name, value, low in (("producers", producers, 1), ("per_request", per_request, 1), ("image_size", image_size, 8)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if producers > 99 or per_request > 9999:
            raise ValueError("at most 99 producers and 9999 samples per request (file names have fixed widths)")
        self.sample_bytes = sample_nbytes(image_size)
        if budget_bytes < self.sample_bytes:
            raise ValueError(
                f"budget_bytes={budget_bytes} is smaller than one sample ({self.sample_bytes} bytes for "
                f"{image_size}x{image_size} images): the cache could hold nothing. Give at least "
                f"{self.sample_bytes * producers * per_request} bytes to keep one epoch's worth."
            )
        self.folder = Path(folder)
        self.budget_bytes, self.producers, self.per_request = int(budget_bytes), producers, per_request
        self.image_size, self.seed, self.timeout, self.policy = image_size, seed, timeout, policy
        self.fail_at = fail_at
        self._ctx = mp.get_context(start_method) if start_method else fork_context()
        self._check_folder(clear)
        self._procs: list[Any] = []
        self._commands: list[Any] = []
        self._done: Any = None
        self._next_request = 0
        self._pending: int | None = None
        self._broken: ProducerError | None = None
        self._listed: set[str] = set()
        self.history: list[EpochStats] = []
        self._finalizer: weakref.finalize | None = None
        self.closed = False

    def _check_folder(self, clear: bool) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache folder {self.folder.name!r}: {exc.strerror or exc}") from None
        probe = self.folder / f".probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CacheError(
                f"the cache folder {self.folder.name!r} is not writable ({exc.strerror or exc}); "
                "producers could not store anything there. Choose a folder on local, writable storage."
            ) from None
        old = self._names()
        if old and not clear:
            raise CacheError(
                f"the cache folder {self.folder.name!r} already holds {len(old)} samples of an earlier run; "
                "pass an empty folder, or clear=True to delete them."
            )
        for name in old:
            (self.folder / name).unlink()

    # ------------------------------------------------------------------ producers

    def start(self) -> "GrowingCache":
        """Start the producer processes (done by ``with``)."""
        if self.closed:
            raise CacheError("this cache was closed; make a new GrowingCache")
        if self._procs:
            return self
        self._done = self._ctx.Queue()
        for p in range(self.producers):
            commands = self._ctx.Queue()
            fail = self.fail_at if p == min(1, self.producers - 1) else None
            proc = self._ctx.Process(
                target=_producer_main,
                args=(p, str(self.folder), self.seed, self.image_size, commands, self._done, fail),
                name=f"cache-producer-{p}",
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)
            self._commands.append(commands)
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._commands, 5.0)
        return self

    def request(self, count: int | None = None) -> int:
        """Ask every producer for ``count`` (default ``per_request``) new samples; return the request number."""
        if not self._procs:
            raise CacheError("the producers are not running: use `with GrowingCache(...) as cache:` or call start()")
        if self._broken is not None:
            raise CacheError(f"this cache's producers failed earlier: {self._broken}")
        if self._pending is not None:
            raise CacheError(f"request {self._pending} is still being written; wait() for it first")
        count = self.per_request if count is None else count
        request = self._next_request
        for q in self._commands:
            q.put((request, count))
        self._pending, self._next_request = request, request + 1
        return request

    def wait(self, timeout: float | None = None) -> None:
        """Block until every producer has written the pending request; raise if one died or is late."""
        if self._pending is None:
            return
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        waiting = set(range(self.producers))
        while waiting:
            try:
                producer, request, error = self._done.get(timeout=0.05)
            except queue.Empty:
                pass
            else:
                if error is not None:
                    self._failed(producer, error)
                if request == self._pending:
                    waiting.discard(producer)
                continue
            for p in sorted(waiting):
                if self._procs[p].exitcode is not None:
                    self._failed(p, None)
            if time.monotonic() > deadline:
                p = min(waiting)
                raise ProducerTimeout(
                    f"producer {p} did not finish request {self._pending} within "
                    f"{self.timeout if timeout is None else timeout:g} seconds (still running: the storage may be slow or full)",
                    producer=p,
                    exitcode=None,
                )
        self._pending = None

    def _failed(self, producer: int, error: str | None) -> None:
        """Raise the ProducerError for a producer that reported an error or exited."""
        proc = self._procs[producer]
        proc.join(5.0)  # it is on its way out: collect its exit code
        while error is None:  # it may have said why before it exited
            try:
                who, _, error = self._done.get(timeout=0.2)
            except queue.Empty:
                break
            if who != producer:
                error = None
        self._remove_temps()
        cause = f" ({error})" if error else " (its traceback, if any, went to this process's standard error)"
        self._broken = ProducerError(
            f"producer {producer} failed while writing request {self._pending}{cause} and exited with "
            f"code {proc.exitcode}. The samples it finished are in the cache; close() this cache and start a new one.",
            producer=producer,
            exitcode=proc.exitcode,
        )
        self._pending = None
        raise self._broken

    # ------------------------------------------------------------------ the folder

    def _names(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.folder) if _NAME.match(e.name) and e.is_file())

    def entries(self) -> list[tuple[str, int]]:
        """``(name, bytes)`` of every complete sample in the cache, oldest first."""
        out = []
        for name in self._names():
            try:
                out.append((name, (self.folder / name).stat().st_size))
            except FileNotFoundError:  # evicted in between by someone else
                continue
        return out

    def nbytes(self) -> int:
        return sum(size for _, size in self.entries())

    def evict(self, policy: EvictionPolicy | None = None) -> list[str]:
        """Delete what ``policy`` (default: the cache's) picks so the cache fits its budget; return the names.

        Call it only between epochs, when no DataLoader worker reads the cache (``next_epoch`` does).
        """
        entries = self.entries()
        chosen = list((policy or self.policy)(entries, self.budget_bytes))
        known = {name for name, _ in entries}
        unknown = [n for n in chosen if n not in known]
        if unknown:
            raise CacheError(f"the eviction policy chose {unknown[:3]}, which the cache does not hold; nothing was deleted")
        if len(set(chosen)) != len(chosen):
            raise CacheError("the eviction policy chose a file twice; nothing was deleted")
        left = sum(size for name, size in entries if name not in set(chosen))
        if left > self.budget_bytes:
            raise CacheError(
                f"after the policy's choice the cache would still hold {left} bytes, over its budget of "
                f"{self.budget_bytes}; nothing was deleted"
            )
        for name in chosen:
            (self.folder / name).unlink()
        return chosen

    def snapshot(self, transform: Callable[[np.ndarray], Any] | None = None) -> CacheSnapshot:
        """A map-style dataset over the samples in the cache now."""
        return CacheSnapshot(self.folder, self._names(), transform)

    def next_epoch(self, transform: Callable[[np.ndarray], Any] | None = None) -> EpochStats:
        """Start an epoch: wait for the samples asked for last time, evict, list, ask for the next ones.

        The first call asks for samples and waits, so that epoch 0 has something to train on.
        """
        if not self._procs:
            self.start()
        if self._pending is None and not self.history:
            self.request()
        self.wait()
        evicted = self.evict()
        dataset = self.snapshot(transform)
        names = set(dataset.names.tolist())
        added = len(names - self._listed) + len([n for n in evicted if n not in self._listed])
        self._listed = names
        stats = EpochStats(len(self.history), added, len(evicted), len(dataset), sum(
            (self.folder / n).stat().st_size for n in dataset.names), dataset)
        self.history.append(stats)
        self.request()  # the producers write while this epoch trains
        return stats

    # ------------------------------------------------------------------ shutdown

    def _remove_temps(self) -> None:
        for e in os.scandir(self.folder):
            if e.name.startswith(".") and ".tmp-" in e.name:
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass

    def close(self, timeout: float = 10.0) -> None:
        """Stop the producers (asked, then terminated, then killed; joins have timeouts) and remove temp files.

        The samples stay in the folder: it is a cache. Calling ``close`` twice is harmless.
        """
        if self.closed:
            return
        self.closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        _stop(self._procs, self._commands, timeout)
        if self._done is not None:
            self._done.close()
            self._done.join_thread()
        self._remove_temps()
        self._pending = None

    @property
    def exitcodes(self) -> list[int | None]:
        """Each producer's exit code (``None`` while it runs)."""
        return [p.exitcode for p in self._procs]

    def __enter__(self) -> "GrowingCache":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("running" if self._procs else "not started")
        return (f"{type(self).__name__}(producers={self.producers}, per_request={self.per_request}, "
                f"budget={self.budget_bytes // self.sample_bytes} samples, {state})")


# --------------------------------------------------------------------------- pictures


def reuse_counts(history: Sequence[EpochStats]) -> dict[str, int]:
    """For every sample that has been evicted by the last epoch of ``history``: in how many epochs it was trained."""
    seen: dict[str, int] = {}
    for stats in history:
        for name in stats.dataset.names.tolist():
            seen[name] = seen.get(name, 0) + 1
    still = set(history[-1].dataset.names.tolist()) if history else set()
    return {name: n for name, n in seen.items() if name not in still}


def plot_growth(history: Sequence[EpochStats], budget_bytes: int, sample_bytes: int) -> Any:
    """Three panels: cache size and samples per epoch; which requests each epoch trained on; reuse per sample."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.1), dpi=80, gridspec_kw={"width_ratios": [1.2, 1.1, 0.8]})
    epochs = np.array([s.epoch for s in history])
    samples = np.array([s.samples for s in history])
    budget = budget_bytes // sample_bytes
    ax = axes[0]
    ax.bar(epochs, samples, color="tab:blue", label="in the cache = trained on")
    ax.bar(epochs, [-s.evicted for s in history], color="tab:red", label="evicted before the epoch")
    ax.plot(epochs, [s.added for s in history], "o-", color="tab:green", label="new since the last epoch")
    ax.axhline(budget, color="k", ls="--", lw=1, label=f"budget ({budget} samples)")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("epoch")
    ax.set_ylabel("samples")
    ax.set_title("the cache, epoch by epoch", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", frameon=False, ncols=2)
    ax.set_ylim(top=max(samples.max(), budget) * 1.55)
    requests = max(int(s.dataset.requests.max()) for s in history if len(s.dataset)) + 1
    grid = np.zeros((len(history), requests))
    for row, s in enumerate(history):
        r, counts = np.unique(s.dataset.requests, return_counts=True)
        grid[row, r] = counts
    ax = axes[1]
    im = ax.imshow(grid, cmap="Blues", aspect="auto", vmin=0)
    ax.set_xlabel("request (left = oldest)")
    ax.set_ylabel("epoch")
    ax.set_title("samples of each request, per epoch", fontsize=10)
    fig.colorbar(im, ax=ax, label="samples")
    ax = axes[2]
    reuse = np.array(list(reuse_counts(history).values()), dtype=np.int64)
    if reuse.size:
        values, counts = np.unique(reuse, return_counts=True)
        ax.bar(values, counts, color="tab:purple")
        ax.set_xticks(values)
    ax.set_xlabel("epochs trained in")
    ax.set_ylabel("evicted samples")
    ax.set_title("how often a sample was used", fontsize=10)
    fig.tight_layout()
    return fig
