"""One rank of tests/test_matrix.py: every start method x worker count, for each kind of data, in one process.

Started by torchrun or as srun starts a task (only ``SLURM_*`` set); joins the job with the course's
``distributed.start`` and reads, in real DataLoader workers:

* ``map``: a map-style dataset through ``DistributedSampler`` (shuffled, epoch 0);
* ``stream``: the course's ``iterable.ShardedStream`` with this rank's ``rank``/``world_size``;
* ``wds``: a webdataset pipeline over ``SHARDS`` tar files, split by node and by worker;
* ``resampled``: the course's reproducible resampled recipe (``ResampledShards(deterministic=True)``),
  ``with_epoch(EPOCH)`` on the loader.

The three iterable kinds share one DataLoader per cell (a chain of the three, each splitting itself),
which saves a third of the worker start-ups, the costly part under spawn. Rank 0 gathers every rank's
indices and writes them as JSON to ``out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os

import torch
import torch.distributed as dist
import webdataset as wds
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from course_lib import distributed
from course_lib.iterable import ShardedStream

N, EPOCH = 36, 10  # samples (12 shards of 3: divides over 1-3 ranks x 1-2 workers); the resampled epoch


class Indices(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


class Chain(IterableDataset):
    """The finite kinds one after the other, each item tagged with its kind, an ``("end", -1)`` mark, then the
    endless resampled stream."""

    def __init__(self, finite: dict, endless: IterableDataset) -> None:
        self.finite, self.endless = finite, endless

    def __iter__(self):
        for kind, part in self.finite.items():
            for item in part:
                yield kind, item
        yield "end", -1
        for item in self.endless:
            yield "resampled", item


def key_index(sample: dict) -> int:
    return int(sample["__key__"][1:])


def iterable_kinds(urls: str, rank: int, world: int) -> Chain:
    pipeline = wds.WebDataset(
        urls, shardshuffle=False, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker, empty_check=False
    ).map(key_index)
    resampled = wds.DataPipeline(
        wds.ResampledShards(urls, seed=0, deterministic=True), wds.tarfile_to_samples(), wds.map(key_index)
    )
    return Chain({"stream": ShardedStream(N, shuffle=True, rank=rank, world_size=world), "wds": pipeline}, resampled)


def read_cell(urls: str, env: distributed.DistEnv, method: str, workers: int) -> dict[str, list[int]]:
    context = mp.get_context(method) if workers else None
    sampler = DistributedSampler(Indices(), num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    got = {
        "map": [
            int(i)
            for i in DataLoader(
                Indices(), batch_size=None, sampler=sampler, num_workers=workers, multiprocessing_context=context
            )
        ]
    }
    loader = DataLoader(
        iterable_kinds(urls, env.rank, env.world_size),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=context,
    )
    got["resampled"], ends = [], 0
    for kind, i in loader:  # until every reader has passed its end mark and the resampled epoch is full
        if kind == "end":
            ends += 1
        elif kind != "resampled":
            got.setdefault(kind, []).append(int(i))
        elif len(got["resampled"]) < EPOCH:  # the first EPOCH the loader yields, as with_epoch on the loader
            got["resampled"].append(int(i))
        if ends == max(workers, 1) and len(got["resampled"]) == EPOCH:
            break
    del loader  # stops the workers of the endless stream
    return got


def plain_start() -> distributed.DistEnv:
    """What a script that reads Slurm's variables by hand does: a process group, and no RANK/WORLD_SIZE exported."""
    env = distributed.dist_env()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    return env


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("urls")
    p.add_argument("out")
    p.add_argument(
        "--cells",
        default="-/0,fork/1,fork/2,spawn/2,forkserver/2",
        help="start method/workers settings, comma-separated (-/0: no workers)",
    )
    p.add_argument("--plain", action="store_true", help="join without the course's start() (the srun pitfall)")
    args = p.parse_args()
    mp.set_forkserver_preload(["torch", "webdataset", "course_lib.iterable"])
    env = plain_start() if args.plain else distributed.start("cpu", timeout_s=60)[0]
    cells = [(cell.split("/")[0], int(cell.split("/")[1])) for cell in args.cells.split(",")]
    cells = {f"{method}/{workers}": read_cell(args.urls, env, method, workers) for method, workers in cells}
    exported = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    gather_to_json(env, {"rank": env.rank, "source": env.source, "cells": cells, "exported": exported}, args.out)


def gather_to_json(env: distributed.DistEnv, mine: dict, out: str) -> None:
    """Every rank's ``mine``, gathered on rank 0 and written there as a JSON list in rank order; then leave the job."""
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    distributed.finish()


if __name__ == "__main__":  # a spawn worker imports this file again
    torch.set_num_threads(1)
    main()
