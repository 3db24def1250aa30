"""Checks for notebook 05 (samplers)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np
import torch

from ..samplers import one_epoch, padding_fraction
from ._core import Hint, attempted, exercise, require


@exercise("05.2", "one weight per sample, 1 / (samples in its class): every class now carries the same total weight.")
def balanced_weights(weights: Any, targets: Any) -> None:
    """``weights`` (one per sample of ``targets``) make WeightedRandomSampler draw every class equally often."""
    attempted(weights)
    labels = torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    k = int(labels.max()) + 1
    try:
        w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
    except (TypeError, ValueError):
        raise Hint(f"weights should be a list, array or tensor of numbers, got {type(weights).__name__}.") from None
    require(w.dim() == 1, f"give one number per sample (a 1-D list, array or tensor), got shape {tuple(w.shape)}.")
    if len(w) == k != len(labels):
        first = int(labels[0])
        raise Hint(
            f"these are {k} weights, one per *class*. WeightedRandomSampler reads each weight as one sample's, so it "
            f"would draw only indices 0..{k - 1}, which are all of class {first} here. Give every sample the weight "
            "of its class: class_weights[targets]."
        )
    require(len(w) == len(labels), f"give one weight per sample of the imbalanced set: {len(labels)} numbers, got {len(w)}.")
    require(bool(torch.isfinite(w).all()), "some weights are inf or nan: divide by the count of each sample's own class (never 0).")
    require(bool((w >= 0).all()) and float(w.sum()) > 0, "weights must be >= 0 and not all 0.")
    # the exact share of draws each class gets from WeightedRandomSampler(w, ..., replacement=True)
    shares = torch.zeros(k, dtype=torch.float64).index_add_(0, labels, w) / w.sum()
    sizes = torch.bincount(labels, minlength=k).double()
    if float(shares.max()) > 1.05 * float(shares.min()):
        spread = f"classes would be drawn from {float(shares.min()):.1%} to {float(shares.max()):.1%} of the time, not {1 / k:.0%} each"
        if bool(torch.all(w == w[0])):
            hint = "every sample has the same weight, so classes come as often as they occur: weight each sample by 1 / (samples in its class)"
        elif _correlation(_class_means(w, labels, k), sizes) > 0.5:
            hint = "large classes get *more* weight than small ones: use 1 / count, not count"
        elif _correlation(shares, sizes) > 0.5:
            hint = "small classes weigh more, but not enough to make up for their size: divide by the count itself, 1 / count"
        else:
            hint = "give each sample 1 / (number of samples of its class) in this set"
        raise Hint(f"{spread}: {hint}.")


def _class_means(w: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    sums = torch.zeros(k, dtype=torch.float64).index_add_(0, labels, w.double())
    return sums / torch.bincount(labels, minlength=k).clamp(min=1)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    r = float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])
    return 0.0 if r != r else r  # nan (a constant series) counts as no correlation


def _pair(out: Any, call: str) -> tuple[Any, Any]:
    require(
        isinstance(out, (tuple, list)) and len(out) == 2,
        f"{call} should return two things: (train_sampler, val_sampler).",
    )
    for name, s in zip(("train", "val"), out):
        require(
            hasattr(s, "__iter__") and hasattr(s, "__len__"),
            f"the {name} sampler should have len() and yield indices (a Sampler or a list of indices), got {type(s).__name__}.",
        )
    return out[0], out[1]


def _is_block(indices: list[int]) -> bool:
    return len(indices) > 1 and max(indices) - min(indices) == len(indices) - 1


@exercise("05.1", "one dataset, two disjoint samplers: a reproducible random split, training reshuffled every epoch, validation in a fixed order.")
def train_val_samplers(fn: Callable[[int, float, int], Any]) -> None:
    """``fn(n, val_fraction, seed) -> (train_sampler, val_sampler)`` over indices ``0..n-1``."""
    attempted(fn)
    for n, fraction in ((100, 0.2), (50, 0.3)):
        call = f"train_val_samplers({n}, {fraction}, seed=0)"
        train, val = _pair(fn(n, fraction, 0), call)
        t1, v1 = one_epoch(train), one_epoch(val)
        n_val = round(n * fraction)
        require(len(v1) == n_val, f"{call}: validation should get round({n} * {fraction}) = {n_val} indices, got {len(v1)}.")
        require(len(t1) == n - n_val, f"{call}: training should get the other {n - n_val} indices, got {len(t1)}.")
        both = sorted(set(t1) & set(v1))
        require(
            not both,
            f"{call}: {len(both)} indices (e.g. {both[0] if both else ''}) are in both parts; a model validated on samples "
            "it trained on looks better than it is. Give every index to one part only.",
        )
        require(sorted(t1 + v1) == list(range(n)), f"{call}: every index 0..{n - 1} should be in exactly one part.")
        require(
            not _is_block(v1),
            f"{call}: the validation indices are one block ({min(v1)}..{max(v1)}). Data stored class by class would "
            "then validate on a few classes only: pick them at random, e.g. torch.randperm(n, generator=g).",
        )
        require(t1 != sorted(t1), f"{call}: training indices come in increasing order: use SubsetRandomSampler to shuffle them.")
        require(t1 != one_epoch(train), f"{call}: the training order is the same in two epochs: pass the generator itself, do not re-seed it per epoch.")
        require(
            v1 == one_epoch(val),
            f"{call}: the validation order changes between epochs. Validation learns nothing from order, and a fixed one "
            "makes runs comparable: a plain list of the indices is a sampler.",
        )
        require(
            getattr(train, "generator", "n/a") not in (None, torch.default_generator),
            "the training sampler shuffles with PyTorch's global generator (generator=None), so any other random draw "
            "changes its order: pass generator=torch.Generator().manual_seed(seed).",
        )
    a, b = _pair(fn(100, 0.2, 0), "train_val_samplers(100, 0.2, 0)"), _pair(fn(100, 0.2, 0), "train_val_samplers(100, 0.2, 0)")
    require(
        one_epoch(a[1]) == one_epoch(b[1]),
        "two calls with seed=0 give different splits: draw the split from torch.Generator().manual_seed(seed).",
    )
    require(
        one_epoch(a[0]) == one_epoch(b[0]),
        "two calls with seed=0 split alike but shuffle training differently: give the sampler a generator seeded with seed.",
    )
    other = _pair(fn(100, 0.2, 1), "train_val_samplers(100, 0.2, 1)")
    require(one_epoch(other[1]) != one_epoch(a[1]), "seeds 0 and 1 give the same split: use the seed argument.")


def _batches(out: Any, call: str) -> list[list[int]]:
    require(
        isinstance(out, (list, tuple)) or hasattr(out, "__iter__"),
        f"{call} should return a list of batches (each a list of indices), got {type(out).__name__}.",
    )
    batches = []
    for b in out:
        require(
            isinstance(b, (list, tuple, range, np.ndarray, torch.Tensor)),
            f"{call}: each batch should be a list of indices, got {type(b).__name__} {b!r}.",
        )
        batches.append(one_epoch([b]))
    return batches


def _lengths(n: int, seed: int) -> list[int]:
    return torch.randint(5, 201, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@exercise("05.3", "sorted by length, cut into batches, batches shuffled: every index once, and hardly any padding.")
def length_batches(fn: Callable[[Any, int, torch.Generator], Any]) -> None:
    """``fn(lengths, batch_size, generator)`` -> batches with every index once and under 10 % padding."""
    attempted(fn)
    for n, batch_size in ((500, 16), (103, 10)):
        lengths = _lengths(n, seed=n)
        call = f"length_batches(lengths of {n} sequences, {batch_size}, generator)"
        batches = _batches(fn(lengths, batch_size, torch.Generator().manual_seed(0)), call)
        seen = Counter(i for b in batches for i in b)
        twice = sorted(i for i, c in seen.items() if c > 1)
        require(not twice, f"{call}: index {twice[0] if twice else ''} is in {seen[twice[0]] if twice else 0} batches; each index belongs in exactly one.")
        missing = sorted(set(range(n)) - set(seen))
        require(not missing, f"{call}: index {missing[0] if missing else ''} is in no batch (and {len(missing)} in all); an epoch covers every sample.")
        require(not (set(seen) - set(range(n))), f"{call}: some indices are outside 0..{n - 1}: return positions in lengths, not lengths.")
        too_big = [len(b) for b in batches if len(b) > batch_size]
        require(not too_big, f"{call}: a batch has {too_big[0] if too_big else 0} indices; at most batch_size={batch_size}.")
        short = [len(b) for b in batches if len(b) < batch_size]
        require(
            len(short) <= 1,
            f"{call}: {len(short)} batches are smaller than batch_size={batch_size}. Cut the sorted indices into "
            "consecutive chunks of batch_size, so that only the last one is short.",
        )
        share = padding_fraction(batches, lengths)
        at_random = padding_fraction(torch.randperm(n, generator=torch.Generator().manual_seed(0)).split(batch_size), lengths)
        require(
            share < 0.10,
            f"{call}: {share:.0%} of the padded batches is padding (random batches: {at_random:.0%}); sort the indices "
            "by length before cutting them into batches (torch.argsort(torch.tensor(lengths))).",
        )
        longest = [max(lengths[i] for i in b) for b in batches]
        require(
            longest != sorted(longest) and longest != sorted(longest, reverse=True),
            f"{call}: the batches go from short to long sequences, so every epoch would start the same way: shuffle the "
            "order of the batches, e.g. with torch.randperm(len(batches), generator=generator).",
        )
    lengths = _lengths(500, seed=500)
    first, again = (_batches(fn(lengths, 16, torch.Generator().manual_seed(0)), "length_batches") for _ in range(2))
    require(first == again, "the same generator seed gives different batch orders: draw the shuffle from generator, not from the global generator.")
    other = _batches(fn(lengths, 16, torch.Generator().manual_seed(1)), "length_batches")
    require(other != first, "generators seeded 0 and 1 give the same batch order: shuffle with the generator you are given.")
