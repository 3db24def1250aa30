"""Checks for notebook 07 (distributed sampling).

Every check compares the learner's answer with torch's own ``DistributedSampler``, over many
data set sizes and world sizes, so a formula that only fits the notebook's example is caught.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data.distributed import DistributedSampler

from ..samplers import coverage
from ._core import Hint, NotAttempted, attempted, exercise, require, whole_number

CASES = [(n, w) for n in (1, 7, 10, 23, 100, 101) for w in (1, 2, 3, 4, 8) if n >= w]


def _as_int(value: Any, call: str) -> int:
    return whole_number(value, call, "a rank gets a whole number of samples (math.ceil / floor division).")


@exercise("07.1", "per rank: ceil(n / world) with padding, n // world with drop_last, the same on every rank.")
def samples_per_rank(fn: Callable[[int, int, bool], Any]) -> None:
    """``fn(n, world_size, drop_last)`` is the number of indices each rank's DistributedSampler yields."""
    attempted(fn)
    for drop_last in (False, True):
        for n, world in CASES:
            call = f"samples_per_rank({n}, {world}, drop_last={drop_last})"
            got = _as_int(fn(n, world, drop_last), call)
            truth = len(DistributedSampler(range(n), num_replicas=world, rank=0, drop_last=drop_last))
            if got == truth:
                continue
            if drop_last and got == math.ceil(n / world):
                raise Hint(
                    f"{call} = {got}: with drop_last=True the sampler drops the tail instead of padding, so round down."
                )
            if not drop_last and got == n // world:
                raise Hint(f"{call} = {got}: with drop_last=False the sampler pads with repeated samples, so round up.")
            if got == n / world or got == round(n / world):
                raise Hint(
                    f"{call} = {got}, but {n} / {world} does not divide evenly: every rank gets the same whole number."
                )
            if got == n:
                raise Hint(f"{call} = {got}: that is the whole data set; each rank gets about 1/{world} of it.")
            raise Hint(f"{call} = {got}, but the sampler gives each rank {truth}.")


def _indices(sampler: Any, call: str) -> list[int]:
    require(
        hasattr(sampler, "__iter__"),
        f"{call} should return a sampler (something that yields indices), got {type(sampler).__name__}.",
    )
    return [int(i) for i in sampler]


@exercise("07.2", "a DistributedSampler per rank with one shared seed, shuffle on, and set_epoch(epoch) called.")
def epoch_sampler(fn: Callable[[Any, int, int, int], Any]) -> None:
    """``fn(dataset, world_size, rank, epoch)`` returns the sampler rank ``rank`` should use in ``epoch``."""
    attempted(fn)
    data = range(23)
    for world in (2, 3, 4):
        orders = []
        for epoch in (0, 1, 2):
            call = f"epoch_sampler(dataset, world_size={world}, rank=..., epoch={epoch})"
            shares = [_indices(fn(data, world, rank, epoch), call.replace("...", str(rank))) for rank in range(world)]
            cov = coverage(shares, len(data))
            if shares[0] == shares[1]:
                raise Hint(
                    f"{call}: ranks 0 and 1 get the same indices; give the sampler num_replicas=world_size and rank=rank."
                )
            sizes = sorted({len(sh) for sh in shares})
            require(
                len(sizes) == 1,
                f"{call}: ranks get {sizes} indices; a DistributedSampler gives every rank the same number.",
            )
            dropped = len(data) - world * sizes[0]  # > 0 only with drop_last=True
            require(
                len(cov.missing) <= max(dropped, 0) and len(cov.repeated) <= world - 1,
                f"{call}: indices {cov.missing[:5]} go to no rank and {len(cov.repeated)} go to several. Did every "
                "rank use the same seed? The shuffle must be the same permutation on every rank, so give them all one seed.",
            )
            require(
                shares[0] != sorted(shares[0]),
                f"{call}: rank 0's indices come in increasing order: turn shuffle on (it is the sampler's job, not the DataLoader's).",
            )
            orders.append(shares[0])
        require(
            len({tuple(o) for o in orders}) == 3,
            f"world_size={world}: rank 0 gets the same order in two of epochs 0, 1, 2. Call sampler.set_epoch(epoch) before returning it.",
        )
    again = _indices(fn(data, 2, 0, 1), "epoch_sampler(dataset, 2, 0, 1)")
    require(
        again == _indices(fn(data, 2, 0, 1), "epoch_sampler(dataset, 2, 0, 1)"),
        "two calls for the same rank and epoch give different orders: pass a fixed seed (the default seed=0 is fine).",
    )


