"""course_lib.checks.nb07: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib.checks import Status, nb07
from course_lib.jobs import launch
from exercise_status import right_and_stubs, status


@pytest.mark.quick
def test_07_samples_per_rank() -> None:
    assert status(nb07.samples_per_rank, lambda n, w, d: n // w if d else math.ceil(n / w))[0] is Status.SOLVED
    assert status(nb07.samples_per_rank, lambda n, w, d: n // w if d else -(-n // w))[0] is Status.SOLVED
    assert status(nb07.samples_per_rank, ...)[0] is Status.NOT_ATTEMPTED
    assert "round down" in status(nb07.samples_per_rank, lambda n, w, d: math.ceil(n / w))[1]
    assert "round up" in status(nb07.samples_per_rank, lambda n, w, d: n // w)[1]
    assert "whole number" in status(nb07.samples_per_rank, lambda n, w, d: n / w)[1]
    assert "whole data set" in status(nb07.samples_per_rank, lambda n, w, d: n)[1]
    assert "whole number" in status(nb07.samples_per_rank, lambda n, w, d: "3")[1]


def _epoch_sampler(dataset, world, rank, epoch, seed=0, shuffle=True, set_epoch=True):
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
    if set_epoch:
        sampler.set_epoch(epoch)
    return sampler


@pytest.mark.quick
def test_07_epoch_sampler() -> None:
    assert status(nb07.epoch_sampler, _epoch_sampler)[0] is Status.SOLVED
    assert status(nb07.epoch_sampler, ...)[0] is Status.NOT_ATTEMPTED
    assert "set_epoch" in status(nb07.epoch_sampler, lambda d, w, r, e: _epoch_sampler(d, w, r, e, set_epoch=False))[1]
    assert "same seed" in status(nb07.epoch_sampler, lambda d, w, r, e: _epoch_sampler(d, w, r, e, seed=r))[1]
    assert (
        "turn shuffle on" in status(nb07.epoch_sampler, lambda d, w, r, e: _epoch_sampler(d, w, r, e, shuffle=False))[1]
    )
    assert "rank=rank" in status(nb07.epoch_sampler, lambda d, w, r, e: _epoch_sampler(d, w, 0, e))[1]
    assert "sampler" in status(nb07.epoch_sampler, lambda d, w, r, e: 3)[1]
    assert status(nb07.epoch_sampler, _dl)[0] is Status.SOLVED  # drop_last=True is fine for training
    assert "set_epoch" in status(nb07.epoch_sampler, lambda d, w, r, e: _epoch_sampler(d, w, r, e % 2))[1]


def _dl(dataset, world, rank, epoch):
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    return sampler


@pytest.mark.quick
def test_07_eval_indices() -> None:
    assert status(nb07.eval_indices, lambda n, w, r: range(r, n, w))[0] is Status.SOLVED
    assert status(nb07.eval_indices, lambda n, w, r: list(np.array_split(np.arange(n), w)[r]))[0] is Status.SOLVED
    assert status(nb07.eval_indices, ...)[0] is Status.NOT_ATTEMPTED
    padded = lambda n, w, r: list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False))
    assert "padding" in status(nb07.eval_indices, padded)[1]
    dropped = lambda n, w, r: (
        list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False, drop_last=True)) if n >= w else []
    )
    assert "never evaluated" in status(nb07.eval_indices, dropped)[1]
    lopsided = lambda n, w, r: list(range(n)) if r == 0 else []
    assert "balance" in status(nb07.eval_indices, lopsided)[1]
    assert "outside" in status(nb07.eval_indices, lambda n, w, r: [n + r])[1]


# ----------------------------------------------------------------- 07.4: who am I, from Slurm's variables


def slurm_ranks(env, expand=True, at_node=True, as_int=True):
    """Exercise 07.4's answer (the notebook's solution with the defaults), and its wrong forms through the keywords."""
    counts = []
    for part in env["SLURM_STEP_TASKS_PER_NODE"].split(","):
        tasks, _, repeat = part.partition("(x")
        counts += [int(tasks)] * (int(repeat.rstrip(")")) if repeat and expand else 1)
    local_world = counts[int(env["SLURM_NODEID"]) if at_node else 0]
    ranks = (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NTASKS"])
    return (*(int(v) if as_int else v for v in ranks), local_world)


@pytest.mark.quick
def test_slurm_ranks() -> None:
    def stub(env):
        raise NotImplementedError

    right_and_stubs(nb07.slurm_ranks, slurm_ranks, stub)
    wrong = {
        "expand the list first": lambda env: slurm_ranks(env, expand=False),
        "position SLURM_NODEID": lambda env: slurm_ranks(env, at_node=False),
        "return ints": lambda env: slurm_ranks(env, as_int=False),
        "SLURM_NTASKS_PER_NODE": lambda env: slurm_ranks(env)[:3] + (int(env["SLURM_NTASKS_PER_NODE"]),),
        "SLURM_PROCID, SLURM_LOCALID": lambda env: (
            int(env["SLURM_LOCALID"]),
            int(env["SLURM_PROCID"]),
            *slurm_ranks(env)[2:],
        ),
    }
    for words, fn in wrong.items():
        outcome, message = status(nb07.slurm_ranks, fn)
        assert outcome is Status.WRONG and words in message, (words, message)


# ----------------------------------------------------------------- 07.5: a DDP training script of your own


def solution_script(folder: Path) -> Path:
    """The notebook's solution, scratch/my_ddp.py as its %%writefile cell writes it."""
    import nbformat

    notebook = nbformat.read(
        Path(__file__).parents[1] / "notebooks/solutions/07_distributed_sampling.ipynb", as_version=4
    )
    cell = next(c.source for c in notebook.cells if c.source.startswith("%%writefile scratch/my_ddp.py"))
    script = folder / "my_ddp.py"
    script.write_text(cell.split("\n", 1)[1] + "\n")
    return script


