"""course_lib.threads: thread pipelines against worker processes, on the same file and the same work."""

from __future__ import annotations

import inspect
import itertools
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.version import Version
from torch.utils.data import DataLoader

from course_lib import threads
from course_lib.highrate import RawDataError, RingLoader, index_tensor_shards, write_raw_tensors
from course_lib.shards import write_tensor_shards

pytestmark = pytest.mark.quick

SB = 16 * 1024  # small samples keep the tests fast


@pytest.fixture
def raw(tmp_path: Path):
    return write_raw_tensors(tmp_path / "raw.f32", 26, sample_bytes=SB, seed=3)


def _truth(raw) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(raw.n, -1))


def _worked(truth: torch.Tensor, work) -> torch.Tensor:
    out = truth.clone()
    for sample in out:
        work(sample)
    return out


@pytest.mark.parametrize("work", [threads.torch_work, threads.python_work], ids=["torch", "python"])
@pytest.mark.timeout(60)
def test_every_reader_delivers_the_worked_samples_in_order(raw, work) -> None:
    want = _worked(_truth(raw), work)
    dataset = threads.WorkedSamples(raw, work)
    readers = {
        "DataLoader": lambda: DataLoader(dataset, batch_size=4, num_workers=2),
        "ThreadBatches": lambda: threads.ThreadBatches(raw, 4, threads=2, in_flight=2, work=work),
        "torchdata.nodes": lambda: threads.nodes_batches(dataset, 4, 2),
        "SPDL": lambda: spdl,
    }
    spdl = threads.SpdlBatches(dataset, 4, 2)
    for name, make in readers.items():
        for _ in range(2):  # the pipelines are kept across passes
            got = torch.cat([batch.clone() for batch in make()])
            assert torch.equal(got, want), name
    spdl.close()
    assert torch.equal(dataset.read_batch([3, 0, 7]), want[[3, 0, 7]])  # one batch tensor, the same samples
    with RingLoader(raw, 4, num_workers=2, transform=work) as ring:  # the work done in its workers, in the slots
        assert torch.equal(torch.cat([b.clone() for b in ring]), want)


def test_the_two_kinds_of_work_change_a_sample_in_place() -> None:
    for work in threads.WORK.values():
        sample = torch.rand(threads.PYTHON_VALUES + 10)
        before = sample.clone()
        assert work(sample) is None and not torch.equal(sample, before)


@pytest.mark.timeout(60)
def test_thread_batches_reuses_its_buffers_and_reads_ahead_only_in_flight(raw) -> None:
    reader = threads.ThreadBatches(raw, 4, threads=2, in_flight=2)
    assert len(reader) == 7  # 26 samples: six batches of 4 and one of 2
    truth = _truth(raw)
    for _ in range(2):  # a second epoch reads the same batches into the same buffers
        kept = []
        for number, batch in enumerate(reader):
            assert torch.equal(batch, truth[4 * number : 4 * number + 4])
            kept.append(batch)
        assert [b.shape[0] for b in kept] == [4] * 6 + [2]
        assert len({b.untyped_storage().data_ptr() for b in kept}) == 3  # in_flight + 1 buffers
    stopped = iter(reader)
    next(stopped)
    stopped.close()  # a loop that stops early: the file is closed, the reads in flight end
    assert torch.equal(torch.cat([b.clone() for b in reader]), truth)


def test_thread_batches_refuses_shards_and_bad_arguments(tmp_path: Path, raw) -> None:
    shards = write_tensor_shards(tmp_path / "shards", 6, sample_bytes=SB, maxcount=3)
    with pytest.raises(RawDataError, match="one raw file"):
        threads.ThreadBatches(index_tensor_shards(shards.paths), 2)
    with pytest.raises(ValueError):
        threads.ThreadBatches(raw, 0)
    with pytest.raises(ValueError):
        threads.ThreadBatches(raw, 4, in_flight=0)