@exercise(
    "07.3", "an exact evaluation split: rank r takes r, r + world, r + 2·world, ... — no padding, nothing dropped."
)
def eval_indices(fn: Callable[[int, int, int], Any]) -> None:
    """``fn(n, world_size, rank)`` lists the validation indices rank ``rank`` evaluates, each exactly once overall."""
    attempted(fn)
    for n, world in CASES + [(3, 4), (1, 2)]:
        call = f"eval_indices({n}, {world}, rank)"
        shares = [_indices(fn(n, world, rank), call.replace("rank)", f"{rank})")) for rank in range(world)]
        require(all(0 <= i < n for s in shares for i in s), f"{call}: some index is outside 0..{n - 1}.")
        cov = coverage(shares, n)
        if cov.repeated:
            raise Hint(
                f"{call}: indices {cov.repeated[:5]} are evaluated twice; that is DistributedSampler's padding, which "
                "counts those samples twice in the metric. Give each index to exactly one rank."
            )
        if cov.missing:
            raise Hint(
                f"{call}: indices {cov.missing[:5]} are never evaluated (drop_last?). Evaluation must see every sample; "
                "ranks may get different counts."
            )
        sizes = [len(s) for s in shares]
        require(max(sizes) - min(sizes) <= 1, f"{call}: ranks get {sizes} samples; balance them (at most one apart).")


# ----------------------------------------------------------------- 07.4: who am I, from Slurm's variables
SLURM_CASES = [  # (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID) -> local world size
    (("5", "1", "8", "4(x2)", "1"), 4),
    (("7", "0", "8", "2(x3),1", "3"), 1),
    (("4", "0", "7", "2(x3),1", "2"), 2),
    (("2", "2", "3", "3", "0"), 3),
    (("3", "1", "5", "1,2(x2)", "1"), 2),
]


@exercise(
    "07.4",
    "rank, local rank and world size from SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS; the tasks on "
    "this node from SLURM_STEP_TASKS_PER_NODE, expanded, at SLURM_NODEID.",
)
def slurm_ranks(fn: Callable[[dict], Any]) -> None:
    """``fn(env)`` returns ``(rank, local_rank, world_size, local_world_size)`` of one task started by ``srun``."""
    attempted(fn)
    for (procid, localid, ntasks, per_node, nodeid), local_world in SLURM_CASES:
        env = {
            "SLURM_PROCID": procid,
            "SLURM_LOCALID": localid,
            "SLURM_NTASKS": ntasks,
            "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_NODEID": nodeid,
            "SLURM_JOB_NODELIST": "gpu[01-04]",
        }
        call = f"slurm_ranks({{..., SLURM_STEP_TASKS_PER_NODE={per_node!r}, SLURM_NODEID={nodeid!r}}})"
        try:
            got = fn(dict(env))
        except KeyError as exc:
            raise Hint(
                f"{call} raised KeyError {exc}: srun sets only the variables in the env given "
                "(SLURM_NTASKS_PER_NODE, for one, is set only when --ntasks-per-node was asked for)."
            ) from None
        except IndexError:
            raise Hint(
                f"{call} raised IndexError: expand the list first ('2(x3),1' is 2, 2, 2, 1: one count per "
                "node), then take the count at position SLURM_NODEID."
            ) from None
        attempted(got)
        require(
            isinstance(got, (tuple, list)) and len(got) == 4,
            f"{call} should return 4 numbers (rank, local_rank, world_size, local_world_size), got {{got!r}}.",
        )
        require(
            all(isinstance(v, int) for v in got),
            f"{call} returned {tuple(got)!r}: the variables are strings; return ints (int(env[...])).",
        )
        want = (int(procid), int(localid), int(ntasks), local_world)
        require(
            tuple(got[:3]) == want[:3],
            f"{call} gave rank, local rank, world size {tuple(got[:3])}, expected "
            f"{want[:3]}: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS.",
        )
        if got[3] != local_world:
            raise Hint(
                f"{call} gave local world size {got[3]}, expected {local_world}: expand the list first "
                "('2(x3),1' is 2, 2, 2, 1: one count per node), then take the count at position SLURM_NODEID."
            )


# ----------------------------------------------------------------- 07.5: a DDP training script of your own

TRAIN_N, VAL_N = (
    201,
    51,
)  # the points of the learner's script: 201 to train on, 51 to evaluate (odd: padding would show)


