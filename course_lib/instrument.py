"""An instrumented ``DataLoader``: see where the time goes (notebook 04).

:class:`InstrumentedLoader` takes the same arguments as ``torch.utils.data.DataLoader`` and
builds a real one from them, so the batches, their order and the worker processes are exactly
what a plain loader gives for the same seed. Around it, it records for every batch:

* which worker made it (``-1``: the main process, when ``num_workers=0``);
* when that worker started and finished it (fetching the samples and collating them);
* how long the training loop waited for it, and how long the loop's own step took.

The clock is ``time.perf_counter()``. It reads the system's monotonic clock on Linux, macOS and
Windows, so times taken in worker processes and in the main process are comparable.

How the worker side is measured, in two small wrappers the DataLoader carries into each worker:
a proxy around the dataset notes when a batch's first sample is requested, and a wrapper around
``collate_fn`` notes when the batch is ready and sends these times along with the batch. The
main process strips them off before the loop sees the batch. torch's own profiler
(``torch.profiler``) records far more, but not per worker lane in a form a learner can read.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, default_convert, get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory as _pin

__all__ = [
    "BatchRecord",
    "EpochRecord",
    "InstrumentedLoader",
    "measure",
    "plot_sweep",
    "plot_timeline",
    "simulated_step",
    "sweep",
]

MAIN = -1  # the worker id recorded for batches made in the main process (num_workers=0)

clock = time.perf_counter


class _WorkerState:
    """Per-process notes: when this process started its current batch, and when it started."""

    batch_start: float | None = None
    batch_samples: int | None = None  # set when one index is a whole list (batch_size=None + a BatchSampler)
    process_start: float | None = None


_state = _WorkerState()


def _note_batch_start() -> bool:
    """Note the start of a batch unless one is under way; return whether this call started it."""
    if _state.batch_start is None:
        _state.batch_start = clock()
        return True
    return False


def _forget_batch() -> None:
    """The batch never reached collation (an error, or the end of an iterable): drop its start."""
    _state.batch_start = None
    _state.batch_samples = None


def _with_index(exc: BaseException, index: Any) -> BaseException:
    """Name the sample in the exception, so the error says which file or row failed."""
    if hasattr(exc, "add_note"):
        exc.add_note(f"(raised while loading sample index {index!r})")
    return exc


class _TimedMapDataset(Dataset):
    """A transparent proxy around a map-style dataset that notes when each batch starts.

    Attribute reads and writes go to the wrapped dataset, so a ``worker_init_fn`` that sets
    ``get_worker_info().dataset.something`` behaves as it would without the proxy.
    """

    def __init__(self, inner: Dataset) -> None:
        object.__setattr__(self, "_inner", inner)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        _note_batch_start()
        if isinstance(index, (list, tuple)) or (isinstance(index, torch.Tensor) and index.dim() == 1):
            _state.batch_samples = len(index)  # a whole batch of indices in one call
        try:
            return self._inner[index]
        except Exception as exc:
            _forget_batch()
            raise _with_index(exc, index)

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        _note_batch_start()
        getitems = getattr(self._inner, "__getitems__", None)
        if getitems:
            try:
                return getitems(indices)
            except Exception as exc:
                _forget_batch()
                raise _with_index(exc, list(indices))
        out = []
        for i in indices:
            try:
                out.append(self._inner[i])
            except Exception as exc:
                _forget_batch()
                raise _with_index(exc, i)
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":  # keeps pickling and copying sane
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class _TimedIterableDataset(IterableDataset):
    """The same proxy for an ``IterableDataset``: a batch starts when its first item is asked for."""

    def __init__(self, inner: IterableDataset) -> None:
        object.__setattr__(self, "_inner", inner)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._inner)
        while True:
            started = _note_batch_start()
            try:
                item = next(it)
            except StopIteration:
                if started:  # no item of a new batch came: there is no batch to time
                    _forget_batch()
                return
            except Exception:
                _forget_batch()
                raise
            yield item

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    __getattr__ = _TimedMapDataset.__getattr__
    __setattr__ = _TimedMapDataset.__setattr__


@dataclass
class _Stamped:
    """A batch plus the worker's notes about it, on its way to the main process."""

    batch: Any
    worker: int
    start: float
    end: float
    samples: int
    nbytes: int
    process_start: float | None

    def pin_memory(self, device: Any = None) -> "_Stamped":  # called by the DataLoader's pin-memory thread
        self.batch = _pin(self.batch)
        return self


