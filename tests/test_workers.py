"""course_lib.workers: each demonstration shows the behaviour the notebook claims."""

from __future__ import annotations

import concurrent.futures
import functools
import math
import multiprocessing
import os
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from course_lib import workers
from course_lib.pitfalls import capture_stderr_fd

pytestmark = [pytest.mark.quick, pytest.mark.timeout(120)]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc and fd limits as on Linux")


def test_global_generators_differ_per_worker_and_repeat_with_the_seed() -> None:
    def run(seed: int) -> list[dict]:
        return list(
            DataLoader(
                workers.RandomnessProbe(4),
                batch_size=None,
                num_workers=2,
                generator=torch.Generator().manual_seed(seed),
            )
        )

    a, b = run(0), run(0)
    assert a == b and a != run(1)
    for key in ("random", "numpy", "torch"):
        assert a[0][key] != a[1][key]  # worker 0 and worker 1


def test_a_generator_made_in_init_repeats_in_every_worker() -> None:
    shifts = [s for _, s in DataLoader(workers.NoisyDataset(8), batch_size=None, num_workers=2)]
    assert shifts[0::2] == shifts[1::2]
    assert [s for _, s in DataLoader(workers.NoisyDataset(8), batch_size=None)] != shifts


@pytest.mark.parametrize(
    "persistent, shared, expected", [(False, False, [0, 1, 2]), (True, False, [0, 0, 0]), (True, True, [0, 1, 2])]
)
def test_epoch_state_in_persistent_workers(persistent: bool, shared: bool, expected: list[int]) -> None:
    ds = (workers.SharedEpochTagged if shared else workers.EpochTagged)(n=4)
    loader = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=persistent)
    seen = []
    for epoch in range(3):
        ds.epoch = epoch
        seen.append({int(e) for _, es in loader for e in es})
    assert seen == [{e} for e in expected]
    assert ds.epoch == 2


def test_decoders_agree_with_the_image() -> None:
    jpeg, ppm = workers.jpeg_payloads(n=1, side=32)[0], workers.ppm_payloads(n=1, side=32)[0]
    a, b = workers.decode_jpeg(jpeg), workers.decode_ppm(ppm)
    assert a.shape == b.shape == (32, 32, 3) and a.dtype == b.dtype == np.uint8
    assert np.abs(a.astype(float) - b).mean() < 8  # the same picture, JPEG-compressed
    assert len(workers.jpeg_payloads(n=5, distinct=2)) == 5
    with pytest.raises(ValueError, match="P3"):
        workers.decode_ppm(b"P6 1 1 255 abc")


def _note_pid(folder: str, item: int) -> None:
    """Decode-free work with a trace: one line per call, naming the item and the process that ran it."""
    with open(f"{folder}/calls.txt", "a") as f:
        f.write(f"{item} {os.getpid()} {threading.get_ident()}\n")


def test_parallel_rounds_runs_every_item_serially_in_threads_and_in_other_processes(tmp_path) -> None:
    items = list(range(12))
    r = workers.parallel_rounds(functools.partial(_note_pid, str(tmp_path)), items, workers=2, rounds=3)
    assert set(r.values) == {"serial", "threads", "processes"}
    assert all(len(v) == 3 and all(math.isfinite(t) and t > 0 for t in v) for v in r.values.values())
    calls = [line.split() for line in (tmp_path / "calls.txt").read_text().splitlines()]
    assert sorted(int(item) for item, _, _ in calls) == sorted(
        items * 9
    )  # 3 rounds: serially, in threads, in processes
    here = [item for item, pid, _ in calls if int(pid) == os.getpid()]
    elsewhere = {pid for _, pid, _ in calls if int(pid) != os.getpid()}
    assert len(here) == 2 * 3 * len(items)  # the serial pass and the thread pool ran in this process
    assert 1 <= len(elsewhere) <= 2  # the process pool's 2 workers, forked


@linux_only
def test_reading_a_list_copies_it_into_a_forked_worker() -> None:
    items = [float(i) for i in range(300_000)]
    assert workers.private_memory_growth(items) > 5  # MB: ~32 bytes per float object and pointer
    assert workers.private_memory_growth(np.asarray(items)) < 1


@linux_only
def test_open_file_limit_and_its_fix() -> None:
    assert "Too many open files" in workers.open_files_demo("file_descriptor", limit=128)
    assert workers.open_files_demo("file_system", limit=128) == "kept all 400 tensors from the workers"


