"""Notebook 12: a training run that survives being stopped, ``torchrun --nproc-per-node=N -m course_lib.resume``.

Every rank trains notebook 07's SmallCNN under DDP on its ``DistributedSampler`` share, a fixed number of
steps per epoch, and appends one line per step to ``rankN.steps.jsonl`` in ``--report`` (run, epoch, step
and the batch's sample indices). It checkpoints every ``--ckpt-every`` steps and when SIGTERM or SIGUSR1
arrives (the step ends, every rank saves, the job exits). ``--loader stateful`` puts torchdata's
``StatefulDataLoader`` state in the checkpoint beside the model and optimizer; ``--loader plain`` saves what
most scripts save (model, optimizer, epoch, step), so a restarted run starts its epoch's data over.
``--stop-at S`` practises an ending after step S: rank 0 and its workers get SIGKILL (a lost node) or torchrun
SIGTERM (a scheduler's notice).

The file reads top to bottom: the pieces notebook 12 teaches, then the program (one rank's loop, the command line).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DistributedSampler, IterableDataset, Sampler, Subset, get_worker_info

from torch.distributed.elastic.multiprocessing.errors import record

from . import distributed
from ._programs import add_data_arguments, one_line, run_on_one_rank
from ._support import new_file, write_atomic
from .datasets import DataNotFoundError, WithIndex, image_tensor, shapes
from .train import ddp_model, weights_digest

__all__ = ["ResumableShuffle", "ResumableStream", "StopFlag", "ignore_stop_signals", "load_checkpoint", "read_steps", "save_checkpoint",
           "stateful_loader"]


def stateful_loader(dataset: Any, **kwargs: Any) -> Any:
    """Notebook 12, section 2: torchdata's ``StatefulDataLoader``, a ``DataLoader`` with ``state_dict()`` and
    ``load_state_dict()``. torchdata 0.11 calls ``torch.set_vital``, which torch 2.14 deprecates; that one warning
    is silenced here."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(dataset, **kwargs)


class ResumableShuffle(Sampler[int]):
    """Notebook 12, section 3 (the reference for exercise 12.2): a new order each epoch from ``(seed, epoch)``,
    that remembers how far it got, so a loader can resume it mid-epoch."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0
        self.start = self.yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded, self.start = self.start, 0  # a resumed pass starts where the saved one stopped, once
        for index in order[self.yielded:]:
            self.yielded += 1
            yield index

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.start = state["epoch"], state["yielded"]


class ResumableStream(IterableDataset):
    """Notebook 12, section 4 (the reference for exercise 12.3): samples ``0..n-1``, every worker its own share,
    each worker's position in its share saved and restored by the ``StatefulDataLoader``, in that worker."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        share = range(worker, self.n, workers)
        for index in share[self.done:]:  # skip what was yielded before the checkpoint, without reading it
            self.done += 1  # before the yield: a checkpoint taken at this point already counts this sample
            yield self.load(index)

    def load(self, index: int) -> int:
        return index  # a real stream reads sample ``index`` here

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.done = state["done"]


class StopFlag:
    """Notebook 12, section 5: remember that SIGTERM or SIGUSR1 arrived; the training loop looks at the end of a step.

    ``agreed()`` is a collective: every rank stops after the same step when any rank got the signal."""

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1)) -> None:
        self.received: int | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum  # only note it: the step in progress finishes first

    def agreed(self) -> bool:
        flag = torch.tensor([int(self.received is not None)])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def save_checkpoint(folder: str | os.PathLike[str], rank: int, step: int, state: dict[str, Any]) -> Path:
    """Notebook 12, section 5: this rank's part of the checkpoint after ``step``, written atomically. Once every rank
    has written its part, rank 0 points ``latest`` at it and removes the older steps: a job killed in between
    resumes from the previous complete checkpoint, never from a mix of two."""
    part = Path(folder) / f"step{step:07d}" / f"rank{rank}.pt"
    part.parent.mkdir(parents=True, exist_ok=True)
    with new_file(part) as f:  # a temporary file, renamed to ``part`` once whole
        torch.save(state, f)
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        write_atomic(Path(folder) / "latest", f"{step}\n")
        for old in Path(folder).glob("step*"):
            if old.is_dir() and old.name < part.parent.name and all(p.suffix == ".pt" for p in old.iterdir()):
                shutil.rmtree(old)  # only the step folders of this function, holding only rank parts
    return part


def load_checkpoint(folder: str | os.PathLike[str], rank: int) -> dict[str, Any] | None:
    """Notebook 12, section 5: this rank's part of the latest complete checkpoint in ``folder``, or ``None``."""
    latest = Path(folder) / "latest"
    if not latest.exists():
        return None
    part = Path(folder) / f"step{int(latest.read_text()):07d}" / f"rank{rank}.pt"
    if not part.exists():
        raise FileNotFoundError(f"{latest} names step {latest.read_text().strip()}, but {part} is missing: this rank "
                                "did not write it (was the job started with more ranks than the one that saved?)")
    return torch.load(part, weights_only=True)  # tensors, numbers and dicts only: no code runs while loading