def _nbytes(obj: Any) -> int:
    """Bytes of tensors and arrays in a (nested) batch; other types count 0."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


class _TimedCollate:
    """Wraps ``collate_fn``: the batch is finished when collation returns."""

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, data: Any) -> _Stamped:
        _note_batch_start()  # an empty batch from an IterableDataset never asked for an item
        start = _state.batch_start
        batch = self.collate_fn(data)
        end = clock()
        _state.batch_start = None
        info = get_worker_info()
        samples = len(data) if self.batched else (_state.batch_samples or 1)
        _state.batch_samples = None
        return _Stamped(batch, MAIN if info is None else info.id, start, end, samples, _nbytes(batch), _state.process_start)


class _TimedWorkerInit:
    """Wraps ``worker_init_fn``: notes when the worker process came up, then runs the user's function."""

    def __init__(self, fn: Callable[[int], None] | None) -> None:
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        _state.process_start = clock()
        _state.batch_start = None
        if self.fn is not None:
            self.fn(worker_id)


@dataclass(frozen=True)
class BatchRecord:
    """What happened to one batch. Times are seconds since the epoch started (``iter(loader)``)."""

    number: int  # position in the epoch, in the order the loop received it
    worker: int  # worker id, or MAIN (-1) for the main process
    start: float  # the worker began fetching its first sample
    end: float  # the worker finished collating
    requested: float  # the loop asked for the batch (called next)
    received: float  # the loop got it
    step_end: float | None  # the loop asked for the following one: its own step was over
    samples: int
    nbytes: int

    @property
    def load(self) -> float:
        """Seconds the worker spent making this batch."""
        return self.end - self.start

    @property
    def wait(self) -> float:
        """Seconds the loop waited for this batch."""
        return self.received - self.requested

    @property
    def step(self) -> float:
        """Seconds of the loop's own work on this batch."""
        return 0.0 if self.step_end is None else self.step_end - self.received


