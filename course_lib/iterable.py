"""Notebook 07: iterable-style datasets, streams, worker sharding, endless data.

An ``IterableDataset`` has ``__iter__`` instead of ``__getitem__``: the DataLoader asks it for
the next sample, never for sample ``i``. With ``num_workers=k`` every worker process gets its
own *copy* of the dataset and iterates it whole, unless ``__iter__`` (or a ``worker_init_fn``)
takes only this worker's share, using :func:`torch.utils.data.get_worker_info`. The pieces:

* :class:`RangeStream`, the naive stream that every worker yields whole (the duplicate
  pitfall), and :func:`split_range_per_worker`, a ``worker_init_fn`` that fixes it from outside;
* :class:`ShardedStream`, the same numbers split between workers in ``__iter__`` (contiguous
  or strided shares, optionally shuffled with one seed shared by every worker);
* :class:`BufferShuffled` / :func:`buffer_shuffle`, the shuffle a stream can afford;
* :class:`EndlessStream`, a stream that never ends, deterministic per worker;
* :class:`ImageStream`, the shapes image files read in order, sharded by worker;
* :func:`epoch_batch_sizes` / :func:`batches_per_epoch`: what the DataLoader makes of a stream
  (every worker batches its own share, so its last batch may be short: pytorch #30599), and
  :func:`loader_batches` / :func:`plot_batches` / :func:`plot_copies` to see it.

They live in a module, not in notebook cells, so that worker processes can pickle them under
any start method.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._support import check_int

__all__ = ["BufferShuffled", "EndlessStream", "ImageStream", "RangeStream", "ShardedStream", "batches_per_epoch",
           "buffer_shuffle", "contiguous_share", "copies", "epoch_batch_sizes", "loader_batches", "plot_batches",
           "plot_copies", "split_range_per_worker", "strided_share", "worker_slot"]

_T = TypeVar("_T")


# --------------------------------------------------------------------------- who am I?


def worker_slot(main: int = 0) -> tuple[int, int]:
    """Notebook 07, section 3: ``(worker id, number of workers)`` of the calling process.

    ``get_worker_info()`` returns ``None`` outside DataLoader workers (``num_workers=0``): the main
    process then plays the only worker, ``(main, 1)``; pass ``main=-1`` to label its samples apart.
    """
    info = get_worker_info()
    return (main, 1) if info is None else (info.id, info.num_workers)


def _check_slot(n: int, worker_id: int, num_workers: int) -> None:
    check_int(n, "n", 0)
    check_int(num_workers, "num_workers", 1)
    check_int(worker_id, "worker_id", 0)
    if worker_id >= num_workers:
        raise ValueError(f"worker_id must be in 0..{num_workers - 1}, got {worker_id}")


def contiguous_share(n: int, worker_id: int, num_workers: int) -> range:
    """Notebook 07, section 3: worker ``worker_id``'s block of ``0..n-1``: consecutive positions, sizes differing by at most one.

    The first ``n % num_workers`` workers get one more (as ``numpy.array_split``). torch's own
    docstring example uses blocks of ``ceil(n / k)``, which can leave the last workers nothing.
    """
    _check_slot(n, worker_id, num_workers)
    base, extra = divmod(n, num_workers)
    start = worker_id * base + min(worker_id, extra)
    return range(start, start + base + (1 if worker_id < extra else 0))


def strided_share(n: int, worker_id: int, num_workers: int) -> range:
    """Notebook 07, section 3: worker ``worker_id``'s positions ``worker_id, worker_id + k, ...`` of ``0..n-1`` (``k`` workers)."""
    _check_slot(n, worker_id, num_workers)
    return range(worker_id, n, num_workers)


_SHARDINGS: dict[str, Callable[[int, int, int], range]] = {"contiguous": contiguous_share, "strided": strided_share}


def _sharding(name: str) -> Callable[[int, int, int], range]:
    try:
        return _SHARDINGS[name]
    except KeyError:
        raise ValueError(f"sharding must be one of {', '.join(map(repr, _SHARDINGS))}, got {name!r}") from None


# --------------------------------------------------------------------------- finite streams


