"""The commands each rank runs: ``python -m course_lib.train``, ``.shard_reader``, ``.capstone`` and ``.resume``.

torchrun or srun starts one per rank (notebooks 07, 09 and 11 through :mod:`course_tools.launch`, the ``hpc/`` scripts,
notebook 11's Slurm script). What the notebooks teach and show lives in those lesson modules: the loaders, the
pipeline, the model, joining and leaving the job (:mod:`course_lib.distributed`), the reports. Here are their
command lines and the loop that puts the pieces together on one rank; each module's ``__main__`` calls its
``*_main`` below, so the commands are unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from course_lib import capstone, distributed, resume, shard_reader, train
from course_lib.datasets import DataNotFoundError
from course_lib.instrument import simulated_step
from course_lib.shards import ShardError, read_shardset, write_image_shards


def _on_one_rank(run: Callable[[distributed.DistEnv, torch.device], dict], device: str, timeout: float) -> dict:
    """Join the job, ``run(env, device)``, leave it. Everything holding the process group (DDP model, loader, workers)
    lives in ``run``'s frames: gone when it returns, cleared when it fails, so ``finish()`` ends the group's threads."""
    env, dev = distributed.start(device, timeout)
    try:
        return run(env, dev)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)  # a failed run's frames hold its DDP model and loader
        raise
    finally:
        distributed.finish()  # what run made is gone: the group and its threads end here


def _one_line(exc: BaseException) -> int:
    """One readable line (with its rank, when torchrun prefixes it) instead of a traceback; exit status 2."""
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 2


# --------------------------------------------------------------------------- python -m course_lib.train
def _train_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.train", description=train.__doc__.split("\n\n")[0])
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


def _train_rank(args: argparse.Namespace, env: distributed.DistEnv, device: torch.device) -> dict:
    """One rank's training (notebook 07, section 5): its loader, DDP, ``set_epoch``, a report."""
    loader, n = train.build_loader(args, env, pin_memory=device.type == "cuda")
    model, ddp, opt = train.ddp_model(device, args.seed, args.lr)
    report: dict[str, Any] = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
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
        report["epochs"].append({"indices": seen, "batches": len(losses),
                                 "mean_loss": train.epoch_mean_loss(losses, device),
                                 "seconds": time.perf_counter() - start})
        print(f"epoch {epoch}: {len(seen)} samples in {len(losses)} batches, first indices {seen[:5]}", flush=True)
    report["weights_sha256"] = train.weights_digest(model)
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


def _maybe_join(ddp: nn.Module, enabled: bool) -> Any:
    """torch's ``Join``: ranks that run out of batches shadow the others' all-reduces instead of leaving them waiting."""
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.algorithms.join import Join

    return Join([ddp])


@record  # torchrun then names the rank whose error came first, with its traceback
def train_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.train``: 0, or 2 after one line for missing data or a half-set environment."""
    args = _train_args(argv)
    try:
        _on_one_rank(lambda env, device: _train_rank(args, env, device), args.device, args.timeout)
    except (DataNotFoundError, distributed.DistEnvError) as exc:
        return _one_line(exc)
    return 0


# --------------------------------------------------------------------------- python -m course_lib.shard_reader
def _reader_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.shard_reader",
                                description=shard_reader.__doc__.split("\n\n")[0])
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


def _read_rank(args: argparse.Namespace, env: distributed.DistEnv) -> dict:
    """One rank's reading (notebook 09, section 7): which keys and shards each worker read, an ``all_reduce`` per batch."""
    loader = shard_reader.build_loader(args)
    keys: list[str] = []
    by_worker: dict[str, list[str]] = {}
    shards_by_worker: dict[str, list[str]] = {}
    batches = 0
    step = torch.zeros(1)
    for batch in loader:
        batch_keys, _labels, urls, workers = batch
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


