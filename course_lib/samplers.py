"""Notebook 06: samplers, which indices a DataLoader asks for, and in which order.

The samplers are PyTorch's; around them: index orders over epochs and their picture, class counts, balancing
weights, an epoch's coverage, padding by length, and :class:`BucketBatchSampler`, which PyTorch lacks.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch.utils.data import Sampler

from .support import check_int

__all__ = [
    "BucketBatchSampler",
    "balancing_weights",
    "class_counts",
    "coverage",
    "imbalanced_subset",
    "index_orders",
    "one_epoch",
    "padding_fraction",
    "plot_index_orders",
    "shared_batchmates",
]


# ----------------------------------------------------------------- inputs
def _int_array(values: Any, name: str, example: str | None = None) -> np.ndarray:
    """1-D int64 whole numbers from a list, array or tensor; with ``example`` (what to pass), non-empty and >= 0."""
    arr = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one entry per sample), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise ValueError(f"{name} must hold whole numbers (class labels or lengths), got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)  # 3.0 is a fine label; 3.5 is not
    if example is not None and arr.size == 0:
        raise ValueError(f"{name} is empty: pass {example}")
    if example is not None and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, found {arr.min()}")
    return arr


def _labels(targets: Any, num_classes: int | None) -> tuple[np.ndarray, int]:
    """Validated class labels and the number of classes."""
    labels = _int_array(targets, "targets", "one class label per sample (e.g. dataset.targets)")
    k = int(labels.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes", 1)
    if labels.max() >= k:
        raise ValueError(f"found class label {labels.max()} but num_classes={k}: labels must be 0..{k - 1}")
    return labels, k


def one_epoch(sampler: Iterable[Any]) -> list[int]:
    """Notebook 06, section 1: the indices ``sampler`` yields in one pass, as a flat list (a batch sampler's batches are joined)."""
    flat: list[int] = []
    for item in sampler:
        if isinstance(item, (list, tuple, range, np.ndarray)) or (isinstance(item, torch.Tensor) and item.dim() > 0):
            flat.extend(int(i) for i in item)
        else:
            flat.append(int(item))
    return flat


# ----------------------------------------------------------------- index orders
def index_orders(sampler: Iterable[Any], epochs: int) -> np.ndarray:
    """Notebook 06, section 1: the indices ``sampler`` yields in each of ``epochs`` epochs: an ``(epochs, len)`` int64 array.

    Each epoch iterates the sampler afresh, as a DataLoader does; ``set_epoch(e)`` is called first when the
    sampler has it (``DistributedSampler``, notebook 07), as a training loop should. A batch sampler's
    batches are joined into one row.
    """
    rows = []
    for e in range(check_int(epochs, "epochs", 1)):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        rows.append(one_epoch(sampler))
    sizes = [len(r) for r in rows]
    if sizes[0] == 0:
        raise ValueError("the sampler yielded no indices: is it built over an empty dataset?")
    if len(set(sizes)) > 1:
        raise ValueError(
            f"the sampler yielded {sizes[0]} indices in the first epoch and {sizes[1:]} after. If it is an "
            "iterator (iter(sampler), a generator), it runs only once: pass the sampler itself."
        )
    return np.array(rows, dtype=np.int64)


def plot_index_orders(
    orders: Any,
    ax: Axes | None = None,
    title: str = "Indices in the order a sampler yields them",
    colour_by: Any = None,
    class_names: Sequence[str] | None = None,
    colour_label: str | None = None,
) -> Figure:
    """Notebook 06, section 1: draw ``orders`` (epochs × positions) as a heat map: one row per epoch.

    Cells are coloured by the sample index, or by ``colour_by[index]``: class labels (``targets``, up to 20
    classes, drawn in distinct colours, named by ``class_names``) or any other whole number per sample, such
    as sequence lengths. Draws into ``ax`` when given; returns the figure.
    """
    grid = np.asarray(orders)
    if grid.ndim != 2 or grid.size == 0:
        raise ValueError(
            f"orders must be a non-empty 2-D array (epochs × positions), e.g. index_orders(sampler, 5); got shape {grid.shape}"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.9 + 0.25 * grid.shape[0]))
    fig = ax.figure
    if colour_by is None:
        im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label=colour_label or "sample index", pad=0.01)
    else:
        values = _int_array(colour_by, "colour_by")
        if grid.min() < 0 or grid.max() >= len(values):
            raise ValueError(
                f"index {grid.max()} has no entry in colour_by (length {len(values)}): pass one value per sample"
            )
        k = int(values.max()) + 1
        if class_names is not None or k <= 20:  # class labels: one distinct colour each
            cmap = plt.get_cmap("tab10" if k <= 10 else "tab20", k)
            im = ax.imshow(values[grid], aspect="auto", cmap=cmap, vmin=-0.5, vmax=k - 0.5, interpolation="nearest")
            bar = fig.colorbar(im, ax=ax, label=colour_label or "class", pad=0.01, ticks=range(k))
            if class_names is not None:
                bar.ax.set_yticklabels(list(class_names)[:k], fontsize=9)
        else:
            im = ax.imshow(values[grid], aspect="auto", cmap="viridis", interpolation="nearest")
            fig.colorbar(im, ax=ax, label=colour_label or "value", pad=0.01)
    ax.set_yticks(range(grid.shape[0]), [str(e) for e in range(grid.shape[0])])  # from 0, as set_epoch
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole numbers
    ax.set(xlabel="position in the epoch", ylabel="epoch")
    ax.set_title(title, fontsize=10)
    return fig


