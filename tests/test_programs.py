"""course_lib._programs and the four programs built on it: every collective a program makes uses a tensor on its
rank's device.

NCCL only takes tensors on the GPU: a collective on a CPU tensor fails at the first step ("No backend type
associated with device type cpu"). Each program's per-rank loop runs here in this process, as a world of one
(gloo on CPU, or NCCL on a GPU where there is one), with torch.distributed's collectives wrapped to record the
device of every tensor they get; all must be the device the rank was given.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib import _programs, capstone, distributed, resume, shard_reader, shards, train

pytestmark = [pytest.mark.quick, pytest.mark.timeout(180)]

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "gather",
    "scatter",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Every tensor device the course's code hands a collective, and the device each rank was given."""
    seen: dict[str, list] = {"tensors": [], "rank_devices": []}

    def wrap(name: str):
        real = getattr(dist, name)

        @functools.wraps(real)
        def collective(*args, **kwargs):
            for value in (*args, *kwargs.values()):
                for t in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(t, torch.Tensor):
                        seen["tensors"].append((name, t.device))
            return real(*args, **kwargs)

        return collective

    for name in COLLECTIVES:
        monkeypatch.setattr(dist, name, wrap(name))
    real_start = distributed.start

    def start(device: str = "auto", timeout_s: float = 600.0):
        env, dev = real_start(device, timeout_s)
        seen["rank_devices"].append(dev)
        return env, dev

    monkeypatch.setattr(distributed, "start", start)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)  # a world of one: this process
    return seen


def assert_on_rank_device(seen: dict[str, list]) -> None:
    assert seen["rank_devices"], "the program never joined a job"
    rank_device = seen["rank_devices"][-1]
    assert seen["tensors"], "the program made no collective: nothing was checked"
    wrong = [(name, d) for name, d in seen["tensors"] if d != rank_device]
    assert not wrong, f"collectives on another device than the rank's {rank_device}: {wrong}"
    assert not dist.is_initialized()  # the program left the job


def test_train(recorded, tiny_root: Path, tmp_path: Path) -> None:
    assert (
        train.main(
            [
                "--data",
                str(tiny_root),
                "--size",
                "tiny",
                "--limit",
                "16",
                "--epochs",
                "1",
                "--workers",
                "0",
                "--batch-size",
                "8",
                "--device",
                DEVICE,
                "--report",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert_on_rank_device(recorded)


def test_resume(recorded, tiny_root: Path, tmp_path: Path) -> None:
    assert (
        resume.main(
            [
                "--data",
                str(tiny_root),
                "--size",
                "tiny",
                "--limit",
                "16",
                "--epochs",
                "1",
                "--workers",
                "0",
                "--ckpt",
                str(tmp_path / "ckpt"),
                "--report",
                str(tmp_path / "steps"),
                "--ckpt-every",
                "2",
                "--device",
                DEVICE,
            ]
        )
        == 0
    )
    assert_on_rank_device(recorded)
    assert any(name == "all_reduce" for name, _ in recorded["tensors"])  # the stop flag's, every step


def test_capstone(recorded, tiny_root: Path, tmp_path: Path) -> None:
    written = shards.write_image_shards(tmp_path / "shards", size="tiny", root=tiny_root, maxcount=20)
    assert (
        capstone.main(
            [
                "train",
                "--shards",
                str(written.folder),
                "--workers",
                "0",
                "--epochs",
                "1",
                "--epoch-batches",
                "2",
                "--batch-size",
                "4",
                "--device",
                DEVICE,
            ]
        )
        == 0
    )
    assert_on_rank_device(recorded)


def test_shard_reader(recorded, tiny_root: Path, tmp_path: Path) -> None:
    written = shards.write_image_shards(tmp_path / "shards", size="tiny", root=tiny_root, maxcount=20)
    assert shard_reader.main(["--urls", written.urls, "--workers", "0", "--batch-size", "10"]) == 0
    assert_on_rank_device(recorded)


def test_run_on_one_rank_leaves_the_job_when_the_run_fails(recorded) -> None:
    with pytest.raises(ValueError, match="on purpose"):
        _programs.run_on_one_rank(lambda env, device: (_ for _ in ()).throw(ValueError("on purpose")), "cpu", 30)
    assert not dist.is_initialized()