class RangeStream(IterableDataset):
    """Notebook 07, section 2: the numbers ``start .. stop-1``, yielded whole by every process that iterates the dataset.

    This is the naive stream: with ``num_workers=k`` each worker iterates its own copy, so every
    number arrives ``k`` times. ``with_worker=True`` yields ``(number, worker id)`` pairs (``-1``
    in the main process), which shows who sent what. ``len()`` is ``stop - start``: the truth in one
    process, wrong with workers.
    """

    def __init__(self, n: int, *, with_worker: bool = False) -> None:
        self.start, self.stop = 0, check_int(n, "n", 0)
        self.with_worker = with_worker

    def __iter__(self) -> Iterator[Any]:
        worker, _ = worker_slot(main=-1)  # every process that iterates this yields all of it
        for i in range(self.start, self.stop):
            yield (i, worker) if self.with_worker else i

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(start={self.start}, stop={self.stop})"


def split_range_per_worker(worker_id: int) -> None:
    """Notebook 07, section 3: a ``worker_init_fn``: narrow this worker's copy of a :class:`RangeStream` to its block.

    Runs once in each worker, before iteration starts; ``get_worker_info().dataset`` is the
    worker's own copy, so changing it changes nothing in the main process or the other workers.
    """
    info = get_worker_info()
    if info is None:
        raise RuntimeError("split_range_per_worker is a worker_init_fn: the DataLoader calls it inside workers")
    ds = info.dataset
    share = contiguous_share(ds.stop - ds.start, worker_id, info.num_workers)
    ds.start, ds.stop = ds.start + share.start, ds.start + share.stop


class ShardedStream(IterableDataset):
    """Notebook 07, section 3: the numbers ``0 .. n-1``, each yielded once over all workers: every worker takes its share.

    ``sharding`` is ``"strided"`` (worker ``w`` takes positions ``w, w+k, ...``) or
    ``"contiguous"`` (blocks). With ``shuffle=True`` the positions are first permuted with a
    generator seeded by ``(seed, epoch)``: the *same* permutation in every worker, so the shares
    still cover everything exactly once, and a different one after :meth:`set_epoch`.
    ``seed_per_worker=True`` is the mistake of seeding each worker differently (notebook 07):
    each worker then cuts its share out of a different permutation, and samples repeat or go
    missing. ``len()`` is ``n``, the number of samples over all workers.
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
    ) -> None:
        self.n = check_int(n, "n", 0)
        self.share = _sharding(sharding)
        self.sharding = sharding
        self.shuffle, self.seed, self.seed_per_worker = shuffle, seed, seed_per_worker
        self.with_worker = with_worker
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use permutation number ``epoch`` from now on (seen by workers started afterwards)."""
        self.epoch = int(epoch)

    def order(self, worker_id: int = 0) -> np.ndarray:
        """The positions in the order worker ``worker_id`` cuts its share from (all of ``0..n-1``)."""
        if not self.shuffle:
            return np.arange(self.n)
        key = [self.seed, self.epoch] + ([worker_id] if self.seed_per_worker else [])
        return np.random.default_rng(key).permutation(self.n)

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = worker_slot()  # (0, 1) in the main process (num_workers=0)
        order = self.order(worker)  # 0..n-1, or a permutation that every worker draws alike
        label = worker_slot(main=-1)[0]
        for position in self.share(self.n, worker, num_workers):  # this worker's positions only
            i = int(order[position])
            yield (i, label) if self.with_worker else i

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, sharding={self.sharding!r}, shuffle={self.shuffle})"