def read_steps(folder: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Notebook 12, section 1: each rank's steps from its ``rankN.steps.jsonl``, in step order. When a restarted run
    did a step again, its line replaces the earlier one: what is left is what trained the final model."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(folder).glob("rank*.steps.jsonl")):
        steps: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                steps[record["step"]] = record
        runs[int(path.name[4:].split(".")[0])] = [steps[s] for s in sorted(steps)]
    if not runs:
        raise FileNotFoundError(f"no rank*.steps.jsonl in {folder}; run course_lib.resume with --report {folder}")
    return runs


def ignore_stop_signals(worker_id: int) -> None:
    """Notebook 12, section 5: a ``worker_init_fn`` for DataLoader workers. torchrun and Slurm send their notice to
    the whole process group, workers too, and torch's workers die of SIGTERM; ignoring it lets the rank finish its
    step with them (they still stop with the rank)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


# --------------------------------------------------------------------------- the program: one rank's training
def _build(args: Any, env: distributed.DistEnv) -> tuple[Any, DistributedSampler]:
    dataset = WithIndex(shapes("train", transform=functools.partial(image_tensor, size=32), size=args.size, root=args.data))
    if args.limit:
        dataset = Subset(dataset, range(min(args.limit, len(dataset))))
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed)
    kwargs = dict(batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                  worker_init_fn=ignore_stop_signals)
    if args.loader == "stateful":
        return stateful_loader(dataset, **kwargs), sampler
    return torch.utils.data.DataLoader(dataset, **kwargs), sampler


def _run(args: Any, env: distributed.DistEnv, device: torch.device) -> str:
    stop = StopFlag()
    loader, sampler = _build(args, env)
    model, ddp, opt = ddp_model(device, args.seed, args.lr)
    per_epoch, total = len(loader), len(loader) * args.epochs
    epoch = step = 0
    log_path = Path(args.report) / f"rank{env.rank}.steps.jsonl"
    run = _runs_logged(log_path)  # this run's number: 0 for the first
    ckpt = load_checkpoint(args.ckpt, env.rank)
    if ckpt is not None:
        if ckpt["world_size"] != env.world_size and ckpt["step"] % per_epoch:
            raise distributed.DistEnvError(
                f"the checkpoint was written by {ckpt['world_size']} ranks in the middle of an epoch; resume it with "
                f"{ckpt['world_size']} ranks (a new world size can start at an epoch boundary only)")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        step = ckpt["step"]
        epoch = step // per_epoch
        if args.loader == "stateful" and step % per_epoch:
            loader.load_state_dict(ckpt["loader"])  # the next batch is the one after the checkpoint
    Path(args.report).mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        while step < total:
            sampler.set_epoch(epoch)  # before iter(): a restored loader skips into this epoch's order
            todo = per_epoch - step % per_epoch  # a plain loader restarts the epoch and takes this many batches
            for index, x, y in itertools.islice(loader, todo):
                loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(args.step_seconds)
                step += 1
                log.write(json.dumps({"run": run, "epoch": epoch, "step": step, "indices": index.tolist()}) + "\n")
                log.flush()
                if step == args.stop_at and env.rank == 0:
                    _practice_stop(args.how, stop)
                stopping = stop.agreed()
                if stopping or (args.ckpt_every and step % args.ckpt_every == 0) or step == total:
                    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                             "step": step, "world_size": env.world_size}
                    if args.loader == "stateful":
                        state["loader"] = loader.state_dict()
                    save_checkpoint(args.ckpt, env.rank, step, state)
                if stopping:
                    return f"stopped by signal {stop.received} after step {step}: checkpoint saved, resume to go on"
            epoch += 1
    digest = weights_digest(model)
    distributed.write_report(args.report, env.rank, {"rank": env.rank, "step": step, "weights_sha256": digest})
    return f"finished at step {step}, weights {digest[:12]}"


def _runs_logged(log_path: Path) -> int:
    """How many runs already wrote steps to this rank's log."""
    if not log_path.exists():
        return 0
    runs = {json.loads(line)["run"] for line in log_path.read_text().splitlines() if line.strip()}
    return max(runs, default=-1) + 1


def _practice_stop(how: str, stop: StopFlag) -> None:
    if how == "kill":
        # this rank and its workers (torchrun makes each rank a process group), no handler runs: a lost node
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getppid(), signal.SIGTERM)  # torchrun forwards it to every rank, as on a scheduler's notice
    deadline = time.monotonic() + 30
    while stop.received is None and time.monotonic() < deadline:
        time.sleep(0.01)  # wait for our own copy, so that the ranks agree on this step


# --------------------------------------------------------------------------- the command line
def _parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_lib.resume", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint folder (resumed from when it holds one)")
    p.add_argument("--report", required=True, help="folder for each rank's rankN.steps.jsonl")
    p.add_argument("--loader", choices=("stateful", "plain"), default="stateful")
    add_data_arguments(p)
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


@record  # torchrun then names the rank whose error came first, with its traceback
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.resume``: 0, or 2 after one line for missing data or a checkpoint it cannot resume."""
    args = _parse_args(argv)

    def run(env: distributed.DistEnv, device: torch.device) -> dict:
        print(f"rank {env.rank}: {_run(args, env, device)}", flush=True)
        return {}

    try:
        run_on_one_rank(run, args.device, args.timeout)
    except (DataNotFoundError, distributed.DistEnvError) as exc:
        return one_line(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
