"""course_lib.checks.nb03: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import numpy as np
import pytest

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from course_lib.checks import Status, nb03
from course_lib.datasets import InMemoryDataset
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


def test_03_count() -> None:
    assert status(nb03.count_batches, (16, 15))[0] is Status.SOLVED
    assert status(nb03.count_batches, (..., ...))[0] is Status.NOT_ATTEMPTED
    assert "partial batch" in status(nb03.count_batches, (15, 15))[1]
    assert "a tuple of two numbers" in status(nb03.count_batches, 16)[1]
    assert status(nb03.count_batches, [16, 15])[0] is Status.SOLVED
    assert "whole numbers (int), got '16' and '15'" in status(nb03.count_batches, ("16", "15"))[1]
    # issue 51: NumPy integers are whole numbers too (np.ceil(1000 / 64).astype(int), 1000 // np.int64(64))
    assert status(nb03.count_batches, (np.int64(16), np.int64(15)))[0] is Status.SOLVED
    assert "partial batch" in status(nb03.count_batches, (np.int64(15), np.int64(15)))[1]
    assert "whole numbers (int), got np.float64(16.0)" in status(nb03.count_batches, (np.float64(16.0), 15))[1]


def test_03_loader() -> None:
    def good(seed):
        return DataLoader(
            InMemoryDataset(torch.arange(100)),
            batch_size=10,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )

    def ordered(seed):
        return DataLoader(InMemoryDataset(torch.arange(100)), batch_size=10)

    def global_rng(seed):
        return DataLoader(InMemoryDataset(torch.arange(100)), batch_size=10, shuffle=True)

    class Reseeding:  # re-seeds at the start of every epoch: all epochs identical
        def __init__(self, seed):
            self.seed = seed

        def __iter__(self):
            return iter(good(self.seed))

    assert status(nb03.reproducible_loader, good)[0] is Status.SOLVED
    assert "turn shuffle on" in status(nb03.reproducible_loader, ordered)[1]
    assert "global generator" in status(nb03.reproducible_loader, global_rng)[1]

    def seeds_global(seed):
        torch.manual_seed(seed)
        return DataLoader(InMemoryDataset(torch.arange(100)), batch_size=10, shuffle=True)

    def seeds_global_as_argument(seed):
        return DataLoader(
            InMemoryDataset(torch.arange(100)), batch_size=10, shuffle=True, generator=torch.manual_seed(seed)
        )

    class OwnIterable:  # not a DataLoader: the generator attribute is absent, the orders decide
        def __init__(self, seed):
            self.seed = seed

        def __iter__(self):
            return iter(global_rng(self.seed))

    def pairs(seed):
        x = torch.arange(100)
        return DataLoader(
            TensorDataset(x, x), batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )

    def no_batch_size(seed):
        return DataLoader(
            InMemoryDataset(torch.arange(100)), shuffle=True, generator=torch.Generator().manual_seed(seed)
        )

    assert "global generator" in status(nb03.reproducible_loader, seeds_global)[1]
    assert "global generator" in status(nb03.reproducible_loader, seeds_global_as_argument)[1]
    assert "different orders" in status(nb03.reproducible_loader, OwnIterable)[1]
    assert status(nb03.reproducible_loader, pairs)[0] is Status.SOLVED
    assert "100 batches of sizes [1]: set batch_size=10" in status(nb03.reproducible_loader, no_batch_size)[1]
    assert "seed the generator once" in status(nb03.reproducible_loader, Reseeding)[1]
    assert status(nb03.reproducible_loader, ...)[0] is Status.NOT_ATTEMPTED


def test_03_loader_with_a_seeded_sampler() -> None:
    """Shuffling by a RandomSampler with its own seeded generator is as reproducible (review finding: it got ❌)."""

    def sampled(seed):
        data = InMemoryDataset(torch.arange(100))
        return DataLoader(
            data, batch_size=10, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(seed))
        )

    assert status(nb03.reproducible_loader, sampled)[0] is Status.SOLVED


# ----------------------------------------------------------------- 03.3: a collate_fn for dict samples


def collate_records(samples):
    """The notebook's solution."""
    tokens = [s["tokens"] for s in samples]
    lengths = torch.tensor([len(t) for t in tokens])
    padded = pad_sequence(tokens, batch_first=True, padding_value=0)
    mask = torch.arange(padded.shape[1])[None, :] < lengths[:, None]
    return {
        "tokens": padded,
        "mask": mask,
        "lengths": lengths,
        "label": torch.tensor([s["label"] for s in samples]),
        "id": [s["id"] for s in samples],
    }


