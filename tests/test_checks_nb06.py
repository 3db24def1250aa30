"""course_lib.checks.nb06: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import pytest

import math

import numpy as np
import torch
from torch.utils.data import Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler

from course_lib.checks import Status, nb06
from course_lib.samplers import imbalanced_subset
from exercise_status import status

pytestmark = pytest.mark.quick


IMBALANCED = np.repeat(np.arange(10), 80)[
    imbalanced_subset(np.repeat(np.arange(10), 80), [80, 60, 45, 35, 25, 18, 12, 8, 5, 3])
]


def test_06_balanced_weights() -> None:
    counts = np.bincount(IMBALANCED)
    assert status(nb06.balanced_weights, 1.0 / counts[IMBALANCED], IMBALANCED)[0] is Status.SOLVED
    assert status(nb06.balanced_weights, torch.tensor(1.0 / counts[IMBALANCED]).float(), IMBALANCED)[0] is Status.SOLVED
    assert (
        status(nb06.balanced_weights, list(3.0 / counts[IMBALANCED]), IMBALANCED)[0] is Status.SOLVED
    )  # scale is free
    assert status(nb06.balanced_weights, ..., IMBALANCED)[0] is Status.NOT_ATTEMPTED
    per_class = status(nb06.balanced_weights, 1.0 / counts, IMBALANCED)
    assert per_class[0] is Status.WRONG and "one per *class*" in per_class[1] and "only indices 0..9" in per_class[1]
    assert "same weight" in status(nb06.balanced_weights, np.ones(len(IMBALANCED)), IMBALANCED)[1]
    assert "1 / count, not count" in status(nb06.balanced_weights, counts[IMBALANCED].astype(float), IMBALANCED)[1]
    assert (
        "one weight per sample of the imbalanced set: 291 numbers, got 800"
        in status(nb06.balanced_weights, np.ones(800), IMBALANCED)[1]
    )
    with np.errstate(divide="ignore"):
        infinite = 1.0 / (counts[IMBALANCED] - counts[0])  # class 0 divides by zero
    assert "inf or nan" in status(nb06.balanced_weights, infinite, IMBALANCED)[1]
    assert "not enough to make up" in status(nb06.balanced_weights, 1.0 / np.sqrt(counts[IMBALANCED]), IMBALANCED)[1]
    odd = np.where(IMBALANCED % 2 == 0, 1.0, 3.0) / counts[IMBALANCED]  # odd classes three times too heavy
    assert "1 / (number of samples of its class)" in status(nb06.balanced_weights, odd, IMBALANCED)[1]
    assert "not all 0" in status(nb06.balanced_weights, np.zeros(len(IMBALANCED)), IMBALANCED)[1]
    assert "1-D" in status(nb06.balanced_weights, np.ones((291, 2)), IMBALANCED)[1]
    assert "list, array or tensor of numbers" in status(nb06.balanced_weights, "heavy", IMBALANCED)[1]


def _split(n, val_fraction, seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist()
    n_val = round(n * val_fraction)
    return SubsetRandomSampler(order[n_val:], generator=g), sorted(order[:n_val])


def test_06_train_val_samplers() -> None:
    assert status(nb06.train_val_samplers, _split)[0] is Status.SOLVED
    assert status(nb06.train_val_samplers, ...)[0] is Status.NOT_ATTEMPTED

    def stub(n, val_fraction, seed):
        raise NotImplementedError

    assert status(nb06.train_val_samplers, stub)[0] is Status.NOT_ATTEMPTED

    def tail_block(n, f, seed):
        n_val = round(n * f)
        return SubsetRandomSampler(range(n - n_val), generator=torch.Generator().manual_seed(seed)), list(
            range(n - n_val, n)
        )

    def overlapping(n, f, seed):
        train, val = _split(n, f, seed)
        return SubsetRandomSampler(list(train.indices[1:]) + [val[0]], generator=train.generator), val

    def sequential_train(n, f, seed):
        train, val = _split(n, f, seed)
        return sorted(train.indices), val

    def shuffled_val(n, f, seed):
        train, val = _split(n, f, seed)
        return train, SubsetRandomSampler(val, generator=torch.Generator().manual_seed(seed + 1))

    def global_rng(n, f, seed):
        train, val = _split(n, f, seed)
        return SubsetRandomSampler(train.indices), val

    def seeds_global(n, f, seed):
        torch.manual_seed(seed)
        order = torch.randperm(n).tolist()
        n_val = round(n * f)
        return SubsetRandomSampler(order[n_val:], generator=torch.default_generator), sorted(order[:n_val])

    def reseeded_each_epoch(n, f, seed):
        train, val = _split(n, f, seed)

        class Reseeding:
            def __len__(self):
                return len(train)

            def __iter__(self):
                return iter(SubsetRandomSampler(train.indices, generator=torch.Generator().manual_seed(seed)))

        return Reseeding(), val

    def fixed_seed(n, f, seed):
        return _split(n, f, 0)

    def sequential_sampler_val(n, f, seed):  # SequentialSampler(val_idx) yields 0..len(val_idx)-1
        train, val = _split(n, f, seed)
        return train, SequentialSampler(val)

    def first_block(n, f, seed):  # issue 51: validation = the first k indices, a plain list: a block, not positions
        n_val = round(n * f)
        return SubsetRandomSampler(range(n_val, n), generator=torch.Generator().manual_seed(seed)), list(range(n_val))

    def wrong_size(n, f, seed):
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(n, generator=g).tolist()
        return SubsetRandomSampler(order[n // 4 :], generator=g), sorted(order[: n // 4])

    assert "one block (80..99)" in status(nb06.train_val_samplers, tail_block)[1]
    assert "in both parts" in status(nb06.train_val_samplers, overlapping)[1]
    message = status(nb06.train_val_samplers, sequential_sampler_val)[1]
    assert "validation sampler yields 0, 1, ..., 19: positions, not the indices you chose" in message
    assert "in both parts" not in message
    message = status(nb06.train_val_samplers, first_block)[1]
    assert "one block (0..19)" in message and "positions" not in message, message
    assert "increasing order: use SubsetRandomSampler" in status(nb06.train_val_samplers, sequential_train)[1]
    assert "validation order changes" in status(nb06.train_val_samplers, shuffled_val)[1]
    assert "global generator" in status(nb06.train_val_samplers, global_rng)[1]
    assert "global generator" in status(nb06.train_val_samplers, seeds_global)[1]
    assert "same in two epochs" in status(nb06.train_val_samplers, reseeded_each_epoch)[1]
    assert "seeds 0 and 1 give the same split" in status(nb06.train_val_samplers, fixed_seed)[1]
    assert "round(100 * 0.2) = 20 indices, got 25" in status(nb06.train_val_samplers, wrong_size)[1]
    assert "two things" in status(nb06.train_val_samplers, lambda n, f, seed: _split(n, f, seed)[0])[1]
    assert (
        "len() and yield indices" in status(nb06.train_val_samplers, lambda n, f, seed: (_split(n, f, seed)[0], 5))[1]
    )


def test_06_checks_leave_the_learners_random_state_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    nb06.train_val_samplers.evaluate(_split)
    nb06.bucket_sampler.evaluate(MyBucketSampler)
    nb06.epoch_shuffle.evaluate(EpochShuffle)
    nb06.balanced_weights.evaluate(np.ones(len(IMBALANCED)), IMBALANCED)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------- 06.1: a first Sampler


class EpochShuffle(Sampler):
    """The notebook's solution."""

    def __init__(self, n, seed=0):
        self.n = n
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.n, generator=g).tolist()

    def __len__(self):
        return self.n


