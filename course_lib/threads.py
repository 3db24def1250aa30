"""Notebook 12, section 6: threads instead of worker processes, measured on the same work.

A ``DataLoader`` worker is a process: each has its own interpreter and GIL, and every batch crosses to the training
process through shared memory. A thread pipeline (Meta's SPDL, torchdata.nodes' ``ParallelMapper`` with
``method="thread"``, or a ``ThreadPoolExecutor`` of your own) runs its workers in the training process: no
pickling, no ``/dev/shm``, no copy of the dataset per worker, one cache for all. Threads run in parallel only where
the work releases the GIL (system calls such as ``preadv``, NumPy and torch operations, decoders written in C).

:func:`compare_threads` reads the same raw file with the same per-sample ``work`` every way, in interleaved rounds,
and reports for each reader its GB/s, its CPU seconds per GB (the training process's own, and the total with its
workers), and its memory (PSS of the training process and its workers). :func:`torch_work` releases the GIL;
:func:`python_work` holds it.
"""

from __future__ import annotations

import collections
import os
import queue
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from .support import check_int
from .highrate import RawDataError, RingLoader, Float32Samples, read_into, rate_and_cpu

__all__ = [
    "SpdlBatches",
    "ThreadBatches",
    "WORK",
    "WorkedSamples",
    "compare_threads",
    "nodes_batches",
    "plot_threads",
    "python_work",
    "torch_work",
    "worker_method_available",
]

PYTHON_VALUES = 32768  # values of each sample that python_work visits in a Python loop


def torch_work(sample: torch.Tensor) -> None:
    """Notebook 12, section 6: work that releases the GIL: three torch operations over every value of the sample, in place."""
    sample.mul_(0.5).add_(0.25).sqrt_()


def python_work(sample: torch.Tensor) -> None:
    """Notebook 12, section 6: work that holds the GIL: a loop in Python over the first values of the sample (a per-sample statistic, as
    hand-written parsing or feature code does), then one torch operation to apply it."""
    total = 0.0
    for value in sample[:PYTHON_VALUES].tolist():
        total += value * value
    sample.mul_(1.0 / (1.0 + total / PYTHON_VALUES))


WORK: dict[str, Callable[[torch.Tensor], None]] = {
    "work that releases the GIL (preadv + torch)": torch_work,
    "work that holds the GIL (a Python loop)": python_work,
}


class WorkedSamples(Dataset):
    """Notebook 12, section 6: sample ``i`` of a raw float32 file, read with ``preadv`` into a fresh tensor, then ``work`` done on it in place.

    The file is opened in each process (or once, shared by threads: ``preadv`` takes its offset, so threads never
    disturb each other)."""

    def __init__(self, raw: Float32Samples, work: Callable[[torch.Tensor], None]) -> None:
        self.raw, self.work = raw, work
        self._fd, self._pid = None, -1

    def __len__(self) -> int:
        return self.raw.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.raw.path, os.O_RDONLY), os.getpid()
        sample = torch.empty(self.raw.sample_len)
        read_into(self._fd, memoryview(sample.numpy()).cast("B"), index * self.raw.sample_bytes)
        self.work(sample)
        return sample

    def read_batch(self, indices: list[int]) -> torch.Tensor:
        """Notebook 12, section 6: samples ``indices`` read straight into **one** batch tensor, ``work`` done on each in
        place: no tensor per sample, no stacking (one task per batch, as SPDL's and torchdata's guides advise)."""
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.raw.path, os.O_RDONLY), os.getpid()
        batch = torch.empty(len(indices), self.raw.sample_len)
        for sample, index in zip(batch, indices):
            read_into(self._fd, memoryview(sample.numpy()).cast("B"), index * self.raw.sample_bytes)
            self.work(sample)
        return batch

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": -1}


def _batches_of(n: int, batch_size: int) -> list[list[int]]:
    """The indices ``0 .. n-1`` cut into batches of ``batch_size`` (the last one shorter): a batch sampler's output."""
    return [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]