@pytest.mark.timeout(120)
def test_compare_threads_measures_every_reader_each_round(tmp_path: Path) -> None:
    raw = write_raw_tensors(
        tmp_path / "raw.f32", 26, sample_bytes=4 * threads.PYTHON_VALUES
    )  # Python work: ~40 ms a pass
    rows = threads.compare_threads(raw, threads.python_work, batch_size=4, workers=2, rounds=2)
    assert list(rows) == [
        "DataLoader, 2 worker processes",
        "RingLoader, 2 worker processes",
        "ThreadBatches, 2 threads",
        "torchdata.nodes, 2 threads",
        "SPDL pipeline, 2 threads",
    ]
    for name, row in rows.items():
        assert len(row.gbps) == len(row.main_cpu) == len(row.total_cpu) == len(row.pss_mb) == 2, name
        assert all(v > 0 for v in row.gbps + row.pss_mb), name
        assert all(t >= m - 1e-9 for m, t in zip(row.main_cpu, row.total_cpu)), (
            name
        )  # the total includes the main process
    threaded = rows["ThreadBatches, 2 threads"]
    tick = 0.01 / (raw.nbytes / 1e9)  # one 10 ms clock tick of another process, per GB of this pass
    assert all(t - m <= 2 * tick for m, t in zip(threaded.main_cpu, threaded.total_cpu))  # threads: no worker processes
    processes = rows["DataLoader, 2 worker processes"]
    assert all(t > m for m, t in zip(processes.main_cpu, processes.total_cpu))  # its workers did the work
    fig = threads.plot_threads({"torch": rows})
    assert len(fig.axes) == 2


def test_worker_method_is_read_from_the_installed_dataloader(monkeypatch: pytest.MonkeyPatch) -> None:
    has = "worker_method" in inspect.signature(DataLoader.__init__).parameters
    assert threads.worker_method_available() is has
    release = Version(torch.__version__.split("+")[0])
    assert not has or release >= Version("2.16"), "2.14.1 and 2.15.0 have no DataLoader(worker_method=...)"

    class Future(DataLoader):
        def __init__(self, *args, worker_method="multiprocessing", **kwargs):
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(threads, "DataLoader", Future)
    assert threads.worker_method_available()


class _Counted(threads.WorkedSamples):
    """Counts the batches read."""

    reads = 0

    def read_batch(self, indices: list[int]) -> torch.Tensor:
        type(self).reads += 1
        return super().read_batch(indices)


@pytest.mark.timeout(60)
def test_spdl_pipeline_is_built_once_reads_nothing_between_passes_and_survives_an_early_stop(raw) -> None:
    dataset = _Counted(raw, threads.torch_work)
    truth = _worked(_truth(raw), threads.torch_work)
    spdl = threads.SpdlBatches(dataset, 4, 2)
    pipeline = spdl.pipeline
    assert len(spdl) == 7 and torch.equal(torch.cat(list(spdl)), truth)
    read = _Counted.reads
    time.sleep(0.3)
    assert _Counted.reads == read == 7  # nothing read ahead of the next pass
    assert len(list(itertools.islice(spdl, 2))) == 2  # a loop that stops early ...
    assert torch.equal(torch.cat(list(spdl)), truth)  # ... leaves nothing stale for the next pass
    assert spdl.pipeline is pipeline  # one pipeline for every pass
    spdl.close()
    spdl.close()  # once is enough; again does nothing
    with pytest.raises(RuntimeError, match="closed"):
        list(spdl)


def test_nodes_loader_is_reused_across_passes(raw) -> None:
    dataset = threads.WorkedSamples(raw, threads.python_work)
    loader = threads.nodes_batches(dataset, 4, 2)
    truth = _worked(_truth(raw), threads.python_work)
    for _ in range(2):
        batches = list(loader)
        assert [b.shape[0] for b in batches] == [4] * 6 + [2] and torch.equal(torch.cat(batches), truth)
    assert threads._batches_of(5, 2) == [[0, 1], [2, 3], [4]]
