"""Checks for notebook 06 (samplers)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np
import torch

from torch.utils.data import DataLoader

from ..samplers import one_epoch, padding_fraction, shared_batchmates
from ._core import Hint, attempted, exercise, require


@exercise("06.3", "one weight per sample, 1 / (samples in its class): every class now carries the same total weight.")
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
    require(
        len(w) == len(labels), f"give one weight per sample of the imbalanced set: {len(labels)} numbers, got {len(w)}."
    )
    require(
        bool(torch.isfinite(w).all()),
        "some weights are inf or nan: divide by the count of each sample's own class (never 0).",
    )
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


@exercise(
    "06.2",
    "two disjoint samplers, one for each dataset object: a reproducible random split, training reshuffled every epoch, validation in a fixed order.",
)
def train_val_samplers(fn: Callable[[int, float, int], Any]) -> None:
    """``fn(n, val_fraction, seed) -> (train_sampler, val_sampler)`` over indices ``0..n-1``."""
    attempted(fn)
    for n, fraction in ((100, 0.2), (50, 0.3)):
        call = f"train_val_samplers({n}, {fraction}, seed=0)"
        train, val = _pair(fn(n, fraction, 0), call)
        t1, v1 = one_epoch(train), one_epoch(val)
        n_val = round(n * fraction)
        require(
            len(v1) == n_val, f"{call}: validation should get round({n} * {fraction}) = {n_val} indices, got {len(v1)}."
        )
        require(len(t1) == n - n_val, f"{call}: training should get the other {n - n_val} indices, got {len(t1)}.")
        split_ok = sorted(t1 + v1) == list(range(n))  # then 0..k-1 are indices chosen (a block), not positions
        for part, indices, epoch in (("validation", n_val, v1), ("training", n - n_val, t1)):
            require(
                split_ok or epoch != list(range(indices)),
                f"{call}: the {part} sampler yields 0, 1, ..., {indices - 1}: positions, not the indices you chose. "
                f"SequentialSampler(indices) uses only len(indices) and counts 0..len-1 (it was made for a data set). "
                "A plain list of the indices is a sampler that yields them in order.",
            )
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
        require(
            t1 != sorted(t1),
            f"{call}: training indices come in increasing order: use SubsetRandomSampler to shuffle them.",
        )
        require(
            t1 != one_epoch(train),
            f"{call}: the training order is the same in two epochs: pass the generator itself, do not re-seed it per epoch.",
        )
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
    a, b = (
        _pair(fn(100, 0.2, 0), "train_val_samplers(100, 0.2, 0)"),
        _pair(fn(100, 0.2, 0), "train_val_samplers(100, 0.2, 0)"),
    )
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


# ----------------------------------------------------------------- 06.1: a first Sampler


@exercise(
    "06.1",
    "EpochShuffle's order is a function of (seed, epoch) alone: any process, any restart, computes the same one.",
)
def epoch_shuffle(sampler_cls: Any) -> None:
    """``sampler_cls(n, seed)``: a permutation of ``range(n)`` per epoch, fixed by ``seed + epoch`` (``set_epoch``)."""
    attempted(sampler_cls)
    require(isinstance(sampler_cls, type), "pass the class itself, `EpochShuffle`, not an instance.")
    s = sampler_cls(10, seed=3)
    require(len(s) == 10, f"len(EpochShuffle(10, seed=3)) should be 10, got {len(s)}.")
    first = one_epoch(s)
    require(sorted(first) == list(range(10)), f"an epoch should hold each index 0..9 once, got {first}.")
    require(first != list(range(10)), "the order is 0, 1, 2, ...: shuffle with torch.randperm(n, generator=...).")
    torch.manual_seed(99)
    torch.rand(5)
    again = one_epoch(s)
    require(
        again == first,
        "epoch 0 gave a different order the second time: the order must depend on (seed, epoch) only. "
        "Make a generator in __iter__, torch.Generator().manual_seed(self.seed + self.epoch).",
    )
    s.set_epoch(1)
    require(one_epoch(s) != first, "set_epoch(1) gave the same order as epoch 0: seed the generator with seed + epoch.")
    s.set_epoch(0)
    require(
        one_epoch(s) == first,
        "set_epoch(0) did not bring back epoch 0's order: build the generator in __iter__ "
        "from (seed, epoch), not once in __init__.",
    )
    require(
        one_epoch(sampler_cls(10, seed=3)) == first,
        "two samplers with seed=3 give different epoch-0 orders: "
        "draw from a generator seeded with seed + epoch, not from the global one.",
    )
    require(one_epoch(sampler_cls(10, seed=4)) != first, "seeds 3 and 4 give the same order: use the seed argument.")
    require(
        len(sampler_cls(7, seed=0)) == 7 and sorted(one_epoch(sampler_cls(7, seed=0))) == list(range(7)),
        "EpochShuffle(7, ...) should cover 0..6: use n, not a fixed number.",
    )
    order = [int(i) for b in DataLoader(list(range(10)), batch_size=5, sampler=s) for i in b]
    require(order == first, "through a DataLoader (sampler=...), the order differs from the sampler's own.")


# ----------------------------------------------------------------- 06.5: a class first, then a sample of it


def _skewed_targets() -> np.ndarray:
    """600 labels of 3 classes: 400, 150 and 50 samples, interleaved."""
    return np.random.default_rng(7).permutation(np.repeat([0, 1, 2], [400, 150, 50]))


@exercise(
    "06.5",
    "ClassThenSample balances the classes with no per-sample weights: a class at random, then one of its samples.",
)
def class_then_sample(sampler_cls: Any) -> None:
    """``sampler_cls(targets, num_samples, generator)``: each draw a uniform class, then a uniform sample of it."""
    attempted(sampler_cls)
    require(isinstance(sampler_cls, type), "pass the class itself, `ClassThenSample`, not an instance.")
    targets = _skewed_targets()
    s = sampler_cls(targets, 3000, torch.Generator().manual_seed(0))
    require(len(s) == 3000, f"len() should be num_samples (3000), got {len(s)}.")
    epoch1 = one_epoch(s)
    require(len(epoch1) == 3000, f"an epoch should yield num_samples indices (3000), got {len(epoch1)}.")
    require(all(0 <= i < len(targets) for i in epoch1), "indices must be positions in targets (0..599), not labels.")
    per_class = np.bincount(targets[epoch1], minlength=3)
    require(
        per_class.min() > 850,
        f"the classes were drawn {per_class.tolist()} times in 3000 draws: pick the class "
        "first, uniformly (torch.randint(number of classes, ...)), then a sample of it.",
    )
    rare = [i for i in epoch1 if targets[i] == 2]
    require(
        len(set(rare)) > 40,
        f"the 50 samples of the rarest class came as only {len(set(rare))} different ones: "
        "pick the sample uniformly among the members of the drawn class.",
    )
    common = Counter(i for i in epoch1 if targets[i] == 0)
    require(
        max(common.values()) < 15,
        "some samples of the largest class come far more often than others: draw "
        "uniformly among the class's members, not always the first ones.",
    )
    require(
        one_epoch(s) != epoch1,
        "the second epoch repeats the first: draw from self.generator in __iter__, which "
        "advances, rather than from a generator made anew each epoch.",
    )
    twin = sampler_cls(targets, 3000, torch.Generator().manual_seed(0))
    require(
        one_epoch(twin) == epoch1,
        "two samplers with generators seeded 0 give different draws: draw every random "
        "number from self.generator, not from torch's global generator.",
    )


# ----------------------------------------------------------------- 06.6: a bucketing batch sampler


def _one_bucket(batches: list[list[int]], lengths: list[int]) -> bool:
    """Whether ``batches`` look like the slices of one bucket sorted by length: their length ranges do not overlap."""
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    return all(high <= next_low for (_, high), (next_low, _) in zip(spans, spans[1:]))


@exercise("06.6", "your bucketing sampler pads little, and draws new buckets and a new batch order every epoch.")
def bucket_sampler(sampler_cls: Any) -> None:
    """``sampler_cls(lengths, batch_size, bucket_size, generator)``: a batch sampler that buckets, sorts, reshuffles."""
    attempted(sampler_cls)
    require(isinstance(sampler_cls, type), "pass the class itself, `MyBucketSampler`, not an instance.")
    lengths = _lengths(500, seed=500)
    s = sampler_cls(lengths, 16, 64, torch.Generator().manual_seed(0))
    call = "MyBucketSampler(500 lengths, batch_size=16, bucket_size=64)"
    epoch1 = _batches(list(s), call)
    seen = Counter(i for b in epoch1 for i in b)
    require(
        sorted(seen) == list(range(500)) and max(seen.values()) == 1,
        f"{call}: an epoch should hold every index 0..499 exactly once, got {len(seen)} distinct in {sum(seen.values())}.",
    )
    sizes = [len(b) for b in epoch1]
    require(
        max(sizes) <= 16 and sum(sz < 16 for sz in sizes) <= 1,
        f"{call}: batch sizes {sorted(Counter(sizes).items())}: cut each sorted bucket into batches of batch_size; "
        "with buckets a multiple of batch_size, only the last one can be short.",
    )
    require(
        len(s) == len(epoch1),
        f"len() says {len(s)} batches but an epoch has {len(epoch1)}: "
        "__len__ is the number of batches, math.ceil(len(lengths) / batch_size).",
    )
    at_random = padding_fraction(torch.randperm(500, generator=torch.Generator().manual_seed(0)).split(16), lengths)
    share = padding_fraction(epoch1, lengths)
    require(
        share < 0.75 * at_random,
        f"{call}: {share:.0%} padding, about as much as random batches ({at_random:.0%}): "
        "sort each bucket by length (torch.argsort) before cutting it into batches.",
    )
    longest = [max(lengths[i] for i in b) for b in epoch1]
    require(
        longest != sorted(longest) and longest != sorted(longest, reverse=True),
        f"{call}: the batches run from short to long: shuffle the order of the batches with the generator.",
    )
    epoch2 = _batches(list(s), call)
    require(
        epoch2 != epoch1,
        "the second epoch repeats the first: draw the shuffle in __iter__ from self.generator, so "
        "that every epoch (every `for` over the sampler) gets new buckets and a new batch order.",
    )
    kept = shared_batchmates(epoch1, epoch2)
    require(
        kept < 0.5,
        f"{kept:.0%} of batch-mates share a batch again next epoch: shuffle all indices before cutting "
        "them into buckets, and sort only within each bucket (a full sort fixes who shares a batch).",
    )
    per_bucket = 64 // 16
    runs = [epoch1[k : k + per_bucket] for k in range(0, len(epoch1), per_bucket)]
    require(
        not all(_one_bucket(run, lengths) for run in runs),
        f"{call}: the batches come bucket by bucket: every {per_bucket} batches in a row are the slices of one "
        "sorted bucket (their lengths never overlap), whatever order you give them within it. Step 4: collect the "
        "batches of all buckets, then yield them in a random order (torch.randperm(len(batches), "
        "generator=self.generator)).",
    )
    twin = sampler_cls(lengths, 16, 64, torch.Generator().manual_seed(0))
    require(
        _batches(list(twin), call) == epoch1 and _batches(list(twin), call) == epoch2,
        "two samplers with generators seeded 0 give different epochs: draw every random choice from self.generator.",
    )
    loader = DataLoader(list(range(500)), batch_sampler=sampler_cls(lengths, 16, 64, torch.Generator().manual_seed(0)))
    require(
        [b.tolist() for b in loader] == epoch1,
        "as a DataLoader's batch_sampler it yields other batches than iterated directly.",
    )


@exercise(
    "06.4",
    "balanced_sampler draws class c in proportion to count_c^(1 - power), with replacement, reproducibly from your generator.",
)
def balanced_sampler(fn: Callable[..., Any]) -> None:
    """``fn(targets, power, generator)``: a sampler of ``len(targets)`` draws, each sample weighted ``count**-power``."""
    attempted(fn)
    counts = np.array([40, 20, 10, 5, 3])
    targets = np.repeat(np.arange(len(counts)), counts)  # stored class by class, as the notebook's subset
    n = len(targets)

    def draws(power: float, seed: int, epochs: int = 1) -> np.ndarray:
        sampler = fn(targets, power, torch.Generator().manual_seed(seed))
        require(sampler is not None, "balanced_sampler returned None: return the sampler.")
        size = len(sampler)
        require(
            size == n,
            f"one epoch should draw as many samples as the data set has ({n}), got len {size}: "
            "num_samples=len(targets).",
        )
        out = np.array([int(i) for _ in range(epochs) for i in sampler])
        require(
            out.size == n * epochs and out.min() >= 0 and out.max() < n,
            f"the sampler should yield {n} indices in 0..{n - 1} per epoch.",
        )
        return out

    first = draws(1.0, 0)
    require(
        first.max() >= len(counts),
        f"only indices 0..{first.max()} come up: those are {len(counts)} weights, one per "
        "*class*. Give every sample the weight of its class: (counts ** -power)[targets].",
    )
    torch.manual_seed(1)
    a = draws(1.0, 0)
    torch.manual_seed(2)
    b = draws(1.0, 0)
    require(
        np.array_equal(a, b), "the same generator seed gave different draws: pass generator=generator to the sampler."
    )
    sampler = fn(targets, 1.0, torch.Generator().manual_seed(0))
    require(
        list(sampler) != list(sampler),
        "two epochs of one sampler drew the same indices: let the sampler draw from "
        "the generator you were given, epoch after epoch, instead of re-seeding it.",
    )
    for power in (1.0, 0.5, 0.0):
        drawn = draws(power, 1, epochs=40)
        shares = np.bincount(targets[drawn], minlength=len(counts)) / drawn.size
        want = counts ** (1.0 - power) / (counts ** (1.0 - power)).sum()
        if not np.allclose(shares, want, atol=0.03):
            got = ", ".join(f"{v:.0%}" for v in shares)
            goal = ", ".join(f"{v:.0%}" for v in want)
            hint = (
                f"with power={power} the classes (sizes {counts.tolist()}) should come up {goal} of the time, got {got}: "
                "weight each sample by count ** -power, count being the size of its class"
            )
            if shares[0] > counts[0] / n + 0.03:
                hint = (
                    f"with power={power} the largest class comes up {shares[0]:.0%} of the time, more often than in the "
                    "data set: the weight is count ** -power (a negative exponent), not count ** power"
                )
            elif power == 1.0 and np.allclose(shares, counts / n, atol=0.03):
                hint = (
                    f"with power={power} the classes come up {got} of the time, the data set's own proportions: draw "
                    "with replacement=True (without it an epoch is a permutation, imbalance and all)"
                )
            raise Hint(hint + ".")


__all__ = [
    "epoch_shuffle",
    "train_val_samplers",
    "balanced_weights",
    "class_then_sample",
    "bucket_sampler",
    "balanced_sampler",
]