def _spdl_available() -> bool:
    """Whether SPDL (``pip install spdl``) imports here."""
    try:
        import spdl.pipeline  # noqa: F401
    except ImportError:
        return False
    return True


class SpdlBatches:
    """Notebook 12, section 6: batches of ``dataset`` through **one** SPDL pipeline, built once and kept across passes.

    As SPDL's guides advise: one task per batch (``dataset.read_batch``, into one batch tensor), ``threads`` tasks at a
    time, and a continuous source (``add_source(..., continuous=True)``: the pipeline is reused for every epoch, not
    rebuilt). The source hands out each pass's batches only when that pass begins, as a ``DataLoader``'s sampler
    does: nothing is read ahead between passes. ``close()`` (or the end of the interpreter) stops the pipeline."""

    def __init__(self, dataset: WorkedSamples, batch_size: int, threads: int) -> None:
        from spdl.pipeline import PipelineBuilder

        self.batches = _batches_of(len(dataset), check_int(batch_size, "batch_size", 1))
        self._passes = _PassGate()
        self.pipeline = (
            PipelineBuilder()
            .add_source(self._passes, continuous=True)  # re-iterated every pass by the same pipeline
            .pipe(dataset.read_batch, concurrency=check_int(threads, "threads", 1), output_order="input")
            .add_sink(buffer_size=2)
            .build(num_threads=threads)
        )
        self._stop = weakref.finalize(self, _stop_spdl, self._passes, self.pipeline)  # once: close(), gc or exit

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if not self._stop.alive:
            raise RuntimeError("this SpdlBatches is closed")
        self._passes.begin(self.batches)  # the source starts this pass's batches now ...
        batches = self.pipeline.get_iterator(timeout=60)  # ... and the pass ends at the source's end of epoch
        try:
            yield from batches
        finally:
            if self._stop.alive:  # a loop that stopped early: finish this pass, so that the next one starts clean
                for _ in batches:
                    pass

    def close(self) -> None:
        self._stop()