class GeneratorInInit(EpochShuffle):
    def __init__(self, n, seed=0):
        super().__init__(n, seed)
        self.g = torch.Generator().manual_seed(seed)

    def __iter__(self):
        yield from torch.randperm(self.n, generator=self.g).tolist()


class GlobalRng(EpochShuffle):
    def __iter__(self):
        yield from torch.randperm(self.n).tolist()


class IgnoresEpoch(EpochShuffle):
    def __iter__(self):
        yield from torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed)).tolist()


class FixedLength(EpochShuffle):
    def __len__(self):
        return 10


class Sequential(EpochShuffle):
    def __iter__(self):
        yield from range(self.n)


class IgnoresSeed(EpochShuffle):
    def __iter__(self):
        yield from torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()


def test_06_epoch_shuffle() -> None:
    check = nb06.epoch_shuffle
    assert status(check, EpochShuffle)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED

    class Stub(EpochShuffle):
        def __iter__(self):
            raise NotImplementedError

    assert status(check, Stub)[0] is Status.NOT_ATTEMPTED
    assert "depend on (seed, epoch) only" in status(check, GeneratorInInit)[1]
    assert "depend on (seed, epoch) only" in status(check, GlobalRng)[1]
    assert "set_epoch(1) gave the same order" in status(check, IgnoresEpoch)[1]
    assert "use n, not a fixed number" in status(check, FixedLength)[1]
    assert "the order is 0, 1, 2" in status(check, Sequential)[1]
    assert "seeds 3 and 4 give the same order" in status(check, IgnoresSeed)[1]
    assert "not an instance" in status(check, EpochShuffle(10))[1]