def test_limits_and_shm_arithmetic() -> None:
    info = workers.os_limits()
    assert info["cpus"] >= 1 and info["sharing_strategy"] in torch.multiprocessing.get_all_sharing_strategies()
    assert workers.shm_needed_mb(1.5, num_workers=4, prefetch_factor=2) == 12.0


def test_slow_storage() -> None:
    ds = workers.SlowStorage(n=16, slow_every=8, slow_s=0.0)
    assert len(ds) == 16 and int(ds.slow.sum()) == 2 and torch.equal(ds[3], torch.full((8,), 3))
    with pytest.raises(IndexError):
        ds[16]
    with pytest.raises(ValueError):
        workers.SlowStorage(slow_every=0)


@linux_only
def test_capture_stderr_fd_sees_a_crashing_spawned_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # a class the parent finds in __main__ and a fresh worker cannot: like one defined in a notebook cell
    Local = type("Local", (workers.EpochTagged,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "Local", Local, raising=False)
    with capture_stderr_fd() as err, pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(DataLoader(Local(n=2), num_workers=1, multiprocessing_context="spawn"))
    assert "Can't get attribute 'Local'" in err.last_line()


@pytest.mark.timeout(60)
def test_parallel_rounds_of_the_jpeg_decoder_in_forked_processes() -> None:
    """Forked pool processes decode without deadlocking. Had the decoder used torch (a float tensor of a 512 px
    image is large enough for torch's OpenMP pool), a process forked after this one started that pool would hang."""
    (torch.ones(3, 512, 512) * 2).sum()  # start torch's OpenMP threads in this process first
    payloads = workers.jpeg_payloads(n=16, side=512)
    result = workers.parallel_rounds(workers.decode_jpeg, payloads, rounds=3)  # a hang here is what this test is about
    assert all(math.isfinite(r) and r > 0 for r in result.ratio("serial", "processes"))
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        decoded = list(pool.map(workers.decode_jpeg, payloads[:2]))  # a forked process decodes what this one does
    assert all(np.array_equal(a, workers.decode_jpeg(p)) for a, p in zip(decoded, payloads))


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU: the error a learner without one would get")
def test_cuda_in_a_worker_needs_a_gpu() -> None:
    with pytest.raises((RuntimeError, AssertionError)):
        workers.CudaInWorker()[0]
    assert len(workers.CudaInWorker()) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.timeout(120)
def test_cuda_before_a_fork_breaks_the_workers_and_spawn_does_not() -> None:
    torch.zeros(1, device="cuda")
    with pytest.raises(RuntimeError, match="re-initialize CUDA in forked subprocess"):
        list(DataLoader(workers.CudaInWorker(), batch_size=None, num_workers=1, multiprocessing_context="fork"))
    spawned = DataLoader(workers.CudaInWorker(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    assert [float(x) for x in spawned] == [0.0, 1.0]


@linux_only
@pytest.mark.timeout(120)
def test_the_copy_on_read_meter_collects_the_parents_garbage_before_it_forks(capfd) -> None:
    """A DataLoader iterator left in a reference cycle (as a failed cell's traceback leaves one) must be collected in
    this process: collected in the forked worker instead, its __del__ fails there and prints a traceback."""
    it = iter(DataLoader(range(4), num_workers=1))
    next(it)
    cycle: list = [it]
    cycle.append(cycle)
    del it, cycle
    growth = workers.private_memory_growth([float(i) for i in range(300_000)])
    assert growth > 1  # the list's pages were copied
    assert "can only test a child process" not in capfd.readouterr().err


@pytest.mark.quick
def test_cpu_count_is_the_affinity_or_a_lower_quota_rounded_up(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(workers, "cgroup_limits", lambda: ("none", None, None))
    assert workers.cpu_count() == cores
    monkeypatch.setattr(workers, "cgroup_limits", lambda: ("v2", 0.5, None))  # a hub's cpu_limit of half a core
    assert workers.cpu_count() == 1
    monkeypatch.setattr(workers, "cgroup_limits", lambda: ("v2", cores - 0.5, None))
    assert workers.cpu_count() == cores
    monkeypatch.setattr(workers, "cgroup_limits", lambda: ("v1", cores + 8.0, None))  # a quota beyond the cores
    assert workers.cpu_count() == cores
    if cores > 1:
        monkeypatch.setattr(workers, "cgroup_limits", lambda: ("v2", 1.0, None))
        assert workers.cpu_count() == 1 and workers.os_limits()["cpus"] == 1