def changed(**replace):
    def collate(samples):
        batch = collate_records(samples)
        for key, fn in replace.items():
            batch[key] = fn(batch, samples)
        return batch

    return collate


def test_03_collate_records() -> None:
    check = nb03.collate_records

    def stub(samples):
        raise NotImplementedError

    right_and_stubs(check, collate_records, stub)
    time_first = changed(tokens=lambda b, s: pad_sequence([x["tokens"] for x in s]))
    assert "time first" in status(check, time_first)[1]
    inverted = changed(mask=lambda b, s: ~b["mask"])
    assert "True for the first" in status(check, inverted)[1]
    int_mask = changed(mask=lambda b, s: b["mask"].long())
    assert "bool tensor" in status(check, int_mask)[1]
    list_labels = changed(label=lambda b, s: [x["label"] for x in s])
    assert "one int64 tensor" in status(check, list_labels)[1]
    no_lengths = changed()
    assert (
        "has no ['lengths']" in status(check, lambda s: {k: v for k, v in no_lengths(s).items() if k != "lengths"})[1]
    )
    assert "return a dict" in status(check, lambda s: tuple(collate_records(s).values()))[1]

    def padded_to_fixed(samples):  # pads every batch to the longest sequence of the data set: wasted work
        batch = collate_records(samples)
        extra = 9 - batch["tokens"].shape[1]
        batch["tokens"] = nn.functional.pad(batch["tokens"], (0, extra))
        batch["mask"] = nn.functional.pad(batch["mask"], (0, extra))
        return batch

    assert "longest sequence in this batch" in status(check, padded_to_fixed)[1]


# ----------------------------------------------------------------- 03.5: batches sliced from tensors


def my_batches(x, y, batch_size, generator, drop_last=False):
    """The notebook's solution."""
    order = torch.randperm(len(x), generator=generator)
    stop = len(x) - len(x) % batch_size if drop_last else len(x)
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]


def test_03_my_batches() -> None:
    check = nb03.my_batches
    assert status(check, my_batches)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED

    def in_order(x, y, batch_size, generator, drop_last=False):
        for start in range(0, len(x), batch_size):
            yield x[start : start + batch_size], y[start : start + batch_size]

    def global_rng(x, y, batch_size, generator, drop_last=False):
        order = torch.randperm(len(x))
        for start in range(0, len(x), batch_size):
            yield x[order[start : start + batch_size]], y[order[start : start + batch_size]]

    def unpaired(x, y, batch_size, generator, drop_last=False):
        ox, oy = torch.randperm(len(x), generator=generator), torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            yield x[ox[start : start + batch_size]], y[oy[start : start + batch_size]]

    def ignores_drop_last(x, y, batch_size, generator, drop_last=False):
        yield from my_batches(x, y, batch_size, generator)

    def loses_the_tail(x, y, batch_size, generator, drop_last=False):
        yield from my_batches(x, y, batch_size, generator, drop_last=True)

    def same_every_epoch(x, y, batch_size, generator, drop_last=False):
        yield from my_batches(x, y, batch_size, torch.Generator().manual_seed(0), drop_last)

    assert "order is 0, 1, 2" in status(check, in_order)[1]
    assert "not from the global one" in status(check, global_rng)[1]
    assert "x and y no longer match" in status(check, unpaired)[1]
    assert "with drop_last=True the sizes should be [4, 4]" in status(check, ignores_drop_last)[1]
    assert "should give sizes [4, 4, 2], got [4, 4]" in status(check, loses_the_tail)[1]
    assert "two epochs with one generator gave the same order" in status(check, same_every_epoch)[1]


