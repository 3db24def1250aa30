"""course_lib.highrate: the raw tensor file, the readers, and the reused-buffer RingLoader."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_tools import bench
from course_lib.timing import medians
from course_lib.highrate import (
    MappedBatches,
    RawDataError,
    RawTensorDataset,
    RingLoader,
    _open_raw,
    _RawBatchDataset,
    _read_files,
    _shard_loader,
    _touch,
    breakdown,
    compare,
    compare_records,
    compare_shards,
    gbps,
    index_tensor_shards,
    plot_main_process,
    plot_rates,
    write_raw_tensors,
)

pytestmark = pytest.mark.quick

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
    assert _open_raw(raw.path) == raw
    assert not list(tmp_path.glob(".*tmp"))
    values = whole(raw)
    assert values.dtype == torch.float32 and 0 <= float(values.min()) and float(values.max()) < 1


def test_missing_and_truncated_files_are_clear_errors(tmp_path: Path, raw) -> None:
    with pytest.raises(RawDataError, match="write_raw_tensors"):
        _open_raw(tmp_path / "nothing.f32")
    with open(raw.path, "r+b") as f:
        f.truncate(raw.nbytes - 10)
    with pytest.raises(RawDataError, match="truncated"):
        _open_raw(raw.path)
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
        batches = [b.clone() for b in _read_files([raw.path], 8 * SB, reuse=reuse)]
        assert [len(b) for b in batches] == [8 * SB] * 4 + [5 * SB]
        assert torch.equal(torch.cat(batches).view(torch.float32).view(37, -1), expected)
    same = list(_read_files([raw.path], 8 * SB, reuse=True))
    assert same[0].data_ptr() == same[1].data_ptr()  # one buffer, overwritten
    fresh = list(_read_files([raw.path], 8 * SB, reuse=False))
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
                order = torch.randperm(37, generator=torch.Generator().manual_seed(4 + epoch))[
                    : 32 if drop_last else 37
                ]
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
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
        RingLoader(raw, batch_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        RingLoader(raw, batch_size=4, num_workers=0)
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
    cpu: dict[str, list[float]] = {}
    threads = torch.get_num_threads()
    results = compare(raw, batch_size=8, workers=1, rounds=1, cpu=cpu)
    assert torch.get_num_threads() == threads, "measured on one thread, then restored"
    assert list(results) == [
        "fastest raw read",
        "raw read, sample-sized reused buffer",
        "raw read, batch-sized reused buffer",
        "raw read, fresh batch buffer",
        "DataLoader, 0 workers",
        "DataLoader, 1 workers",
        "DataLoader, batch reads, 1 workers",
        "RingLoader, 1 workers",
    ]
    assert all(len(v) == 1 and v[0] > 0 for v in results.values())
    assert results["fastest raw read"] == [max(v[0] for name, v in results.items() if name.startswith("raw read"))]
    assert list(cpu) == list(results)[1:] and all(v[0] >= 0 for v in cpu.values())
    fig = plot_rates(results)
    assert len(fig.axes[0].patches) == 8
    fig = plot_main_process(results, cpu)
    assert len(fig.axes[0].patches) == 14  # own CPU + waiting, per method
    costs = breakdown(results, cpu, workers=1)
    assert list(costs) == [
        "copy from the page cache",
        "a fresh buffer per batch",
        "per-sample arrays + collate's copy",
        "main process, fresh shared batches",
        "main process, RingLoader slots",
    ]
    assert costs["copy from the page cache"] == pytest.approx(1 / results["raw read, batch-sized reused buffer"][0])
    assert set(medians(results)) == set(results)
    with pytest.raises(RuntimeError, match="delivered"):
        gbps(lambda: _read_files([raw.path], 8 * SB), raw.nbytes + 1)
    assert _touch(torch.ones(4096)) == 4.0  # one value per 4 KiB page


@pytest.mark.timeout(120)
def test_bench_highrate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(
        [
            "highrate",
            "--data",
            str(tmp_path / "b.f32"),
            "--size-mb",
            "4",
            "--sample-mb",
            "0.125",
            "--batch-size",
            "8",
            "--workers",
            "1",
            "--rounds",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert (
        code == 0 and "RingLoader, 1 workers" in out and "goals:" in out and out.count("PASS") + out.count("FAIL") == 2
    )
    with pytest.raises(SystemExit):
        bench.main(["highrate"])  # --data is required


@pytest.mark.timeout(90)
def test_ring_loader_under_spawn(raw) -> None:
    # macOS and Windows start workers with spawn: the slots travel to them as shared memory handles
    with RingLoader(raw, batch_size=16, num_workers=1, start_method="spawn") as ring:
        assert torch.equal(torch.cat([b.clone() for b in ring]), whole(raw))


def test_batch_dataset_reads_whole_batches(raw) -> None:
    ds = _RawBatchDataset(raw, 8)
    assert len(ds) == 5 and [len(ds[i]) for i in range(5)] == [8, 8, 8, 8, 5]
    assert torch.equal(torch.cat([ds[i] for i in range(5)]), whole(raw))
    with pytest.raises(IndexError, match="out of range"):
        ds[5]
    with pytest.raises(ValueError):
        _RawBatchDataset(raw, 0)


@pytest.mark.timeout(60)
def test_batch_dataset_in_workers_sends_shared_memory(raw) -> None:
    loader = DataLoader(_RawBatchDataset(raw, 8), batch_size=None, num_workers=2)
    batches = list(loader)
    assert all(b.is_shared() for b in batches)
    assert torch.equal(torch.cat(batches), whole(raw))


@pytest.fixture()
def tensor_shards(tmp_path: Path):
    from course_lib.shards import write_tensor_shards

    return write_tensor_shards(tmp_path / "shards", 37, sample_bytes=SB, maxcount=10, seed=2)


def shard_values(shardset) -> torch.Tensor:
    import tarfile

    from course_lib.shards import load_npy

    arrays = []
    for path in shardset.paths:
        with tarfile.open(path) as tar:
            arrays += [load_npy(tar.extractfile(m).read()) for m in tar if m.name.endswith(".npy")]
    return torch.from_numpy(np.stack(arrays))


def test_index_finds_every_npy_payload(tensor_shards) -> None:
    index = index_tensor_shards(tensor_shards.paths)
    assert index.n == 37 and index.sample_bytes == SB and len(index.files) == 4
    values = shard_values(tensor_shards)
    with open(index.files[1], "rb") as f:
        file, offset = index.locations[12]
        assert file == 1
        f.seek(offset)
        assert f.read(SB) == values[12].numpy().tobytes()


def test_index_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "f64.tar")) as sink:
        sink.write({"__key__": "a", "npy": np.zeros(4, dtype=np.float64)})
    with pytest.raises(RawDataError, match="float32"):
        index_tensor_shards([tmp_path / "f64.tar"])
    with wds.TarWriter(str(tmp_path / "mixed.tar")) as sink:
        sink.write({"__key__": "a", "npy": np.zeros(4, dtype=np.float32)})
        sink.write({"__key__": "b", "npy": np.zeros(8, dtype=np.float32)})
    with pytest.raises(RawDataError, match="one size"):
        index_tensor_shards([tmp_path / "mixed.tar"])
    with wds.TarWriter(str(tmp_path / "none.tar")) as sink:
        sink.write({"__key__": "a", "txt": "hello"})
    with pytest.raises(RawDataError, match="no .npy members"):
        index_tensor_shards([tmp_path / "none.tar"])


@pytest.mark.timeout(60)
def test_ring_loader_reads_shards_by_the_index(tensor_shards) -> None:
    index = index_tensor_shards(tensor_shards.paths)
    with RingLoader(index, batch_size=8, num_workers=2, shuffle=True, seed=3) as ring:
        order = torch.randperm(37, generator=torch.Generator().manual_seed(3))
        assert torch.equal(torch.cat([b.clone() for b in ring]), shard_values(tensor_shards)[order])


@pytest.mark.timeout(60)
def test_shard_loader_and_file_reads(tensor_shards) -> None:
    batches = list(_shard_loader(tensor_shards.urls, batch_size=8, num_workers=2))
    got = torch.cat(batches)
    assert got.shape == (37, SB // 4)
    assert sorted(got[:, 0].tolist()) == sorted(shard_values(tensor_shards)[:, 0].tolist())
    chunks = list(_read_files(tensor_shards.paths, 1 << 16))
    assert sum(len(c) for c in chunks) == sum(p.stat().st_size for p in tensor_shards.paths)


@pytest.mark.timeout(120)
def test_compare_shards(tensor_shards) -> None:
    results = compare_shards(tensor_shards.paths, batch_size=8, workers=2, rounds=1)
    assert list(results) == [
        "shard files read, sample-sized reused buffer",
        "WebDataset, 2 workers",
        "RingLoader on the index, 2 workers",
    ]
    assert all(v[0] > 0 for v in results.values())
    with pytest.raises(ValueError, match="at least 2"):
        compare_shards(tensor_shards.paths[:1], batch_size=8, workers=2, rounds=1)


def test_breakdown_of_known_numbers() -> None:
    """Seconds per GB from GB/s medians: differences of neighbouring methods, and the main process's own CPU."""
    results = {
        "raw read, batch-sized reused buffer": [4.0, 5.0, 6.0],  # median 5 GB/s: 0.2 s per GB
        "raw read, fresh batch buffer": [2.0, 2.5, 3.0],  # 0.4 s per GB
        "DataLoader, 0 workers": [1.0, 1.0, 0.5],  # 1.0 s per GB
        "DataLoader, batch reads, 2 workers": [1.5],
        "RingLoader, 2 workers": [8.0],
    }
    cpu = {"DataLoader, batch reads, 2 workers": [0.3, 0.1, 0.2], "RingLoader, 2 workers": [0.04]}
    costs = breakdown(results, cpu, workers=2)
    assert costs == pytest.approx(
        {
            "copy from the page cache": 0.2,
            "a fresh buffer per batch": 0.2,
            "per-sample arrays + collate's copy": 0.6,
            "main process, fresh shared batches": 0.2,
            "main process, RingLoader slots": 0.04,
        }
    )
    noisy = dict(results, **{"raw read, fresh batch buffer": [6.0]})  # faster than the reused buffer, by noise
    assert breakdown(noisy, cpu, workers=2)["a fresh buffer per batch"] == 0.0


