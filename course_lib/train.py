"""The course's data-parallel training script: ``torchrun --nproc-per-node=N -m course_lib.train``.

Every rank loads its share of the shapes images through a real DataLoader with worker processes,
trains a small CNN wrapped in ``DistributedDataParallel`` (gloo on CPU, NCCL on GPUs), and
reports what it saw. Notebook 06 launches it with :func:`course_lib.distributed.launch`; the
Slurm scripts in ``hpc/`` run the same module on a cluster (under torchrun, or one task per GPU
with ranks read from Slurm's variables).

How each rank gets its share (``--sharding``):

* ``sampler`` (the default): torch's ``DistributedSampler``; every rank gets the same number of
  samples (the sampler pads by repeating a few, or drops them with ``--drop-last``);
* ``by-hand``: ``indices[rank::world_size]``, the tempting do-it-yourself split. When the length
  does not divide, ranks get different numbers of batches, and DDP's collectives wait for a rank
  that has already finished: the "uneven inputs" hang. ``--join`` (torch's ``Join`` context)
  fixes it; ``--drop-last`` only when both shares give the same number of full batches.

With ``--report FOLDER`` each rank writes ``rankN.json``: the indices it loaded per epoch, its
batch counts and losses, and a SHA-256 of its model weights (identical on every rank if DDP did
its job). ``python -m course_lib.train --help`` lists the options.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from . import distributed
from .datasets import DataNotFoundError, WithIndex, shapes


class SmallCNN(nn.Module):
    """Two convolutions and a linear layer: enough to learn the 10 shapes, fast on a CPU."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def image_transform(image_size: int):
    """Decode to a float tensor in [0, 1], resized: the same on every rank (no augmentation)."""
    from torchvision.transforms import v2

    return v2.Compose([v2.PILToTensor(), v2.Resize(image_size, antialias=True), v2.ToDtype(torch.float32, scale=True)])


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal digests mean bit-identical models."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="folder holding the prepared data sets (default: $COURSE_DATA_DIR or the cache)")
    p.add_argument("--size", default="small", help="which prepared set (default: small)")
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
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a collective may wait for the other ranks (start-up and checkpoints included)")
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


def build_loader(args: argparse.Namespace, env: distributed.DistEnv, use_cuda: bool = False) -> tuple[DataLoader, int]:
    """This rank's DataLoader over its share, and the length of the whole data set."""
    dataset = WithIndex(shapes("train", transform=image_transform(args.image_size), size=args.size, root=args.data))
    if args.limit:
        dataset = Subset(dataset, range(min(args.limit, len(dataset))))
    n = len(dataset)
    common = dict(batch_size=args.batch_size, num_workers=args.workers,
                  persistent_workers=args.workers > 0, pin_memory=use_cuda,
                  # workers' seeds differ per rank; the order itself comes from the sampler's seed
                  generator=torch.Generator().manual_seed(args.seed + env.rank))
    if args.sharding == "sampler":
        # shuffling belongs to the sampler: the DataLoader itself gets shuffle=False
        sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank,
                                     shuffle=True, seed=args.seed, drop_last=args.drop_last)
        return DataLoader(dataset, sampler=sampler, drop_last=False, **common), n
    share = Subset(dataset, range(env.rank, n, env.world_size))
    return DataLoader(share, shuffle=True, drop_last=args.drop_last, **common), n


def train(args: argparse.Namespace) -> dict:
    env = distributed.dist_env()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and torch.cuda.device_count() == 0:
        raise distributed.DistEnvError("--device cuda, but this process sees no GPU; use --device cpu or auto")
    # usually one GPU per local rank; with --gpus-per-task=1 each task sees only its own, as cuda:0
    device = torch.device(f"cuda:{env.local_rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # else every rank's pin-memory thread opens a context on GPU 0
    if env.world_size == 1:  # one process (also a Slurm or Jupyter session with 1 task): no port needed
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        distributed.init_process_group("nccl" if use_cuda else "gloo", timeout_s=args.timeout, env=env)
    try:
        loader, n = build_loader(args, env, use_cuda)
        torch.manual_seed(args.seed)  # the same start on every rank; DDP also broadcasts rank 0's weights
        model = SmallCNN().to(device)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        report: dict = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
                        "source": env.source, "dataset_len": n, "sharding": args.sharding, "epochs": []}
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
            # the usual end of an epoch: wait for every rank (say, before rank 0 saves a checkpoint),
            # then average the loss over all ranks for the log. Every rank must reach both calls.
            dist.barrier()
            total = torch.tensor([sum(losses), len(losses)], dtype=torch.float64, device=device)
            dist.all_reduce(total)
            report["epochs"].append({"indices": seen, "batches": len(losses),
                                     "mean_loss": float(total[0] / max(total[1], 1)),
                                     "seconds": time.perf_counter() - start})
            print(f"epoch {epoch}: {len(seen)} samples in {len(losses)} batches, "
                  f"first indices {seen[:5]}", flush=True)
        report["weights_sha256"] = weights_digest(model)
        if args.report:
            distributed.write_report(args.report, env.rank, report)
        return report
    finally:
        dist.destroy_process_group()


def _maybe_join(ddp: nn.parallel.DistributedDataParallel, enabled: bool):
    """torch's ``Join`` context when asked: ranks that run out of batches shadow the others'
    all-reduces instead of leaving them waiting."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.algorithms.join import Join

    return Join([ddp])


@record  # torchrun then names the rank whose error came first, with its traceback
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except (DataNotFoundError, distributed.DistEnvError) as exc:
        # one readable line (with its rank, when torchrun prefixes it) instead of a traceback
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
