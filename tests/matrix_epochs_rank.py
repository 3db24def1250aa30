"""One rank of tests/test_matrix.py's epoch matrix: every recipe the course teaches, over several epochs.

Started by torchrun or as srun starts a task; joins the job with the course's ``distributed.start`` and, for each
start method given, reads ``--epochs`` epochs of each recipe in real DataLoader workers (2 per rank):

* ``sampler``: a map-style dataset through ``DistributedSampler`` with ``set_epoch`` (notebook 07), persistent workers;
* ``stream``: the course's ``iterable.ShardedStream`` with ``set_epoch`` (notebook 08), a loader per epoch;
* ``shards``: ``shard_reader.rank_webloader(args, epoch)``, the shard list dealt anew by (seed, epoch) before the
  node and worker split, samples mixed in shuffle buffers (notebook 09);
* ``resampled``: the same loader with ``--resampled`` and ``--epoch-batches`` (notebook 09, section 8), and the shard
  draws of its source alone, many of them, to count how many distinct shards k draws reach;
* ``capstone``: ``capstone.make_loader``'s persistent pipeline, a fixed number of steps per epoch (notebook 13).

Rank 0 gathers every rank's epochs and writes them as JSON to ``out``; tests/test_matrix.py checks them.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from course_lib import capstone, distributed, shard_reader
from course_lib.iterable import ShardedStream
from matrix_rank import gather_to_json  # this folder: the script's own

N, BATCH, WORKERS = 36, 4, 2  # samples of the txt shards (12 shards of 3), batch size, DataLoader workers per rank
DRAWS, NAMES = 150, 100  # shard draws per rank and epoch from a list of NAMES shards, for the resampled count


class Indices(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def key_index(key: str) -> int:
    return int(key[1:])


def sampler_epochs(env: distributed.DistEnv, epochs: int) -> list[list[int]]:
    sampler = DistributedSampler(Indices(), num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=0)
    loader = DataLoader(Indices(), batch_size=BATCH, sampler=sampler, num_workers=WORKERS, persistent_workers=True)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append([int(i) for batch in loader for i in batch])
    return out


def stream_epochs(env: distributed.DistEnv, epochs: int) -> list[list[int]]:
    stream = ShardedStream(N, shuffle=True, rank=env.rank, world_size=env.world_size)
    out = []
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        out.append([int(i) for batch in DataLoader(stream, batch_size=BATCH, num_workers=WORKERS) for i in batch])
    return out


def reader_args(urls: str, **options) -> argparse.Namespace:
    defaults = dict(
        urls=urls,
        workers=WORKERS,
        batch_size=BATCH,
        seed=0,
        buffer=8,
        resampled=False,
        epoch_batches=0,
        no_nodesplitter=False,
    )
    return argparse.Namespace(**{**defaults, **options})


def shard_epochs(urls: str, epochs: int, **options) -> list[list[int]]:
    return [
        [key_index(k) for keys, *_ in shard_reader.rank_webloader(reader_args(urls, **options), epoch) for k in keys]
        for epoch in range(epochs)
    ]


def shard_draws(epochs: int) -> list[list[str]]:
    """The resampled recipe's source (ResampledShards seeded by the epoch, as shard_reader seeds it), alone."""
    names = [f"shard-{i:03d}.tar" for i in range(NAMES)]
    out = []
    for epoch in range(epochs):
        seed = int(np.random.default_rng([0, epoch]).integers(2**31))
        source = wds.ResampledShards(names, seed=seed, deterministic=True)
        loader = DataLoader(source, batch_size=None, num_workers=WORKERS)
        out.append([d["url"] for d in itertools.islice(loader, DRAWS)])  # this rank's draws from its 2 workers
    return out


def capstone_epochs(image_shards: str, epochs: int, steps: int) -> list[dict]:
    loader = capstone.make_loader(image_shards, num_workers=WORKERS, batch_size=BATCH, decode_ms=0.0, seed=0)
    out = []
    for _ in range(epochs):
        keys: list[list[str]] = []
        _, workers = capstone.run_epoch(loader, steps, lambda batch: keys.append(list(batch[2])))
        out.append(
            {
                "keys": [k for batch in keys for k in batch],
                "by_worker": {
                    str(w): [k for kk, ww in zip(keys, workers) if ww == w for k in kk] for w in set(workers)
                },
            }
        )
    del loader
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("urls", help="the txt shards: 12 shards of 3 samples, keys s000..s035")
    p.add_argument("image_shards", help="a folder of image shards for the capstone pipeline")
    p.add_argument("out")
    p.add_argument("--methods", default="fork,spawn")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--capstone-steps", type=int, default=5)
    args = p.parse_args()
    env = distributed.start("cpu", timeout_s=120)[0]
    cells, draws = {}, None
    for method in args.methods.split(","):
        torch.multiprocessing.set_start_method(method, force=True)  # every DataLoader below starts its workers so
        if draws is None:  # what counts is how the seeds draw, not how the workers start: once, in forked workers
            torch.multiprocessing.set_start_method("fork", force=True)
            draws = shard_draws(args.epochs)
            torch.multiprocessing.set_start_method(method, force=True)
        cells[method] = {
            "sampler": sampler_epochs(env, args.epochs),
            "stream": stream_epochs(env, args.epochs),
            "shards": shard_epochs(args.urls, args.epochs),
            "resampled": shard_epochs(args.urls, args.epochs, resampled=True, epoch_batches=3),
            "draws": draws,
            "capstone": capstone_epochs(args.image_shards, args.epochs, args.capstone_steps),
        }
    gather_to_json(env, {"rank": env.rank, "source": env.source, "cells": cells}, args.out)


if __name__ == "__main__":  # a spawn worker imports this file again
    torch.set_num_threads(1)
    mp.set_forkserver_preload(["torch", "webdataset"])
    main()
