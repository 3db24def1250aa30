"""Notebook 08: iterable-style datasets, streams, worker sharding, endless data.

Every DataLoader worker iterates its own *copy* of an ``IterableDataset``, so each must take only its share:
the naive :class:`RangeStream`, fixed from outside (:func:`split_range_per_worker`) or inside
(:class:`ShardedStream`); buffer shuffling; endless streams; what the DataLoader makes of a stream's batches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import count, zip_longest
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .support import check_int
from .datasets import ImageFileDataset

__all__ = [
    "BufferShuffled",
    "EndlessStream",
    "ImageStream",
    "RangeStream",
    "ShardedStream",
    "buffer_shuffle",
    "contiguous_share",
    "count_copies",
    "epoch_batch_sizes",
    "loader_batches",
    "plot_batches",
    "plot_copies",
    "split_range_per_worker",
    "strided_share",
    "worker_shares",
    "worker_slot",
]

_T = TypeVar("_T")


def worker_slot(main: int = 0) -> tuple[int, int]:
    """Notebook 08, section 3: ``(worker id, number of workers)`` of the calling process.
    Outside DataLoader workers (``num_workers=0``) the main process is the only worker: ``(main, 1)``."""
    info = get_worker_info()
    return (main, 1) if info is None else (info.id, info.num_workers)


def _check_slot(n: int, worker_id: int, num_workers: int) -> None:
    check_int(n, "n", 0)
    if check_int(worker_id, "worker_id", 0) >= check_int(num_workers, "num_workers", 1):
        raise ValueError(f"worker_id must be in 0..{num_workers - 1}, got {worker_id}")


def contiguous_share(n: int, worker_id: int, num_workers: int) -> range:
    """Notebook 08, section 3: worker ``worker_id``'s block of ``0..n-1``; the first ``n % num_workers`` get one more.

    As ``numpy.array_split``; torch's docstring example uses blocks of ``ceil(n / k)``, leaving the last workers nothing.
    """
    _check_slot(n, worker_id, num_workers)
    base, extra = divmod(n, num_workers)
    start = worker_id * base + min(worker_id, extra)
    return range(start, start + base + (1 if worker_id < extra else 0))


def strided_share(n: int, worker_id: int, num_workers: int) -> range:
    """Notebook 08, section 3: worker ``worker_id``'s positions ``worker_id, worker_id + k, ...`` of ``0..n-1``."""
    _check_slot(n, worker_id, num_workers)
    return range(worker_id, n, num_workers)


_SHARDINGS = {"contiguous": contiguous_share, "strided": strided_share}


class RangeStream(IterableDataset):
    """Notebook 08, section 2: the numbers ``0 .. n-1``, yielded whole by every process that iterates the dataset.

    The naive stream: with ``num_workers=k`` every number arrives ``k`` times. ``with_worker=True`` yields
    ``(number, worker id)`` pairs (``-1`` in the main process). ``len()`` is right in one process only.
    """

    def __init__(self, n: int, *, with_worker: bool = False) -> None:
        self.start, self.stop, self.with_worker = 0, check_int(n, "n", 0), with_worker

    def __iter__(self) -> Iterator[Any]:
        worker, _ = worker_slot(main=-1)  # every process that iterates this yields all of it
        for i in range(self.start, self.stop):
            yield (i, worker) if self.with_worker else i

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(start={self.start}, stop={self.stop})"


def split_range_per_worker(worker_id: int) -> None:
    """Notebook 08, section 3: a ``worker_init_fn``: narrow this worker's copy of a :class:`RangeStream` to its block.

    ``get_worker_info().dataset`` is the worker's own copy: changing it changes nothing elsewhere.
    """
    info = get_worker_info()
    if info is None:
        raise RuntimeError("split_range_per_worker is a worker_init_fn: the DataLoader calls it inside workers")
    ds = info.dataset
    share = contiguous_share(ds.stop - ds.start, worker_id, info.num_workers)
    ds.start, ds.stop = ds.start + share.start, ds.start + share.stop


