"""Notebook 13, the capstone: a small CNN trained under DDP over WebDataset shards, its data stall measured on every rank.

One pipeline (:func:`build_dataset`): every epoch the shard list is dealt out anew between the readers (the workers
of all ranks), every reader cycles through its own share and mixes its samples in a buffer, and every rank takes the
same number of steps per epoch. :func:`timed_epoch`/:func:`sweep` time it in the
notebook; ``torchrun -m course_lib.capstone train --shards DIR`` trains on every rank and writes
``rankN.json``; ``decode_ms``/``step_ms`` are simulated costs (sleeps), 0 on a cluster.

The file reads top to bottom: the pipeline, measuring it, the checks before a job starts, then the program
(each rank's training loop and the command line with its subcommands ``train``, ``check`` and ``shards``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset
from torch.distributed.elastic.multiprocessing.errors import record

from . import distributed
from ._programs import one_line, run_on_one_rank
from .datasets import DataNotFoundError, image_tensor
from .instrument import EpochRecord, InstrumentedLoader, simulated_step
from .resume import load_checkpoint, save_checkpoint
from .shards import ShardError, find_shards, check_enough_shards, read_shardset, write_image_shards
from .train import ddp_model, epoch_mean_loss, weights_digest

__all__ = [
    "BATCH_SIZE",
    "DECODE_MS",
    "EndlessShardCycle",
    "RotatingShardList",
    "SHUFFLE_BUFFER",
    "STALL_TARGET",
    "STEP_MS",
    "ShuffleBuffer",
    "SimulatedDecode",
    "build_dataset",
    "check_job",
    "cpus_per_task",
    "make_loader",
    "timed_epoch",
    "plot_stall",
    "run_epoch",
    "sweep",
]

#: The notebook's workload: what one sample costs to decode, and one training step, in ms.
DECODE_MS = 9.0
STEP_MS = 100.0
BATCH_SIZE = 16
#: The exercise's target: the loop may wait for data at most this share of the time (after the first batch).
STALL_TARGET = 0.15
#: Samples each reader mixes in its shuffle buffer: two of the notebook's shards of 50.
SHUFFLE_BUFFER = 100


# --------------------------------------------------------------------------- the pipeline
# A loader with persistent workers iterates each worker's copy of the pipeline anew at every ``iter(loader)``: once
# per epoch. The three seeded stages below count those iterations as epochs (``first_epoch``: where a resumed job
# starts), so each epoch's stream depends on (seed, epoch, rank, worker) only, not on what earlier epochs consumed.
class RotatingShardList(IterableDataset):
    """Notebook 13, section 1: pipeline source: all the shards, in a new order each epoch, drawn from (seed, epoch).

    The order is the same on every rank and worker (no rank in the seed), so ``split_by_node`` and ``split_by_worker``
    after it still give every reader shards of its own, but other shards every epoch (notebook 09, exercise 09.5).
    """

    def __init__(self, urls: str | Sequence[str], seed: int = 0, first_epoch: int = 0) -> None:
        import webdataset as wds

        self.urls = wds.shardlists.expand_urls(urls) if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ShardError("no shard to read: the list of shard URLs is empty")
        self.seed, self.epoch = seed, first_epoch

    def __iter__(self) -> Iterator[dict]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.urls))
        self.epoch += 1
        for i in order:
            yield {"url": self.urls[i]}


class EndlessShardCycle:
    """Notebook 13, section 1: pipeline stage: this reader's shards, over and over, in a new seeded order each pass.

    After ``split_by_node`` and ``split_by_worker`` it sees this epoch's share of this reader only; its orders are
    drawn from ``seed``, rank, worker and epoch: reproducible, and different on every reader.
    """

    def __init__(self, seed: int = 0, first_epoch: int = 0) -> None:
        self.seed, self.epoch = seed, first_epoch

    def __call__(self, src: Iterable[dict]) -> Iterator[dict]:
        import webdataset as wds

        urls = [d["url"] for d in src]
        rank, world, worker, workers = wds.utils.pytorch_worker_info()
        if not urls:
            raise ShardError(
                f"worker {worker} of rank {rank} got no shard ({world} ranks × {workers} workers share them): "
                "write more shards or use fewer workers"
            )
        rng = random.Random(f"{self.seed}-{rank}-{worker}-{self.epoch}")  # str seeds are stable across runs
        self.epoch += 1
        while True:
            order = list(urls)
            rng.shuffle(order)
            for url in order:
                yield {"url": url}


class ShuffleBuffer:
    """Notebook 13, section 1: pipeline stage: samples mixed in a buffer of ``size``, so that a batch mixes shards.

    Once the buffer is full, each new sample takes the place of a random one, which goes on. A round over the
    reader's shards ends where a sample's key comes again: the buffer is emptied then, in random order, so every
    round still yields each of its samples once. The draws are seeded by ``seed``, rank, worker and epoch, like
    :class:`EndlessShardCycle`'s: reproducible, and different on every reader.
    """

    def __init__(self, size: int, seed: int = 0, first_epoch: int = 0) -> None:
        if size < 1:
            raise ValueError(f"the shuffle buffer needs room for at least 1 sample, got size={size}")
        self.size, self.seed, self.epoch = size, seed, first_epoch

    def __call__(self, src: Iterable[dict]) -> Iterator[dict]:
        import webdataset as wds

        rank, _, worker, _ = wds.utils.pytorch_worker_info()
        rng = random.Random(f"buffer-{self.seed}-{rank}-{worker}-{self.epoch}")
        self.epoch += 1
        buffer: list = []
        this_round: set = set()
        for sample in src:
            if sample["__key__"] in this_round:  # the next round over the shards begins: finish this one first
                rng.shuffle(buffer)
                yield from buffer
                buffer, this_round = [], set()
            this_round.add(sample["__key__"])
            if len(buffer) < self.size:
                buffer.append(sample)
                continue
            i = rng.randrange(self.size)
            buffer[i], sample = sample, buffer[i]
            yield sample
        rng.shuffle(buffer)  # a stream that ends: what is left, in random order
        yield from buffer


class SimulatedDecode:
    """Notebook 13, section 1: pipeline stage: ``ms`` of simulated work per sample, standing in for a heavier decode.

    Paid in sleeps of at least ``chunk_ms``, counting the time actually slept: on a busy machine every wake-up
    comes late, and a sleep per sample would add up those delays instead of the cost asked for.
    """

    def __init__(self, ms: float, chunk_ms: float = 10.0) -> None:
        if ms < 0:
            raise ValueError(f"decode_ms must be >= 0, got {ms}")
        self.seconds, self.chunk, self.debt = ms / 1000, chunk_ms / 1000, 0.0

    def __call__(self, sample: tuple) -> tuple:
        self.debt += self.seconds
        if self.debt >= self.chunk:
            start = time.perf_counter()
            time.sleep(self.debt)
            self.debt -= time.perf_counter() - start  # a late wake-up pays ahead for the next samples
        return sample


def _decode(sample: tuple[bytes, bytes, str]) -> tuple[torch.Tensor, int, str]:
    """``(jpg bytes, cls bytes, key)`` -> ``(float image [3, H, W] in [0, 1], label, key)``."""
    jpg, cls, key = sample
    return image_tensor(jpg), int(cls), key


def build_dataset(
    urls: str | Sequence[str],
    seed: int = 0,
    decode_ms: float = DECODE_MS,
    first_epoch: int = 0,
    buffer: int = SHUFFLE_BUFFER,
):
    """Notebook 13, section 1: the shards as an endless stream of ``(image [3, H, W] float, label, key)`` for this reader,
    its shards dealt anew every epoch (``first_epoch``: the epoch a resumed job starts at)."""
    import webdataset as wds

    return wds.DataPipeline(
        RotatingShardList(
            urls, seed, first_epoch
        ),  # all shards, in an order drawn from (seed, epoch): alike everywhere
        wds.split_by_node,  # this rank's shards (rank from torch.distributed, or RANK/WORLD_SIZE)
        wds.split_by_worker,  # this worker's share of them
        EndlessShardCycle(seed, first_epoch),
        wds.tarfile_to_samples(),
        ShuffleBuffer(buffer, seed, first_epoch),  # before decoding: the buffer holds compressed bytes
        wds.to_tuple("jpg", "cls", "__key__"),
        wds.map(_decode),
        wds.map(SimulatedDecode(decode_ms)),
    )


def make_loader(
    urls: str | Sequence[str],
    num_workers: int = 0,
    prefetch_factor: int = 2,
    batch_size: int = BATCH_SIZE,
    decode_ms: float = DECODE_MS,
    seed: int = 0,
    pin_memory: bool = False,
    first_epoch: int = 0,
) -> InstrumentedLoader:
    """Notebook 13, section 2: an :class:`InstrumentedLoader` over :func:`build_dataset`; workers are persistent, and each
    ``iter(loader)`` starts the next epoch of the pipeline's seeded stages in them. ``seed`` must be the same on every
    rank: it deals out the shards."""
    if num_workers < 0 or prefetch_factor < 1 or batch_size < 1:
        raise ValueError(
            f"need num_workers >= 0, prefetch_factor >= 1 and batch_size >= 1, "
            f"got {num_workers}, {prefetch_factor} and {batch_size}"
        )
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
    )
    if num_workers:
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=True)
    gc.collect()  # earlier loaders' leftovers must not be copied into this loader's forked workers
    return InstrumentedLoader(build_dataset(urls, seed, decode_ms, first_epoch), **kwargs)


def run_epoch(loader: InstrumentedLoader, batches: int, step: Callable[[Any], None]) -> tuple[EpochRecord, list]:
    """Notebook 13, section 2: take exactly ``batches`` batches from an endless ``loader``, calling ``step`` on each.
    Returns the epoch's record and the batches' worker ids. Closing the iterator at the end ends
    the last step's timing (the loop never asks for a batch after it)."""
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    it = iter(loader)
    try:
        for _ in range(batches):
            step(next(it))
    finally:
        it.close()
        del it
    record = loader.last
    return record, [b.worker for b in record.batches]