# ----------------------------------------------------------------- 06.6: a bucketing batch sampler


class MyBucketSampler(Sampler):
    """The notebook's solution."""

    def __init__(self, lengths, batch_size, bucket_size, generator):
        self.lengths = torch.as_tensor(lengths)
        self.batch_size = batch_size
        self.bucket_size = bucket_size
        self.generator = generator

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        batches = []
        for bucket in order.split(self.bucket_size):
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True)]
            batches.extend(by_length.split(self.batch_size))
        for k in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[k].tolist()

    def __len__(self):
        return math.ceil(len(self.lengths) / self.batch_size)


class OnceInInit(MyBucketSampler):  # the batches computed once: every epoch the same (what 06.3 used to teach)
    def __init__(self, lengths, batch_size, bucket_size, generator):
        super().__init__(lengths, batch_size, bucket_size, generator)
        self.fixed = list(super().__iter__())

    def __iter__(self):
        yield from self.fixed


class FullSort(MyBucketSampler):
    def __iter__(self):
        by_length = torch.argsort(self.lengths, stable=True)
        batches = list(by_length.split(self.batch_size))
        for k in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[k].tolist()


class NoSort(MyBucketSampler):
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        for b in order.split(self.batch_size):
            yield b.tolist()


class BatchesInOrder(MyBucketSampler):
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        by_length = order[torch.argsort(self.lengths[order], stable=True)]
        yield from (b.tolist() for b in by_length.split(self.batch_size))


class NoBatchShuffle(MyBucketSampler):  # steps 1-3 only: each bucket's batches, short to long, bucket after bucket
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        for bucket in order.split(self.bucket_size):
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True)]
            yield from (b.tolist() for b in by_length.split(self.batch_size))


class NoBatchShuffleLongFirst(MyBucketSampler):  # the same, each bucket long to short
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        for bucket in order.split(self.bucket_size):
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True, descending=True)]
            yield from (b.tolist() for b in by_length.split(self.batch_size))


class ZigZag(MyBucketSampler):  # issue 51: buckets in turn short to long and long to short, never shuffled
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        for k, bucket in enumerate(order.split(self.bucket_size)):
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True, descending=k % 2 == 1)]
            yield from (b.tolist() for b in by_length.split(self.batch_size))


class ShuffledWithinBucket(MyBucketSampler):  # issue 51: each bucket's batches shuffled, the buckets one after another
    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator)
        for bucket in order.split(self.bucket_size):
            by_length = bucket[torch.argsort(self.lengths[bucket], stable=True)]
            batches = by_length.split(self.batch_size)
            for k in torch.randperm(len(batches), generator=self.generator).tolist():
                yield batches[k].tolist()


class WrongLength(MyBucketSampler):
    def __len__(self):
        return len(self.lengths)


class GlobalShuffle(MyBucketSampler):
    def __iter__(self):
        self.generator = None
        yield from super().__iter__()


def test_06_bucket_sampler() -> None:
    check = nb06.bucket_sampler
    assert status(check, MyBucketSampler)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert "second epoch repeats the first" in status(check, OnceInInit)[1]
    assert "sort only within each bucket" in status(check, FullSort)[1]
    assert "sort each bucket by length" in status(check, NoSort)[1]
    assert "run from short to long" in status(check, BatchesInOrder)[1]
    for no_step_4 in (NoBatchShuffle, NoBatchShuffleLongFirst, ZigZag, ShuffledWithinBucket):
        assert "Step 4: collect the batches of all buckets" in status(check, no_step_4)[1], no_step_4
    assert "__len__ is the number of batches" in status(check, WrongLength)[1]
    assert "draw every random choice from self.generator" in status(check, GlobalShuffle)[1]


