"""course_lib.train: the data-parallel training script, as one process.

Under a real torchrun it runs in notebook 07 (2 ranks: shares, identical weights, the uneven-inputs hang
and its two fixes, a crashed rank; nbval compares every line) and in the Slurm stage (tests/test_slurm.py:
torchrun on one and two nodes, and srun tasks), so it is not started again here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import train
from course_lib.distributed import read_reports

pytestmark = pytest.mark.quick


def args(root: Path, *extra: str) -> list[str]:
    return [
        "--data",
        str(root),
        "--size",
        "tiny",
        "--limit",
        "41",
        "--batch-size",
        "10",
        "--epochs",
        "2",
        "--workers",
        "1",
        "--device",
        "cpu",
        *extra,
    ]


@pytest.mark.timeout(120)
def test_single_process_run_sees_every_sample_each_epoch(tiny_root: Path, tmp_path: Path) -> None:
    assert train.main(args(tiny_root, "--report", str(tmp_path))) == 0
    (report,) = read_reports(tmp_path)
    assert report["world_size"] == 1 and report["source"] == "single"
    for epoch in report["epochs"]:
        assert sorted(epoch["indices"]) == list(range(41)) and epoch["batches"] == 5
    assert report["epochs"][0]["indices"] != report["epochs"][1]["indices"]  # set_epoch reshuffles


def run_module(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "course_lib.train", *argv], capture_output=True, text=True, timeout=60, env=full_env
    )


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