@dataclass
class EpochRecord:
    """All batches of one pass over an :class:`InstrumentedLoader`, and what they add up to."""

    num_workers: int
    t0: float  # absolute clock() when the epoch started
    batches: list[BatchRecord] = field(default_factory=list)
    worker_started: dict[int, float] = field(default_factory=dict)  # worker -> start, seconds since t0
    end: float | None = None  # seconds since t0; None while running or if the loop broke off
    settings: dict[str, Any] = field(default_factory=dict)
    shutdown_s: float = 0.0  # the last next(), which ends the epoch (and stops non-persistent workers)

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def wall(self) -> float:
        """Seconds from ``iter(loader)`` to the end of the last step."""
        if self.end is not None:
            return self.end
        last = self.batches[-1] if self.batches else None
        return 0.0 if last is None else (last.step_end or last.received)

    @property
    def samples(self) -> int:
        return sum(b.samples for b in self.batches)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.batches)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall if self.wall > 0 else float("nan")

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.wall if self.wall > 0 else float("nan")

    @property
    def waited(self) -> float:
        """Seconds the loop spent in ``next(loader)``, including the final call that ends the epoch."""
        return sum(b.wait for b in self.batches) + self.shutdown_s

    @property
    def stall_fraction(self) -> float:
        """Share of the wall time the loop spent waiting for data (0: never, 1: always)."""
        return self.waited / self.wall if self.wall > 0 else float("nan")

    @property
    def first_batch_s(self) -> float:
        """Seconds from ``iter(loader)`` to the first batch: worker start-up plus one batch."""
        return self.batches[0].received if self.batches else float("nan")

    @property
    def steady_stall_fraction(self) -> float:
        """The stall fraction after the first batch arrived: what start-up costs are left out of."""
        rest = self.wall - self.first_batch_s
        return (sum(b.wait for b in self.batches[1:]) + self.shutdown_s) / rest if rest > 0 else float("nan")

    @property
    def worker_busy(self) -> dict[int, float]:
        """Per worker (``-1``: main process), the share of the wall time it spent making batches."""
        busy: dict[int, float] = {}
        for b in self.batches:
            busy[b.worker] = busy.get(b.worker, 0.0) + b.load
        return {w: s / self.wall for w, s in sorted(busy.items())} if self.wall > 0 else {}

    @property
    def mean_load(self) -> float:
        """Mean seconds one worker needs for one batch."""
        return float(np.mean([b.load for b in self.batches])) if self.batches else float("nan")

    @property
    def mean_step(self) -> float:
        return float(np.mean([b.step for b in self.batches])) if self.batches else float("nan")

    def summary(self) -> str:
        """A few lines a person can read (times vary between runs; the structure does not)."""
        from .timing import format_seconds

        busy = ", ".join(
            f"{'main' if w == MAIN else f'w{w}'} {share:.0%}" for w, share in self.worker_busy.items()
        )
        return (
            f"{len(self.batches)} batches, {self.samples} samples in {format_seconds(self.wall)}: "
            f"{self.samples_per_s:.0f} samples/s, {self.mb_per_s:.1f} MB/s\n"
            f"waiting for data: {self.stall_fraction:.0%} of the time; first batch after {format_seconds(self.first_batch_s)}\n"
            f"busy: {busy}"
        )


class InstrumentedLoader:
    """A real ``DataLoader`` that records, per batch, who made it and who waited for it.

    Build it exactly like a ``DataLoader``; iterate it the same way. Each pass appends an
    :class:`EpochRecord` to :attr:`history`; :attr:`last` is the latest. ``dataset``,
    ``collate_fn`` and ``worker_init_fn`` are yours; other attributes (``batch_size``,
    ``num_workers``, ``sampler``, ...) are the inner loader's. A batch is recorded when the loop
    asks for the next one (that is when its step ends). It is not a ``DataLoader`` subclass, and
    inside workers ``get_worker_info().dataset`` is a thin proxy that forwards to your dataset.
    """

    def __init__(self, dataset: Dataset | IterableDataset, *args: Any, **kwargs: Any) -> None:
        if args:  # DataLoader's positional order: batch_size, shuffle, sampler, ...
            bound = inspect.signature(DataLoader.__init__).bind(None, dataset, *args, **kwargs)
            kwargs = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
        batch_size = kwargs.get("batch_size", 1)
        batched = batch_size is not None or kwargs.get("batch_sampler") is not None
        collate_fn = kwargs.pop("collate_fn", None)
        if collate_fn is None:  # the DataLoader's own default, made explicit so it can be wrapped
            collate_fn = default_collate if batched else default_convert
        proxy = _TimedIterableDataset(dataset) if isinstance(dataset, IterableDataset) else _TimedMapDataset(dataset)
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.worker_init_fn = kwargs.pop("worker_init_fn", None)
        self.history: list[EpochRecord] = []
        self.loader = DataLoader(
            proxy,
            collate_fn=_TimedCollate(collate_fn, batched),
            worker_init_fn=_TimedWorkerInit(self.worker_init_fn),
            **kwargs,
        )
        self._settings = {
            "num_workers": self.loader.num_workers,
            "batch_size": self.loader.batch_size,
            "prefetch_factor": self.loader.prefetch_factor,
            "persistent_workers": self.loader.persistent_workers,
            "pin_memory": self.loader.pin_memory,
        }

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def last(self) -> EpochRecord:
        if not self.history:
            raise RuntimeError("nothing recorded yet: iterate over the loader first (e.g. `for batch in loader: ...`).")
        return self.history[-1]

    def __iter__(self) -> Iterator[Any]:
        epoch = EpochRecord(num_workers=self.loader.num_workers, t0=clock(), settings=dict(self._settings))
        self.history.append(epoch)
        # the main process makes the batches itself when num_workers == 0
        _state.batch_start = None
        if self.loader.num_workers == 0:
            epoch.worker_started[MAIN] = 0.0
        return _RecordingIterator(iter(self.loader), epoch)

    def __repr__(self) -> str:
        s = self._settings
        return (
            f"InstrumentedLoader({type(self.dataset).__name__}, batch_size={s['batch_size']}, "
            f"num_workers={s['num_workers']}, prefetch_factor={s['prefetch_factor']}, "
            f"persistent_workers={s['persistent_workers']}, pin_memory={s['pin_memory']}, epochs recorded={len(self.history)})"
        )