# ----------------------------------------------------------------- 06.5: a class first, then a sample of it


class ClassThenSample(Sampler):
    """The notebook's solution."""

    def __init__(self, targets, num_samples, generator):
        targets = torch.as_tensor(targets)
        self.members = [torch.nonzero(targets == c).flatten() for c in targets.unique()]
        self.num_samples = num_samples
        self.generator = generator

    def __iter__(self):
        classes = torch.randint(len(self.members), (self.num_samples,), generator=self.generator)
        for c in classes.tolist():
            members = self.members[c]
            yield int(members[torch.randint(len(members), (1,), generator=self.generator)])

    def __len__(self):
        return self.num_samples


class UniformOverSamples(ClassThenSample):
    def __iter__(self):
        n = sum(len(m) for m in self.members)
        yield from torch.randint(n, (self.num_samples,), generator=self.generator).tolist()


class FirstMembers(ClassThenSample):
    def __iter__(self):
        classes = torch.randint(len(self.members), (self.num_samples,), generator=self.generator)
        for c in classes.tolist():
            yield int(self.members[c][torch.randint(5, (1,), generator=self.generator)])


class FreshGenerator(ClassThenSample):
    def __iter__(self):
        self.generator = torch.Generator().manual_seed(0)
        yield from super().__iter__()


class GlobalDraws(ClassThenSample):
    def __iter__(self):
        self.generator = None
        yield from super().__iter__()


class YieldsLabels(ClassThenSample):
    def __iter__(self):
        yield from torch.randint(len(self.members), (self.num_samples,), generator=self.generator).tolist()


def test_06_class_then_sample() -> None:
    check = nb06.class_then_sample
    assert status(check, ClassThenSample)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert "pick the class first" in status(check, UniformOverSamples)[1]
    assert "only 5 different ones" in status(check, FirstMembers)[1]
    assert "second epoch repeats the first" in status(check, FreshGenerator)[1]
    assert "not from torch's global generator" in status(check, GlobalDraws)[1]
    assert "pick the class first" in status(check, YieldsLabels)[1]


# ----------------------------------------------------------------- 06.4: softer balancing


def balanced_sampler(targets, power, generator):
    """The notebook's solution."""
    targets = torch.as_tensor(targets)
    weights = torch.bincount(targets).double()[targets] ** -power
    return WeightedRandomSampler(weights, num_samples=len(targets), replacement=True, generator=generator)


def test_06_balanced_sampler() -> None:
    check = nb06.balanced_sampler
    assert status(check, balanced_sampler)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED

    def stub(targets, power, generator):
        raise NotImplementedError

    def weighted(weights_of, replacement=True, size=None, generator_of=lambda g: g):
        def fn(targets, power, generator):
            targets = torch.as_tensor(targets)
            weights = weights_of(torch.bincount(targets).double(), targets, power)
            return WeightedRandomSampler(
                weights, num_samples=size or len(targets), replacement=replacement, generator=generator_of(generator)
            )

        return fn

    class Reseeding:  # a new generator with the same seed every epoch: all epochs alike
        def __init__(self, targets, power, generator):
            self.args, self.seed = (targets, power), generator.initial_seed()

        def __len__(self):
            return len(self.args[0])

        def __iter__(self):
            return iter(balanced_sampler(*self.args, torch.Generator().manual_seed(self.seed)))

    per_sample = lambda counts, targets, power: counts[targets] ** -power
    assert status(check, stub)[0] is Status.NOT_ATTEMPTED
    assert "one per *class*" in status(check, weighted(lambda c, t, p: c**-p))[1]
    assert "with power=0.5" in status(check, weighted(lambda c, t, p: c[t] ** -1.0))[1]
    assert "negative exponent" in status(check, weighted(lambda c, t, p: c[t] ** p))[1]
    assert "replacement=True" in status(check, weighted(per_sample, replacement=False))[1]
    assert "pass generator=generator" in status(check, weighted(per_sample, generator_of=lambda g: None))[1]
    assert "num_samples=len(targets)" in status(check, weighted(per_sample, size=10))[1]
    assert "instead of re-seeding" in status(check, Reseeding)[1]
