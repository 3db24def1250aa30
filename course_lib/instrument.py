"""Notebook 04: an instrumented ``DataLoader``, to see where the time goes.

:class:`InstrumentedLoader` builds a real ``DataLoader`` from the same arguments (same batches, order and
workers) and records per batch which worker made it and when, how long the loop waited for it and how long
its own step took: in each worker, ``_TimedDataset`` stamps every sample with the moment it was asked for
and ``_TimedCollate`` sends the stamp along with the batch. Times come from ``time.perf_counter()``.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, default_convert

from .iterable import worker_slot
from .timing import format_seconds

__all__ = [
    "BatchRecord",
    "EpochRecord",
    "InstrumentedLoader",
    "timed_loader",
    "plot_sweep",
    "plot_timeline",
    "simulated_step",
    "sweep",
]

_MAIN = -1  # the worker id recorded for batches made in the main process (num_workers=0)
_clock = time.perf_counter
_process_start: float | None = None  # set in each worker process when it starts (by _TimedWorkerInit)


# --------------------------------------------------------------------------- in the workers
@dataclass
class _Stamped:
    """A sample (or a list of samples) and the moment it was asked for."""

    start: float
    value: Any
    count: int = 1


def _fetch(get: Callable[[Any], Any], index: Any) -> Any:
    """``get(index)``; an error it raises names the index, so the message says which file or row failed."""
    try:
        return get(index)
    except Exception as exc:
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"(raised while loading sample index {index!r})")
        raise


class _TimedDataset(Dataset):
    """Your dataset, each sample stamped with the moment it was asked for; its attributes are your dataset's."""

    def __init__(self, inner: Dataset) -> None:
        object.__setattr__(self, "inner", inner)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> _Stamped:
        start, count = _clock(), len(index) if isinstance(index, (list, tuple)) else 1  # a list: a batch at once
        return _Stamped(start, _fetch(self.inner.__getitem__, index), count)

    def __getitems__(self, indices: Sequence[Any]) -> _Stamped:  # the DataLoader asks for a batch's samples at once
        start = _clock()
        getitems = getattr(self.inner, "__getitems__", None)
        samples = _fetch(getitems, indices) if getitems else [_fetch(self.inner.__getitem__, i) for i in indices]
        return _Stamped(start, samples, len(indices))

    def __iter__(self) -> Iterator[_Stamped]:  # IterableDataset: a batch starts when its first item is asked for
        start = _clock()
        for item in self.inner:  # type: ignore[attr-defined]
            yield _Stamped(start, item)
            start = _clock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "inner":  # keeps pickling and copying sane
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:  # worker_init_fn's get_worker_info().dataset.x = ... too
        setattr(self.inner, name, value)


class _TimedIterable(_TimedDataset, IterableDataset):
    """The same wrapper, seen by the DataLoader as an ``IterableDataset``."""


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors, arrays and bytes in a (nested) batch; anything else counts 0."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(_nbytes(v) for v in items)