def timed_epoch(
    urls: str | Sequence[str],
    num_workers: int = 0,
    prefetch_factor: int = 2,
    batches: int = 20,
    step_ms: float = STEP_MS,
    decode_ms: float = DECODE_MS,
    batch_size: int = BATCH_SIZE,
    seed: int = 0,
) -> EpochRecord:
    """Notebook 13, section 2: time ``batches`` batches of the pipeline in this process, each followed by a ``step_ms`` step."""
    loader = make_loader(urls, num_workers, prefetch_factor, batch_size, decode_ms, seed)
    record, _ = run_epoch(loader, batches, lambda batch: simulated_step(batch, step_ms / 1000))
    record.settings.update(decode_ms=decode_ms, step_ms=step_ms)  # the workload, for the checks
    del loader
    gc.collect()  # stop the persistent workers now, not when the next loader starts
    return record


def sweep(urls: str | Sequence[str], name: str, values: Iterable[int], **fixed: Any) -> dict[int, EpochRecord]:
    """Notebook 13, section 3: :func:`timed_epoch` once per value of one setting (``"num_workers"`` or ``"prefetch_factor"``)."""
    if name not in ("num_workers", "prefetch_factor"):
        raise ValueError(f"sweep over 'num_workers' or 'prefetch_factor', not {name!r}")
    return {v: timed_epoch(urls, **{**fixed, name: v}) for v in values}


