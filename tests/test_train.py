"""course_lib.train: the data-parallel training script, as one process and under a real torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import train
from course_lib.distributed import read_reports, sampler_shares
from course_lib.samplers import coverage
from course_tools.launch import launch


def args(root: Path, *extra: str) -> list[str]:
    return ["--data", str(root), "--size", "tiny", "--limit", "41", "--batch-size", "10", "--epochs", "2",
            "--workers", "1", "--device", "cpu", *extra]


@pytest.mark.timeout(120)
def test_single_process_run_sees_every_sample_each_epoch(tiny_root: Path, tmp_path: Path) -> None:
    assert train.main(args(tiny_root, "--report", str(tmp_path))) == 0
    (report,) = read_reports(tmp_path)
    assert report["world_size"] == 1 and report["source"] == "single"
    for epoch in report["epochs"]:
        assert sorted(epoch["indices"]) == list(range(41)) and epoch["batches"] == 5
    assert report["epochs"][0]["indices"] != report["epochs"][1]["indices"]  # set_epoch reshuffles


@pytest.mark.timeout(180)
def test_two_ranks_under_torchrun_split_each_epoch_and_keep_identical_weights(tiny_root: Path, tmp_path: Path) -> None:
    result = launch("course_lib.train", *args(tiny_root, "--report", str(tmp_path)), nproc=2, timeout=120, show=False)
    assert result.ok
    reports = read_reports(tmp_path)
    assert [r["rank"] for r in reports] == [0, 1] and {r["source"] for r in reports} == {"torchrun"}
    for e in range(2):
        shares = [r["epochs"][e]["indices"] for r in reports]
        # exactly the padded multiset torch's DistributedSampler hands out
        assert shares == sampler_shares(41, 2, epoch=e).tolist()
        cov = coverage(shares, 41)
        assert cov.missing == [] and len(cov.repeated) == 1
    assert len({r["weights_sha256"] for r in reports}) == 1


@pytest.mark.timeout(180)
def test_uneven_inputs_time_out_and_join_fixes_them(tiny_root: Path, tmp_path: Path) -> None:
    # 41 samples by hand over 2 ranks: 21 vs 20, i.e. 3 batches against 2
    hang = launch("course_lib.train", *args(tiny_root, "--sharding", "by-hand", "--timeout", "4"),
                  nproc=2, timeout=90, check=False, show=False)
    assert not hang.ok and not hang.timed_out
    assert "Timed out" in hang.first_error()
    joined = launch("course_lib.train", *args(tiny_root, "--sharding", "by-hand", "--join", "--report", str(tmp_path)),
                    nproc=2, timeout=120, show=False)
    assert joined.ok
    reports = read_reports(tmp_path)
    for e in range(2):
        assert coverage([r["epochs"][e]["indices"] for r in reports], 41).exact
    assert [r["epochs"][0]["batches"] for r in reports] == [3, 2]
    assert len({r["weights_sha256"] for r in reports}) == 1


def run_module(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "course_lib.train", *argv], capture_output=True, text=True,
                          timeout=60, env=full_env)


def test_missing_data_is_one_clear_line(tmp_path: Path) -> None:
    done = run_module("--data", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # no traceback
    assert "DataNotFoundError" in done.stderr and "python -m course_lib prepare" in done.stderr


def test_half_set_slurm_environment_is_one_clear_line(tiny_root: Path) -> None:
    done = run_module(*args(tiny_root), env={"SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert done.returncode == 2 and "DistEnvError" in done.stderr and "SLURM_LOCALID" in done.stderr


@pytest.mark.parametrize("bad", [["--epochs", "0"], ["--batch-size", "0"], ["--workers", "-1"], ["--sharding", "x"]])
def test_bad_arguments_are_argparse_errors(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        train._parse_args(bad)
    assert info.value.code == 2


def test_the_model_and_digest() -> None:
    import torch

    model = train.SmallCNN()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    torch.manual_seed(0)
    a = train.weights_digest(train.SmallCNN())
    torch.manual_seed(0)
    assert train.weights_digest(train.SmallCNN()) == a and len(a) == 64