class _TimedCollate:
    """Wraps ``collate_fn``: collates the samples and returns ``(batch, stamp)`` to the main process."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, data: _Stamped | list[_Stamped]) -> tuple[Any, tuple]:
        if isinstance(data, _Stamped):  # a whole batch fetched at once, or one unbatched sample
            start, samples, count = data.start, data.value, data.count
        else:  # one stamped sample per item (an IterableDataset)
            start, samples, count = min(d.start for d in data), [d.value for d in data], len(data)
        batch = self.collate_fn(samples)
        return batch, (worker_slot(main=_MAIN)[0], start, _clock(), count, _nbytes(batch), _process_start)


class _TimedWorkerInit:
    """Wraps ``worker_init_fn``: notes when the worker process came up, then runs yours."""

    def __init__(self, fn: Callable[[int], None] | None) -> None:
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        global _process_start
        _process_start = _clock()
        if self.fn is not None:
            self.fn(worker_id)


# --------------------------------------------------------------------------- the records
@dataclass
class BatchRecord:
    """Notebook 04, section 2: what happened to one batch. Times are seconds since the epoch started (``iter(loader)``)."""

    number: int  # position in the epoch, in the order the loop received it
    worker: int  # worker id, or -1 for the main process
    start: float  # the worker began fetching its first sample
    end: float  # the worker finished collating
    requested: float  # the loop asked for the batch (called next)
    received: float  # the loop got it
    step_end: float | None  # the loop asked for the following one: its own step was over (None until then)
    samples: int
    nbytes: int

    @property
    def load(self) -> float:  # seconds the worker spent making this batch
        return self.end - self.start

    @property
    def wait(self) -> float:  # seconds the loop waited for this batch
        return self.received - self.requested

    @property
    def step(self) -> float:  # seconds of the loop's own work on this batch
        return 0.0 if self.step_end is None else self.step_end - self.received


@dataclass
class EpochRecord:
    """Notebook 04, section 2: all batches of one pass over an :class:`InstrumentedLoader`, and what they add up to."""

    num_workers: int
    t0: float  # absolute clock time when the epoch started
    batches: list[BatchRecord] = field(default_factory=list)
    worker_started: dict[int, float] = field(default_factory=dict)  # worker -> start, seconds since t0
    end: float | None = None  # seconds since t0; None while running or if the loop broke off
    settings: dict[str, Any] = field(default_factory=dict)
    shutdown_s: float = 0.0  # the last next(), which ends the epoch (and stops non-persistent workers)

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def wall(self) -> float:  # seconds from iter(loader) to the end of the last step
        if self.end is not None or not self.batches:
            return self.end or 0.0
        return self.batches[-1].step_end or self.batches[-1].received

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
    def waited(self) -> float:  # seconds in next(loader), the final call that ends the epoch included
        return sum(b.wait for b in self.batches) + self.shutdown_s

    @property
    def stall_fraction(self) -> float:  # share of the wall time spent waiting for data (0: never, 1: always)
        return self.waited / self.wall if self.wall > 0 else float("nan")

    @property
    def first_batch_s(self) -> float:  # seconds from iter(loader) to the first batch: start-up plus one batch
        return self.batches[0].received if self.batches else float("nan")

    @property
    def steady_stall_fraction(self) -> float:  # the stall fraction after the first batch, start-up left out
        rest = self.wall - self.first_batch_s
        return (sum(b.wait for b in self.batches[1:]) + self.shutdown_s) / rest if rest > 0 else float("nan")

    @property
    def worker_busy(self) -> dict[int, float]:  # worker (-1: main process) -> share of the wall time it made batches
        workers = sorted({b.worker for b in self.batches}) if self.wall > 0 else []
        return {w: sum(b.load for b in self.batches if b.worker == w) / self.wall for w in workers}

    @property
    def mean_load(self) -> float:  # mean seconds one worker needs for one batch
        return float(np.mean([b.load for b in self.batches])) if self.batches else float("nan")

    @property
    def mean_step(self) -> float:
        return float(np.mean([b.step for b in self.batches])) if self.batches else float("nan")

    def summary(self) -> str:
        """A few lines a person can read (times vary between runs; the structure does not)."""
        busy = ", ".join(f"{'main' if w == _MAIN else f'w{w}'} {share:.0%}" for w, share in self.worker_busy.items())
        return (
            f"{len(self.batches)} batches, {self.samples} samples in {format_seconds(self.wall)}: "
            f"{self.samples_per_s:.0f} samples/s, {self.mb_per_s:.1f} MB/s\n"
            f"waiting for data: {self.stall_fraction:.0%} of the time; first batch after {format_seconds(self.first_batch_s)}\n"
            f"busy: {busy}"
        )


# --------------------------------------------------------------------------- in the main process
class InstrumentedLoader:
    """Notebook 04, section 2: a real ``DataLoader`` that records, per batch, who made it and who waited for it.

    Build and iterate it exactly like a ``DataLoader``. Each pass appends an :class:`EpochRecord` to
    :attr:`history`; :attr:`last` is the latest. ``dataset``, ``collate_fn`` and ``worker_init_fn`` are
    yours; other attributes (``batch_size``, ``num_workers``, ...) are the inner loader's. A loop that
    stops early should call ``close()`` on its iterator, which ends the last step's timing there.
    """

    def __init__(self, dataset: Dataset | IterableDataset, *args: Any, **kwargs: Any) -> None:
        if args:  # DataLoader's positional order: batch_size, shuffle, sampler, ...
            bound = inspect.signature(DataLoader.__init__).bind(None, dataset, *args, **kwargs)
            kwargs = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
        batched = kwargs.get("batch_size", 1) is not None or kwargs.get("batch_sampler") is not None
        self.dataset = dataset
        # the DataLoader's own default collate, made explicit so that it can be wrapped
        self.collate_fn = kwargs.pop("collate_fn", None) or (default_collate if batched else default_convert)
        self.worker_init_fn = kwargs.pop("worker_init_fn", None)
        self.history: list[EpochRecord] = []
        timed = _TimedIterable(dataset) if isinstance(dataset, IterableDataset) else _TimedDataset(dataset)
        self.loader = DataLoader(
            timed,
            collate_fn=_TimedCollate(self.collate_fn),
            worker_init_fn=_TimedWorkerInit(self.worker_init_fn),
            **kwargs,
        )

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

    def __iter__(self) -> _Recorder:
        settings = {
            name: getattr(self.loader, name)
            for name in ("num_workers", "batch_size", "prefetch_factor", "persistent_workers", "pin_memory")
        }
        epoch = EpochRecord(num_workers=self.loader.num_workers, t0=_clock(), settings=settings)
        if self.loader.num_workers == 0:
            epoch.worker_started[_MAIN] = 0.0  # the main process makes the batches itself
        self.history.append(epoch)
        return _Recorder(iter(self.loader), epoch)

    def __repr__(self) -> str:
        s = self.loader
        return (
            f"InstrumentedLoader({type(self.dataset).__name__}, batch_size={s.batch_size}, num_workers={s.num_workers}, "
            f"prefetch_factor={s.prefetch_factor}, persistent_workers={s.persistent_workers}, "
            f"pin_memory={s.pin_memory}, epochs recorded={len(self.history)})"
        )


class _Recorder:
    """Iterates the inner loader, records each batch, and hands the loop the plain batch."""

    def __init__(self, it: Iterator[tuple[Any, tuple]], epoch: EpochRecord) -> None:
        self.it, self.epoch = it, epoch

    def __iter__(self) -> _Recorder:
        return self

    def __len__(self) -> int:
        return len(self.it)  # type: ignore[arg-type]

    def close(self, now: float | None = None) -> None:
        """The loop stops here: the step of the last batch it received ends now (or at ``now``)."""
        if self.epoch.batches and self.epoch.batches[-1].step_end is None:
            self.epoch.batches[-1].step_end = (_clock() if now is None else now) - self.epoch.t0

    def __next__(self) -> Any:
        t0, requested = self.epoch.t0, _clock()
        self.close(requested)  # asking for a batch ends the step on the previous one
        if not self.epoch.batches:
            requested = t0  # starting the workers (inside iter()) was waiting too
        try:
            batch, (worker, start, end, samples, nbytes, process_start) = next(self.it)
        except StopIteration:
            now = _clock()
            self.epoch.end, self.epoch.shutdown_s = now - t0, now - requested
            raise
        received = _clock()
        if process_start is not None and process_start >= t0:  # a worker started for this epoch
            self.epoch.worker_started.setdefault(worker, process_start - t0)
        self.epoch.batches.append(
            BatchRecord(
                len(self.epoch.batches),
                worker,
                start - t0,
                end - t0,
                requested - t0,
                received - t0,
                None,
                samples,
                nbytes,
            )
        )
        return batch


# --------------------------------------------------------------------------- measuring a setting
def simulated_step(
    batch: Any, seconds: float, device: torch.device | str | None = None, non_blocking: bool = False
) -> None:
    """Notebook 04, section 1: stand-in for a training step on an accelerator, copy the batch there, then wait ``seconds``.
    A GPU computing leaves the CPU free: ``time.sleep`` models that (busy work would not). No copy to a CPU device."""
    if device is not None and torch.device(device).type != "cpu":
        for t in batch if isinstance(batch, (list, tuple)) else [batch]:
            if isinstance(t, torch.Tensor):
                t.to(device, non_blocking=non_blocking)
    if seconds > 0:
        time.sleep(seconds)


def timed_loader(
    dataset: Dataset | IterableDataset,
    step_s: float = 0.0,
    epochs: int = 1,
    max_batches: int | None = None,
    **loader_kwargs: Any,
) -> InstrumentedLoader:
    """Notebook 04, section 3: run ``epochs`` passes of a loop that takes ``step_s`` per batch; return the loader and its records."""
    loader = InstrumentedLoader(dataset, **loader_kwargs)
    for _ in range(epochs):
        it = iter(loader)
        for i, batch in enumerate(it):
            simulated_step(batch, step_s)
            if max_batches is not None and i + 1 >= max_batches:
                break
        it.close()
        loader.last.settings.update(step_s=step_s)  # the workload, for the checks
    return loader


def sweep(
    dataset: Dataset | IterableDataset, name: str, values: Iterable[Any], step_s: float = 0.0, **loader_kwargs: Any
) -> dict[Any, EpochRecord]:
    """Notebook 04, section 3: measure one epoch for each value of one DataLoader argument, e.g. ``sweep(ds, "num_workers", [0, 1, 2])``."""
    out = {}
    for v in values:
        kwargs = {**loader_kwargs, name: v}
        if name == "num_workers" and v == 0:  # torch refuses these two without workers
            kwargs = {k: x for k, x in kwargs.items() if k not in ("prefetch_factor", "persistent_workers")}
        out[v] = timed_loader(dataset, step_s=step_s, **kwargs).last
    return out


# --------------------------------------------------------------------------- pictures
def plot_timeline(
    records: EpochRecord | InstrumentedLoader | Sequence[EpochRecord], ax: Any = None, title: str | None = None
) -> Any:
    """Notebook 04, section 2: who did what when, one lane per worker plus the training loop (waiting vs stepping).

    Draws one :class:`EpochRecord`, several (one after another) or an :class:`InstrumentedLoader`'s; returns the Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    epochs = records.history if isinstance(records, InstrumentedLoader) else records
    epochs = [epochs] if isinstance(epochs, EpochRecord) else list(epochs)
    if not epochs:
        raise ValueError("nothing to draw: iterate over the loader first")
    workers = sorted({b.worker for e in epochs for b in e.batches} | {w for e in epochs for w in e.worker_started})
    lanes = {w: i for i, w in enumerate(reversed(workers))}
    loop_y = len(lanes)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.55 * (len(lanes) + 1) + 1.4))
    colours = plt.get_cmap("tab10")
    for e in epochs:
        off = e.t0 - epochs[0].t0
        for b in e.batches:
            ax.broken_barh(
                [(off + b.start, b.load)],
                (lanes[b.worker] - 0.35, 0.7),
                facecolors=colours(b.number % 10),
                edgecolor="white",
                linewidth=0.5,
            )
            ax.broken_barh([(off + b.requested, b.wait)], (loop_y - 0.35, 0.7), facecolors="#d62728")
            ax.broken_barh([(off + b.received, b.step)], (loop_y - 0.35, 0.7), facecolors="#2ca02c")
        for w, t in e.worker_started.items():
            if w != _MAIN:
                ax.plot([off + t], [lanes[w] + 0.42], marker="v", color="black", markersize=5)
        if len(epochs) > 1:
            ax.axvline(off, color="grey", linestyle=":", linewidth=1)
    names = ["main process\n(loading)" if w == _MAIN else f"worker {w}" for w in lanes]
    ax.set_yticks([*lanes.values(), loop_y], [*names, "training loop"])
    ax.set(
        xlabel="seconds since the first epoch started", xlim=(0, None), ylim=(-0.6, loop_y + 1.3)
    )  # room for the legend
    maker = "the main process makes" if workers == [_MAIN] else "a worker makes"
    ax.legend(
        handles=[
            Patch(color="#d62728", label="loop waits for data"),
            Patch(color="#2ca02c", label="loop's own step"),
            Patch(color=colours(0), label=f"{maker} a batch (colour = batch)"),
        ],
        loc="upper center",
        ncol=3,
        fontsize=8,
        frameon=False,
        borderaxespad=0.1,
    )
    ax.set_title(title or f"num_workers={epochs[-1].num_workers}: waiting {epochs[-1].stall_fraction:.0%} of the time")
    ax.figure.tight_layout()
    return ax.figure


def plot_sweep(results: dict[Any, EpochRecord], name: str, ax: Any = None, title: str | None = None) -> Any:
    """Notebook 04, section 3: throughput (bars) and stall fraction (line) for each value of one setting."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = [str(v) for v in results]
    ax.bar(labels, [r.samples_per_s for r in results.values()], color="#1f77b4")
    ax.set(xlabel=name, title=title or f"throughput and data stall vs {name}")
    ax.set_ylabel("samples / s", color="#1f77b4")
    ax2 = ax.twinx()
    ax2.plot(labels, [100 * r.stall_fraction for r in results.values()], color="#d62728", marker="o")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("% of time waiting for data", color="#d62728")
    ax.figure.tight_layout()
    return ax.figure