def test_mapped_batches_gather_every_record_once_into_one_buffer(raw) -> None:
    truth = whole(raw)
    reader = MappedBatches(raw.path, raw.sample_bytes, 8, seed=3)
    assert len(reader) == 5
    epochs = []
    for _ in range(2):
        batches = [(b.untyped_storage().data_ptr(), b.clone()) for b in reader]
        assert len({ptr for ptr, _ in batches}) == 1, "one buffer, allocated once"
        assert [b.shape[0] for _, b in batches] == [8, 8, 8, 8, 5]
        got = torch.cat([b for _, b in batches])
        order = [int(torch.nonzero((truth == row).all(dim=1))[0]) for row in got]
        assert sorted(order) == list(range(raw.n))
        epochs.append(order)
    assert epochs[0] != epochs[1], "a new order each epoch"
    again = [
        int(torch.nonzero((truth == row).all(dim=1))[0])
        for b in MappedBatches(raw.path, raw.sample_bytes, 8, seed=3)
        for row in b.clone()
    ]
    assert again == epochs[0], "the same seed, the same first epoch"
    assert torch.equal(
        torch.cat([b.clone() for b in MappedBatches(raw.path, raw.sample_bytes, 8, shuffle=False)]), truth
    )


def test_mapped_batches_refuse_a_file_that_is_not_whole_records(raw) -> None:
    with pytest.raises(RawDataError, match="not a whole number of 1000-byte"):
        MappedBatches(raw.path, 1000, 8)
    with pytest.raises(RawDataError, match="multiple of 4"):
        MappedBatches(raw.path, 6, 8)


@pytest.mark.timeout(120)
def test_compare_records_measures_every_reader_at_every_size(tmp_path: Path) -> None:
    cpu: dict[int, dict[str, list[float]]] = {}
    results = compare_records(
        tmp_path, (4096, 65536), total_bytes=1 << 20, batch_bytes=256 << 10, workers=1, rounds=1, cpu=cpu
    )
    assert list(results) == [4096, 65536] and list(cpu) == [4096, 65536]
    for size, by_method in results.items():
        assert list(by_method) == [
            "fastest raw read",
            "raw read, record-sized reused buffer",
            "raw read, batch-sized reused buffer",
            "DataLoader, 1 workers, tensors",
            "DataLoader, 1 workers, NumPy batches",
            "RingLoader, 1 workers",
            "MappedBatches, no workers",
        ]
        assert by_method["fastest raw read"][0] == max(v[0] for k, v in by_method.items() if k.startswith("raw read"))
        assert list(cpu[size]) == list(by_method)[1:]
        assert (tmp_path / f"records-{size}.f32").stat().st_size == 1 << 20
