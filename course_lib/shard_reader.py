"""Notebook 09, section 7: read tar shards on every rank of a job, ``torchrun --nproc-per-node=N -m course_lib.shard_reader``.

Each rank reads the shards split by node and by worker, records which keys each worker saw, and meets the
other ranks in an ``all_reduce`` after every batch, as DDP would; ``--resampled --epoch-batches N`` and
``--no-nodesplitter`` reproduce notebook 09's other cases. The whole program is this file: each rank's loader,
its loop and report, then the command line.
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from . import distributed
from ._programs import run_on_one_rank
from .iterable import worker_slot

__all__ = ["build_loader"]


def _tag_worker(sample: tuple) -> tuple:
    """Append the id of the DataLoader worker that read ``sample`` (-1: the main process)."""
    return (*sample, worker_slot(main=-1)[0])


def build_loader(args: argparse.Namespace):
    """Notebook 09, section 7: this rank's WebLoader of ``(keys, labels, shard urls, worker ids)`` batches."""
    import webdataset as wds

    options = dict(workersplitter=wds.split_by_worker, seed=args.seed)
    if not args.no_nodesplitter:
        options["nodesplitter"] = wds.split_by_node
    if args.resampled:  # WebDataset(resampled=True) ignores seed= (webdataset 1.0.2): a seeded source instead, whose
        # draws depend on (rank, worker, epoch, seed) only: reproducible, and different on every rank and worker
        source = wds.ResampledShards(args.urls, seed=args.seed, deterministic=True)
        dataset = wds.DataPipeline(source, wds.tarfile_to_samples(), wds.to_tuple("__key__", "cls", "__url__"))
    else:  # keys and labels only: nothing to decode, this run is about who reads what
        dataset = wds.WebDataset(args.urls, shardshuffle=args.shardshuffle or False, **options)
        dataset = dataset.to_tuple("__key__", "cls", "__url__")
    dataset = dataset.compose(wds.map(_tag_worker), wds.batched(args.batch_size))
    loader = wds.WebLoader(dataset, num_workers=args.workers, batch_size=None)
    if args.epoch_batches:
        # on the loader, with_epoch counts this rank's batches (on the dataset it would count per worker)
        loader = loader.with_epoch(args.epoch_batches)
    return loader


# --------------------------------------------------------------------------- one rank's reading
def _read_rank(args: argparse.Namespace, env: distributed.DistEnv) -> dict:
    """One rank's reading: which keys and shards each worker read, and an ``all_reduce`` per batch, as DDP would."""
    loader = build_loader(args)
    keys: list[str] = []
    by_worker: dict[str, list[str]] = {}
    shards_by_worker: dict[str, list[str]] = {}
    batches = 0
    step = torch.zeros(1)
    for batch_keys, _labels, urls, workers in loader:
        for key, url, worker in zip(batch_keys, urls, workers):
            keys.append(key)
            by_worker.setdefault(str(int(worker)), []).append(key)
            names = shards_by_worker.setdefault(str(int(worker)), [])
            if os.path.basename(url) not in names:
                names.append(os.path.basename(url))
        batches += 1
        dist.all_reduce(step)  # what DDP's backward does every step: wait for every rank
    totals = torch.tensor([float(batches)])
    dist.all_reduce(totals)  # the ranks finished together, or this never returns
    report = {"rank": env.rank, "world_size": env.world_size, "workers": args.workers,
              "resampled": args.resampled, "batches": batches, "samples": len(keys), "keys": keys,
              "keys_by_worker": by_worker, "shards_by_worker": shards_by_worker}
    for worker in sorted(by_worker, key=int):
        shard_list = ", ".join(s.rsplit("-", 1)[-1].split(".")[0] for s in shards_by_worker[worker])
        drawn = " (drawn at random, with replacement)" if args.resampled else ""
        print(f"worker {worker}: {len(by_worker[worker])} samples from shards {shard_list}{drawn}")
    print(f"rank {env.rank}: {batches} batches, {len(keys)} samples")
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


# --------------------------------------------------------------------------- the command line
def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.shard_reader", description=__doc__.split("\n\n")[0])
    p.add_argument("--urls", required=True, help="the shards: a brace pattern such as data/shapes-train-{000000..000007}.tar")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--shardshuffle", type=int, default=0, help="shard shuffle buffer (0: shards in order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resampled", action="store_true", help="draw shards with replacement (needs --epoch-batches)")
    p.add_argument("--epoch-batches", type=int, default=0, help="cut each rank's epoch at this many batches")
    p.add_argument("--no-nodesplitter", action="store_true", help="omit nodesplitter= (the pitfall)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a collective may wait for the other ranks")
    p.add_argument("--report", help="folder for one rankN.json report per rank")
    args = p.parse_args(argv)
    if args.workers < 0 or args.batch_size < 1 or args.epoch_batches < 0:
        p.error("--workers must be >= 0, --batch-size >= 1 and --epoch-batches >= 0")
    if args.resampled and not args.epoch_batches:
        p.error("--resampled never ends by itself: give --epoch-batches N")
    return args


@record  # torchrun then names the rank whose error came first, with its traceback
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.shard_reader``."""
    args = _parse_args(argv)
    warnings.filterwarnings("ignore", message=r"WebDataset\(shardshuffle")  # set explicitly in build_loader
    run_on_one_rank(lambda env, _device: _read_rank(args, env), "cpu", args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
