"""course_lib.highrate: the raw tensor file, the readers, and the reused-buffer RingLoader."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_lib import bench
from course_lib.highrate import (
    RawDataError,
    RawTensorDataset,
    RingLoader,
    compare,
    gbps,
    medians,
    open_raw,
    plot_rates,
    read_sequential,
    touch,
    write_raw_tensors,
)

SB = 64 * 1024  # small samples keep the tests fast


@pytest.fixture()
def raw(tmp_path: Path):
    return write_raw_tensors(tmp_path / "raw.f32", 37, sample_bytes=SB, seed=1)


def whole(raw) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(raw.n, raw.sample_len))


def test_write_is_deterministic_idempotent_and_checked(tmp_path: Path, raw) -> None:
    again = write_raw_tensors(tmp_path / "other.f32", 37, sample_bytes=SB, seed=1)
    assert Path(again.path).read_bytes() == Path(raw.path).read_bytes()
    mtime = os.stat(raw.path).st_mtime_ns
    assert write_raw_tensors(raw.path, 37, sample_bytes=SB, seed=1) == raw and os.stat(raw.path).st_mtime_ns == mtime
    assert open_raw(raw.path) == raw
    assert not list(tmp_path.glob(".*tmp"))
    values = whole(raw)
    assert values.dtype == torch.float32 and 0 <= float(values.min()) and float(values.max()) < 1


def test_missing_and_truncated_files_are_clear_errors(tmp_path: Path, raw) -> None:
    with pytest.raises(RawDataError, match="write_raw_tensors"):
        open_raw(tmp_path / "nothing.f32")
    with open(raw.path, "r+b") as f:
        f.truncate(raw.nbytes - 10)
    with pytest.raises(RawDataError, match="truncated"):
        open_raw(raw.path)
    with pytest.raises(ValueError):
        write_raw_tensors(tmp_path / "x", 0)
    with pytest.raises(ValueError):
        write_raw_tensors(tmp_path / "x", 3, sample_bytes=6)


def test_dataset_and_sequential_reads_give_the_file(raw) -> None:
    ds = RawTensorDataset(raw)
    expected = whole(raw)
    assert len(ds) == 37 and torch.equal(ds[5], expected[5])
    with pytest.raises(IndexError, match="out of range"):
        ds[37]
    for reuse in (True, False):
        batches = [b.clone() for b in read_sequential(raw, 8, reuse=reuse)]
        assert [len(b) for b in batches] == [8, 8, 8, 8, 5]
        assert torch.equal(torch.cat(batches), expected)
    same = list(read_sequential(raw, 8, reuse=True))
    assert same[0].data_ptr() == same[1].data_ptr()  # one buffer, overwritten
    fresh = list(read_sequential(raw, 8, reuse=False))
    assert fresh[0].data_ptr() != fresh[1].data_ptr()


@pytest.mark.timeout(60)
def test_dataset_works_in_dataloader_workers(raw) -> None:
    loader = DataLoader(RawTensorDataset(raw), batch_size=8, num_workers=2)
    assert torch.equal(torch.cat(list(loader)), whole(raw))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffle, drop_last", [(False, False), (True, False), (True, True)])
def test_ring_loader_yields_the_file_in_order_every_epoch(raw, shuffle: bool, drop_last: bool) -> None:
    expected = whole(raw)
    with RingLoader(raw, batch_size=8, num_workers=2, slots=3, shuffle=shuffle, seed=4, drop_last=drop_last) as ring:
        assert len(ring) == (4 if drop_last else 5)
        for epoch in range(3):
            batches = [b.clone() for b in ring]
            assert len(batches) == len(ring)
            if shuffle:
                order = torch.randperm(37, generator=torch.Generator().manual_seed(4 + epoch))[: 32 if drop_last else 37]
            else:
                order = torch.arange(37)
            assert torch.equal(torch.cat(batches), expected[order])


@pytest.mark.timeout(60)
def test_ring_slots_are_reused_and_an_early_break_is_safe(raw) -> None:
    with RingLoader(raw, batch_size=4, num_workers=1, slots=2) as ring:
        pointers = {b.data_ptr() for b in ring}
        assert len(pointers) == 2  # no allocation per batch: the same two slots, again and again
        for i, _ in enumerate(ring):
            if i == 1:
                break
        assert torch.equal(torch.cat([b.clone() for b in ring]), whole(raw))


@pytest.mark.timeout(60)
def test_ring_errors(raw) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RingLoader(raw, batch_size=0)
    with pytest.raises(ValueError, match="2 slots"):
        RingLoader(raw, batch_size=4, slots=1)
    ring = RingLoader(raw, batch_size=8, num_workers=1)
    with open(raw.path, "r+b") as f:  # the file shrinks under the loader: the worker reports, the loop raises
        f.truncate(SB * 20)
    with pytest.raises(RuntimeError, match="failed in a worker: RawDataError: unexpected end of file"):
        list(ring)
    ring.close()
    ring.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(ring)


@pytest.mark.timeout(120)
def test_compare_measures_every_reader_on_the_same_bytes(raw) -> None:
    results = compare(raw, batch_size=8, workers=1, rounds=1)
    assert list(results) == ["raw read, reused buffer", "raw read, fresh buffer", "DataLoader, 0 workers",
                             "DataLoader, 1 workers", "RingLoader, 1 workers"]
    assert all(len(v) == 1 and v[0] > 0 for v in results.values())
    fig = plot_rates(results)
    assert len(fig.axes[0].patches) == 5
    assert set(medians(results)) == set(results)
    with pytest.raises(RuntimeError, match="delivered"):
        gbps(lambda: read_sequential(raw, 8), raw.nbytes + 1)
    assert touch(torch.ones(4096)) == 4.0  # one value per 4 KiB page


@pytest.mark.timeout(120)
def test_bench_highrate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["highrate", "--data", str(tmp_path / "b.f32"), "--size-mb", "4", "--sample-mb", "0.125",
                       "--batch-size", "8", "--workers", "1", "--rounds", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "RingLoader, 1 workers" in out and "goals:" in out and out.count("PASS") + out.count("FAIL") == 2
    with pytest.raises(SystemExit):
        bench.main(["highrate"])  # --data is required


@pytest.mark.timeout(90)
def test_ring_loader_under_spawn(raw) -> None:
    # macOS and Windows start workers with spawn: the slots travel to them as shared memory handles
    with RingLoader(raw, batch_size=16, num_workers=1, start_method="spawn") as ring:
        assert torch.equal(torch.cat([b.clone() for b in ring]), whole(raw))
