"""Notebook 14: a training run that survives being stopped, ``torchrun --nproc-per-node=N -m course_lib.resume``.

Every rank trains notebook 07's SmallCNN under DDP on its ``DistributedSampler`` share, with a random
augmentation whose draws come from (seed, epoch, sample index), a fixed number of steps per epoch, and appends
one line per step to ``rankN.steps.jsonl`` in ``--report`` (run, epoch, step, the batch's sample indices and a
digest of the augmented batch). It checkpoints every ``--ckpt-every`` steps and when SIGTERM or SIGUSR1
arrives (the step ends, every rank saves, the job exits): rank 0 saves the model and optimizer once, every
rank its own loader state. ``--loader stateful`` puts torchdata's ``StatefulDataLoader`` state in the
checkpoint; ``--loader plain`` saves what most scripts save (model, optimizer, epoch, step), so a restarted run
starts its epoch's data over. A job restarted with another number of ranks resumes at an epoch boundary, or
is refused with a message (:func:`resume_point`).
``--stop-at S`` practises an ending after step S: rank 0 and its workers get SIGKILL (a lost node) or torchrun
SIGTERM (a scheduler's notice).

The file reads top to bottom: the pieces notebook 14 teaches, then the program (one rank's loop, the command line).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, Sampler, Subset, get_worker_info

from . import distributed
from ._programs import add_data_arguments, one_line, run_on_one_rank
from .support import fsync_folder, new_file, write_atomic
from .datasets import DataNotFoundError, image_tensor, shapes
from .train import ddp_model, weights_digest

__all__ = [
    "EpochKeys",
    "ResumableShuffle",
    "ResumableStream",
    "ResumeError",
    "SeededAugmentation",
    "StaleStateStream",
    "StopFlag",
    "ignore_stop_signals",
    "load_checkpoint",
    "read_steps",
    "resume_point",
    "save_checkpoint",
    "stateful_loader",
]


def stateful_loader(dataset: Any, **kwargs: Any) -> Any:
    """Notebook 14, section 2: torchdata's ``StatefulDataLoader``, a ``DataLoader`` with ``state_dict()`` and
    ``load_state_dict()``. torchdata 0.11 calls ``torch.set_vital``, which torch 2.14 deprecates; that one warning
    is silenced here."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(dataset, **kwargs)


class ResumableShuffle(Sampler[int]):
    """Notebook 14, section 3 (the reference for exercise 14.2): a new order each epoch from ``(seed, epoch)``,
    that remembers how far it got, so a loader can resume it mid-epoch."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0
        self.start = self.yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded, self.start = self.start, 0  # a resumed pass starts where the saved one stopped, once
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.start = state["epoch"], state["yielded"]


class ResumableStream(IterableDataset):
    """Notebook 14, section 4 (the reference for exercise 14.3): samples ``0..n-1``, every worker its own share,
    each worker's position in its share saved and restored by the ``StatefulDataLoader``, in that worker."""

    def __init__(self, n: int) -> None:
        self.n, self.done, self.start = n, 0, 0

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        share = range(worker, self.n, workers)
        # a restored position serves one pass only: the next pass (the same object without workers, or with
        # persistent ones) starts its share from the beginning again
        self.done, self.start = self.start, 0
        for index in share[self.done :]:  # skip what was yielded before the checkpoint, without reading it
            self.done += 1  # before the yield: a checkpoint taken at this point already counts this sample
            yield self.load(index)

    def load(self, index: int) -> int:
        return index  # a real stream reads sample ``index`` here

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        # done too: a worker whose state is taken before its first batch after the resume reports where it stands,
        # not 0 (that would send a second resume back to the start of its share)
        self.done = self.start = state["done"]


