"""Notebook 07, section 5: the course's data-parallel training script, ``torchrun --nproc-per-node=N -m course_lib.train``.

Every rank loads its share of the shapes images with DataLoader workers, trains a small CNN under DDP
(gloo on CPU, NCCL on GPUs) and, with ``--report``, writes ``rankN.json`` (indices per epoch, weights digest).
``--sharding by-hand`` (``indices[rank::world]``) shows the uneven-inputs hang that ``--join`` fixes.

The whole program is this file, top to bottom: the model and the pieces a rank uses, then one rank's loop over
epochs, then the command line. Joining and leaving the job is :func:`course_lib.distributed.start` and
:func:`~course_lib.distributed.finish` (``course_lib._programs.run_on_one_rank`` calls both).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from . import distributed
from ._programs import add_data_arguments, one_line, run_on_one_rank
from .datasets import DataNotFoundError, WithIndex, image_tensor, shapes

__all__ = ["SmallCNN", "rank_dataloader", "ddp_model", "epoch_mean_loss", "weights_digest"]


class SmallCNN(nn.Module):
    """Notebook 07, section 5: two convolutions and a linear layer, enough to learn the 10 shapes fast on a CPU."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
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


def rank_dataloader(
    args: argparse.Namespace, env: distributed.DistEnv, pin_memory: bool = False
) -> tuple[DataLoader, int]:
    """Notebook 07, section 5: this rank's DataLoader over its share, and the length of the whole data set."""
    dataset = WithIndex(
        shapes("train", transform=functools.partial(image_tensor, size=args.image_size), size=args.size, root=args.data)
    )
    if args.limit:
        dataset = Subset(dataset, range(min(args.limit, len(dataset))))
    n = len(dataset)
    common = dict(
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        pin_memory=pin_memory,
        # workers' seeds differ per rank; the order itself comes from the sampler's seed
        generator=torch.Generator().manual_seed(args.seed + env.rank),
    )
    if args.sharding == "sampler":
        # shuffling belongs to the sampler: the DataLoader itself gets shuffle=False
        sampler = DistributedSampler(
            dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed, drop_last=args.drop_last
        )
        return DataLoader(dataset, sampler=sampler, drop_last=False, **common), n
    share = Subset(dataset, range(env.rank, n, env.world_size))
    return DataLoader(share, shuffle=True, drop_last=args.drop_last, **common), n


# --------------------------------------------------------------------------- one rank's training
def _train_rank(args: argparse.Namespace, env: distributed.DistEnv, device: torch.device) -> dict:
    """One rank's training: its loader, DDP, ``set_epoch`` every epoch, a report of what it loaded."""
    loader, n = rank_dataloader(args, env, pin_memory=device.type == "cuda")
    model, ddp, opt = ddp_model(device, args.seed, args.lr)
    report: dict[str, Any] = {
        "rank": env.rank,
        "world_size": env.world_size,
        "local_rank": env.local_rank,
        "source": env.source,
        "dataset_len": n,
        "sharding": args.sharding,
        "epochs": [],
    }
    for epoch in range(args.epochs):
        if args.sharding == "sampler" and not args.no_set_epoch:
            loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on every rank
        seen, losses = [], []
        start = time.perf_counter()
        with _maybe_join(ddp, args.join):
            for step, (index, x, y) in enumerate(loader):
                if env.rank == args.crash_rank and step == 2:
                    raise RuntimeError(f"rank {env.rank} crashed on purpose at batch {step} (--crash-rank)")
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = F.cross_entropy(ddp(x), y)
                opt.zero_grad()
                loss.backward()  # DDP averages the gradients over all ranks here
                opt.step()
                seen += index.tolist()
                losses.append(loss.item())
        report["epochs"].append(
            {
                "indices": seen,
                "batches": len(losses),
                "mean_loss": epoch_mean_loss(losses, device),
                "seconds": time.perf_counter() - start,
            }
        )
        print(f"epoch {epoch}: {len(seen)} samples in {len(losses)} batches, first indices {seen[:5]}", flush=True)
    report["weights_sha256"] = weights_digest(model)
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


def _maybe_join(ddp: nn.Module, enabled: bool) -> Any:
    """torch's ``Join``: ranks that run out of batches shadow the others' all-reduces instead of leaving them waiting."""
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.algorithms.join import Join

    return Join([ddp])


# --------------------------------------------------------------------------- the command line
def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.train", description=__doc__.split("\n\n")[0])
    add_data_arguments(p)
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sharding", choices=("sampler", "by-hand"), default="sampler")
    p.add_argument("--drop-last", action="store_true", help="drop what does not divide evenly")
    p.add_argument("--no-set-epoch", action="store_true", help="forget sampler.set_epoch (the pitfall)")
    p.add_argument("--join", action="store_true", help="wrap the loop in torch's Join context (uneven inputs)")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds a collective may wait for the other ranks (start-up and checkpoints included)",
    )
    p.add_argument("--device", default="auto", help="auto (a GPU per rank when there is one), cpu or cuda")
    p.add_argument("--report", help="folder for one rankN.json report per rank")
    p.add_argument("--crash-rank", type=int, default=-1, help="raise an error on this rank at its 3rd batch (practice)")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "image_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.workers < 0 or args.limit < 0:
        p.error("--workers and --limit cannot be negative")
    return args


@record  # torchrun then names the rank whose error came first, with its traceback
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.train``: 0, or 2 after one line for missing data or a half-set environment."""
    args = _parse_args(argv)
    try:
        run_on_one_rank(lambda env, device: _train_rank(args, env, device), args.device, args.timeout)
    except (DataNotFoundError, distributed.DistEnvError) as exc:
        return one_line(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