class _RecordingIterator:
    """Iterates the inner loader, records each batch, and hands the loop the plain batch."""

    def __init__(self, it: Iterator[_Stamped], epoch: EpochRecord) -> None:
        self._it = it
        self._epoch = epoch
        self._pending: dict[str, Any] | None = None  # the batch the loop is working on

    def __iter__(self) -> "_RecordingIterator":
        return self

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def _close_step(self, now: float) -> None:
        if self._pending is not None:
            self._epoch.batches.append(BatchRecord(step_end=now - self._epoch.t0, **self._pending))
            self._pending = None

    def __next__(self) -> Any:
        requested = clock()
        self._close_step(requested)
        if not self._epoch.batches and self._pending is None:
            requested = self._epoch.t0  # starting the workers (inside iter()) was waiting too
        try:
            item = next(self._it)
        except StopIteration:
            now = clock()
            self._epoch.end = now - self._epoch.t0
            self._epoch.shutdown_s = now - requested
            raise
        received = clock()
        t0 = self._epoch.t0
        if item.process_start is not None and item.worker not in self._epoch.worker_started and item.process_start >= t0:
            self._epoch.worker_started[item.worker] = item.process_start - t0
        self._pending = dict(
            number=len(self._epoch.batches),
            worker=item.worker,
            start=item.start - t0,
            end=item.end - t0,
            requested=requested - t0,
            received=received - t0,
            samples=item.samples,
            nbytes=item.nbytes,
        )
        return item.batch

    def __del__(self) -> None:  # the loop broke off: keep what it did see
        try:
            self._close_step(clock())
        except Exception:
            pass


# --- measuring a setting -------------------------------------------------------------------


def simulated_step(batch: Any, seconds: float, device: torch.device | str | None = None, non_blocking: bool = False) -> None:
    """Stand-in for a training step on an accelerator: copy the batch there, then wait ``seconds``.

    While a GPU computes, the CPU is free, which is what ``time.sleep`` models; on a CPU-only
    machine the copy is skipped. Sleeping, unlike busy work, leaves the cores to the workers.
    """
    if device is not None and torch.device(device).type != "cpu":
        tensors = batch if isinstance(batch, (list, tuple)) else [batch]
        for t in tensors:
            if isinstance(t, torch.Tensor):
                t.to(device, non_blocking=non_blocking)
    if seconds > 0:
        time.sleep(seconds)


def measure(
    dataset: Dataset | IterableDataset,
    step_s: float = 0.0,
    epochs: int = 1,
    max_batches: int | None = None,
    **loader_kwargs: Any,
) -> InstrumentedLoader:
    """Run ``epochs`` passes of a loop that takes ``step_s`` per batch; return the loader and its records."""
    loader = InstrumentedLoader(dataset, **loader_kwargs)
    for _ in range(epochs):
        for i, batch in enumerate(loader):
            simulated_step(batch, step_s)
            if max_batches is not None and i + 1 >= max_batches:
                break
    return loader