# ----------------------------------------------------------------- classes and weights
def class_counts(indices: Iterable[Any], targets: Any, num_classes: int | None = None) -> np.ndarray:
    """Notebook 06, section 4: how many of ``indices`` (a sampler, a list, a batch sampler) fall in each class.
    ``targets[i]`` is sample ``i``'s class; the result has ``num_classes`` entries (default: the largest label + 1)."""
    labels, k = _labels(targets, num_classes)
    drawn = np.array(one_epoch(indices), dtype=np.int64)
    if drawn.size and (drawn.min() < 0 or drawn.max() >= len(labels)):
        bad = drawn.min() if drawn.min() < 0 else drawn.max()
        raise ValueError(
            f"index {bad} is out of range for {len(labels)} targets: "
            "are the indices and the targets from the same dataset?"
        )
    return np.bincount(labels[drawn], minlength=k)


def balancing_weights(targets: Any, num_classes: int | None = None) -> torch.Tensor:
    """Notebook 06, section 4: one weight per **sample**, ``1 / (number of samples of its class)``, as a float64 tensor.

    Every class then carries the same total weight, so ``WeightedRandomSampler(weights, num_samples=len(weights),
    replacement=True)`` draws each class equally often on average. (Passing one weight per *class* instead is a
    classic mistake: the sampler reads each weight as a sample, and draws only indices ``0 .. num_classes - 1``.)
    """
    labels, k = _labels(targets, num_classes)
    return torch.from_numpy(1.0 / np.bincount(labels, minlength=k)[labels])


def imbalanced_subset(targets: Any, counts: Sequence[int], seed: int = 0) -> np.ndarray:
    """Notebook 06, section 4: indices of a class-imbalanced subset: ``counts[c]`` samples of class ``c``, chosen at random.
    Only the labels are needed (``dataset.targets``), so no image is decoded. The indices come
    back sorted, so ``Subset(dataset, indices)`` keeps the dataset's class-by-class order."""
    labels, k = _labels(targets, None)
    want = _int_array(list(counts), "counts")
    if len(want) != k:
        raise ValueError(f"counts needs one number per class: the targets have {k} classes, counts has {len(want)}")
    rng = np.random.default_rng(seed)
    chosen = []
    for c, n in enumerate(want):
        members = np.flatnonzero(labels == c)
        if not 0 <= n <= len(members):
            raise ValueError(
                f"class {c} has {len(members)} samples; counts[{c}]={n} must be between 0 and {len(members)}"
            )
        chosen.append(rng.choice(members, size=int(n), replace=False))
    return np.sort(np.concatenate(chosen))


@dataclass(frozen=True)
class Coverage:
    """What one epoch drew (:func:`coverage`); ``repeated``: samples drawn more than once, ``missing``: never drawn."""

    drawn: int  # indices yielded
    distinct: int  # different samples among them
    repeated: list[int]
    missing: list[int]

    @property
    def repeats(self) -> int:  # draws of a sample already drawn this epoch
        return self.drawn - self.distinct

    @property
    def unseen(self) -> int:  # samples never drawn
        return len(self.missing)

    @property
    def exact(self) -> bool:  # every sample drawn exactly once
        return not self.repeated and not self.missing

    def __repr__(self) -> str:
        return f"Coverage(drawn={self.drawn}, distinct={self.distinct}, repeats={self.repeats}, unseen={self.unseen})"


def coverage(indices: Iterable[Any], n: int) -> Coverage:
    """Notebook 06, section 2: count duplicates and never-seen samples in one epoch of ``indices`` over ``n`` samples.
    ``indices`` may be a sampler, a batch sampler, a list of indices, or one list per rank or per
    worker (notebooks 07-09): they are joined into one epoch."""
    n = check_int(n, "n", 1)
    drawn = np.array(one_epoch(indices), dtype=np.int64)
    if drawn.size and (drawn.min() < 0 or drawn.max() >= n):
        raise ValueError(f"indices must lie in 0..{n - 1}; got {drawn.min()}..{drawn.max()}")
    counts = np.bincount(drawn, minlength=n)
    return Coverage(
        int(drawn.size),
        int((counts > 0).sum()),
        np.flatnonzero(counts > 1).tolist(),
        np.flatnonzero(counts == 0).tolist(),
    )