def plot_stall(
    results: dict[int, EpochRecord], target: float = STALL_TARGET, name: str = "num_workers", ax: Any = None
):
    """Notebook 13, section 3: the steady data stall (after the first batch, whose start-up would otherwise weigh as
    much as a long job's warm-up) of each setting as bars, green under ``target``, and the target line."""
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("nothing to draw: measure at least one setting")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3), dpi=80)
    fig = ax.figure
    labels = [str(k) for k in results]
    stalls = [100 * r.steady_stall_fraction for r in results.values()]
    ax.bar(labels, stalls, color=["#2ca02c" if s < 100 * target else "#d62728" for s in stalls])
    ax.axhline(100 * target, color="black", linestyle="--", linewidth=1)
    ax.text(len(labels) - 0.5, 100 * target, f"target {100 * target:.0f} %", ha="right", va="bottom", fontsize=9)
    ax.set(
        ylim=(0, 100),
        xlabel=name,
        ylabel="% of time waiting for data\n(after the first batch)",
        title=f"data stall vs {name}",
    )
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- before a job starts
def check_job(shards: str | os.PathLike[str], world_size: int, num_workers: int) -> list[Path]:
    """Notebook 13, section 4: the job's shard files, after checking they exist and are enough for ranks × workers readers."""
    if world_size < 1 or num_workers < 0:
        raise ValueError(f"need world_size >= 1 and num_workers >= 0, got {world_size} and {num_workers}")
    paths = find_shards(shards)  # ShardError naming what is missing
    try:
        check_enough_shards(len(paths), world_size, num_workers)
    except ShardError as exc:
        # the general advice ends with "or resample": this pipeline resamples already, within each reader's shards
        first = str(exc).split(" At least")[0]
        raise ShardError(
            f"{first} Every reader needs shards of its own here (at least {world_size * max(1, num_workers)}, better "
            "several each): write smaller shards (python -m course_lib.capstone shards --maxcount N) or use fewer workers."
        ) from None
    return paths


