"""course_lib.growing: producers fill the cache, epochs see exact counts, errors are clear, shutdown is clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from course_lib import growing
from course_lib.growing import (
    CacheError,
    CacheSnapshot,
    GrowingCache,
    ProducerError,
    ProducerTimeout,
    evict_oldest,
    reuse_counts,
    sample_nbytes,
)
from course_lib.growing import _make_sample as make_sample
from course_lib.growing import _parse_name as parse_name
from course_lib.growing import _sample_name as sample_name

pytestmark = [pytest.mark.quick, pytest.mark.timeout(120)]
SAMPLE = sample_nbytes(16)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc as on Linux")


def cache(folder: Path, **kwargs) -> GrowingCache:
    options = dict(budget_bytes=10 * SAMPLE, producers=2, per_request=3, image_size=16, seed=0, timeout=30)
    options.update(kwargs)
    return GrowingCache(folder, **options)


def hidden(folder: Path) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(".")]


def dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


# ------------------------------------------------------------------ names, samples, eviction


def test_names_sort_oldest_first_and_parse_back() -> None:
    names = [sample_name(r, p, k, 3) for r in (0, 1, 12) for p in (0, 1) for k in (0, 2, 10)]
    assert sorted(names) == names
    assert parse_name(sample_name(12, 1, 10, 7)) == (12, 1, 10, 7)
    with pytest.raises(ValueError, match="not a cache sample name"):
        parse_name("x.npy")


def test_samples_are_deterministic_images() -> None:
    a, la = make_sample(0, 1, 2, 3, 16)
    b, lb = make_sample(0, 1, 2, 3, 16)
    c, _ = make_sample(1, 1, 2, 3, 16)
    assert a.shape == (16, 16, 3) and a.dtype == np.uint8 and 0 <= la < 10
    assert np.array_equal(a, b) and la == lb and not np.array_equal(a, c)
    assert sample_nbytes(16) == 16 * 16 * 3 + 128  # an .npy header and the pixels


def test_evict_oldest_examples() -> None:
    entries = [("a", 300), ("b", 50), ("c", 50), ("d", 50), ("e", 200), ("f", 100)]
    assert evict_oldest(entries, 400) == ["a", "b"]
    assert evict_oldest(entries, 750) == []
    assert evict_oldest(entries, 0) == ["a", "b", "c", "d", "e", "f"]
    assert evict_oldest([], 10) == []


@given(sizes=st.lists(st.integers(1, 500), max_size=30), budget=st.integers(0, 5000))
def test_evict_oldest_is_the_shortest_prefix_that_fits(sizes: list[int], budget: int) -> None:
    entries = [(f"n{i}", s) for i, s in enumerate(sizes)]
    chosen = evict_oldest(entries, budget)
    k = len(chosen)
    assert chosen == [name for name, _ in entries[:k]]
    assert sum(sizes[k:]) <= budget
    if k:
        assert sum(sizes[k - 1 :]) > budget  # one fewer would not fit


# ------------------------------------------------------------------ bad inputs


def test_a_budget_below_one_sample_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"smaller than one sample \\({SAMPLE} bytes"):
        cache(tmp_path, budget_bytes=SAMPLE - 1)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "bad", [dict(producers=0), dict(per_request=0), dict(producers=True), dict(image_size=4), dict(producers=100)]
)
def test_bad_sizes_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError):
        cache(tmp_path, **bad)


def test_a_folder_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="cannot create the cache folder 'cache'"):
        cache(blocker / "cache")


def test_a_folder_that_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", refuse)  # as root, chmod would not stop us
    with pytest.raises(CacheError, match="is not writable \\(Permission denied\\)"):
        cache(tmp_path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(CacheError, match="not writable"):
            cache(folder)
    finally:
        folder.chmod(0o700)


def test_samples_of_an_earlier_run_are_not_mixed_in(tmp_path: Path) -> None:
    (tmp_path / sample_name(0, 0, 0, 1)).write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("kept")
    with pytest.raises(CacheError, match="already holds 1 samples"):
        cache(tmp_path)
    c = cache(tmp_path, clear=True)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    c.close()


def test_requests_need_running_producers(tmp_path: Path) -> None:
    c = cache(tmp_path)
    with pytest.raises(CacheError, match="not running"):
        c.request()
    c.close()
    with pytest.raises(CacheError, match="closed"):
        c.start()


# ------------------------------------------------------------------ a real run


def run_epochs(folder: Path, epochs: int, **kwargs) -> tuple[list[tuple[int, int, int, int]], list[list[str]]]:
    stats, names = [], []
    with cache(folder, **kwargs) as c:
        for _ in range(epochs):
            s = c.next_epoch()  # the producers are writing the next request meanwhile
            assert not any(n.startswith(".") for n in s.dataset.names), "a snapshot lists only complete files"
            stats.append((s.added, s.evicted, s.samples, s.nbytes))
            names.append(s.dataset.names.tolist())
        c.wait()
        assert not hidden(folder), "no temporary file is left once a request is written"
        assert c.nbytes() <= c.budget_bytes + c.producers * c.per_request * SAMPLE
    assert c.exitcodes == [0, 0]
    return stats, names


def test_epochs_see_exact_counts_and_the_oldest_go_first(tmp_path: Path) -> None:
    stats, names = run_epochs(tmp_path / "a", 6)
    # budget 10 samples, 6 new per epoch: 6, then 12 -> evict 2, then 16 -> evict 6, ...
    assert [s[:3] for s in stats] == [(6, 0, 6), (6, 2, 10), (6, 6, 10), (6, 6, 10), (6, 6, 10), (6, 6, 10)]
    assert all(s[3] == s[2] * SAMPLE for s in stats)
    for before, after in zip(names, names[1:]):
        gone = sorted(set(before) - set(after))
        assert gone == sorted(before)[: len(gone)], "evicted files are the oldest of the previous epoch"
    ages = [sorted({parse_name(n)[0] for n in epoch}) for epoch in names]
    assert ages[0] == [0] and ages[-1][-1] == 5


def test_two_runs_write_the_same_samples(tmp_path: Path) -> None:
    _, a = run_epochs(tmp_path / "a", 3)
    _, b = run_epochs(tmp_path / "b", 3)
    assert a == b
    for name in a[-1]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    _, c = run_epochs(tmp_path / "c", 3, seed=1)
    assert [parse_name(n)[3] for n in c[-1]] != [parse_name(n)[3] for n in a[-1]]


def test_a_snapshot_is_a_map_style_dataset_for_workers(tmp_path: Path) -> None:
    with cache(tmp_path, per_request=4, budget_bytes=20 * SAMPLE) as c:
        c.next_epoch()
        stats = c.next_epoch()
        ds = stats.dataset
        assert len(ds) == 16 and repr(ds) == "CacheSnapshot(samples=16)"
        x, y = ds[0]
        assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and 0 <= float(x.min()) <= float(x.max()) <= 1
        assert y == parse_name(ds.names[0])[3] and ds.labels.tolist() == [parse_name(n)[3] for n in ds.names]
        labels = torch.cat([b for _, b in DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, timeout=60)])
        assert sorted(labels.tolist()) == sorted(ds.labels.tolist())
        raw = CacheSnapshot(tmp_path, ds.names, transform=lambda a: a.shape)
        assert raw[1] == ((16, 16, 3), ds.labels[1])
        assert "epoch 1: +8 new, -0 evicted, 16 samples" in str(stats)


def test_a_file_deleted_under_a_snapshot_is_named(tmp_path: Path) -> None:
    with cache(tmp_path) as c:
        ds = c.next_epoch().dataset
        (tmp_path / ds.names[0]).unlink()
        with pytest.raises(CacheError, match=f"{ds.names[0]} is in this epoch's snapshot but no longer in the cache"):
            ds[0]


def test_eviction_policy_errors_delete_nothing(tmp_path: Path) -> None:
    with cache(tmp_path) as c:
        c.next_epoch()
        c.next_epoch()  # 12 written, 10 kept
        c.wait()
        before = sorted(os.listdir(tmp_path))
        with pytest.raises(CacheError, match="does not hold"):
            c.evict(lambda entries, budget: ["nope.npy"])
        with pytest.raises(CacheError, match="twice"):
            c.evict(lambda entries, budget: [entries[0][0]] * 2)
        with pytest.raises(CacheError, match="over its budget"):
            c.evict(lambda entries, budget: [])
        assert sorted(os.listdir(tmp_path)) == before
        newest = c.evict(lambda entries, budget: [name for name, _ in entries[-6:]])
        assert newest == before[-6:]
        with pytest.raises(CacheError, match="still being written"):
            c.request()
            c.request()


# ------------------------------------------------------------------ failures and shutdown


def test_a_crashed_producer_is_named_with_its_exit_code(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with cache(tmp_path, per_request=4, fail_at=1) as c:
        c.next_epoch()
        with pytest.raises(ProducerError) as info:
            c.next_epoch()
        assert info.value.producer == 1 and info.value.exitcode == 1
        assert "producer 1 failed while writing request 1 (ConnectionError" in str(info.value)
        assert "exited with code 1" in str(info.value)
        assert c.exitcodes[1] == 1 and c.exitcodes[0] is None
        with pytest.raises(CacheError, match="failed earlier"):
            c.next_epoch()
    assert not hidden(tmp_path)
    assert c.exitcodes == [0, 1]
    assert "ConnectionError: producer 1: the remote store went away (simulated)" in capfd.readouterr().err


@linux_only
def test_a_killed_producer_is_named(tmp_path: Path) -> None:
    with cache(tmp_path) as c:
        c.next_epoch()
        pid = c.pids[0]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while c.exitcodes[0] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ProducerError, match="producer 0 failed .* exited with code -9") as info:
            c.next_epoch()
        assert info.value.exitcode == -signal.SIGKILL


@linux_only
def test_a_stuck_producer_times_out_and_close_still_stops_it(tmp_path: Path) -> None:
    c = cache(tmp_path).start()
    c.next_epoch()
    c.wait()
    # A producer's report is read before its queue thread lets go of the queue's write lock: stopped in that instant,
    # producer 1 would keep producer 0's report from ever coming (seen once under load). Stop it once the lock is free.
    assert c._done._wlock.acquire(timeout=5)
    c._done._wlock.release()
    os.kill(c.pids[1], signal.SIGSTOP)
    try:
        c.request()
        # Producer 0 runs on; the error must name the stopped producer 1, not a producer 0 that a busy machine
        # slowed down. So wait (as long as it takes, up to the test's timeout) for producer 0's 3 files first.
        while len(list(tmp_path.glob("r00002-p00-*.npy"))) < 3:
            time.sleep(0.05)
        # its files are written just before it reports them: give the report 8 s to come (4 s were too few once, on a
        # machine running the whole suite); the stopped one never does
        with pytest.raises(ProducerTimeout, match="producer 1 did not finish request 2 within 8 seconds") as info:
            c.wait(timeout=8.0)
        assert isinstance(info.value, TimeoutError) and info.value.exitcode is None
    finally:
        start = time.monotonic()
        c.close(timeout=1.0)
    assert time.monotonic() - start < 10
    assert all(code is not None for code in c.exitcodes)


@linux_only
def test_close_does_not_wait_on_a_lock_a_killed_producer_held(tmp_path: Path) -> None:
    """A producer killed while reporting leaves the shared report queue's write lock taken for good.

    The one test that reaches inside: that death cannot be timed from outside (the lock is held for the few
    microseconds of a write), so the test takes the lock itself, as the dead producer would have left it."""
    c = cache(tmp_path).start()
    c.next_epoch()
    c.wait()
    assert c._done._wlock.acquire(timeout=5)  # as if a dead producer held it
    start = time.monotonic()
    c.close(timeout=1.0)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("method", ["spawn"])
def test_producers_work_under_spawn(tmp_path: Path, method: str) -> None:
    """The default on macOS and Windows: the producer function and its arguments are pickled."""
    stats, names = run_epochs(tmp_path, 2, start_method=method)
    assert [s[:3] for s in stats] == [(6, 0, 6), (6, 2, 10)]


def test_close_is_clean_and_idempotent(tmp_path: Path) -> None:
    c = cache(tmp_path).start()
    c.next_epoch()
    (tmp_path / ".leftover.npy.tmp-123").write_bytes(b"half")
    c.close()
    c.close()
    assert c.closed and all(code == 0 for code in c.exitcodes)
    assert not hidden(tmp_path)
    assert "closed" in repr(c)
    with pytest.raises(CacheError, match="closed"):
        c.next_epoch()


@linux_only
def test_producers_do_not_outlive_a_killed_consumer(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from course_lib.growing import GrowingCache\n"
        f"c = GrowingCache({str(tmp_path)!r}, budget_bytes=10**6, image_size=16).start()\n"
        "c.next_epoch()\n"
        "print(*c.pids, flush=True)\n"
        "os._exit(0)  # no close(), no atexit: as if the kernel were killed\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(dead(p) for p in pids):
        time.sleep(0.2)
    assert all(dead(p) for p in pids)


# ------------------------------------------------------------------ pictures


def test_reuse_counts_and_plot(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with cache(tmp_path) as c:
        for _ in range(5):
            c.next_epoch()
    reuse = reuse_counts(c.history)
    assert reuse and set(reuse.values()) <= {1, 2}
    assert all(name not in c.history[-1].dataset.names for name in reuse)
    fig = growing.plot_growth(c.history, c.budget_bytes, c.sample_bytes)
    assert len(fig.axes) == 4  # three panels and a colour bar
    plt.close(fig)