class StaleStateStream(IterableDataset):
    """Notebook 14, section 4: a stand-in for a bug class of 2026 (huggingface/datasets#8308, in datasets 5.0): a
    stream that resumes right once, after which its state stops advancing.

    As in that bug, the position lives in a dict that ``state_dict()`` copies through a second reference, and
    ``load_state_dict()`` binds the position to a *new* dict: the stream goes on from the right place, but every
    state it reports afterwards is the stale one, position 0. A checkpoint taken after a resume therefore restarts
    the share from its beginning. One stop and resume cannot see it; two in the same epoch do."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = {"done": 0, "start": 0}
        self.reported = self.position  # what state_dict() copies: the same dict, until load_state_dict rebinds

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        share = range(worker, self.n, workers)
        self.position["done"], self.position["start"] = self.position["start"], 0
        for index in share[self.position["done"] :]:
            self.position["done"] += 1
            yield index

    def load(self, index: int) -> int:
        return index

    def state_dict(self) -> dict[str, int]:
        return {"done": self.reported["done"]}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = {"done": 0, "start": state["done"]}  # a new dict: self.reported still names the old one


class EpochKeys(Sampler):
    """Notebook 14, section 6: a sampler's indices as ``(epoch, index)`` keys, the epoch read when a pass starts.

    Wrap a sampler that has ``set_epoch`` (``DistributedSampler``, :class:`ResumableShuffle`); the dataset then
    knows which epoch each sample is drawn for, and can derive its random draws from it."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        for index in self.sampler:
            yield epoch, index

    def __len__(self) -> int:
        return len(self.sampler)


class SeededAugmentation(Dataset):
    """Notebook 14, section 6: ``dataset[index]`` randomly flipped, shifted and brightened, by ``(epoch, index)`` key.

    Every random draw comes from a generator seeded with ``(seed, epoch, index)``, not from the worker's random
    state: a sample gets the same augmentation in the same epoch on any run, in any worker, after any restart,
    and another one in the next epoch. Items are ``(index, image, label)``."""

    def __init__(self, dataset: Dataset, seed: int = 0) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, torch.Tensor, Any]:
        epoch, index = key
        image, label = self.dataset[index]
        rng = np.random.default_rng([self.seed, epoch, index])  # this sample's draws in this epoch, on every run
        if rng.random() < 0.5:
            image = image.flip(-1)
        dy, dx = rng.integers(-4, 5, size=2)
        image = torch.roll(image, shifts=(int(dy), int(dx)), dims=(-2, -1))
        return index, (image * rng.uniform(0.8, 1.2)).clamp(0, 1), label


