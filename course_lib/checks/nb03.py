"""Checks for notebook 03 (DataLoader basics)."""

from __future__ import annotations

import numbers
from typing import Any, Callable

import torch

from torch.utils.data import DataLoader

from ..support import fork_context
from ..datasets import RandomSequences
from ._core import Hint, attempted, drain, exercise, require


@exercise("03.1", "1000 samples in batches of 64 give 16 batches (the last one has 40), or 15 with drop_last.")
def count_batches(answer: Any) -> None:
    """``answer == (batches without drop_last, batches with drop_last)`` for 1000 samples, batch 64."""
    attempted(answer)
    require(
        isinstance(answer, (tuple, list)) and len(answer) == 2,
        "answer should be a tuple of two numbers: (batches with drop_last=False, batches with drop_last=True).",
    )
    keep, drop = answer
    require(
        all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (keep, drop)),  # np.int64 too
        f"both counts should be whole numbers (int), got {keep!r} and {drop!r}.",
    )
    require(keep == 16, f"without drop_last: {keep!r} is not right. 1000 / 64 = 15.6; does the partial batch count?")
    require(drop == 15, f"with drop_last: {drop!r} is not right. The 40 samples left over are dropped.")


def _records(n: int) -> list[dict[str, Any]]:
    ds = RandomSequences(n=n, min_len=2, max_len=9, seed=3)
    return [{"tokens": ds[i][0], "label": int(ds[i][1]), "id": f"doc-{i:02d}"} for i in range(n)]


def _check_record_batch(batch: Any, samples: list[dict[str, Any]]) -> None:
    require(
        isinstance(batch, dict), f"return a dict (keys tokens, mask, lengths, label, id), got {type(batch).__name__}."
    )
    missing = {"tokens", "mask", "lengths", "label", "id"} - set(batch)
    require(not missing, f"the batch has no {sorted(missing)}: return all of tokens, mask, lengths, label, id.")
    tokens, mask, lengths = batch["tokens"], batch["mask"], batch["lengths"]
    b, longest = len(samples), max(len(s["tokens"]) for s in samples)
    shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
    require(
        shape != (longest, b) or longest == b,
        f"tokens has shape {shape}, time first: pad_sequence(..., batch_first=True) puts the batch first.",
    )
    require(
        shape == (b, longest),
        f"tokens should have shape ({b}, {longest}) (batch, longest sequence in this batch), got {shape}.",
    )
    require(
        isinstance(lengths, torch.Tensor) and lengths.tolist() == [len(s["tokens"]) for s in samples],
        "lengths should be a tensor of each sample's number of tokens, in batch order.",
    )
    require(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and tuple(mask.shape) == (b, longest),
        "mask should be a bool tensor of the same shape as tokens (compare positions with the lengths).",
    )
    for i, s in enumerate(samples):
        n = len(s["tokens"])
        require(
            torch.equal(tokens[i, :n], s["tokens"]) and bool((tokens[i, n:] == 0).all()),
            f"row {i} of tokens should be sample {i}'s tokens, then padding 0.",
        )
        require(
            bool(mask[i, :n].all()) and not bool(mask[i, n:].any()),
            f"row {i} of mask should be True for the first {n} positions (real tokens) and False after.",
        )
    require(
        isinstance(batch["label"], torch.Tensor) and batch["label"].tolist() == [s["label"] for s in samples],
        "label should be one int64 tensor of the samples' labels, in order: torch.tensor([...]).",
    )
    require(
        list(batch["id"]) == [s["id"] for s in samples] and not isinstance(batch["id"], torch.Tensor),
        "id should be the list of the samples' ids, in order (strings stay a list, as default_collate keeps them).",
    )