class _PassGate:
    """A source that waits for each pass's batches (``begin``) and then hands them out; ``close`` ends it for good."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False

    def begin(self, batches: list[list[int]]) -> None:
        self._queue.put(batches)

    def close(self) -> None:
        self.closed = True
        self._queue.put(None)  # wakes a source thread that waits for a pass

    def __iter__(self) -> Iterator[list[int]]:
        batches = None if self.closed else self._queue.get()
        yield from batches or ()


def _stop_spdl(gate: _PassGate, pipeline: Any) -> None:
    """Stop an :class:`SpdlBatches` pipeline: release its source thread (SPDL cannot interrupt a waiting source, and
    its thread would keep the interpreter alive), then stop the pipeline."""
    gate.close()
    pipeline.stop()


def nodes_batches(dataset: WorkedSamples, batch_size: int, threads: int) -> Iterable[torch.Tensor]:
    """Notebook 12, section 6: the same with torchdata.nodes (torchdata is in maintenance since 2026-06), as its guide from
    the DataLoader builds it: batches of indices, one ``ParallelMapper`` task per batch, a ``Loader`` reused every pass."""
    import torchdata.nodes as tn

    node = tn.IterableWrapper(_batches_of(len(dataset), batch_size))  # a batch sampler's output, again every pass
    node = tn.ParallelMapper(node, map_fn=dataset.read_batch, num_workers=threads, method="thread", in_order=True)
    return tn.Loader(node)


class ThreadBatches:
    """Notebook 12, exercise 12.5 (the course's version): batches of a raw float32 file, read by a thread pool into
    reused buffers, at most ``in_flight`` batches read ahead of the loop.

    ``in_flight + 1`` buffers are allocated once: ``in_flight`` being filled, one held by the loop. A batch is valid
    until the next one is requested (``.clone()`` what you keep). Each read is one ``preadv`` at the batch's offset,
    which releases the GIL and never moves a shared file position. ``work``, if given, runs on every sample, in the
    reading thread."""

    def __init__(
        self,
        raw: Float32Samples,
        batch_size: int,
        threads: int = 2,
        in_flight: int = 2,
        work: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        if len(raw.files) != 1:
            raise RawDataError(f"ThreadBatches reads one raw file; this description spans {len(raw.files)} files")
        self.raw, self.batch_size = raw, check_int(batch_size, "batch_size", 1)
        self.threads, self.in_flight = check_int(threads, "threads", 1), check_int(in_flight, "in_flight", 1)
        self.work = work
        self.buffers = [torch.empty(batch_size, raw.sample_len) for _ in range(in_flight + 1)]

    def __len__(self) -> int:
        return -(-self.raw.n // self.batch_size)

    def _read(self, fd: int, number: int, buffer: torch.Tensor) -> torch.Tensor:
        first = number * self.batch_size
        batch = buffer[: min(self.batch_size, self.raw.n - first)]
        read_into(fd, memoryview(batch.numpy()).cast("B"), first * self.raw.sample_bytes)
        if self.work is not None:
            for sample in batch:
                self.work(sample)
        return batch

    def __iter__(self) -> Iterator[torch.Tensor]:
        fd = os.open(self.raw.path, os.O_RDONLY)
        pending: collections.deque = collections.deque()
        try:
            with ThreadPoolExecutor(self.threads) as pool:
                for number in range(len(self)):
                    buffer = self.buffers[number % len(self.buffers)]
                    pending.append(pool.submit(self._read, fd, number, buffer))
                    if len(pending) > self.in_flight:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            for future in pending:  # a loop that stopped early: let the reads in flight end before the file closes
                future.cancel()
            for future in pending:
                if not future.cancelled():
                    future.exception()
            os.close(fd)


def worker_method_available() -> bool:
    """Notebook 12, section 7: whether this torch's ``DataLoader`` takes ``worker_method="thread"`` (pytorch/pytorch#161044): not in 2.14.1 or
    2.15.0, whose ``WorkerInfo`` already has a ``worker_method`` field but whose ``DataLoader`` takes no such argument."""
    import inspect

    return "worker_method" in inspect.signature(DataLoader.__init__).parameters


@dataclass
class Measured:
    """Notebook 12, section 6: one reader's measurements, one per round: GB/s, CPU seconds per GB (the training
    process alone, and with its worker processes), and MB of PSS (the training process and its workers, after the pass)."""

    gbps: list[float] = field(default_factory=list)
    main_cpu: list[float] = field(default_factory=list)
    total_cpu: list[float] = field(default_factory=list)
    pss_mb: list[float] = field(default_factory=list)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _children_cpu(me: psutil.Process) -> dict[int, float]:
    out = {}
    for child in me.children(recursive=True):
        try:
            out[child.pid] = _cpu_seconds(child)
        except psutil.Error:  # it ended meanwhile
            pass
    return out


def _pss_mb(processes: Iterable[psutil.Process]) -> float:
    total = 0
    for p in processes:
        try:
            total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):  # gone, or no PSS on this OS (Linux has it)
            pass
    return total / 1e6


def _one_pass(
    make: Callable[[], Iterable[torch.Tensor]],
    nbytes: int,
    row: Measured | None,
    workers: Callable[[], list[psutil.Process]] = list,
) -> None:
    """One pass (:func:`highrate.rate_and_cpu`: GB/s and this process's CPU per GB), plus its workers' CPU and the PSS."""
    me = psutil.Process()
    before = _children_cpu(me)
    rate, main_per_gb = rate_and_cpu(make, nbytes)
    if row is None:
        return
    others = sum(cpu - before.get(pid, 0.0) for pid, cpu in _children_cpu(me).items())
    row.gbps.append(rate)
    row.main_cpu.append(main_per_gb)
    row.total_cpu.append(main_per_gb + others / (nbytes / 1e9))
    row.pss_mb.append(_pss_mb([me, *workers()]))


def compare_threads(
    raw: Float32Samples, work: Callable[[torch.Tensor], None], batch_size: int = 16, workers: int = 2, rounds: int = 3
) -> dict[str, Measured]:
    """Notebook 12, section 6: every reader over the same file with the same per-sample ``work``, ``workers`` processes or threads each.

    Like with like: every reader is built **once**, as its documentation recommends, and kept across passes (the
    ``DataLoader``'s workers persistent, the ``RingLoader``'s started with it, the SPDL pipeline and the torchdata
    ``Loader`` reused); each makes one untimed pass (which starts its workers or threads), then one pass per round, in
    turn, on one torch thread each. So no row counts a start-up or a shutdown. The ``DataLoader`` reads each sample
    into its own tensor and collates them (its plain use); the thread pipelines read each batch into one tensor, one
    task per batch (SPDL's and torchdata's guides). CPU seconds: the training process's own (``main_cpu``) and with
    its worker processes (``total_cpu``): a thread pipeline's workers are in ``main_cpu``. PSS: the training process
    and this reader's workers, after each pass."""
    check_int(rounds, "rounds", 1)
    me = psutil.Process()
    dataset = WorkedSamples(raw, work)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ring = RingLoader(raw, batch_size, num_workers=workers, transform=work)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, persistent_workers=True)
    nodes = nodes_batches(dataset, batch_size, workers)
    spdl = SpdlBatches(dataset, batch_size, workers) if _spdl_available() else None
    readers: dict[str, Callable[[], Iterable[torch.Tensor]]] = {
        f"DataLoader, {workers} worker processes": lambda: loader,
        f"RingLoader, {workers} worker processes": lambda: ring,
        f"ThreadBatches, {workers} threads": lambda: ThreadBatches(raw, batch_size, threads=workers, work=work),
        f"torchdata.nodes, {workers} threads": lambda: nodes,
    }
    if spdl is not None:
        readers[f"SPDL pipeline, {workers} threads"] = lambda: spdl
    try:
        rows = {name: Measured() for name in readers}
        own: dict[str, list[psutil.Process]] = {}  # each reader's worker processes (none for threads)
        for name, make in readers.items():
            known = {c.pid for c in me.children(recursive=True)}
            _one_pass(make, raw.nbytes, None)
            own[name] = [c for c in me.children(recursive=True) if c.pid not in known]
        own[f"RingLoader, {workers} worker processes"] = [psutil.Process(p.pid) for p in ring._procs]  # started with it
        for _ in range(rounds):
            for name, make in readers.items():
                _one_pass(make, raw.nbytes, rows[name], lambda: own[name])
        return rows
    finally:
        torch.set_num_threads(threads)
        ring.close()
        if spdl is not None:
            spdl.close()
        loader = None  # the last reference: its persistent workers stop now