class StopFlag:
    """Notebook 14, section 5: remember that SIGTERM or SIGUSR1 arrived; the training loop looks at the end of a step.

    ``agreed()`` is a collective: every rank stops after the same step when any rank got the signal. Its tensor
    lives on ``device``, the rank's device: NCCL refuses a CPU tensor ("No backend type associated with device
    type cpu"), gloo on CPU needs one."""

    def __init__(
        self, device: torch.device | str = "cpu", signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1)
    ) -> None:
        self.device, self.received = torch.device(device), None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum  # only note it: the step in progress finishes first

    def agreed(self) -> bool:
        flag = torch.tensor([int(self.received is not None)], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class ResumeError(RuntimeError):
    """Notebook 14, section 7: a checkpoint this job cannot resume from; the message says what to do."""


def save_checkpoint(
    folder: str | os.PathLike[str], rank: int, step: int, state: dict[str, Any], shared: dict[str, Any] | None = None
) -> Path:
    """Notebook 14, section 5: the checkpoint after ``step``: this rank's own ``state`` (its loader's position, its
    random state) as ``stepN/rankR.pt``, and, from rank 0, what all ranks share (the model and optimizer, which DDP
    keeps identical) once, as ``stepN/shared.pt``. Every file is written to a temporary name, flushed to the disk
    (fsync) and renamed. Once every rank has written its part, rank 0 points ``latest`` at the step and removes
    the older steps: a job killed in between resumes from the previous complete checkpoint, never from a mix."""
    step_folder = Path(folder) / f"step{step:07d}"
    step_folder.mkdir(parents=True, exist_ok=True)
    part = step_folder / f"rank{rank}.pt"
    with new_file(part, durable=True) as f:
        torch.save(state, f)
    if shared is not None:
        with new_file(step_folder / "shared.pt", durable=True) as f:
            torch.save(shared, f)
    fsync_folder(step_folder)  # the renames themselves reach the disk
    if dist.is_initialized():
        dist.barrier()  # every rank's part is on disk
    if rank == 0:
        write_atomic(Path(folder) / "latest", f"{step}\n", durable=True)
        for old in Path(folder).glob("step*"):
            if old.is_dir() and old.name < step_folder.name and all(p.suffix == ".pt" for p in old.iterdir()):
                shutil.rmtree(old)  # only the step folders of this function, holding only its .pt files
    return part


def load_checkpoint(folder: str | os.PathLike[str], rank: int) -> dict[str, Any] | None:
    """Notebook 14, section 5: the latest complete checkpoint in ``folder`` as this rank sees it, or ``None``.

    Returns the shared part (the model and optimizer, where rank 0 saved them) with this rank's own part on top;
    ``"rank_part"`` says whether this rank had one (a job started with more ranks than the one that saved has
    ranks without: :func:`resume_point` decides whether that is fine)."""
    latest = Path(folder) / "latest"
    if not latest.exists():
        return None
    step_folder = Path(folder) / f"step{int(latest.read_text()):07d}"
    shared_path, part_path = step_folder / "shared.pt", step_folder / f"rank{rank}.pt"
    checkpoint: dict[str, Any] = {}
    if shared_path.exists():
        checkpoint.update(torch.load(shared_path, weights_only=True))  # tensors, numbers and dicts: no code runs
    if part_path.exists():
        checkpoint.update(torch.load(part_path, weights_only=True))
    elif not checkpoint:
        raise ResumeError(
            f"{latest} names step {latest.read_text().strip()}, but {step_folder} holds neither "
            f"shared.pt nor rank{rank}.pt: the checkpoint is damaged; remove {latest} to start afresh"
        )
    checkpoint["rank_part"] = part_path.exists()
    return checkpoint


def resume_point(saved: dict[str, int], world_size: int, steps_per_epoch: int) -> tuple[int, int]:
    """Notebook 14, section 7: where a job of ``world_size`` ranks, ``steps_per_epoch`` steps each, resumes from a
    checkpoint saved after ``saved["step"]`` steps by ``saved["world_size"]`` ranks of ``saved["steps_per_epoch"]``.

    Returns ``(epoch, step)`` in the new job's counting. With as many ranks, anywhere. With another number of ranks
    only at an epoch boundary of the job that saved: mid-epoch, the new ranks' shares would cover other samples
    than the old ones did, and the rest of the epoch is not what an uninterrupted run would read."""
    step, old_world, old_per_epoch = saved["step"], saved["world_size"], saved["steps_per_epoch"]
    epoch, into = divmod(step, old_per_epoch)
    if world_size == old_world:
        if steps_per_epoch != old_per_epoch:
            raise ResumeError(
                f"the checkpoint's job had {old_per_epoch} steps per epoch, this one {steps_per_epoch} "
                "with as many ranks: resume with the same data, batch size and --limit"
            )
        return epoch, step
    if into:
        raise ResumeError(
            f"the checkpoint was saved by {old_world} ranks at step {step}, {into} steps into epoch "
            f"{epoch} ({old_per_epoch} steps per epoch): resume it with {old_world} ranks, or wait for "
            f"a checkpoint at an epoch's end (step {(epoch + 1) * old_per_epoch}) to change their number"
        )
    return epoch, epoch * steps_per_epoch


def read_steps(folder: str | os.PathLike[str], program: str = "course_lib.resume") -> dict[int, list[dict[str, Any]]]:
    """Notebooks 14 and 15: each rank's steps from its ``rankN.steps.jsonl``, in step order. When a restarted run
    did a step again, its line replaces the earlier one: what is left is what trained the final model. ``program``:
    the one that writes them, named in the error when there are none."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(folder).glob("rank*.steps.jsonl")):
        steps: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                steps[record["step"]] = record
        runs[int(path.name[4:].split(".")[0])] = [steps[s] for s in sorted(steps)]
    if not runs:
        raise FileNotFoundError(
            f"no rank*.steps.jsonl in {folder}; run {program} with --report {folder} first (in a notebook: the cell "
            "that starts the job)"
        )
    return runs


def ignore_stop_signals(worker_id: int) -> None:
    """Notebook 14, section 5: a ``worker_init_fn`` for DataLoader workers. torchrun and Slurm send their notice to
    the whole process group, workers too, and torch's workers die of SIGTERM; ignoring it lets the rank finish its
    step with them (they still stop with the rank)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


# --------------------------------------------------------------------------- the program: one rank's training
def _build(args: Any, env: distributed.DistEnv) -> tuple[Any, DistributedSampler]:
    images = shapes("train", transform=functools.partial(image_tensor, size=32), size=args.size, root=args.data)
    if args.limit:
        images = Subset(images, range(min(args.limit, len(images))))
    sampler = DistributedSampler(images, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed)
    kwargs = dict(
        batch_size=args.batch_size,
        sampler=EpochKeys(sampler),
        num_workers=args.workers,
        worker_init_fn=ignore_stop_signals,
    )
    dataset = SeededAugmentation(images, seed=args.seed)  # random draws from (seed, epoch, index): resumable
    if args.loader == "stateful":
        return stateful_loader(dataset, **kwargs), sampler
    return torch.utils.data.DataLoader(dataset, **kwargs), sampler


def _run(args: Any, env: distributed.DistEnv, device: torch.device) -> str:
    stop = StopFlag(device)
    loader, sampler = _build(args, env)
    model, ddp, opt = ddp_model(device, args.seed, args.lr)
    per_epoch, total = len(loader), len(loader) * args.epochs
    epoch = step = 0
    log_path = Path(args.report) / f"rank{env.rank}.steps.jsonl"
    run = _runs_logged(log_path)  # this run's number: 0 for the first
    ckpt = load_checkpoint(args.ckpt, env.rank)
    if ckpt is not None:
        epoch, step = resume_point(ckpt, env.world_size, per_epoch)  # refuses what cannot resume exactly
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if step % per_epoch:  # mid-epoch, with as many ranks: this rank's own part carries on
            if not ckpt["rank_part"]:
                raise ResumeError(f"rank {env.rank} has no part in the checkpoint in {args.ckpt}: it is incomplete")
            torch.set_rng_state(ckpt["rng"])
            if args.loader == "stateful":
                loader.load_state_dict(ckpt["loader"])  # the next batch is the one after the checkpoint
        print(f"resumed at step {step} (epoch {epoch}) from a checkpoint of {ckpt['world_size']} ranks", flush=True)
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
                log.write(
                    json.dumps(
                        {
                            "run": run,
                            "epoch": epoch,
                            "step": step,
                            "indices": index.tolist(),
                            "images": hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16],
                        }
                    )
                    + "\n"
                )
                log.flush()
                if step == args.stop_at and env.rank == 0:
                    _practice_stop(args.how, stop)
                stopping = stop.agreed()
                if stopping or (args.ckpt_every and step % args.ckpt_every == 0) or step == total:
                    mine = {"rng": torch.get_rng_state()}
                    if args.loader == "stateful":
                        mine["loader"] = loader.state_dict()
                    shared = None
                    if env.rank == 0:  # DDP keeps the models identical: one copy is enough
                        shared = {
                            "model": model.state_dict(),
                            "optimizer": opt.state_dict(),
                            "step": step,
                            "world_size": env.world_size,
                            "steps_per_epoch": per_epoch,
                        }
                    save_checkpoint(args.ckpt, env.rank, step, mine, shared=shared)
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
    p.add_argument(
        "--how",
        choices=("kill", "term"),
        default="kill",
        help="kill: rank 0 and its workers get SIGKILL; term: rank 0 sends torchrun SIGTERM",
    )
    p.add_argument("--step-seconds", type=float, default=0.0, help="simulated extra work per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may wait for the other ranks")
    p.add_argument("--device", default="auto", help="auto (a GPU per rank when there is one), cpu or cuda")
    args = p.parse_args(argv)
    if min(args.epochs, args.batch_size) < 1 or min(args.workers, args.limit, args.ckpt_every, args.stop_at) < 0:
        p.error(
            "--epochs and --batch-size must be at least 1; --workers, --limit, --ckpt-every, --stop-at not negative"
        )
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
    except (DataNotFoundError, distributed.DistEnvError, ResumeError) as exc:
        return one_line(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