# ----------------------------------------------------------------- batching by length
def padding_fraction(batches: Iterable[Sequence[int]], lengths: Any) -> float:
    """Notebook 06, section 6: the share of padded batch tensors that is padding, over all ``batches``.
    A batch of ``b`` sequences padded to its longest, ``L``, is a ``b × L`` tensor holding
    ``sum(lengths)`` real tokens; the rest is padding. ``batches`` may be a batch sampler."""
    lens = _int_array(lengths, "lengths")
    cells = real = 0
    for batch in batches:
        idx = np.asarray(one_epoch([batch]), dtype=np.int64)
        if idx.size == 0:
            continue
        if idx.min() < 0 or idx.max() >= len(lens):
            raise ValueError(
                f"batch holds index {idx.max() if idx.max() >= len(lens) else idx.min()}, but lengths has {len(lens)} entries"
            )
        cells += idx.size * int(lens[idx].max())
        real += int(lens[idx].sum())
    if cells == 0:
        raise ValueError("no batches (or only empty ones, or sequences of length 0): nothing to measure")
    return 1 - real / cells


def shared_batchmates(epoch_a: Iterable[Sequence[int]], epoch_b: Iterable[Sequence[int]]) -> float:
    """Notebook 06, section 6: the share of pairs of samples batched together in ``epoch_a`` that share a batch again in ``epoch_b``.
    About ``(batch_size - 1) / (n - 1)`` for random batches; close to 1 when batches barely change
    from epoch to epoch (sorting the whole data set by length, for example)."""
    where = {i: k for k, batch in enumerate(epoch_b) for i in one_epoch([batch])}
    pairs = kept = 0
    for batch in epoch_a:
        idx = one_epoch([batch])
        pairs += len(idx) * (len(idx) - 1) // 2
        groups = Counter(where.get(i, -1 - n) for n, i in enumerate(idx))  # an index missing from b pairs with no one
        kept += sum(c * (c - 1) // 2 for c in groups.values())
    if pairs == 0:
        raise ValueError("epoch_a has no batch of two or more samples: no pairs to compare")
    return kept / pairs


class BucketBatchSampler(Sampler[list[int]]):
    """Notebook 06, section 6: batches of indices whose sequences have similar lengths, in a new random order every epoch.

    Each epoch: shuffle all indices, cut them into buckets of ``bucket_size`` samples, sort each bucket by
    length, cut it into batches of ``batch_size``, and shuffle the order of all batches. Sorting means little
    padding; sorting only *within* random buckets keeps batches different from epoch to epoch; shuffling the
    batches mixes short and long ones over the epoch. A larger bucket: less padding, less randomness
    (``bucket_size=batch_size`` is plain random batching). ``bucket_size`` must be a multiple of ``batch_size``
    (default: 100 batches), so that only the last batch of an epoch can be short.

    Use it as ``DataLoader(dataset, batch_sampler=BucketBatchSampler(lengths, 32), collate_fn=pad_collate)``.
    The order comes from ``generator`` (advanced every epoch); without one, each epoch draws a
    seed from PyTorch's global generator, as ``RandomSampler`` does.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray | torch.Tensor,
        batch_size: int,
        bucket_size: int | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        lens = _int_array(lengths, "lengths", "the length of every sample, e.g. [len(x) for x, _ in dataset]")
        self.batch_size = check_int(batch_size, "batch_size", 1)
        bucket = 100 * self.batch_size if bucket_size is None else check_int(bucket_size, "bucket_size", 1)
        if bucket % self.batch_size:
            lower = max(self.batch_size, bucket // self.batch_size * self.batch_size)
            raise ValueError(
                f"bucket_size={bucket} is not a multiple of batch_size={self.batch_size}, so buckets would "
                f"leave partial batches: use {lower} or {lower + self.batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}: torch.Generator().manual_seed(0)"
            )
        self.lengths, self.bucket_size = torch.from_numpy(lens), bucket
        self.drop_last, self.generator = drop_last, generator

    def __iter__(self) -> Iterator[list[int]]:
        g = self.generator
        if g is None:  # like RandomSampler: a fresh seed from the global generator each epoch
            g = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        order = torch.randperm(len(self.lengths), generator=g)
        batches: list[torch.Tensor] = []
        for bucket in order.split(self.bucket_size):
            # a stable sort keeps equal lengths in their shuffled order
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True)]
            batches.extend(by_length.split(self.batch_size))
        # every bucket but the last holds whole batches, so only the very last batch can be short
        if self.drop_last and len(batches[-1]) < self.batch_size:
            batches.pop()
        for k in torch.randperm(len(batches), generator=g).tolist():
            yield batches[k].tolist()

    def __len__(self) -> int:
        n = len(self.lengths)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={len(self.lengths)}, batch_size={self.batch_size}, "
            f"bucket_size={self.bucket_size}, drop_last={self.drop_last})"
        )