@record
def shard_reader_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.shard_reader``."""
    args = _reader_args(argv)
    warnings.filterwarnings("ignore", message=r"WebDataset\(shardshuffle")  # set explicitly in build_loader
    _on_one_rank(lambda env, _: _read_rank(args, env), "cpu", args.timeout)
    return 0


# --------------------------------------------------------------------------- python -m course_lib.capstone
def _capstone_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.capstone", description=capstone.__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on every rank (start it with torchrun)")
    t.add_argument("--shards", required=True, help="a folder of .tar shards, a brace pattern or a glob")
    t.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    t.add_argument("--prefetch-factor", type=int, default=2, help="batches each worker prepares ahead")
    t.add_argument("--batch-size", type=int, default=capstone.BATCH_SIZE, help="per rank")
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--epoch-batches", type=int, default=0,
                   help="steps per epoch on every rank (0: one pass's worth, from the shards' manifest)")
    t.add_argument("--decode-ms", type=float, default=0.0, help="simulated extra decoding per sample (0 on a cluster)")
    t.add_argument("--step-ms", type=float, default=0.0, help="simulated accelerator time per step (0 on a cluster)")
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for the other ranks")
    t.add_argument("--device", default="auto", help="auto (a GPU per rank when there is one), cpu or cuda")
    t.add_argument("--report", help="folder for one rankN.json report per rank")
    t.add_argument("--ckpt", help="checkpoint folder: saved at every epoch's end, resumed from when it holds one (a "
                                  "shard stream has no mid-epoch state: a stopped job redoes its unfinished epoch)")
    c = sub.add_parser("check", help="are there enough shards for the job? (run it before starting one)")
    c.add_argument("--shards", required=True)
    c.add_argument("--ranks", type=int, required=True, help="the job's world size (nodes × ranks per node)")
    c.add_argument("--workers", type=int, required=True)
    w = sub.add_parser("shards", help="write the shapes images as shards (on a login node)")
    w.add_argument("--out", required=True)
    w.add_argument("--size", default="small")
    w.add_argument("--data", help="folder of the prepared data sets (default: $COURSE_DATA_DIR or the cache)")
    w.add_argument("--maxcount", type=int, default=50, help="samples per shard")
    args = p.parse_args(argv)
    if args.command == "train":
        if args.workers < 0 or args.prefetch_factor < 1 or args.batch_size < 1 or args.epochs < 1 or args.epoch_batches < 0:
            p.error("need --workers >= 0, --prefetch-factor >= 1, --batch-size >= 1, --epochs >= 1, --epoch-batches >= 0")
        if args.decode_ms < 0 or args.step_ms < 0:
            p.error("--decode-ms and --step-ms cannot be negative")
    if args.command == "check" and (args.ranks < 1 or args.workers < 0):
        p.error("need --ranks >= 1 and --workers >= 0")
    return args


def _one_pass_batches(paths: Sequence[Path], world_size: int, batch_size: int) -> int:
    """Steps per rank for about one pass over the shards, from their folder's manifest."""
    try:
        samples = read_shardset(paths[0].parent).samples
    except ShardError:
        raise ShardError(
            f"{paths[0].parent.name}/ has no manifest to count its samples: give --epoch-batches N "
            "(steps per epoch on every rank)"
        ) from None
    batches = samples // (world_size * batch_size)
    if batches < 1:
        raise ShardError(f"{samples} samples are less than one batch of {batch_size} per rank for {world_size} ranks: "
                         "use a smaller --batch-size or give --epoch-batches")
    return batches


def _capstone_train(args: argparse.Namespace) -> dict:
    """One rank's run: returns (and writes, with ``--report``) what it read and how long it waited."""
    env = distributed.dist_env()
    paths = capstone.check_job(args.shards, env.world_size, args.workers)  # before any rendezvous: all ranks alike
    epoch_batches = args.epoch_batches or _one_pass_batches(paths, env.world_size, args.batch_size)
    return _on_one_rank(lambda env, device: _capstone_rank(args, env, device, paths, epoch_batches),
                        args.device, args.timeout)


