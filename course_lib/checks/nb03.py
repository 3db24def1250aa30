"""Checks for notebook 03 (DataLoader basics)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..datasets import RandomSequences
from ._core import Hint, attempted, exercise, require


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
        all(isinstance(v, int) and not isinstance(v, bool) for v in (keep, drop)),
        f"both counts should be whole numbers (int), got {keep!r} and {drop!r}.",
    )
    require(keep == 16, f"without drop_last: {keep!r} is not right. 1000 / 64 = 15.6; does the partial batch count?")
    require(drop == 15, f"with drop_last: {drop!r} is not right. The 40 samples left over are dropped.")


@exercise("03.3", "collate_with_mask pads the batch and marks real tokens with True (nn.MultiheadAttention wants the opposite: pass ~mask).")
def collate_with_mask(fn: Callable[[list], Any]) -> None:
    """``fn(samples) -> (padded [B, T] int64, mask [B, T] bool, labels [B])``."""
    attempted(fn)
    ds = RandomSequences(n=6, min_len=2, max_len=9, seed=3)
    samples = [ds[i] for i in range(6)]
    out = fn(samples)
    require(isinstance(out, tuple) and len(out) == 3, "return three things: (padded, mask, labels).")
    padded, mask, labels = out
    longest = max(len(s) for s, _ in samples)
    require(isinstance(padded, torch.Tensor) and tuple(padded.shape) == (6, longest),
            f"padded should have shape (6, {longest}) (batch, longest sequence), got {getattr(padded, 'shape', padded)}.")
    require(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
            "mask should be a bool tensor (True where a real token is): compare positions with the lengths.")
    require(tuple(mask.shape) == tuple(padded.shape), "mask should have the same shape as padded.")
    for i, (seq, label) in enumerate(samples):
        n = len(seq)
        require(torch.equal(padded[i, :n], seq), f"row {i} of padded does not start with sample {i}'s tokens.")
        require(bool((padded[i, n:] == 0).all()), f"row {i}: positions after the sequence must be padding (0).")
        require(bool(mask[i, :n].all()) and not bool(mask[i, n:].any()),
                f"row {i} of mask should be True for the first {n} positions and False after.")
    require(torch.equal(torch.as_tensor(labels), torch.tensor([l for _, l in samples])), "labels should keep the samples' labels, in order.")


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
        raise Hint(f"expected 10 batches of 10 samples, got {len(sizes)} batches of sizes {sorted(set(sizes))}: set batch_size=10.")
    epoch2, epoch3 = _order(a), _order(a)
    require(sorted(epoch2) == list(range(100)), "each epoch should contain every index 0..99 exactly once.")
    require(epoch2 != list(range(100)), "the order is 0, 1, 2, ...: turn shuffle on.")
    require(
        getattr(a, "generator", "n/a") not in (None, torch.default_generator),
        "this loader shuffles with PyTorch's global generator, so anything else that draws random numbers changes "
        "its order: give it its own, generator=torch.Generator().manual_seed(seed).",
    )
    require(epoch2 != epoch3, "two epochs gave the same order: seed the generator once, not before every epoch.")
    b, c = make_loader(0), make_loader(0)  # make both first: a loader seeded via the global generator fails here
    require(
        _order(b) == _order(c),
        "two loaders made with the same seed give different orders: pass generator=torch.Generator().manual_seed(seed).",
    )
    require(_order(make_loader(1)) != _order(make_loader(0)), "seeds 0 and 1 give the same order: use the seed argument.")