class _Epochs(IterableDataset):
    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch number ``epoch`` from now on (seen by workers started afterwards)."""
        self.epoch = int(epoch)


class ShardedStream(_Epochs):
    """Notebook 08, sections 3-4: the numbers ``0 .. n-1``, each yielded once over all workers (and ranks, given
    ``rank``/``world_size`` in the main process as to a ``DistributedSampler``: exercise 08.2): each takes its share.

    ``sharding`` is ``"strided"`` (worker ``w`` takes positions ``w, w+k, ...``) or ``"contiguous"`` (blocks).
    ``shuffle=True`` first permutes the positions with ``(seed, epoch)``: the same permutation in every
    worker, so the shares still cover everything once. ``seed_per_worker=True`` is the mistake of seeding
    each worker differently: samples then repeat or go missing. ``len()`` is ``n``.
    """

    def __init__(
        self,
        n: int,
        sharding: str = "strided",
        *,
        shuffle: bool = False,
        seed: int = 0,
        seed_per_worker: bool = False,
        with_worker: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if sharding not in _SHARDINGS:
            raise ValueError(f"sharding must be one of {', '.join(map(repr, _SHARDINGS))}, got {sharding!r}")
        self.n, self.sharding, self.share = check_int(n, "n", 0), sharding, _SHARDINGS[sharding]
        self.shuffle, self.seed, self.seed_per_worker, self.with_worker = shuffle, seed, seed_per_worker, with_worker
        self.rank, self.world_size = rank, world_size

    def order(self, worker_id: int = 0) -> np.ndarray:
        """The positions in the order worker ``worker_id`` cuts its share from (all of ``0..n-1``)."""
        if not self.shuffle:
            return np.arange(self.n)
        key = [self.seed, self.epoch] + ([worker_id] if self.seed_per_worker else [])
        return np.random.default_rng(key).permutation(self.n)

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = worker_slot()  # (0, 1) in the main process (num_workers=0)
        label = worker_slot(main=-1)[0]  # what with_worker reports: -1 for the main process
        order = self.order(worker)  # 0..n-1, or a permutation that every worker draws alike
        reader, readers = self.rank * num_workers + worker, self.world_size * num_workers
        for position in self.share(self.n, reader, readers):  # this worker's positions only
            i = int(order[position])
            yield (i, label) if self.with_worker else i

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, sharding={self.sharding!r}, shuffle={self.shuffle})"


def buffer_shuffle(items: Iterable[_T], size: int, rng: np.random.Generator) -> Iterator[_T]:
    """Notebook 08, section 4: shuffle a stream of unknown length with a buffer of ``size`` items.

    Once the buffer is full, every arriving item replaces a random one, which is yielded; at the end
    the rest comes out shuffled. An item moves back by less than ``size``: a larger buffer mixes
    better and costs more memory and start-up time. (WebDataset's and tf.data's ``shuffle`` do this.)
    """
    size = check_int(size, "size", 1)
    buffer: list[_T] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = int(rng.integers(size))
        yield buffer[j]
        buffer[j] = item
    rng.shuffle(buffer)  # type: ignore[arg-type]
    yield from buffer


class BufferShuffled(_Epochs):
    """Notebook 08, section 4: ``source`` (an iterable dataset) shuffled by :func:`buffer_shuffle` in each worker.
    Each worker seeds with ``(seed, epoch, worker id)``; :meth:`set_epoch` is passed on to ``source``."""

    def __init__(self, source: IterableDataset, size: int, seed: int = 0) -> None:
        self.source, self.size, self.seed = source, check_int(size, "size", 1), seed

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        rng = np.random.default_rng([self.seed, self.epoch, worker_slot()[0]])
        return buffer_shuffle(self.source, self.size, rng)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, size={self.size})"


class EndlessStream(_Epochs):
    """Notebook 08, section 6: a stream that never ends: ``(x, worker, step)``, ``x`` a float vector of ``dim``.

    Worker ``w`` of rank ``r`` draws from ``default_rng((seed, epoch, r, w))``: the same on every run, different
    between workers and between DDP ranks (``RANK``, set by torchrun and by ``distributed.start`` under srun; without
    it every rank would train on the same batches). ``worker`` is ``-1`` in the main process; ``step`` counts this
    worker's samples. No ``len()``: take a fixed number of batches per "epoch" with ``itertools.islice``.
    """

    def __init__(self, seed: int = 0, dim: int = 4) -> None:
        self.seed, self.dim = seed, check_int(dim, "dim", 1)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int]]:
        worker = worker_slot(main=-1)[0]
        rng = np.random.default_rng([self.seed, self.epoch, int(os.environ.get("RANK", 0)), max(worker, 0)])
        for step in count():
            yield torch.from_numpy(rng.standard_normal(self.dim).astype(np.float32)), worker, step

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed}, dim={self.dim})"


class ImageStream(ShardedStream):
    """Notebook 08, section 3: the images of ``root/<split>/<class>/<file>``, read in order, sharded by worker.

    Yields ``(transform(image), label)`` like :class:`course_lib.datasets.ImageFileDataset`, whose file
    list and decoding it reuses; ``shuffle=True`` permutes the order as :class:`ShardedStream` does.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str | None = "train",
        transform: Callable | None = None,
        *,
        sharding: str = "strided",
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        self.images = ImageFileDataset(root, split, transform=transform)
        super().__init__(len(self.images), sharding, shuffle=shuffle, seed=seed)

    def __iter__(self) -> Iterator[Any]:
        for i in super().__iter__():
            yield self.images[i]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.images.root.name!r}, split={self.images.split!r}, n={len(self)}, "
            f"sharding={self.sharding!r})"
        )