def reports(
    seed_of=lambda rank: 0, set_epoch=True, distributed=True, ddp=True, val_share=None, reduce=True, rank_of=None
):
    """The two reports the learner's script writes, computed in this process; the keywords make it wrong."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    val = nb07.points(nb07.VAL_N, 1)
    out = []
    for rank in range(2):
        epochs = []
        for epoch in range(2):
            sampler = DistributedSampler(range(nb07.TRAIN_N), num_replicas=2, rank=rank, seed=seed_of(rank))
            sampler.set_epoch(epoch if set_epoch else 0)
            epochs.append(list(sampler) if distributed else list(range(nb07.TRAIN_N)))
        weights = [(p + (0.01 * rank if not ddp else 0)).tolist() for p in model.parameters()]
        share = list(val_share(rank)) if val_share else list(range(rank, nb07.VAL_N, 2))
        with torch.no_grad():
            right = model(val.tensors[1][share]).argmax(1) == val.tensors[2][share]
        out.append(
            {
                "rank": rank if rank_of is None else rank_of(rank),
                "epochs": epochs,
                "weights": weights,
                "correct": int(right.sum()),
                "seen": len(share),
            }
        )
    if reduce:
        totals = sum(x["correct"] for x in out), sum(x["seen"] for x in out)
        for r in out:
            r["correct"], r["seen"] = totals
    return out


def hint(reports_) -> str:
    try:
        nb07.check_ddp_reports(reports_)
    except nb07.Hint as exc:
        return str(exc)
    return "passed"


@pytest.mark.quick
def test_07_ddp_reports() -> None:
    assert hint(reports()) == "passed"
    assert "one seed on every rank" in hint(reports(seed_of=lambda rank: rank))
    assert "set_epoch(epoch)" in hint(reports(set_epoch=False))
    assert "no DistributedSampler" in hint(reports(distributed=False))
    assert "DistributedDataParallel" in hint(reports(ddp=False))
    padded = lambda rank: DistributedSampler(range(nb07.VAL_N), num_replicas=2, rank=rank, shuffle=False)
    assert "no DistributedSampler padding" in hint(reports(val_share=padded))
    assert "reports 26 validation samples" in hint(reports(reduce=False))
    assert "one report from each of the 2 ranks" in hint(reports(rank_of=lambda rank: 0))


@pytest.mark.full
@pytest.mark.timeout(300)
def test_07_ddp_script_under_torchrun(tmp_path: Path) -> None:
    """The solution, started for real with torchrun (2 ranks, gloo); the stub; a script whose ranks fail."""
    script = solution_script(tmp_path)
    assert status(nb07.ddp_script, script, launch)[0] is Status.SOLVED
    stub = tmp_path / "stub.py"
    stub.write_text(script.read_text().split("### BEGIN SOLUTION")[0] + "raise NotImplementedError\n")
    assert status(nb07.ddp_script, stub, launch)[0] is Status.NOT_ATTEMPTED
    broken = tmp_path / "broken.py"
    broken.write_text(
        script.read_text().replace('dist.init_process_group("gloo")', 'dist.init_process_group("gloo")\nrank = 1 / 0')
    )
    assert "the job failed" in status(nb07.ddp_script, broken, launch)[1]