# ----------------------------------------------------------------- 03.6: a training pass over any iterable


def my_train_epoch(model, optimizer, batches):
    """The notebook's solution."""
    total, count = 0.0, 0
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        count += len(y)
    return total / count


def test_03_my_train_epoch() -> None:
    check = nb03.my_train_epoch
    assert status(check, my_train_epoch)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED

    def mean_of_means(model, optimizer, batches):
        losses = []
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return sum(losses) / len(losses)

    def no_zero_grad(model, optimizer, batches):
        total, count = 0.0, 0
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(y), count + len(y)
        return total / count

    def no_step(model, optimizer, batches):
        total, count = 0.0, 0
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            total, count = total + loss.item() * len(y), count + len(y)
        return total / count

    def keeps_graph(model, optimizer, batches):
        total, count = 0.0, 0
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
            total, count = total + loss * len(y), count + len(y)
        return total / count

    def no_return(model, optimizer, batches):
        my_train_epoch(model, optimizer, batches)

    assert "you averaged the batch means" in status(check, mean_of_means)[1]
    assert "call optimizer.zero_grad()" in status(check, no_zero_grad)[1]
    assert "call optimizer.step()" in status(check, no_step)[1]
    assert "not a tensor that keeps the whole graph" in status(check, keeps_graph)[1]
    assert "returned None" in status(check, no_return)[1]


# ----------------------------------------------------------------- 03.4: MixUp by hand


def mixup(images, labels, num_classes, generator):
    """The notebook's solution."""
    lam = torch.rand((), generator=generator)
    perm = torch.randperm(len(images), generator=generator)
    targets = nn.functional.one_hot(labels, num_classes).float()
    return lam * images + (1 - lam) * images[perm], lam * targets + (1 - lam) * targets[perm]


def mixup_with(lam=None, perm=None, labels_mixed=True, swap=False, in_place=False):
    """A wrong MixUp: a fixed or per-sample lam, no permutation, hard labels, swapped weights, or written in place."""

    def fn(images, labels, num_classes, generator):
        g = generator if lam != "global" else None
        w = torch.rand((), generator=g) if lam in (None, "global") else lam(len(images), generator)
        p = torch.randperm(len(images), generator=g) if perm is None else perm(len(images))
        t = nn.functional.one_hot(labels, num_classes).float()
        wi = w.view(-1, 1, 1, 1) if torch.is_tensor(w) and w.dim() else w
        wl = w.view(-1, 1) if torch.is_tensor(w) and w.dim() else w
        other = images[p]
        x = images.mul_(wi).add_((1 - wi) * other) if in_place else wi * images + (1 - wi) * other
        y = ((1 - wl) * t + wl * t[p]) if swap else (wl * t + (1 - wl) * t[p])
        return x, (y if labels_mixed else t)

    return fn


def test_03_my_mixup() -> None:
    check = nb03.my_mixup

    def stub(images, labels, num_classes, generator):
        raise NotImplementedError

    right_and_stubs(check, mixup, stub)
    assert "the labels are not" in status(check, mixup_with(labels_mixed=False))[1]
    assert "swapped" in status(check, mixup_with(swap=True))[1]
    assert "not the global one" in status(check, mixup_with(lam="global"))[1]
    assert "the same proportion" in status(check, mixup_with(lam=lambda n, g: torch.tensor(0.5)))[1]
    assert "nothing was mixed" in status(check, mixup_with(perm=lambda n: torch.arange(n)))[1]
    assert "different proportions" in status(check, mixup_with(lam=lambda n, g: torch.rand(n, generator=g)))[1]
    assert "changed the batch" in status(check, mixup_with(in_place=True))[1]
    assert "soft vectors" in status(check, lambda images, labels, k, g: (mixup(images, labels, k, g)[0], labels))[1]
    assert "a pair" in status(check, lambda images, labels, k, g: mixup(images, labels, k, g)[0])[1]
