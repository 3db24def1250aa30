"""course_lib.distributed: who-am-I from torchrun/Slurm, DistributedSampler shares, reports."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.distributed import (
    DistEnvError,
    check_one_gpu_per_rank,
    dist_env,
    expand_nodelist,
    padding_report,
    plot_shares,
    read_reports,
    sampler_shares,
)
from course_lib.samplers import coverage

pytestmark = pytest.mark.quick

# --------------------------------------------------------------------------- every index once per epoch


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 9),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 50),
    seed=st.integers(0, 2**31 - 1),
)
def test_sampler_shares_cover_every_index_once_or_the_padded_multiset(
    n, world, drop_last, shuffle, epoch, seed
) -> None:
    if drop_last and n < world:
        with pytest.raises(ValueError, match="every rank empty"):
            sampler_shares(n, world, epoch=epoch, drop_last=drop_last)
        return
    shares = sampler_shares(n, world, epoch=epoch, shuffle=shuffle, drop_last=drop_last, seed=seed)
    per_rank = n // world if drop_last else math.ceil(n / world)
    assert shares.shape == (world, per_rank)
    counts = np.bincount(shares.ravel(), minlength=n)
    if n % world == 0:  # divides evenly: exactly once, with or without drop_last
        assert (counts == 1).all()
    elif drop_last:  # n % world samples are left out, none is repeated
        assert counts.max() == 1 and (counts == 0).sum() == n % world
    else:  # padding: everything at least once, exactly world - n % world extra loads, each of a distinct sample
        pad = world * per_rank - n
        assert counts.min() >= 1 and counts.sum() == n + pad
        assert (counts == 2).sum() == pad or n < pad  # tiny sets wrap around more than once
    if not drop_last or n % world == 0:
        assert coverage(list(shares), n).missing == []


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 200), world=st.integers(2, 8), epochs=st.integers(2, 4))
def test_same_order_every_epoch_only_without_set_epoch(n, world, epochs) -> None:
    forgot = [sampler_shares(n, world, epoch=e, set_epoch=False) for e in range(epochs)]
    assert all((f == forgot[0]).all() for f in forgot)
    if math.factorial(min(n, 20)) > 10**6:  # enough permutations that two epochs never collide by chance
        fixed = [sampler_shares(n, world, epoch=e) for e in range(epochs)]
        assert len({f.tobytes() for f in fixed}) == epochs


def test_sampler_shares_reject_bad_sizes() -> None:
    with pytest.raises(ValueError, match="dataset_len"):
        sampler_shares(0, 2)
    with pytest.raises(ValueError, match="world_size"):
        sampler_shares(10, 0)


def test_padding_report_and_coverage() -> None:
    shares = sampler_shares(10, 4, shuffle=False)
    assert padding_report(shares, 10) == {
        "samples": 10,
        "drawn": 12,
        "seen once": 8,
        "seen twice or more": 2,
        "never seen": 0,
    }
    cov = coverage(list(shares), 10)
    assert cov.repeated == [0, 1] and not cov.exact
    assert coverage([[0, 2], [1, 3]], 4).exact
    assert coverage([[0], [0]], 3).missing == [1, 2]
    with pytest.raises(ValueError, match="must lie in 0..2"):
        coverage([[0, 5]], 3)


def test_plot_shares_draws_a_row_per_rank() -> None:
    fig = plot_shares(sampler_shares(23, 4), 23)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert len(ax.patches) == 1  # one padded sample outlined


# --------------------------------------------------------------------------- who am I?

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
SLURM = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_dist_env_from_torchrun_slurm_or_nothing() -> None:
    env = dist_env(TORCHRUN)
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port, env.source) == (
        3,
        1,
        4,
        "n1",
        1234,
        "torchrun",
    )
    env = dist_env(SLURM)
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port, env.source) == (
        3,
        1,
        4,
        "gpu07",
        29500,
        "slurm",
    )
    assert (
        dist_env(
            {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"} | {"SLURM_NODELIST": "cn[2-3]"}
        ).master_addr
        == "cn2"
    )
    assert dist_env({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4000"}).master_addr == "head"
    assert dist_env({**SLURM, "MASTER_PORT": "4000"}).master_port == 4000
    both = dist_env({**SLURM, **TORCHRUN, "SLURM_PROCID": "0"})  # srun torchrun: torchrun's numbers win
    assert both.source == "torchrun" and both.rank == 3
    single = dist_env({})
    assert (single.rank, single.world_size, single.source, single.local_world_size) == (0, 1, "single", 1)
    assert "rank 3 of 4" in str(dist_env(TORCHRUN))


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({}, 4),  # nothing says how many per node: all on one
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1"}, 2),
        ({"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"}, 1),
        ({"SLURM_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "0"}, 3),  # the job's, when the step's is not set
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1),
    ],
)
def test_local_world_size_from_slurm_tasks_per_node(extra: dict, expected: int) -> None:
    """What MDS (and torchrun) call LOCAL_WORLD_SIZE: the processes of this node; start() exports it under srun."""
    assert dist_env({**SLURM, **extra}).local_world_size == expected
    assert dist_env({**TORCHRUN, "LOCAL_WORLD_SIZE": "2"}).local_world_size == 2
    assert "local rank 1 of 2" in str(dist_env({**TORCHRUN, "LOCAL_WORLD_SIZE": "2"}))


def test_unreadable_tasks_per_node_is_an_error() -> None:
    with pytest.raises(DistEnvError, match="tasks per node"):
        dist_env({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2(y2)"})


@pytest.mark.parametrize("missing", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_half_set_torchrun_environment_names_what_is_missing(missing: str) -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(DistEnvError, match=missing):
        dist_env(env)


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST"])
def test_half_set_slurm_environment_names_what_is_missing(missing: str) -> None:
    env = {k: v for k, v in SLURM.items() if k != missing}
    with pytest.raises(DistEnvError, match=missing):
        dist_env(env)


@pytest.mark.parametrize(
    "env, message",
    [
        ({**TORCHRUN, "RANK": "4"}, "outside 0..3"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, "at least 1"),
        ({**TORCHRUN, "RANK": "x"}, "not an integer"),
        ({**TORCHRUN, "LOCAL_RANK": "-1"}, "LOCAL_RANK"),
        ({**SLURM, "SLURM_NTASKS": "2"}, "outside 0..1"),
        ({**SLURM, "SLURM_JOB_NODELIST": "gpu[9-3]"}, "backwards"),
        ({**SLURM, "SLURM_JOB_NODELIST": ""}, "MASTER_ADDR"),
    ],
)
def test_inconsistent_environments_are_errors(env: dict, message: str) -> None:
    with pytest.raises(DistEnvError, match=message):
        dist_env(env)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[08-10,12],login1", ["gpu08", "gpu09", "gpu10", "gpu12", "login1"]),
        ("r1i[0-1]n[3,5]", ["r1i0n3", "r1i0n5", "r1i1n3", "r1i1n5"]),
        ("jean-zay-iam[01-02]", ["jean-zay-iam01", "jean-zay-iam02"]),
        ("127.0.0.1", ["127.0.0.1"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["", "gpu[1-", "gpu[a-b]", "gpu[]", "a,,b"])
def test_expand_nodelist_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_nodelist(bad)


@given(
    prefix=st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True),
    lo=st.integers(0, 50),
    span=st.integers(0, 20),
    width=st.integers(1, 4),
)
def test_expand_nodelist_ranges_roundtrip(prefix: str, lo: int, span: int, width: int) -> None:
    hi = lo + span
    hosts = expand_nodelist(f"{prefix}[{str(lo).zfill(width)}-{str(hi).zfill(width)}]")
    assert hosts == [f"{prefix}{str(i).zfill(width)}" for i in range(lo, hi + 1)]


def test_read_reports_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--report"):
        read_reports(tmp_path)


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    "variables, gpus, refused",
    [
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", **MASTER},
            1,
            True,
        ),  # a 1-GPU hub, 2 ranks
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", **MASTER}, 2, False),
        (
            {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", **MASTER},
            2,
            False,
        ),  # 2 nodes of 2
        (
            {
                "SLURM_PROCID": "1",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_JOB_NODELIST": "g1",
                "SLURM_STEP_TASKS_PER_NODE": "4",
            },
            1,
            True,
        ),  # 4 tasks see one GPU, all the same
        (
            {
                "SLURM_PROCID": "1",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_JOB_NODELIST": "g1",
                "SLURM_STEP_TASKS_PER_NODE": "4",
                "SLURM_GPUS_PER_TASK": "1",
            },
            1,
            False,
        ),  # each task its own, as cuda:0
        ({}, 1, False),  # a notebook: a world of one
    ],
)
def test_two_ranks_on_one_gpu_are_refused_with_what_to_do(variables, gpus, refused) -> None:
    env = dist_env(variables)
    if refused:
        with pytest.raises(DistEnvError, match=r"NCCL needs a GPU of its own for every rank.*--device cpu"):
            check_one_gpu_per_rank(env, gpus, variables)
    else:
        check_one_gpu_per_rank(env, gpus, variables)
    with pytest.raises(DistEnvError, match="sees no GPU"):
        check_one_gpu_per_rank(env, 0, variables)