def points(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """The exercise's data: ``(index, point, label)``, 2-D points, label 1 outside the unit circle."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return torch.utils.data.TensorDataset(torch.arange(n), x, (x.norm(dim=1) > 1).long())


def _model_from(weights: list[Any]) -> torch.nn.Module:
    """The script's model, ``Linear(2, 16) -> ReLU -> Linear(16, 2)``, with a rank's reported weights."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    require(
        len(weights) == 4, f"report the model's 4 parameter tensors (model.module.parameters()), got {len(weights)}."
    )
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            require(
                tuple(torch.tensor(w).shape) == tuple(p.shape),
                "the reported weights do not fit "
                "Linear(2, 16) -> ReLU -> Linear(16, 2): keep the model of the template.",
            )
            p.copy_(torch.tensor(w))
    return model


def check_ddp_reports(reports: list[dict[str, Any]], world: int = 2) -> None:
    """What the ranks of the learner's script did, from their reports: raises Hint at the first fault."""
    require(
        sorted(r.get("rank", -1) for r in reports) == list(range(world)),
        f"expected one report from each of the "
        f"{world} ranks, got ranks {sorted(r.get('rank', -1) for r in reports)}: take the rank from dist.get_rank().",
    )
    reports = sorted(reports, key=lambda r: r["rank"])
    epochs = [r["epochs"] for r in reports]
    require(all(len(e) == 2 for e in epochs), "each report should list the indices of 2 epochs.")
    for epoch in range(2):
        shares = [e[epoch] for e in epochs]
        cov = coverage(shares, TRAIN_N)
        require(
            not cov.missing,
            f"epoch {epoch}: {len(cov.missing)} samples were never loaded, e.g. {cov.missing[:5]}, "
            "and others twice: give the DistributedSampler one seed on every rank (seed=0), not one per rank.",
        )
        require(
            cov.drawn == math.ceil(TRAIN_N / world) * world and all(len(s) == cov.drawn // world for s in shares),
            f"epoch {epoch}: the ranks loaded {[len(s) for s in shares]} samples; each should load "
            f"ceil({TRAIN_N} / {world}) = {math.ceil(TRAIN_N / world)}, its DistributedSampler share. Every rank loading "
            "the whole set means the loader has no DistributedSampler (sampler=sampler).",
        )
    require(
        all(e[0] != e[1] for e in epochs),
        "both epochs loaded the same order: call sampler.set_epoch(epoch) at the "
        "top of every epoch, so that the shuffle changes.",
    )
    models = [_model_from(r["weights"]) for r in reports]
    same = all(torch.equal(a, b) for m in models[1:] for a, b in zip(models[0].parameters(), m.parameters()))
    require(
        same,
        "the ranks ended with different weights: wrap the model in DistributedDataParallel, which averages "
        "the gradients of all ranks before every step (and start from one seed, torch.manual_seed(0)).",
    )
    val = points(VAL_N, 1)
    with torch.no_grad():
        truth = int((models[0](val.tensors[1]).argmax(1) == val.tensors[2]).sum())
    for r in reports:
        require(
            r.get("seen") == VAL_N,
            f"rank {r['rank']} reports {r.get('seen')} validation samples seen over all "
            f"ranks, not {VAL_N}: give each rank an exact share (range(rank, {VAL_N}, world)), no DistributedSampler "
            "padding, and all_reduce the counts.",
        )
        require(
            r.get("correct") == truth,
            f"rank {r['rank']} reports {r.get('correct')} correct over all ranks; the "
            f"final model gets {truth} of {VAL_N} right: sum [correct, seen] over the ranks with dist.all_reduce, "
            "after evaluating model.module under torch.no_grad().",
        )


@exercise(
    "07.5",
    "your script's 2 ranks split every epoch, reshuffled, trained identical models, and counted every "
    "validation sample exactly once.",
)
def ddp_script(path: Any, launch: Callable[..., Any]) -> None:
    """Start the learner's script with ``launch`` (``course_lib.jobs.launch``) on 2 ranks; check their reports."""
    if re.search(r"^\s*raise NotImplementedError", Path(path).read_text(), flags=re.MULTILINE):
        raise NotAttempted(
            f"{path} still holds the stub's `raise NotImplementedError`: write the script, run its "
            "cell, then run this check again."
        )
    with tempfile.TemporaryDirectory(prefix="course07-") as folder:
        run = launch(str(path), folder, nproc=2, timeout=120, check=False, show=False)
        require(run.ok, f"the job failed: {run.first_error()}")
        files = sorted(Path(folder).glob("rank*.json"))
        require(
            bool(files),
            "the ranks wrote no report: json.dump(report, f) into the folder given as sys.argv[1], as rank<rank>.json.",
        )
        check_ddp_reports([json.loads(f.read_text()) for f in files])
