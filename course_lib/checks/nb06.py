"""Checks for notebook 06 (distributed sampling).

Every check compares the learner's answer with torch's own ``DistributedSampler``, over many
data set sizes and world sizes, so a formula that only fits the notebook's example is caught.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils.data.distributed import DistributedSampler

from ..samplers import coverage
from ._core import Hint, attempted, exercise, require, whole_number

CASES = [(n, w) for n in (1, 7, 10, 23, 100, 101) for w in (1, 2, 3, 4, 8) if n >= w]


def _as_int(value: Any, call: str) -> int:
    return whole_number(value, call, "a rank gets a whole number of samples (math.ceil / floor division).")


@exercise("06.1", "per rank: ceil(n / world) with padding, n // world with drop_last, the same on every rank.")
def samples_per_rank(fn: Callable[[int, int, bool], Any]) -> None:
    """``fn(n, world_size, drop_last)`` is the number of indices each rank's DistributedSampler yields."""
    attempted(fn)
    for drop_last in (False, True):
        for n, world in CASES:
            call = f"samples_per_rank({n}, {world}, drop_last={drop_last})"
            got = _as_int(fn(n, world, drop_last), call)
            truth = len(DistributedSampler(range(n), num_replicas=world, rank=0, drop_last=drop_last))
            if got == truth:
                continue
            if drop_last and got == math.ceil(n / world):
                raise Hint(f"{call} = {got}: with drop_last=True the sampler drops the tail instead of padding, so round down.")
            if not drop_last and got == n // world:
                raise Hint(f"{call} = {got}: with drop_last=False the sampler pads with repeated samples, so round up.")
            if got == n / world or got == round(n / world):
                raise Hint(f"{call} = {got}, but {n} / {world} does not divide evenly: every rank gets the same whole number.")
            if got == n:
                raise Hint(f"{call} = {got}: that is the whole data set; each rank gets about 1/{world} of it.")
            raise Hint(f"{call} = {got}, but the sampler gives each rank {truth}.")


def _indices(sampler: Any, call: str) -> list[int]:
    require(hasattr(sampler, "__iter__"), f"{call} should return a sampler (something that yields indices), got {type(sampler).__name__}.")
    return [int(i) for i in sampler]


@exercise("06.2", "a DistributedSampler per rank with one shared seed, shuffle on, and set_epoch(epoch) called.")
def epoch_sampler(fn: Callable[[Any, int, int, int], Any]) -> None:
    """``fn(dataset, world_size, rank, epoch)`` returns the sampler rank ``rank`` should use in ``epoch``."""
    attempted(fn)
    data = range(23)
    for world in (2, 3, 4):
        orders = []
        for epoch in (0, 1, 2):
            call = f"epoch_sampler(dataset, world_size={world}, rank=..., epoch={epoch})"
            shares = [_indices(fn(data, world, rank, epoch), call.replace("...", str(rank))) for rank in range(world)]
            cov = coverage(shares, len(data))
            if shares[0] == shares[1]:
                raise Hint(f"{call}: ranks 0 and 1 get the same indices; give the sampler num_replicas=world_size and rank=rank.")
            sizes = sorted({len(sh) for sh in shares})
            require(len(sizes) == 1, f"{call}: ranks get {sizes} indices; a DistributedSampler gives every rank the same number.")
            dropped = len(data) - world * sizes[0]  # > 0 only with drop_last=True
            require(
                len(cov.missing) <= max(dropped, 0) and len(cov.repeated) <= world - 1,
                f"{call}: indices {cov.missing[:5]} go to no rank and {len(cov.repeated)} go to several. Did every "
                "rank use the same seed? The shuffle must be the same permutation on every rank, so give them all one seed.",
            )
            require(shares[0] != sorted(shares[0]), f"{call}: rank 0's indices come in increasing order: turn shuffle on (it is the sampler's job, not the DataLoader's).")
            orders.append(shares[0])
        require(
            len({tuple(o) for o in orders}) == 3,
            f"world_size={world}: rank 0 gets the same order in two of epochs 0, 1, 2. Call sampler.set_epoch(epoch) before returning it.",
        )
    again = _indices(fn(data, 2, 0, 1), "epoch_sampler(dataset, 2, 0, 1)")
    require(
        again == _indices(fn(data, 2, 0, 1), "epoch_sampler(dataset, 2, 0, 1)"),
        "two calls for the same rank and epoch give different orders: pass a fixed seed (the default seed=0 is fine).",
    )


@exercise("06.3", "an exact evaluation split: rank r takes r, r + world, r + 2·world, ... — no padding, nothing dropped.")
def eval_indices(fn: Callable[[int, int, int], Any]) -> None:
    """``fn(n, world_size, rank)`` lists the validation indices rank ``rank`` evaluates, each exactly once overall."""
    attempted(fn)
    for n, world in CASES + [(3, 4), (1, 2)]:
        call = f"eval_indices({n}, {world}, rank)"
        shares = [_indices(fn(n, world, rank), call.replace("rank)", f"{rank})")) for rank in range(world)]
        require(all(0 <= i < n for s in shares for i in s), f"{call}: some index is outside 0..{n - 1}.")
        cov = coverage(shares, n)
        if cov.repeated:
            raise Hint(
                f"{call}: indices {cov.repeated[:5]} are evaluated twice; that is DistributedSampler's padding, which "
                "counts those samples twice in the metric. Give each index to exactly one rank."
            )
        if cov.missing:
            raise Hint(
                f"{call}: indices {cov.missing[:5]} are never evaluated (drop_last?). Evaluation must see every sample; "
                "ranks may get different counts."
            )
        sizes = [len(s) for s in shares]
        require(max(sizes) - min(sizes) <= 1, f"{call}: ranks get {sizes} samples; balance them (at most one apart).")