def _capstone_rank(args: argparse.Namespace, env: distributed.DistEnv, device: torch.device, paths: Sequence[Path],
                   epoch_batches: int) -> dict:
    """One rank's training (notebook 11, section 4): the instrumented shard pipeline, DDP, a report with each stall."""
    model, ddp, opt = train.ddp_model(device, args.seed, args.lr)
    report: dict = {"rank": env.rank, "world_size": env.world_size, "source": env.source, "shards": len(paths),
                    "workers": args.workers, "prefetch_factor": args.prefetch_factor,
                    "batch_size": args.batch_size, "epoch_batches": epoch_batches, "epochs": [], "resumed_at": []}
    ckpt = resume.load_checkpoint(args.ckpt, env.rank) if args.ckpt else None
    if ckpt is not None:  # the end of an epoch: the next one's stream is a fresh seeded one (EndlessShardCycle)
        if ckpt["report"]["world_size"] != env.world_size:
            raise distributed.DistEnvError(f"the checkpoint in {args.ckpt} was written by {ckpt['report']['world_size']} "
                                           f"ranks, this job has {env.world_size}: resume it with as many, or start "
                                           "afresh with another --ckpt folder")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        report = ckpt["report"]
        report["resumed_at"].append(len(report["epochs"]))
        print(f"resumed from {args.ckpt}: {len(report['epochs'])} epoch(s) done", flush=True)
    first = len(report["epochs"])
    loader = capstone.make_loader([str(p) for p in paths], args.workers, args.prefetch_factor, args.batch_size,
                                  args.decode_ms, args.seed + env.rank, pin_memory=device.type == "cuda", first_epoch=first)
    for epoch in range(first, args.epochs):
        keys: list[list[str]] = []
        losses: list[float] = []

        def step(batch: tuple) -> None:
            x, y, batch_keys = batch
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce: every rank must take the same number of steps
            opt.step()
            simulated_step(None, args.step_ms / 1000)
            keys.append(list(batch_keys))
            losses.append(loss.item())

        stats, workers = capstone.run_epoch(loader, epoch_batches, step)
        by_worker: dict[str, list[str]] = {}
        for worker, batch_keys in zip(workers, keys):
            by_worker.setdefault(str(worker), []).extend(batch_keys)
        report["epochs"].append({
            "batches": len(keys), "samples": sum(map(len, keys)), "keys_by_worker": by_worker,
            "stall": stats.stall_fraction, "steady_stall": stats.steady_stall_fraction,
            "first_batch_s": stats.first_batch_s, "mean_wait_ms": 1000 * stats.waited / max(1, len(keys)),
            "mean_step_ms": 1000 * stats.mean_step, "mean_load_ms": 1000 * stats.mean_load,
            "seconds": stats.wall, "mean_loss": train.epoch_mean_loss(losses, device),
        })
        print(f"epoch {epoch}: {len(keys)} batches, {sum(map(len, keys))} samples from "
              f"{len(by_worker)} reader(s); waiting for data {stats.steady_stall_fraction:.0%} of the time "
              "after the first batch", flush=True)
        if args.ckpt:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "report": report}
            resume.save_checkpoint(args.ckpt, env.rank, epoch + 1, state)  # "step" = epochs done
    report["weights_sha256"] = train.weights_digest(model)
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


def capstone_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.capstone train|check|shards``: 0, or 2 after one line for a known error."""
    args = _capstone_args(argv)
    try:
        if args.command == "train":
            record(_capstone_train)(args)  # torchrun then names the rank whose error came first
        elif args.command == "check":
            paths = capstone.check_job(args.shards, args.ranks, args.workers)
            print(f"{len(paths)} shards for {args.ranks} ranks × {max(1, args.workers)} readers each: "
                  f"{len(paths) / (args.ranks * max(1, args.workers)):.1f} shards per reader")
        else:
            written = write_image_shards(args.out, size=args.size, root=args.data, maxcount=args.maxcount)
            print(written.describe())
    except (ShardError, DataNotFoundError, distributed.DistEnvError) as exc:
        return _one_line(exc)
    return 0


# --------------------------------------------------------------------------- python -m course_lib.resume
def _resume_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.resume", description=resume.__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint folder (resumed from when it holds one)")
    p.add_argument("--report", required=True, help="folder for each rank's rankN.steps.jsonl")
    p.add_argument("--loader", choices=("stateful", "plain"), default="stateful")
    p.add_argument("--data", help="folder holding the prepared data sets (default: $COURSE_DATA_DIR or the cache)")
    p.add_argument("--size", default="small", help="which prepared set (default: small)")
    p.add_argument("--limit", type=int, default=64, help="use only the first N training images (0: all)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    p.add_argument("--ckpt-every", type=int, default=4, help="steps between checkpoints (0: only when signalled)")
    p.add_argument("--stop-at", type=int, default=0, help="practice: end the job after this step (0: never)")
    p.add_argument("--how", choices=("kill", "term"), default="kill",
                   help="kill: rank 0 and its workers get SIGKILL; term: rank 0 sends torchrun SIGTERM")
    p.add_argument("--step-seconds", type=float, default=0.0, help="simulated extra work per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for the other ranks")
    p.add_argument("--device", default="auto", help="auto (a GPU per rank when there is one), cpu or cuda")
    args = p.parse_args(argv)
    if min(args.epochs, args.batch_size) < 1 or min(args.workers, args.limit, args.ckpt_every, args.stop_at) < 0:
        p.error("--epochs and --batch-size must be at least 1; --workers, --limit, --ckpt-every, --stop-at not negative")
    return args


def resume_main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.resume``: 0, or 2 after one line for missing data or a checkpoint it cannot resume."""
    args = _resume_args(argv)

    def run(env: distributed.DistEnv, device: torch.device) -> dict:
        print(f"rank {env.rank}: {resume._run(args, env, device)}", flush=True)
        return {}

    try:
        _on_one_rank(run, args.device, args.timeout)
    except (DataNotFoundError, distributed.DistEnvError) as exc:
        return _one_line(exc)
    return 0