def plot_threads(by_work: dict[str, dict[str, Measured]]) -> Any:
    """Notebook 12, section 6: per kind of work (a row), each reader's median GB/s, and its CPU seconds per GB:
    the training process's own (solid) and its worker processes' (hatched). Threads blue, processes orange."""
    import statistics

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(by_work), 2, figsize=(11, 1.2 + 1.6 * len(by_work)), dpi=80, sharey="row")
    for (kind, rows), (rate_ax, cpu_ax) in zip(by_work.items(), axes.reshape(len(by_work), 2)):
        names = list(rows)
        y = range(len(names))
        colours = ["#4C72B0" if "thread" in n else "#DD8452" for n in names]
        rate_ax.barh(y, [statistics.median(rows[n].gbps) for n in names], color=colours)
        rate_ax.set(yticks=y, yticklabels=names, xlabel="GB/s (longer is faster)", title=kind)
        main = [statistics.median(rows[n].main_cpu) for n in names]
        total = [max(m, statistics.median(rows[n].total_cpu)) for n, m in zip(names, main)]
        cpu_ax.barh(y, main, color=colours)
        cpu_ax.barh(y, [t - m for t, m in zip(total, main)], left=main, color="white", edgecolor="#888888", hatch="//")
        cpu_ax.set(
            xlabel="CPU seconds per GB (shorter is cheaper)",
            title="CPU: training process (solid), its workers (hatched)",
        )
        rate_ax.invert_yaxis()
        for ax in (rate_ax, cpu_ax):
            ax.margins(x=0.12)  # room between the longest bar and the frame
    fig.tight_layout()
    return fig