# --------------------------------------------------------------------------- the Slurm script
def cpus_per_task(ranks_per_node: int, num_workers: int) -> int:
    """Notebook 13, section 5: CPUs for one node's task (torchrun and all its ranks): each rank runs 1 training process
    and ``num_workers`` DataLoader workers, each of which keeps one core busy when it must."""
    if ranks_per_node < 1 or num_workers < 0:
        raise ValueError(f"need ranks_per_node >= 1 and num_workers >= 0, got {ranks_per_node} and {num_workers}")
    return ranks_per_node * (num_workers + 1)


# --------------------------------------------------------------------------- the program: one rank's training
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
        raise ShardError(
            f"{samples} samples are less than one batch of {batch_size} per rank for {world_size} ranks: "
            "use a smaller --batch-size or give --epoch-batches"
        )
    return batches


def _train(args: argparse.Namespace) -> dict:
    """One rank's run: returns (and writes, with ``--report``) what it read and how long it waited."""
    env = distributed.dist_env()
    paths = check_job(args.shards, env.world_size, args.workers)  # before any rendezvous: all ranks alike
    epoch_batches = args.epoch_batches or _one_pass_batches(paths, env.world_size, args.batch_size)
    return run_on_one_rank(
        lambda env, device: _train_rank(args, env, device, paths, epoch_batches), args.device, args.timeout
    )


def _train_rank(
    args: argparse.Namespace, env: distributed.DistEnv, device: torch.device, paths: Sequence[Path], epoch_batches: int
) -> dict:
    """One rank's training (section 4): the instrumented shard pipeline, DDP, a report with each epoch's stall."""
    model, ddp, opt = ddp_model(device, args.seed, args.lr)
    report: dict = {
        "rank": env.rank,
        "world_size": env.world_size,
        "source": env.source,
        "shards": len(paths),
        "workers": args.workers,
        "prefetch_factor": args.prefetch_factor,
        "batch_size": args.batch_size,
        "epoch_batches": epoch_batches,
        "epochs": [],
        "resumed_at": [],
    }
    ckpt = load_checkpoint(args.ckpt, env.rank) if args.ckpt else None
    if (
        ckpt is not None
    ):  # the end of an epoch: the next one's stream is a fresh seeded one (build_dataset's first_epoch)
        if ckpt["world_size"] != env.world_size or not ckpt["rank_part"]:
            raise distributed.DistEnvError(
                f"the checkpoint in {args.ckpt} was written by {ckpt['world_size']} "
                f"ranks, this job has {env.world_size}: resume it with as many, or start "
                "afresh with another --ckpt folder"
            )
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        report = ckpt["report"]
        report["resumed_at"].append(len(report["epochs"]))
        print(f"resumed from {args.ckpt}: {len(report['epochs'])} epoch(s) done", flush=True)
    first = len(report["epochs"])
    loader = make_loader(
        [str(p) for p in paths],
        args.workers,
        args.prefetch_factor,
        args.batch_size,
        args.decode_ms,
        args.seed,
        pin_memory=device.type == "cuda",
        first_epoch=first,
    )
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

        stats, workers = run_epoch(loader, epoch_batches, step)
        by_worker: dict[str, list[str]] = {}
        for worker, batch_keys in zip(workers, keys):
            by_worker.setdefault(str(worker), []).extend(batch_keys)
        report["epochs"].append(
            {
                "batches": len(keys),
                "samples": sum(map(len, keys)),
                "keys_by_worker": by_worker,
                "stall": stats.stall_fraction,
                "steady_stall": stats.steady_stall_fraction,
                "first_batch_s": stats.first_batch_s,
                "mean_wait_ms": 1000 * stats.waited / max(1, len(keys)),
                "mean_step_ms": 1000 * stats.mean_step,
                "mean_load_ms": 1000 * stats.mean_load,
                "seconds": stats.wall,
                "mean_loss": epoch_mean_loss(losses, device),
            }
        )
        print(
            f"epoch {epoch}: {len(keys)} batches, {sum(map(len, keys))} samples from "
            f"{len(by_worker)} reader(s); waiting for data {stats.steady_stall_fraction:.0%} of the time "
            "after the first batch",
            flush=True,
        )
        if args.ckpt:  # the model and optimizer once (rank 0: DDP keeps them identical), each rank its report
            shared = None
            if env.rank == 0:
                shared = {"model": model.state_dict(), "optimizer": opt.state_dict(), "world_size": env.world_size}
            save_checkpoint(args.ckpt, env.rank, epoch + 1, {"report": report}, shared=shared)  # "step" = epochs done
    report["weights_sha256"] = weights_digest(model)
    if args.report:
        distributed.write_report(args.report, env.rank, report)
    return report


