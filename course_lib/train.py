"""Notebook 07, section 5: the course's data-parallel training script, ``torchrun --nproc-per-node=N -m course_lib.train``.

Every rank loads its share of the shapes images with DataLoader workers, trains a small CNN under DDP
(gloo on CPU, NCCL on GPUs) and, with ``--report``, writes ``rankN.json`` (indices per epoch, weights digest).
``--sharding by-hand`` (``indices[rank::world]``) shows the uneven-inputs hang that ``--join`` fixes.
Here are the pieces a rank uses; the command's arguments and its loop over epochs are in
:mod:`course_tools.rank_scripts`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from . import distributed
from .datasets import WithIndex, image_tensor, shapes

__all__ = ["SmallCNN", "build_loader", "ddp_model", "epoch_mean_loss", "weights_digest"]


class SmallCNN(nn.Module):
    """Notebook 07, section 5: two convolutions and a linear layer, enough to learn the 10 shapes fast on a CPU."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def ddp_model(device: torch.device, seed: int, lr: float) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    """Notebook 07, section 5: ``(model, its DDP wrapper, optimizer)``, the same start on every rank (DDP also
    broadcasts rank 0's weights). Train through the wrapper: its ``backward`` averages the gradients over all ranks."""
    torch.manual_seed(seed)
    model = SmallCNN().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)


def epoch_mean_loss(losses: Sequence[float], device: torch.device) -> float:
    """Notebook 07, section 5: the usual end of an epoch, which every rank must reach: a barrier (say, before rank 0
    saves a checkpoint), then the mean loss over all ranks' batches for the log."""
    dist.barrier()
    total = torch.tensor([sum(losses), len(losses)], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total[0] / max(total[1], 1))


def weights_digest(model: nn.Module) -> str:
    """Notebook 07, section 5: SHA-256 of every parameter's bytes; equal digests mean bit-identical models."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_loader(args: argparse.Namespace, env: distributed.DistEnv, pin_memory: bool = False) -> tuple[DataLoader, int]:
    """Notebook 07, section 5: this rank's DataLoader over its share, and the length of the whole data set."""
    dataset = WithIndex(shapes("train", transform=functools.partial(image_tensor, size=args.image_size),
                               size=args.size, root=args.data))
    if args.limit:
        dataset = Subset(dataset, range(min(args.limit, len(dataset))))
    n = len(dataset)
    common = dict(batch_size=args.batch_size, num_workers=args.workers,
                  persistent_workers=args.workers > 0, pin_memory=pin_memory,
                  # workers' seeds differ per rank; the order itself comes from the sampler's seed
                  generator=torch.Generator().manual_seed(args.seed + env.rank))
    if args.sharding == "sampler":
        # shuffling belongs to the sampler: the DataLoader itself gets shuffle=False
        sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                     shuffle=True, seed=args.seed, drop_last=args.drop_last)
        return DataLoader(dataset, sampler=sampler, drop_last=False, **common), n
    share = Subset(dataset, range(env.rank, n, env.world_size))
    return DataLoader(share, shuffle=True, drop_last=args.drop_last, **common), n


if __name__ == "__main__":  # the command line and the loop over epochs: course_tools.rank_scripts
    from course_tools.rank_scripts import train_main

    raise SystemExit(train_main())