def sweep(
    dataset: Dataset | IterableDataset,
    name: str,
    values: Iterable[Any],
    step_s: float = 0.0,
    **loader_kwargs: Any,
) -> dict[Any, EpochRecord]:
    """Measure one epoch for each value of one DataLoader argument, e.g. ``sweep(ds, "num_workers", [0, 1, 2])``."""
    out = {}
    for v in values:
        kwargs = dict(loader_kwargs, **{name: v})
        if name == "num_workers" and v == 0:
            kwargs.pop("prefetch_factor", None)  # torch refuses prefetch_factor without workers
            kwargs.pop("persistent_workers", None)
        out[v] = measure(dataset, step_s=step_s, **kwargs).last
    return out


# --- pictures -------------------------------------------------------------------------------


def _lane_name(w: int) -> str:
    return "main process\n(loading)" if w == MAIN else f"worker {w}"


def plot_timeline(records: EpochRecord | InstrumentedLoader | Sequence[EpochRecord], ax: Any = None, title: str | None = None) -> Any:
    """Draw who did what when: one lane per worker, plus the training loop (waiting vs stepping).

    Pass one :class:`EpochRecord`, several (drawn one after another, on one time axis), or an
    :class:`InstrumentedLoader` (all its epochs). Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if isinstance(records, InstrumentedLoader):
        records = records.history
    epochs = [records] if isinstance(records, EpochRecord) else list(records)
    if not epochs:
        raise ValueError("nothing to draw: iterate over the loader first")
    origin = epochs[0].t0
    workers = sorted({b.worker for e in epochs for b in e.batches} | {w for e in epochs for w in e.worker_started})
    lanes = {w: i for i, w in enumerate(sorted(workers, reverse=True))}
    loop_y = len(lanes)
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.55 * (len(lanes) + 1) + 1.2))
    else:
        fig = ax.figure
    colours = plt.get_cmap("tab10")
    for e in epochs:
        off = e.t0 - origin
        for b in e.batches:
            ax.broken_barh([(off + b.start, b.load)], (lanes[b.worker] - 0.35, 0.7),
                           facecolors=colours(b.number % 10), edgecolor="white", linewidth=0.5)
            ax.broken_barh([(off + b.requested, b.wait)], (loop_y - 0.35, 0.7), facecolors="#d62728")
            ax.broken_barh([(off + b.received, b.step)], (loop_y - 0.35, 0.7), facecolors="#2ca02c")
        for w, t in e.worker_started.items():
            if w != MAIN:
                ax.plot([off + t], [lanes[w] + 0.42], marker="v", color="black", markersize=5)
        if len(epochs) > 1:
            ax.axvline(off, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks([*lanes.values(), loop_y], [*(_lane_name(w) for w in lanes), "training loop"])
    ax.set_xlabel("seconds since the first epoch started")
    ax.set_xlim(left=0)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#d62728", label="loop waits for data"), Patch(color="#2ca02c", label="loop's own step"),
                       Patch(color=colours(0), label="a worker makes a batch (colour = batch)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.28 if len(lanes) < 3 else -0.18), ncol=3, fontsize=8, frameon=False)
    e = epochs[-1]
    ax.set_title(title or f"num_workers={e.num_workers}: waiting {e.stall_fraction:.0%} of the time")
    fig.tight_layout()
    return fig


def plot_sweep(results: dict[Any, EpochRecord], name: str, ax: Any = None, title: str | None = None) -> Any:
    """Throughput (bars) and stall fraction (line) for each value of one setting."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 3.4))
    else:
        fig = ax.figure
    labels = [str(v) for v in results]
    ax.bar(labels, [r.samples_per_s for r in results.values()], color="#1f77b4")
    ax.set_xlabel(name)
    ax.set_ylabel("samples / s", color="#1f77b4")
    ax2 = ax.twinx()
    ax2.plot(labels, [100 * r.stall_fraction for r in results.values()], color="#d62728", marker="o")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("% of time waiting for data", color="#d62728")
    ax.set_title(title or f"throughput and data stall vs {name}")
    fig.tight_layout()
    return fig
