"""Notebook 09, section 7: read tar shards on every rank of a job, ``torchrun --nproc-per-node=N -m course_lib.shard_reader``.

Each rank reads the shards split by node and by worker, records which keys each worker saw in each epoch, and
meets the other ranks in an ``all_reduce`` after every batch, as DDP would. Every epoch is a new one: the shard
list is permuted by ``(seed, epoch)`` before it is split (alike on every rank, so the ranks still share it out
exactly), and shuffle buffers seeded by ``(seed, epoch)`` mix the samples of several shards into each batch.
``--resampled --epoch-batches N`` and ``--no-nodesplitter`` reproduce notebook 09's other cases. ``s3://`` URLs
(notebook 10) work too. The whole program is this file: each rank's loader, its loop and report, then the command
line.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from . import distributed
from ._programs import run_on_one_rank
from .iterable import worker_slot
from .object_store import register_s3_scheme

__all__ = ["rank_webloader"]

# webdataset 1.0.2 cannot open s3:// URLs (notebook 10): registered when this module is imported, which is in every
# rank, and in every spawn or forkserver worker too, since each imports this module to unpickle the pipeline
register_s3_scheme()


def _tag_worker(sample: tuple) -> tuple:
    """Append the id of the DataLoader worker that read ``sample`` (-1: the main process)."""
    return (*sample, worker_slot(main=-1)[0])


def rank_webloader(args: argparse.Namespace, epoch: int = 0):
    """Notebook 09, section 7: this rank's WebLoader for ``epoch``: batches of ``(keys, labels, shard urls, worker ids)``."""
    import webdataset as wds

    rng = np.random.default_rng([args.seed, epoch])  # from (seed, epoch), never the rank: alike on every rank
    if args.resampled:  # WebDataset(resampled=True) ignores seed= (webdataset 1.0.2): a seeded source instead, whose
        # draws depend on (rank, worker, this epoch's seed) only: reproducible, and different on every rank and worker
        source = wds.ResampledShards(args.urls, seed=int(rng.integers(2**31)), deterministic=True)
        dataset = wds.DataPipeline(source, wds.tarfile_to_samples())
    else:  # this epoch's order of the whole list (exercise 09.5), then split by node and worker: new shares every epoch
        urls = wds.shardlists.expand_urls(args.urls)
        splitters = dict(workersplitter=wds.split_by_worker)
        if not args.no_nodesplitter:
            splitters["nodesplitter"] = wds.split_by_node
        dataset = wds.WebDataset([urls[i] for i in rng.permutation(len(urls))], shardshuffle=False, **splitters)
    seed = int(rng.integers(2**31))  # the shuffle buffers' seed, also from (seed, epoch)
    dataset = dataset.compose(
        wds.shuffle(args.buffer, seed=seed),  # samples of the worker's shards, mixed
        wds.to_tuple("__key__", "cls", "__url__"),  # keys and labels only: this run is about who reads what
        wds.map(_tag_worker),
        wds.batched(args.batch_size),
    )
    loader = wds.WebLoader(dataset, num_workers=args.workers, batch_size=None)
    # the workers' streams mixed: a batch holds samples of several shards
    loader = loader.unbatched().shuffle(args.buffer, seed=seed).batched(args.batch_size)
    if args.epoch_batches:
        # on the loader, with_epoch counts this rank's batches (on the dataset it would count per worker)
        loader = loader.with_epoch(args.epoch_batches)
    return loader


# --------------------------------------------------------------------------- one rank's reading
def _read_epoch(args: argparse.Namespace, epoch: int, device: torch.device) -> dict:
    """One epoch of one rank: which keys and shards each worker read, and an ``all_reduce`` per batch, as DDP would."""
    keys_by_worker: dict[str, list[str]] = {}
    shards_by_worker: dict[str, list[str]] = {}
    batches = 0
    step = torch.zeros(1, device=device)  # a collective's tensor lives on the rank's device
    for batch_keys, _labels, urls, workers in rank_webloader(args, epoch):
        for key, url, worker in zip(batch_keys, urls, workers):
            keys_by_worker.setdefault(str(int(worker)), []).append(key)
            names = shards_by_worker.setdefault(str(int(worker)), [])
            if os.path.basename(url) not in names:
                names.append(os.path.basename(url))
        batches += 1
        dist.all_reduce(step)  # what DDP's backward does every step: wait for every rank
    return {
        "epoch": epoch,
        "batches": batches,
        "samples": sum(map(len, keys_by_worker.values())),
        "keys_by_worker": keys_by_worker,
        "shards_by_worker": shards_by_worker,
    }


def _shard_numbers(names: list[str]) -> str:
    """``shapes-train-000004.tar`` -> ``000004``, comma-separated."""
    return ", ".join(name.rsplit("-", 1)[-1].split(".")[0] for name in names)


def _read_rank(args: argparse.Namespace, env: distributed.DistEnv, device: torch.device) -> dict:
    """One rank's reading, epoch by epoch, printed and written as a report."""
    report = {
        "rank": env.rank,
        "world_size": env.world_size,
        "workers": args.workers,
        "resampled": args.resampled,
        "epochs": [],
    }
    drawn = " (drawn at random, with replacement)" if args.resampled else ""
    for epoch in range(args.epochs):
        read = _read_epoch(args, epoch, device)
        report["epochs"].append(read)
        for worker in sorted(read["keys_by_worker"], key=int):
            print(
                f"epoch {epoch}, worker {worker}: {len(read['keys_by_worker'][worker])} samples from shards "
                f"{_shard_numbers(read['shards_by_worker'][worker])}{drawn}"
            )
        print(f"epoch {epoch}, rank {env.rank}: {read['batches']} batches, {read['samples']} samples")
    totals = torch.tensor([float(sum(r["batches"] for r in report["epochs"]))], device=device)
    dist.all_reduce(totals)  # the ranks finished together, or this never returns
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


# --------------------------------------------------------------------------- the command line
def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.shard_reader", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--urls", required=True, help="the shards: a brace pattern such as data/shapes-train-{000000..000007}.tar"
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1, help="epochs to read, each with its own shard order and shares")
    p.add_argument(
        "--buffer", type=int, default=100, help="samples in each shuffle buffer (the workers' and the loader's)"
    )
    p.add_argument("--seed", type=int, default=0, help="with the epoch, seeds the shard order and the shuffle buffers")
    p.add_argument("--resampled", action="store_true", help="draw shards with replacement (needs --epoch-batches)")
    p.add_argument("--epoch-batches", type=int, default=0, help="cut each rank's epoch at this many batches")
    p.add_argument("--no-nodesplitter", action="store_true", help="omit nodesplitter= (the pitfall)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a collective may wait for the other ranks")
    p.add_argument("--report", help="folder for one rankN.json report per rank")
    args = p.parse_args(argv)
    if args.workers < 0 or args.batch_size < 1 or args.epochs < 1 or args.buffer < 1 or args.epoch_batches < 0:
        p.error("need --workers >= 0, --batch-size >= 1, --epochs >= 1, --buffer >= 1 and --epoch-batches >= 0")
    if args.resampled and not args.epoch_batches:
        p.error("--resampled never ends by itself: give --epoch-batches N")
    return args


@record  # torchrun then names the rank whose error came first, with its traceback
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.shard_reader``."""
    args = _parse_args(argv)
    run_on_one_rank(lambda env, device: _read_rank(args, env, device), "cpu", args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