# --------------------------------------------------------------------------- the command line
def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.capstone", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on every rank (start it with torchrun)")
    t.add_argument("--shards", required=True, help="a folder of .tar shards, a brace pattern or a glob")
    t.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    t.add_argument("--prefetch-factor", type=int, default=2, help="batches each worker prepares ahead")
    t.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="per rank")
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument(
        "--epoch-batches",
        type=int,
        default=0,
        help="steps per epoch on every rank (0: one pass's worth, from the shards' manifest)",
    )
    t.add_argument("--decode-ms", type=float, default=0.0, help="simulated extra decoding per sample (0 on a cluster)")
    t.add_argument("--step-ms", type=float, default=0.0, help="simulated accelerator time per step (0 on a cluster)")
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for the other ranks")
    t.add_argument("--device", default="auto", help="auto (a GPU per rank when there is one), cpu or cuda")
    t.add_argument("--report", help="folder for one rankN.json report per rank")
    t.add_argument(
        "--ckpt",
        help="checkpoint folder: saved at every epoch's end, resumed from when it holds one (a "
        "shard stream has no mid-epoch state: a stopped job redoes its unfinished epoch)",
    )
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
        if (
            args.workers < 0
            or args.prefetch_factor < 1
            or args.batch_size < 1
            or args.epochs < 1
            or args.epoch_batches < 0
        ):
            p.error(
                "need --workers >= 0, --prefetch-factor >= 1, --batch-size >= 1, --epochs >= 1, --epoch-batches >= 0"
            )
        if args.decode_ms < 0 or args.step_ms < 0:
            p.error("--decode-ms and --step-ms cannot be negative")
    if args.command == "check" and (args.ranks < 1 or args.workers < 0):
        p.error("need --ranks >= 1 and --workers >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.capstone train|check|shards``: 0, or 2 after one line for a known error."""
    args = _parse_args(argv)
    try:
        if args.command == "train":
            record(_train)(args)  # torchrun then names the rank whose error came first
        elif args.command == "check":
            paths = check_job(args.shards, args.ranks, args.workers)
            print(
                f"{len(paths)} shards for {args.ranks} ranks × {max(1, args.workers)} readers each: "
                f"{len(paths) / (args.ranks * max(1, args.workers)):.1f} shards per reader"
            )
        else:
            written = write_image_shards(args.out, size=args.size, root=args.data, maxcount=args.maxcount)
            print(written.describe())
    except (ShardError, DataNotFoundError, distributed.DistEnvError) as exc:
        return one_line(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
