"""course_lib.samplers: orders over epochs, class counts and weights, and the bucketing batch sampler."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
)

from course_lib.datasets import RandomSequences
from course_lib.loaders import pad_collate
from course_lib.samplers import (
    BucketBatchSampler,
    balancing_weights,
    class_counts,
    coverage,
    imbalanced_subset,
    index_orders,
    one_epoch,
    padding_fraction,
    plot_index_orders,
    shared_batchmates,
)

pytestmark = pytest.mark.quick


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------- index orders


def test_index_orders_of_sequential_and_random_samplers() -> None:
    seq = index_orders(SequentialSampler(range(6)), 3)
    assert seq.shape == (3, 6) and seq.dtype == np.int64
    assert (seq == np.arange(6)).all()
    rnd = index_orders(RandomSampler(range(6), generator=gen()), 4)
    assert all(sorted(row) == list(range(6)) for row in rnd.tolist())
    assert len({tuple(row) for row in rnd.tolist()}) > 1  # the generator advances: new order each epoch
    assert (index_orders(RandomSampler(range(6), generator=gen()), 4) == rnd).all()  # and replays for a seed


def test_index_orders_joins_batches_and_calls_set_epoch() -> None:
    batches = index_orders(BatchSampler(SequentialSampler(range(7)), 3, drop_last=False), 2)
    assert batches.tolist() == [list(range(7))] * 2

    class EpochAware:
        def __init__(self) -> None:
            self.epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            return iter([self.epoch, self.epoch])

    assert index_orders(EpochAware(), 3).tolist() == [[0, 0], [1, 1], [2, 2]]


def test_index_orders_errors() -> None:
    with pytest.raises(ValueError, match="runs only once: pass the sampler itself"):
        index_orders(iter(range(5)), 2)
    with pytest.raises(ValueError, match="no indices"):
        index_orders([], 2)
    with pytest.raises(ValueError, match="epochs must be a whole number >= 1"):
        index_orders(range(3), 0)
    with pytest.raises(ValueError, match="epochs"):
        index_orders(range(3), 2.5)


def test_plot_index_orders() -> None:
    orders = index_orders(RandomSampler(range(20), generator=gen()), 3)
    fig = plot_index_orders(orders, title="random")
    assert isinstance(fig, Figure) and fig.axes[0].get_title() == "random"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "1", "2"]
    targets = np.repeat(np.arange(4), 5)
    fig = plot_index_orders(orders, colour_by=targets, class_names=["a", "b", "c", "d"])
    assert fig.axes[0].images[0].get_array().max() == 3  # coloured by class, not by index
    import matplotlib.pyplot as plt

    fig2, ax = plt.subplots()
    assert plot_index_orders(orders, ax=ax) is fig2
    lengths = np.arange(20) * 10  # many distinct values: a continuous scale
    fig = plot_index_orders(orders, colour_by=lengths, colour_label="length")
    assert fig.axes[0].images[0].get_array().max() == 190 and fig.axes[-1].get_ylabel() == "length"
    with pytest.raises(ValueError, match="2-D"):
        plot_index_orders([1, 2, 3])
    with pytest.raises(ValueError, match="no entry in colour_by"):
        plot_index_orders(orders, colour_by=[0, 1])


# ----------------------------------------------------------------- classes and weights


def test_class_counts_from_samplers_lists_and_batches() -> None:
    targets = np.array([0, 0, 1, 2, 2, 2])
    assert class_counts(range(6), targets).tolist() == [2, 1, 3]
    assert class_counts([5, 5, 5], targets, num_classes=4).tolist() == [0, 0, 3, 0]
    assert class_counts(BatchSampler(range(6), 4, False), torch.tensor(targets)).tolist() == [2, 1, 3]
    assert class_counts(torch.tensor([0, 2]), targets.tolist()).tolist() == [1, 1, 0]


def test_class_counts_errors() -> None:
    with pytest.raises(ValueError, match="out of range for 3 targets"):
        class_counts([0, 3], [0, 1, 1])
    with pytest.raises(ValueError, match="num_classes=2"):
        class_counts([0], [0, 2], num_classes=2)
    with pytest.raises(ValueError, match="empty"):
        class_counts([0], [])
    with pytest.raises(ValueError, match="whole numbers"):
        class_counts([0], [0.5, 1.0])
    with pytest.raises(ValueError, match=">= 0"):
        class_counts([0], [0, -1])
    with pytest.raises(ValueError, match="one-dimensional"):
        class_counts([0], [[0, 1]])


def test_balancing_weights_are_per_sample_and_balance_the_classes() -> None:
    targets = np.repeat(np.arange(4), [40, 20, 8, 2])
    w = balancing_weights(targets)
    assert w.dtype == torch.float64 and w.shape == (70,)
    assert w[0] == pytest.approx(1 / 40) and w[-1] == pytest.approx(1 / 2)
    per_class = torch.zeros(4, dtype=torch.float64).index_add_(0, torch.as_tensor(targets), w)
    assert torch.allclose(per_class, torch.ones(4, dtype=torch.float64))
    drawn = class_counts(WeightedRandomSampler(w, 8000, generator=gen()), targets)
    assert drawn.min() > 0.85 * 2000 and drawn.max() < 1.15 * 2000
    assert balancing_weights([1.0, 1.0, 0.0]).tolist() == [0.5, 0.5, 1.0]  # float labels that are whole are fine


def test_per_class_weights_are_the_pitfall() -> None:
    """One weight per class: WeightedRandomSampler draws only indices 0..k-1."""
    targets = np.repeat(np.arange(4), [40, 20, 8, 2])
    class_weights = 1.0 / np.bincount(targets)
    drawn = one_epoch(WeightedRandomSampler(class_weights, 1000, generator=gen()))
    assert set(drawn) <= {0, 1, 2, 3}
    assert class_counts(drawn, targets).tolist() == [1000, 0, 0, 0]


def test_balancing_weights_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        balancing_weights([])
    with pytest.raises(ValueError, match="whole numbers"):
        balancing_weights(["cat", "dog"])
    with pytest.raises(ValueError, match=">= 0"):
        balancing_weights([0, -2])


def test_coverage_counts_repeats_and_unseen() -> None:
    cov = coverage([0, 1, 1, 1, 3], 5)
    assert (cov.drawn, cov.distinct, cov.repeats, cov.unseen, cov.repeated, cov.missing) == (5, 3, 2, 2, [1], [2, 4])
    assert repr(cov) == "Coverage(drawn=5, distinct=3, repeats=2, unseen=2)" and not cov.exact  # notebook 08 prints it
    assert coverage(RandomSampler(range(10), generator=gen()), 10).exact
    cov = coverage(RandomSampler(range(1000), replacement=True, generator=gen()), 1000)
    assert 0.33 < cov.unseen / 1000 < 0.41  # about 1/e of the samples are never drawn
    with pytest.raises(ValueError, match="0..4"):
        coverage([5], 5)
    with pytest.raises(ValueError, match="n must be"):
        coverage([0], 0)


def test_imbalanced_subset() -> None:
    targets = np.repeat(np.arange(3), 10)
    idx = imbalanced_subset(targets, [10, 4, 1], seed=3)
    assert idx.tolist() == sorted(idx.tolist()) and len(set(idx.tolist())) == 15
    assert np.bincount(targets[idx]).tolist() == [10, 4, 1]
    assert (imbalanced_subset(targets, [10, 4, 1], seed=3) == idx).all()
    assert (imbalanced_subset(targets, [10, 4, 1], seed=4) != idx).any()
    assert len(imbalanced_subset(targets, [0, 0, 2])) == 2
    with pytest.raises(ValueError, match="class 1 has 10 samples; counts\\[1\\]=11"):
        imbalanced_subset(targets, [1, 11, 1])
    with pytest.raises(ValueError, match="one number per class: the targets have 3 classes, counts has 2"):
        imbalanced_subset(targets, [1, 1])
    with pytest.raises(ValueError, match="between 0 and"):
        imbalanced_subset(targets, [1, -1, 1])


# ----------------------------------------------------------------- padding and bucketing


def test_padding_fraction() -> None:
    lengths = [1, 3, 2, 2]
    assert padding_fraction([[0, 1]], lengths) == pytest.approx(2 / 6)
    assert padding_fraction([[2, 3]], lengths) == 0.0
    assert padding_fraction([[0, 1], [2, 3]], lengths) == pytest.approx(2 / 10)
    assert padding_fraction([torch.tensor([0, 1])], torch.tensor(lengths)) == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="index 9, but lengths has 4"):
        padding_fraction([[0, 9]], lengths)
    with pytest.raises(ValueError, match="nothing to measure"):
        padding_fraction([], lengths)


def test_shared_batchmates() -> None:
    assert shared_batchmates([[0, 1, 2], [3, 4]], [[4, 3], [2, 1, 0]]) == 1.0
    assert shared_batchmates([[0, 1, 2], [3, 4]], [[0, 3], [1, 4], [2]]) == 0.0
    assert shared_batchmates([[0, 1], [2, 3]], [[0, 1, 2]]) == 0.5  # 3 is missing from the second epoch
    assert shared_batchmates([[0, 1], [2, 3]], [[0], [1], [2]]) == 0.0
    n, b = 960, 32
    random_pair = [list(BatchSampler(RandomSampler(range(n), generator=gen(s)), b, False)) for s in (0, 1)]
    assert shared_batchmates(*random_pair) == pytest.approx((b - 1) / (n - 1), abs=0.01)
    with pytest.raises(ValueError, match="no pairs"):
        shared_batchmates([[0], [1]], [[0, 1]])


def test_bucket_batch_sampler_basics() -> None:
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]
    s = BucketBatchSampler(lengths, 2, bucket_size=10, generator=gen())
    assert len(s) == 5 and "bucket_size=10" in repr(s)
    epoch1, epoch2 = list(s), list(s)
    assert sorted(i for b in epoch1 for i in b) == list(range(10))
    assert epoch1 != epoch2  # the generator advances
    assert epoch1 == list(BucketBatchSampler(lengths, 2, bucket_size=10, generator=gen()))
    # one bucket holding the whole set: batches are neighbours in length
    assert padding_fraction(epoch1, lengths) == pytest.approx(5 / 60)
    assert all(isinstance(i, int) for b in epoch1 for i in b)
    assert len(BucketBatchSampler(lengths, 3, bucket_size=9)) == 4
    assert len(BucketBatchSampler(lengths, 3, bucket_size=9, drop_last=True)) == 3


def test_bucketing_reduces_padding_on_random_sequences() -> None:
    ds = RandomSequences(n=600, min_len=5, max_len=200, seed=0)
    lengths = [len(ds[i][0]) for i in range(len(ds))]
    random_batches = BatchSampler(RandomSampler(ds, generator=gen()), 32, drop_last=False)
    bucketed = BucketBatchSampler(lengths, 32, bucket_size=32 * 8, generator=gen())
    assert padding_fraction(random_batches, lengths) > 0.35
    assert padding_fraction(bucketed, lengths) < 0.15
    loader = DataLoader(ds, batch_sampler=bucketed, collate_fn=pad_collate)
    padded, lens, _ = next(iter(loader))
    assert padded.shape[1] == int(lens.max())


def test_without_a_generator_the_global_generator_decides() -> None:
    s = BucketBatchSampler(list(range(20)), 4, bucket_size=8)
    torch.manual_seed(1)
    a = list(s)
    torch.manual_seed(1)
    assert list(s) == a


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lengths=[], batch_size=2), "lengths is empty"),
        (dict(lengths=[3, -1], batch_size=2), "lengths must be >= 0"),
        (dict(lengths=[[1, 2]], batch_size=2), "one-dimensional"),
        (dict(lengths=[1.5, 2], batch_size=2), "whole numbers"),
        (dict(lengths=[1, 2], batch_size=0), "batch_size must be a whole number >= 1, got 0"),
        (dict(lengths=[1, 2], batch_size=2.0), "batch_size must be a whole number"),
        (dict(lengths=[1, 2], batch_size=True), "batch_size must be a whole number"),
        (dict(lengths=[1, 2], batch_size=4, bucket_size=10), "not a multiple of batch_size=4.*use 8 or 12"),
        (dict(lengths=[1, 2], batch_size=4, bucket_size=3), "use 4 or 8"),
        (dict(lengths=[1, 2], batch_size=4, bucket_size=0), "bucket_size must be"),
        (dict(lengths=[1, 2], batch_size=1, drop_last="yes"), "drop_last must be True or False"),
    ],
)
def test_bucket_batch_sampler_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketBatchSampler(**kwargs)


def test_bucket_batch_sampler_rejects_a_seed_as_generator() -> None:
    with pytest.raises(TypeError, match="torch.Generator"):
        BucketBatchSampler([1, 2], 1, generator=0)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=120),
    batch_size=st.integers(1, 17),
    batches_per_bucket=st.integers(1, 6),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_every_index_once_per_epoch(
    lengths: list[int], batch_size: int, batches_per_bucket: int, drop_last: bool, seed: int
) -> None:
    s = BucketBatchSampler(
        lengths, batch_size, bucket_size=batch_size * batches_per_bucket, drop_last=drop_last, generator=gen(seed)
    )
    n = len(lengths)
    for _ in range(2):  # two epochs
        batches = list(s)
        assert len(batches) == len(s)
        counts = Counter(i for b in batches for i in b)
        assert all(c == 1 for c in counts.values()), "an index came twice in one epoch"
        assert set(counts) <= set(range(n))
        if drop_last:
            assert all(len(b) == batch_size for b in batches)
            assert len(counts) == n // batch_size * batch_size  # only the incomplete batch was dropped
        else:
            assert len(counts) == n
            assert sum(len(b) < batch_size for b in batches) <= 1 and all(1 <= len(b) <= batch_size for b in batches)