def buffer_shuffle(items: Iterable[_T], size: int, rng: np.random.Generator) -> Iterator[_T]:
    """Notebook 07, section 4: shuffle a stream of unknown length with a buffer of ``size`` items.

    The buffer is filled first; then every arriving item replaces a randomly chosen one, which
    is yielded; at the end the rest of the buffer comes out in random order. An item can move
    forward by any amount but back by about ``size`` at most: the larger the buffer, the better
    the mix, and the more memory and start-up time it costs. ``size=1`` changes nothing.
    (WebDataset's ``shuffle`` and tf.data's ``shuffle`` work the same way.)
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


class BufferShuffled(IterableDataset):
    """Notebook 07, section 4: ``source`` (an iterable dataset) shuffled by :func:`buffer_shuffle`, inside each worker.

    Each worker seeds its generator with ``(seed, epoch, worker id)``: deterministic, and
    different per worker and per epoch. :meth:`set_epoch` is passed on to ``source``.
    """

    def __init__(self, source: IterableDataset, size: int, seed: int = 0) -> None:
        self.source, self.size, self.seed = source, check_int(size, "size", 1), seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        worker, _ = worker_slot()
        rng = np.random.default_rng([self.seed, self.epoch, worker])
        return buffer_shuffle(self.source, self.size, rng)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, size={self.size})"


# --------------------------------------------------------------------------- endless streams


class EndlessStream(IterableDataset):
    """Notebook 07, section 6: a stream that never ends: ``(x, worker, step)``, ``x`` a float vector of ``dim`` numbers.

    Worker ``w`` draws from ``numpy.random.default_rng((seed, epoch, w))``, so what a worker
    yields is the same on every run (it does not depend on torch's per-worker seeds) and
    different between workers. ``worker`` is ``-1`` in the main process; ``step`` counts this
    worker's samples from 0. There is no ``len()``: take a fixed number of batches per "epoch"
    with ``itertools.islice``.
    """

    def __init__(self, seed: int = 0, dim: int = 4) -> None:
        self.seed, self.dim = seed, check_int(dim, "dim", 1)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int]]:
        worker, _ = worker_slot(main=-1)
        rng = np.random.default_rng([self.seed, self.epoch, max(worker, 0)])
        step = 0
        while True:
            yield torch.from_numpy(rng.standard_normal(self.dim).astype(np.float32)), worker, step
            step += 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed}, dim={self.dim})"


# --------------------------------------------------------------------------- real files


class ImageStream(IterableDataset):
    """Notebook 07, section 3: the images of a folder (``root/<split>/<class>/<file>``), read in order, sharded by worker.

    Yields ``(transform(image), label)`` like :class:`course_lib.datasets.ImageFileDataset`,
    whose file list and decoding it reuses. Reading files in a fixed order, each once, is
    what a stream over a large remote set does; ``shuffle=True`` permutes the order with one
    seed for all workers (``(seed, epoch)``), as :class:`ShardedStream` does.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str | None = "train",
        transform: Callable[[Any], Any] | None = None,
        *,
        sharding: str = "strided",
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        from .datasets import ImageFileDataset

        self.images = ImageFileDataset(root, split, transform=transform)
        self.share = _sharding(sharding)
        self.sharding, self.shuffle, self.seed = sharding, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = worker_slot()
        n = len(self.images)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)
        for position in self.share(n, worker, num_workers):
            yield self.images[int(order[position])]

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.images.root.name!r}, split={self.images.split!r}, n={len(self)}, sharding={self.sharding!r})"


# --------------------------------------------------------------------------- batches per epoch


def _worker_shares(n: int, num_workers: int, *, sharded: bool = True) -> list[int]:
    """How many samples each process iterates in one epoch over a stream of ``n`` samples.

    ``num_workers=0``: the main process takes all ``n``. Sharded: ``n`` split as evenly as
    possible (contiguous and strided shares have the same sizes). Not sharded: ``n`` each.
    """
    n, num_workers = check_int(n, "n", 0), check_int(num_workers, "num_workers", 0)
    if num_workers == 0:
        return [n]
    if not sharded:
        return [n] * num_workers
    return [len(contiguous_share(n, w, num_workers)) for w in range(num_workers)]


def epoch_batch_sizes(
    n: int, batch_size: int | None, num_workers: int, drop_last: bool = False, *, sharded: bool = True
) -> list[int]:
    """Notebook 07, section 5: the sizes of the batches a DataLoader yields over an ``n``-sample stream, in arrival order.

    What the DataLoader does with an ``IterableDataset``: each worker fills batches from *its own*
    iterator, so each worker's last batch may be short (or, with ``drop_last=True``, is dropped),
    and the main process takes one batch from each worker in turn (``in_order=True``, the
    default) until all are done. ``batch_size=None`` turns batching off: one item per "batch".
    """
    shares = _worker_shares(n, num_workers, sharded=sharded)
    if batch_size is None:
        per_worker = [[1] * s for s in shares]
    else:
        batch_size = check_int(batch_size, "batch_size", 1)
        per_worker = [
            [batch_size] * (s // batch_size) + ([s % batch_size] if s % batch_size and not drop_last else [])
            for s in shares
        ]
    rounds = max((len(p) for p in per_worker), default=0)
    return [p[r] for r in range(rounds) for p in per_worker if r < len(p)]


def batches_per_epoch(n: int, batch_size: int | None, num_workers: int, drop_last: bool = False, *, sharded: bool = True) -> int:
    """Notebook 07, section 5: how many batches one epoch over an ``n``-sample stream has, the sum over workers of
    ``ceil(share / batch_size)`` (``floor`` with ``drop_last``). Compare ``len(loader)``, which
    is ``ceil(n / batch_size)`` whatever ``num_workers`` is."""
    return len(epoch_batch_sizes(n, batch_size, num_workers, drop_last, sharded=sharded))


@dataclass(frozen=True)
class _BatchInfo:
    """One batch as the loop received it: which worker made it (``-1``: main process) and its samples."""

    worker: int
    samples: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.samples)


