"""Notebook 07: data-parallel jobs, from "who am I?" to what each rank loaded.

:func:`dist_env` reads rank, local rank, world size and the rendezvous address from torchrun's
variables or, failing that, Slurm's (as IDRIS's ``idr_torch`` does); a half-set environment is an
error naming what is missing. :func:`start` joins the job, :func:`sampler_shares` shows each rank's
``DistributedSampler`` share without starting a process, and the reports say what each rank loaded.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import re
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .support import check_int, write_atomic

__all__ = [
    "DistEnv",
    "DistEnvError",
    "check_one_gpu_per_rank",
    "dist_env",
    "expand_nodelist",
    "finish",
    "padding_report",
    "plot_shares",
    "read_reports",
    "sampler_shares",
    "start",
    "write_report",
]

#: torchrun sets all of these for every process it starts.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: What a Slurm task needs; the node list comes from one of two names (see :data:`SLURM_NODELIST_VARS`).
SLURM_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")  # the step's own nodes first
#: The rendezvous port when Slurm starts the tasks and MASTER_PORT is not set (torch's default).
DEFAULT_PORT = 29500


class DistEnvError(RuntimeError):
    """Notebook 07, section 4: the environment says "distributed", but not completely; the message says what is missing."""


# --------------------------------------------------------------------------- who am I?
@dataclass(frozen=True)
class DistEnv:
    """Notebook 07, section 4: where this process sits in a job, what ``torch.distributed`` needs to start."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "single"
    local_world_size: int = 1  # processes on this node (what MDS reads as LOCAL_WORLD_SIZE)

    def __str__(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size} (local rank {self.local_rank} of {self.local_world_size}), "
            f"rendezvous {self.master_addr}:{self.master_port}, from {self.source}"
        )


def expand_nodelist(nodelist: str) -> list[str]:
    """Notebook 07, section 4: expand a Slurm host list such as ``"gpu[01-03,07],login1"`` into host names, in order.
    Zero padding is kept (``n[08-10]`` gives ``n08 n09 n10``), as ``scontrol show hostnames`` does."""
    hosts: list[str] = []
    # split on commas that are not inside brackets
    parts = re.findall(r"(?:[^,\[\]]|\[[^\]\[]*\])+", nodelist.strip())
    if ",".join(parts) != nodelist.strip():  # unbalanced brackets or empty items
        raise ValueError(f"cannot parse Slurm node list {nodelist!r}")
    for part in parts:
        pieces = re.split(r"\[([^\]]*)\]", part)
        expanded = [""]
        for i, piece in enumerate(pieces):
            if i % 2 == 0:  # plain text between bracket groups
                if "[" in piece or "]" in piece:
                    raise ValueError(f"cannot parse Slurm node list {nodelist!r}")
                expanded = [e + piece for e in expanded]
                continue
            choices: list[str] = []
            for item in piece.split(","):
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
                if not m:
                    raise ValueError(f"cannot parse {item!r} in Slurm node list {nodelist!r}")
                lo, hi = m.group(1), m.group(2) or m.group(1)
                if int(hi) < int(lo):
                    raise ValueError(f"range {item!r} runs backwards in Slurm node list {nodelist!r}")
                choices += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
            expanded = [e + c for e in expanded for c in choices]
        hosts += expanded
    if not hosts or any(not h for h in hosts):
        raise ValueError(f"empty host name in Slurm node list {nodelist!r}")
    return hosts