def worker_shares(n: int, num_workers: int, *, sharded: bool = True) -> list[int]:
    """Notebook 08, section 5: how many samples each process iterates in one epoch over an ``n``-sample stream.
    All ``n`` in the main process (``num_workers=0``); else ``n`` split evenly if ``sharded``, or ``n`` each."""
    n, num_workers = check_int(n, "n", 0), check_int(num_workers, "num_workers", 0)
    if num_workers == 0:
        return [n]
    return [len(contiguous_share(n, w, num_workers)) if sharded else n for w in range(num_workers)]


def epoch_batch_sizes(
    n: int, batch_size: int | None, num_workers: int, drop_last: bool = False, *, sharded: bool = True
) -> list[int]:
    """Notebook 08, section 5: the sizes of the batches a DataLoader yields over an ``n``-sample stream, in order.

    Each worker batches *its own* share, so each worker's last batch may be short (or, with
    ``drop_last=True``, is dropped); the main process takes one batch from each worker in turn
    (``in_order=True``, the default). ``batch_size=None`` turns batching off: one item per "batch".
    """
    b = 1 if batch_size is None else check_int(batch_size, "batch_size", 1)
    per_worker = []
    for share in worker_shares(n, num_workers, sharded=sharded):
        full, rest = divmod(share, b)
        per_worker.append([b] * full + ([rest] if rest and not drop_last else []))
    return [size for turn in zip_longest(*per_worker) for size in turn if size is not None]


@dataclass(frozen=True)
class BatchInfo:
    worker: int  # which worker made it (-1: the main process)
    samples: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.samples)


def loader_batches(dataset: IterableDataset, **loader_kwargs: Any) -> list[BatchInfo]:
    """Notebook 08, section 5: one epoch of a real DataLoader over a stream of ``(number, worker)`` pairs: its batches.
    The dataset yields pairs (``with_worker=True``), and the loader batches; a batch mixing workers is an error."""
    out = []
    for numbers, workers in DataLoader(dataset, **loader_kwargs):
        ws = {int(w) for w in workers}
        if len(ws) != 1:
            raise RuntimeError(f"a batch mixes samples of workers {sorted(ws)}")
        out.append(BatchInfo(ws.pop(), tuple(int(i) for i in numbers)))
    return out


def count_copies(numbers: Iterable[Any], n: int) -> np.ndarray:
    """Notebook 08, section 2: how many times each of ``0..n-1`` occurs in ``numbers`` (an array of length ``n``)."""
    values = np.fromiter((int(i) for i in numbers), dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= n):
        raise ValueError(f"numbers must lie in 0..{n - 1}; got {values.min()}..{values.max()}")
    return np.bincount(values, minlength=n)


def _worker_colors(workers: Iterable[int]) -> dict[int, Any]:
    import matplotlib.pyplot as plt

    return {w: ("0.55" if w < 0 else plt.get_cmap("tab10")(w % 10)) for w in sorted(set(workers))}


def _worker_label(w: int) -> str:
    return "main process" if w < 0 else f"worker {w}"


def plot_copies(pairs: Sequence[tuple[int, int]], n: int, ax: Any = None, title: str | None = None) -> Any:
    """Notebook 08, section 2: a bar per sample ``0..n-1``: how many copies arrived, stacked by the sending worker."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.5), dpi=80)
    colors = _worker_colors(w for _, w in pairs)
    bottom = np.zeros(n)
    for w, color in colors.items():
        counts = count_copies([i for i, ww in pairs if ww == w], n)
        ax.bar(np.arange(n), counts, bottom=bottom, color=color, edgecolor="white", label=_worker_label(w))
        bottom += counts
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xticks=np.arange(n), xlabel="sample", ylabel="copies per epoch", ylim=(0, max(1, bottom.max()) * 1.3 + 0.2))
    ax.legend(fontsize=8, ncols=min(4, len(colors)), loc="upper right", frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_batches(
    runs: dict[str, Sequence[BatchInfo]], batch_size: int, ax: Any = None, title: str | None = None
) -> Any:
    """Notebook 08, section 5: a row per run: its batches in arrival order, as wide as their sizes, coloured by worker."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len(runs)), dpi=80)
    colors = _worker_colors(b.worker for batches in runs.values() for b in batches)
    for row, batches in enumerate(runs.values()):
        x = 0
        for b in batches:
            short = b.size < batch_size
            ax.barh(row, b.size, left=x, height=0.7, color=colors[b.worker], edgecolor="white", linewidth=2)
            ax.text(
                x + b.size / 2,
                row,
                str(b.size),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if short else "black",
                fontweight="bold" if short else None,
            )
            x += b.size
    ax.set_yticks(range(len(runs)), list(runs))
    ax.invert_yaxis()
    ax.set_xlabel(f"samples, in arrival order (batch_size={batch_size}; white numbers: short batches)")
    ax.legend(
        handles=[Patch(color=c, label=_worker_label(w)) for w, c in colors.items()],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    if title:
        ax.set_title(title, fontsize=10)
    return ax
