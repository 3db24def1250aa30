"""``python -m course_lib bench loader``: the instructors' DataLoader benchmark, on the tiny set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from course_lib import data
from course_tools import bench
from course_lib.transforms import decode_augment

pytestmark = pytest.mark.quick

FAST = ["--limit", "24", "--rounds", "1", "--workers", "0", "2", "--batch-size", "8"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "course_lib", "bench", *args], capture_output=True, text=True, timeout=120
    )


def test_decode_augment_makes_uint8_tensors_of_the_size(tiny_set: Path) -> None:
    from course_lib.datasets import ImageFileDataset

    image, _ = ImageFileDataset(tiny_set, "train", decode_augment(48))[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 48, 48)


@pytest.mark.timeout(120)
def test_result_holds_every_figure(tiny_set: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # 2 workers on "1 CPU": torch warns
    args = bench.build_parser().parse_args(["loader", "--data", str(tiny_set), *FAST])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = bench.run_loader_bench(args)
    assert not [w for w in caught if "suggested max number of worker" in str(w.message)]
    assert result["facts"]["samples"] == 24
    assert result["facts"]["bytes_per_batch"] == 8 * 3 * 128 * 128  # uint8 images of 128x128
    assert list(result["workers"]) == [0, 2]
    for figures in result["workers"].values():
        for key in ("plain", "instrumented", "ratio"):
            assert isinstance(figures[key], float) and figures[key] > 0
        assert len(figures["rounds"]["plain"]) == len(figures["rounds"]["instrumented"]) == 1
    assert list(result["scaling"]) == [2] and isinstance(result["scaling"][2], float) and result["scaling"][2] > 0
    assert list(result["goals"]) == [
        "instrumented/plain >= 0.97 for every worker count",
        "2 workers >= 1.6× the throughput of 0",
    ]
    assert all(isinstance(ok, bool) for ok in result["goals"].values())


def test_generated_set_and_split_none(tiny_root: Path, tiny_set: Path) -> None:
    parse = bench.build_parser().parse_args
    ds, name = bench.load_dataset(parse(["loader", "--size", "tiny", "--root", str(tiny_root), "--split", "val"]))
    assert len(ds) == 20 and name == "shapes-tiny-seed0/val"
    ds, name = bench.load_dataset(
        parse(["loader", "--data", str(tiny_set / "train"), "--split", "none", "--limit", "5"])
    )
    assert len(ds) == 5 and name.endswith("first 5 of 80")


@pytest.mark.timeout(120)
def test_cli_prints_ratios_and_goals(tiny_set: Path) -> None:
    done = run("loader", "--data", str(tiny_set), *FAST)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "24 samples, batch size 8" in out
    assert (
        len(re.findall(r"^  (0|2) workers: plain \d+, instrumented \d+, instrumented/plain \d\.\d{3}$", out, re.M)) == 2
    )
    assert "2 workers: " in out and "× the throughput of 0" in out
    assert "2 workers >= 1.6× the throughput of 0" in out
    assert "suggested max number of worker" not in done.stderr


def test_missing_data_folder_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["loader", "--data", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --data ") and "no such folder" in err and "--split none" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "bad", [["--workers", "-1"], ["--workers", "0", "-2"], ["--rounds", "0"], ["--batch-size", "x"]]
)
def test_bad_numbers_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        bench.main(["loader", *bad])
    assert stop.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_summary_of_known_rounds() -> None:
    """Medians per loader, the median of the *paired* ratios (not the ratio of medians), scaling, goals."""
    rounds = {
        0: {"plain": [100.0, 110.0, 90.0], "instrumented": [95.0, 88.0, 108.0]},
        2: {"plain": [170.0, 150.0, 160.0], "instrumented": [168.0, 150.0, 150.0]},
    }
    result = bench.summarize(rounds)
    zero, two = result["workers"][0], result["workers"][2]
    assert (zero["plain"], zero["instrumented"]) == (100.0, 95.0)
    assert zero["ratio"] == pytest.approx(0.95)  # pairs 0.95, 0.8, 1.2
    assert two["ratio"] == pytest.approx(168 / 170)  # pairs 0.988, 1.0, 0.9375; the ratio of medians would be 0.9375
    assert result["scaling"] == {2: pytest.approx(1.6)}
    assert result["goals"] == {
        "instrumented/plain >= 0.97 for every worker count": False,
        "2 workers >= 1.6× the throughput of 0": True,
    }


def test_check_turns_a_missed_goal_into_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = {
        "facts": {},
        "workers": {0: {"plain": 10.0, "instrumented": 9.0, "ratio": 0.9}},
        "scaling": {},
        "goals": {"instrumented/plain >= 0.97 for every worker count": False},
    }
    monkeypatch.setattr(bench, "run_loader_bench", lambda args, log: fake)
    assert bench.main(["loader", "--size", "tiny"]) == 0
    assert bench.main(["loader", "--size", "tiny", "--check"]) == 1
    assert "FAIL  instrumented/plain >= 0.97" in capsys.readouterr().out


def test_default_data_is_the_decode_bound_set() -> None:
    args = bench.build_parser().parse_args(["loader"])
    assert (args.size, args.split, args.batch_size, args.workers, args.rounds) == ("medium", "train", 32, [0, 1, 2], 5)
    assert data.SIZES[args.size].image_size == 128


@pytest.mark.timeout(180)
def test_bench_highrate_on_tensor_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(
        [
            "highrate",
            "--source",
            "shards",
            "--data",
            str(tmp_path / "shards"),
            "--size-mb",
            "4",
            "--sample-mb",
            "0.125",
            "--batch-size",
            "8",
            "--workers",
            "2",
            "--shards",
            "4",
            "--rounds",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "4 tar shards" in out and "RingLoader on the index, 2 workers" in out
    assert out.count("PASS") + out.count("FAIL") == 2 and "CPU s/GB" in out


@pytest.mark.timeout(300)
@pytest.mark.xdist_group("mds")  # it writes and reads MDS: tests/conftest.py, MDS
def test_bench_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["formats", "--out", str(tmp_path / "f"), "--size", "small", "--rounds", "1", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "samples/s with 1 worker" in out
    for name in ("WebDataset", "MDS", "litdata"):
        assert out.count(f"  {name}") == 2, name  # its write row and its samples/s row
    assert (tmp_path / "f" / "mds" / "index.json").is_file() and (tmp_path / "f" / "litdata" / "index.json").is_file()


def test_bench_rejects_bad_arguments() -> None:
    for argv in (
        ["highrate", "--data", "x", "--source", "tape"],
        ["formats", "--workers", "-1"],
        ["formats", "--rounds", "0"],
    ):
        with pytest.raises(SystemExit):
            bench.main(argv)


@pytest.mark.timeout(240)
def test_bench_highrate_on_a_raw_file_prints_the_thread_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(
        [
            "highrate",
            "--data",
            str(tmp_path / "raw.f32"),
            "--size-mb",
            "8",
            "--sample-mb",
            "0.25",
            "--batch-size",
            "4",
            "--workers",
            "2",
            "--rounds",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "RingLoader, 2 workers" in out
    for kind in ("work that releases the GIL", "work that holds the GIL"):
        assert f"threads and processes, {kind}" in out
    for reader in (
        "DataLoader, 2 worker processes",
        "RingLoader, 2 worker processes",
        "ThreadBatches, 2 threads",
        "torchdata.nodes, 2 threads",
        "SPDL pipeline, 2 threads",
    ):
        assert out.count(reader) == 2, reader  # one row per kind of work
    assert out.count(" MB\n") >= 10 and "total CPU s/GB" in out