def _int_var(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DistEnvError(f"{name}={env[name]!r} is not an integer") from None


def _check_ranks(rank: int, local_rank: int, world_size: int, names: tuple[str, str, str]) -> None:
    if world_size < 1:
        raise DistEnvError(f"{names[2]} must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise DistEnvError(f"{names[0]}={rank} is outside 0..{world_size - 1} ({names[2]}={world_size})")
    if not 0 <= local_rank <= rank:
        raise DistEnvError(f"{names[1]}={local_rank} cannot be above {names[0]}={rank} or negative")


def _tasks_on_node(env: Mapping[str, str]) -> int:
    """The tasks on this task's node, from Slurm's ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``: 2, 2, 2 and 1)."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env["SLURM_NTASKS"]
    if not re.fullmatch(r"\d+(\(x\d+\))?(,\d+(\(x\d+\))?)*", spec):
        raise DistEnvError(f"cannot read tasks per node from {spec!r}")
    counts = [int(n) for n, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", spec) for _ in range(int(times or 1))]
    return counts[min(int(env.get("SLURM_NODEID", 0)), len(counts) - 1)]


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Notebook 07, section 4: read rank, local rank, world size and the rendezvous address from the environment.

    torchrun's variables win when any of them is set (under ``srun torchrun`` both are present, and torchrun's
    describe the process it started). Otherwise Slurm's: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, and
    the first host of the node list (:data:`SLURM_NODELIST_VARS`) as the rendezvous address, unless
    ``MASTER_ADDR``/``MASTER_PORT`` are set. With neither, a single process: rank 0 of 1 on 127.0.0.1.
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        missing = [name for name in TORCHRUN_VARS if name not in env]
        if missing:
            raise DistEnvError(
                f"torchrun-style environment is half set: {', '.join(missing)} missing "
                f"(found {', '.join(n for n in TORCHRUN_VARS if n in env)}). Start the script with torchrun, "
                "which sets all five, or unset RANK/LOCAL_RANK/WORLD_SIZE to run as a single process."
            )
        rank, local, world = (_int_var(env, n) for n in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        _check_ranks(rank, local, world, ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        local_world = _int_var(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        return DistEnv(rank, local, world, env["MASTER_ADDR"], _int_var(env, "MASTER_PORT"), "torchrun", local_world)
    if any(name in env for name in SLURM_VARS):
        missing = [name for name in SLURM_VARS if name not in env]
        if not any(name in env for name in SLURM_NODELIST_VARS) and "MASTER_ADDR" not in env:
            missing.append(" or ".join(SLURM_NODELIST_VARS))
        if missing:
            raise DistEnvError(
                f"Slurm environment is half set: {', '.join(missing)} missing. Start one task per process "
                "with srun inside an sbatch/salloc allocation (srun sets them all), or use torchrun."
            )
        rank, local, world = (_int_var(env, n) for n in SLURM_VARS)
        _check_ranks(rank, local, world, SLURM_VARS)
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        else:
            nodelist = next(env[n] for n in SLURM_NODELIST_VARS if n in env)
            try:
                addr = expand_nodelist(nodelist)[0]
            except ValueError as exc:
                raise DistEnvError(f"{exc}; set MASTER_ADDR to the first node's host name instead") from None
        port = _int_var(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
        return DistEnv(rank, local, world, addr, port, "slurm", _tasks_on_node(env))
    return DistEnv(0, 0, 1, "127.0.0.1", DEFAULT_PORT, "single", 1)


def start(device: str = "auto", timeout_s: float = 600.0) -> tuple[DistEnv, Any]:
    """Notebook 07, section 5: join the job as this process's rank; return ``(env, device)``.

    The device is a GPU per local rank when there is one (``device="auto"``), else the CPU; the
    process group then uses NCCL or gloo. Under srun it exports ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE``, which spawn/forkserver DataLoader workers read (webdataset's ``split_by_node``, MDS). A job of one process (world size 1, e.g. a notebook)
    gets a group of one without any rendezvous or port. Keep ``timeout_s`` generous on a cluster:
    start-up and checkpoints wait too.
    """
    import torch
    import torch.distributed as dist

    # before any group exists: imported later (DDP's constructor does), its ``group=group.WORLD`` defaults keep
    # the group and its threads alive past destroy_process_group(), into Python's shutdown, where they can abort
    # the process ("terminate called without an active exception"); checked with torch 2.14, see finish()
    import torch.distributed.nn

    env = dist_env()
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        check_one_gpu_per_rank(env, torch.cuda.device_count())
    # usually one GPU per local rank; with --gpus-per-task=1 each task sees only its own, as cuda:0
    dev = torch.device(f"cuda:{env.local_rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)  # else every rank's pin-memory thread opens a context on GPU 0
    if env.world_size == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return env, dev
    # env:// rendezvous reads MASTER_*; spawn/forkserver DataLoader workers inherit no process group, and webdataset's
    # split_by_node then reads RANK/WORLD_SIZE, which srun alone does not set: without them every rank reads every shard
    for name, value in dict(
        MASTER_ADDR=env.master_addr,
        MASTER_PORT=env.master_port,
        RANK=env.rank,
        LOCAL_RANK=env.local_rank,
        WORLD_SIZE=env.world_size,
        LOCAL_WORLD_SIZE=env.local_world_size,
    ).items():
        os.environ.setdefault(name, str(value))
    # timeout_s bounds how long a collective waits for the other ranks: a rank that runs out of
    # data then fails with an error instead of waiting torch's default (30 min for gloo, 10 for NCCL)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return env, dev


def check_one_gpu_per_rank(env: DistEnv, gpus: int, environ: Mapping[str, str] | None = None) -> None:
    """Notebook 07, section 6: refuse, with what to do, a job that would put two ranks on one GPU (NCCL fails then).

    ``gpus`` is how many GPUs this process sees. Under Slurm with ``--gpus-per-task`` (or ``--gpu-bind``) every task
    sees its own GPU as ``cuda:0``, so one visible GPU for several ranks on a node is right there."""
    environ = os.environ if environ is None else environ
    if gpus == 0:
        raise DistEnvError("device cuda was asked for, but this process sees no GPU; use --device cpu or auto")
    own_gpu = (
        env.source == "slurm" and gpus == 1 and any(v in environ for v in ("SLURM_GPUS_PER_TASK", "SLURM_GPU_BIND"))
    )
    if env.local_world_size > gpus and not own_gpu:
        raise DistEnvError(
            f"{env.local_world_size} ranks on this node but {gpus} GPU(s): NCCL needs a GPU of its own for "
            f"every rank. Start at most {gpus} rank(s) per node (--nproc-per-node={gpus}), or train "
            "on the CPU with --device cpu (gloo)"
        )


def finish() -> None:
    """Notebook 07, section 5: leave the job: destroy this rank's process group, and its threads with it.

    Call it once the DDP model and the DataLoaders are gone (they sit in reference cycles: collected first);
    a ``RuntimeWarning`` says if anything still holds the group, whose threads would outlive Python's shutdown.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    gc.collect()
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        warnings.warn(
            "torch.distributed's process group is still referenced after destroy_process_group(): its threads "
            "will run while Python shuts down, which can abort the process. Release the DDP model and the "
            "DataLoaders first.",
            RuntimeWarning,
            stacklevel=2,
        )


# --------------------------------------------------------------------------- what does each rank get?
def sampler_shares(
    dataset_len: int,
    world_size: int,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    set_epoch: bool = True,
) -> np.ndarray:
    """Notebook 07, section 1: the indices torch's ``DistributedSampler`` gives each rank, a (world_size, per-rank) array.
    It builds one real sampler per rank with ``num_replicas``/``rank`` given, so no process group
    is needed. ``set_epoch=False`` imitates a loop that forgets to call ``sampler.set_epoch``."""
    from torch.utils.data.distributed import DistributedSampler

    check_int(dataset_len, "dataset_len", 1), check_int(world_size, "world_size", 1)
    if drop_last and dataset_len < world_size:
        raise ValueError(
            f"with drop_last=True, {dataset_len} samples over {world_size} ranks leaves every rank empty; "
            "use fewer ranks or drop_last=False"
        )
    rows = []
    for rank in range(world_size):
        sampler = DistributedSampler(
            range(dataset_len), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        if set_epoch:
            sampler.set_epoch(epoch)
        rows.append(list(sampler))
    return np.array(rows, dtype=np.int64)


def padding_report(shares: np.ndarray, dataset_len: int) -> dict[str, int]:
    """Notebook 07, section 1: count what the ranks' shares do to a data set of ``dataset_len``: seen, repeated, dropped."""
    counts = np.bincount(shares.ravel(), minlength=dataset_len)
    return {
        "samples": dataset_len,
        "drawn": int(shares.size),
        "seen once": int((counts == 1).sum()),
        "seen twice or more": int((counts > 1).sum()),
        "never seen": int((counts == 0).sum()),
    }


def plot_shares(shares: np.ndarray, dataset_len: int, ax=None, title: str | None = None):
    """Notebook 07, section 1: which rank gets which index, one row per rank, one column per sample: coloured by
    rank, dark and outlined where loaded twice (padding), white where nobody loads it. Returns the figure."""
    import matplotlib.pyplot as plt

    shares = np.asarray(shares)
    world = shares.shape[0]
    grid = np.zeros((world, dataset_len), dtype=int)
    for rank, row in enumerate(shares):
        np.add.at(grid[rank], row, 1)
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(10, 2 + dataset_len * 0.3), 0.5 + 0.45 * world), dpi=80)
    fig = ax.figure
    colours = plt.get_cmap("tab10")
    image = np.ones((world, dataset_len, 3))
    for rank in range(world):
        image[rank, grid[rank] >= 1] = colours(rank % 10)[:3]
        image[rank, grid[rank] >= 2] = np.array(colours(rank % 10)[:3]) * 0.45
    ax.imshow(image, aspect="auto", interpolation="nearest")
    totals = grid.sum(axis=0)
    for i in np.flatnonzero(totals > 1):  # samples loaded more than once over all ranks
        ax.add_patch(plt.Rectangle((i - 0.5, -0.5), 1, world, fill=False, lw=1.5, ec="black"))
    ax.set_yticks(range(world), [f"rank {r}" for r in range(world)])
    ax.set(
        xticks=range(0, dataset_len, max(1, dataset_len // 25)),
        xlim=(-0.5, dataset_len - 0.5),
        xlabel="sample index in the data set (outlined: loaded more than once; white column: never)",
        title=title or f"{dataset_len} samples over {world} ranks",
    )
    return fig


# --------------------------------------------------------------------------- reading the ranks' reports
def write_report(folder: str | os.PathLike[str], rank: int, report: dict) -> Path:
    """Notebook 07, section 5: write one rank's JSON report as ``FOLDER/rankN.json``, atomically
    (a reader never sees half of one)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return write_atomic(Path(folder) / f"rank{rank}.json", json.dumps(report))


def read_reports(folder: str | os.PathLike[str]) -> list[dict]:
    """Notebook 07, section 5: the ``rankN.json`` reports of a course script's ranks, in rank order."""
    paths = sorted(Path(folder).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise FileNotFoundError(f"no rank*.json reports in {folder}; run course_lib.train with --report {folder}")
    return [json.loads(p.read_text()) for p in paths]