@exercise(
    "03.3", "collate_records pads each batch to its own longest record, with lengths and a mask, and works in workers."
)
def collate_records(fn: Callable[[list], Any]) -> None:
    """``fn(list of {"tokens", "label", "id"})`` returns the batch as a dict; checked directly and in 2 workers."""
    attempted(fn)
    require(callable(fn), "collate_records should be a function of a list of samples.")
    samples = _records(12)
    _check_record_batch(fn(samples[:6]), samples[:6])
    _check_record_batch(fn(samples[6:7]), samples[6:7])
    loader = DataLoader(samples, batch_size=4, collate_fn=fn, num_workers=2, multiprocessing_context=fork_context())
    batches = drain(loader)
    require(len(batches) == 3, f"12 records in batches of 4 gave {len(batches)} batches.")
    for k, batch in enumerate(batches):
        _check_record_batch(batch, samples[4 * k : 4 * k + 4])


def _indices(batch: Any) -> torch.Tensor:
    """The sample values of one batch, whether it is a tensor or a (values, ...) tuple."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        batch = batch[0]
    return torch.as_tensor(batch).flatten()


def _order(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in _indices(batch)]


@exercise("03.2", "make_loader shuffles differently every epoch, yet the same seed replays the same run.")
def reproducible_loader(make_loader: Callable[[int], Any]) -> None:
    """``make_loader(seed)`` returns a shuffled loader over 0..99 in batches of 10."""
    attempted(make_loader)
    a = make_loader(0)
    sizes = [len(_indices(batch)) for batch in a]  # epoch 1
    if sizes != [10] * 10:
        raise Hint(
            f"expected 10 batches of 10 samples, got {len(sizes)} batches of sizes {sorted(set(sizes))}: set batch_size=10."
        )
    epoch2, epoch3 = _order(a), _order(a)
    require(sorted(epoch2) == list(range(100)), "each epoch should contain every index 0..99 exactly once.")
    require(epoch2 != list(range(100)), "the order is 0, 1, 2, ...: turn shuffle on.")
    own = getattr(a, "generator", "n/a")
    if own is None:  # shuffling may also be a sampler's job, with the sampler's own generator (notebook 06)
        own = getattr(getattr(a, "sampler", None), "generator", None)
    require(
        own not in (None, torch.default_generator),
        "this loader shuffles with PyTorch's global generator, so anything else that draws random numbers changes "
        "its order: give it its own, generator=torch.Generator().manual_seed(seed).",
    )
    require(epoch2 != epoch3, "two epochs gave the same order: seed the generator once, not before every epoch.")
    b, c = make_loader(0), make_loader(0)  # make both first: a loader seeded via the global generator fails here
    require(
        _order(b) == _order(c),
        "two loaders made with the same seed give different orders: pass generator=torch.Generator().manual_seed(seed).",
    )
    require(
        _order(make_loader(1)) != _order(make_loader(0)), "seeds 0 and 1 give the same order: use the seed argument."
    )


# ----------------------------------------------------------------- 03.5 and 03.6: a loader and a loop of your own


@exercise(
    "03.5",
    "my_batches slices shuffled batches straight from tensors: every sample once, the order set by the generator.",
)
def my_batches(fn: Callable[..., Any]) -> None:
    """``fn(x, y, batch_size, generator, drop_last=False)`` yields ``(x[idx], y[idx])`` batches of a fresh permutation."""
    attempted(fn)
    x, y = torch.arange(10) * 10.0, torch.arange(10)

    def run(seed: int | None = None, drop_last: bool = False, generator: Any = None) -> list[tuple[Any, Any]]:
        g = generator if generator is not None else torch.Generator().manual_seed(seed)
        return list(fn(x, y, 4, g, drop_last=drop_last))

    batches = run(0)
    for xb, yb in batches:
        require(
            isinstance(xb, torch.Tensor) and isinstance(yb, torch.Tensor),
            "each batch should be a pair of tensors (x, y).",
        )
        require(torch.equal(xb, yb * 10.0), "x and y no longer match within a batch: pick the same indices from both.")
    sizes = [len(yb) for _, yb in batches]
    require(sizes == [4, 4, 2], f"10 samples in batches of 4 should give sizes [4, 4, 2], got {sizes}.")
    seen = sorted(int(v) for _, yb in batches for v in yb)
    require(seen == list(range(10)), f"an epoch should hold every sample once, got {seen}.")
    require(
        seen != [int(v) for _, yb in batches for v in yb],
        "the order is 0, 1, 2, ...: shuffle with torch.randperm(len(x), generator=generator).",
    )
    torch.manual_seed(123)
    again = run(0)
    require(
        all(torch.equal(a[1], b[1]) for a, b in zip(batches, again)),
        "the same seed gave a different order: draw "
        "the permutation from the generator you are given (generator=generator), not from the global one.",
    )
    g = torch.Generator().manual_seed(0)
    first, second = run(generator=g), run(generator=g)
    require(
        any(not torch.equal(a[1], b[1]) for a, b in zip(first, second)),
        "two epochs with one generator gave the same order: draw a new permutation each time the function runs.",
    )
    dropped = [len(yb) for _, yb in run(0, drop_last=True)]
    require(dropped == [4, 4], f"with drop_last=True the sizes should be [4, 4], got {dropped}.")


@exercise("03.6", "my_train_epoch steps the optimiser once per batch and returns the mean loss per sample.")
def my_train_epoch(fn: Callable[..., Any]) -> None:
    """``fn(model, optimizer, batches)``: a training pass over any iterable; returns the mean loss per sample."""
    attempted(fn)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 3, generator=g), torch.randint(0, 2, (10,), generator=g)
    batches = [(x[:4], y[:4]), (x[4:8], y[4:8]), (x[8:], y[8:])]  # the last one smaller

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

    model, optimizer = fresh()
    result = fn(model, optimizer, iter(batches))  # an iterator: any iterable of batches will do
    ref_model, ref_opt = fresh()
    total = 0.0
    batch_means = []
    for xb, yb in batches:
        loss = torch.nn.functional.cross_entropy(ref_model(xb), yb)
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
        total += loss.item() * len(yb)
        batch_means.append(loss.item())
    require(result is not None, "my_train_epoch returned None: return the mean loss per sample.")
    require(
        not (isinstance(result, torch.Tensor) and result.requires_grad),
        "return a number (loss.item()), not a tensor that keeps the whole graph alive.",
    )
    same_weights = all(torch.allclose(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    untouched = all(torch.allclose(a, b) for a, b in zip(model.parameters(), fresh()[0].parameters()))
    require(not untouched, "the model did not change: call optimizer.step() after loss.backward().")
    require(
        same_weights,
        "the weights differ from three plain SGD steps: call optimizer.zero_grad() before each "
        "backward(), or the gradients of earlier batches add up.",
    )
    value = float(result)
    require(
        abs(value - sum(batch_means) / 3) > 1e-6 or abs(value - total / 10) < 1e-6,
        "you averaged the batch means; "
        "the last batch has only 2 samples: weight each loss by len(y) and divide by the number of samples.",
    )
    require(
        abs(value - total / 10) < 1e-5,
        f"the mean loss per sample should be {total / 10:.4f}, got {value:.4f}: "
        "sum loss.item() * len(y) over the batches, then divide by the number of samples.",
    )


def _mix_weights(images: torch.Tensor, labels: torch.Tensor, out: Any, classes: int) -> torch.Tensor:
    """The soft labels of ``out = fn(images, labels, ...)``, after checking their form; one row per output sample."""
    require(isinstance(out, (tuple, list)) and len(out) == 2, "return a pair: (mixed images, mixed labels).")
    mixed, soft = out
    require(
        isinstance(mixed, torch.Tensor) and mixed.shape == images.shape,
        f"the mixed images should keep the batch's shape {tuple(images.shape)}, got "
        f"{tuple(mixed.shape) if isinstance(mixed, torch.Tensor) else type(mixed).__name__}.",
    )
    require(
        isinstance(soft, torch.Tensor) and soft.shape == (len(labels), classes),
        f"the labels should become soft vectors, [batch, num_classes] = {(len(labels), classes)}: "
        "one_hot(labels, num_classes).float(), then blend them as you blend the images.",
    )
    require(
        soft.is_floating_point() and bool((soft >= -1e-6).all()) and torch.allclose(soft.sum(1), torch.ones(len(soft))),
        "every soft label should be a float vector of shares that add up to 1: lam * one_hot + (1 - lam) * one_hot[perm].",
    )
    # every sample has a class of its own, so a soft label says how much of each sample is in the mix
    expected = soft[:, labels] @ images.flatten(1)
    if not torch.allclose(mixed.flatten(1), expected, atol=1e-4):
        pairs = (soft > 1e-6).sum(1, keepdim=True) == 2
        require(
            bool(pairs.any()),
            "the images are mixed but the labels are not: a blend of two images needs a blend "
            "of their labels, lam * one_hot + (1 - lam) * one_hot[perm], or the model learns the wrong target.",
        )
        swapped = torch.where(pairs & (soft > 1e-6), 1 - soft, soft)
        require(
            not torch.allclose(mixed.flatten(1), swapped[:, labels] @ images.flatten(1), atol=1e-4),
            "lam and 1 - lam are swapped between the images and the labels: the image that gets weight lam "
            "must give its label weight lam too.",
        )
    require(
        torch.allclose(mixed.flatten(1), expected, atol=1e-4),
        "the images and the labels are not blended alike: image i should be lam * images[i] + (1 - lam) * "
        "images[perm[i]], and its label lam * one_hot[i] + (1 - lam) * one_hot[perm[i]] (same lam, same perm).",
    )
    return soft


@exercise(
    "03.4",
    "my_mixup blends images and one-hot labels with one lam and one permutation per batch, drawn from your generator.",
)
def my_mixup(fn: Callable[..., Any]) -> None:
    """``fn(images, labels, num_classes, generator) -> (mixed images, soft labels)``: MixUp by hand."""
    attempted(fn)
    batch, classes = 6, 6
    labels = torch.tensor([3, 0, 5, 1, 4, 2])  # one sample per class
    images = torch.arange(1.0, batch + 1)[:, None, None, None].expand(batch, 3, 4, 4).clone()
    images[:, 1] *= -1  # not constant across channels: a mix of the wrong samples shows

    def run(seed: int) -> Any:
        before = images.clone()
        out = fn(images, labels, classes, torch.Generator().manual_seed(seed))
        require(
            torch.equal(images, before),
            "your function changed the batch it was given: compute new tensors "
            "(lam * images + ...) instead of writing into images.",
        )
        return out

    softs = [_mix_weights(images, labels, run(seed), classes) for seed in range(12)]
    mixed_rows = [s for s in softs if bool(((s > 1e-6).sum(1) > 1).any())]
    require(
        mixed_rows,
        "nothing was mixed: every image is itself and every label one-hot. Blend each sample with "
        "the one a random permutation puts beside it: images[torch.randperm(len(images), generator=generator)].",
    )
    for s in mixed_rows:
        rows = s[(s > 1e-6).sum(1) > 1]
        lam = rows.max(1).values
        require(
            torch.allclose(lam, lam[0], atol=1e-5),
            "the rows of one batch are mixed in different proportions: "
            "draw one lam per batch (torch.rand((), generator=generator)), as MixUp does.",
        )
    lams = {round(float(s.max(1).values.min()), 4) for s in softs}
    require(
        len(lams) > 3,
        "every batch is mixed in the same proportion: draw lam anew for each batch from the "
        "generator, e.g. torch.rand((), generator=generator) (Beta(1, 1), the uniform distribution).",
    )
    torch.manual_seed(7)
    first = run(0)
    torch.manual_seed(8)
    again = run(0)
    require(
        all(torch.equal(a, b) for a, b in zip(first, again)),
        "the same generator seed gave a different mix: draw "
        "lam and the permutation from the generator you are given (generator=generator), not the global one.",
    )


__all__ = ["count_batches", "reproducible_loader", "collate_records", "my_batches", "my_train_epoch", "my_mixup"]