def loader_batches(dataset: IterableDataset, **loader_kwargs: Any) -> list[_BatchInfo]:
    """Notebook 07, section 5: run one epoch of a real DataLoader over a stream of ``(number, worker)`` pairs; list its batches.

    The dataset must yield pairs (``with_worker=True`` on the streams here) and the loader must
    batch (``batch_size`` not ``None``). A batch whose samples come from several workers is an
    error: with the default collate that never happens.
    """
    out = []
    for numbers, workers in DataLoader(dataset, **loader_kwargs):
        ws = {int(w) for w in workers}
        if len(ws) != 1:
            raise RuntimeError(f"a batch mixes samples of workers {sorted(ws)}")
        out.append(_BatchInfo(ws.pop(), tuple(int(i) for i in numbers)))
    return out


def copies(numbers: Iterable[Any], n: int) -> np.ndarray:
    """Notebook 07, section 2: how many times each of ``0..n-1`` occurs in ``numbers`` (an array of length ``n``)."""
    values = np.fromiter((int(i) for i in numbers), dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= n):
        raise ValueError(f"numbers must lie in 0..{n - 1}; got {values.min()}..{values.max()}")
    return np.bincount(values, minlength=n)


# --------------------------------------------------------------------------- pictures


def _worker_colors(workers: Iterable[int]) -> dict[int, Any]:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return {w: ("0.55" if w < 0 else cmap(w % 10)) for w in sorted(set(workers))}


def _worker_label(w: int) -> str:
    return "main process" if w < 0 else f"worker {w}"


def plot_copies(pairs: Sequence[tuple[int, int]], n: int, ax: Any = None, title: str | None = None) -> Any:
    """Notebook 07, section 2: a stacked bar per sample ``0..n-1``: how many copies arrived, coloured by the worker that sent them."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.5), dpi=80)
    workers = sorted({w for _, w in pairs})
    colors = _worker_colors(workers)
    bottom = np.zeros(n)
    for w in workers:
        counts = copies([i for i, ww in pairs if ww == w], n)
        ax.bar(np.arange(n), counts, bottom=bottom, color=colors[w], edgecolor="white", label=_worker_label(w))
        bottom += counts
    from matplotlib.ticker import MaxNLocator

    ax.set_xticks(np.arange(n))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("sample")
    ax.set_ylabel("copies per epoch")
    ax.set_ylim(0, max(1.0, bottom.max()) * 1.3 + 0.2)
    ax.legend(fontsize=8, ncols=min(4, len(workers)), loc="upper right", frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_batches(runs: dict[str, Sequence[_BatchInfo]], batch_size: int, ax: Any = None, title: str | None = None) -> Any:
    """Notebook 07, section 5: one row per run: its batches in arrival order, each as wide as its size, coloured by worker."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len(runs)), dpi=80)
    colors = _worker_colors(b.worker for batches in runs.values() for b in batches)
    names = list(runs)
    for row, name in enumerate(names):
        x = 0.0
        for b in runs[name]:
            ax.barh(row, b.size, left=x, height=0.7, color=colors[b.worker], edgecolor="white", linewidth=2)
            ax.text(x + b.size / 2, row, str(b.size), ha="center", va="center", fontsize=8,
                    color="white" if b.size < batch_size else "black", fontweight="bold" if b.size < batch_size else None)
            x += b.size
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel(f"samples, in arrival order (batch_size={batch_size}; white numbers: short batches)")
    ax.legend(handles=[Patch(color=c, label=_worker_label(w)) for w, c in colors.items()], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
