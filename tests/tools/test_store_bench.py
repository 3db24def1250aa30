"""``python -m course_lib bench store``: the readers judged against the server's own limit, measured in the same run."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from course_tools import store_bench

pytestmark = pytest.mark.quick


@pytest.mark.timeout(300)
def test_bench_store_prints_the_servers_limit_its_cpu_and_three_goals() -> None:
    """A small run: the workload stated, the sweep of raw GETs with the best taken, seven rows in GB/s, the store
    against disk as a figure with the CPU per GB that explains it, three goals judged by the claims rule (holds,
    does not hold or inconclusive: whatever this machine shows), and the server stopped."""
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "bench", "store"]
        + ["--shards", "4", "--shard-mib", "2", "--rounds", "3", "--min-seconds", "0.05"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "4 shards of 2 MiB (8 MiB in all), read whole as raw bytes (no decoding) by 2 DataLoader workers" in out
    sweep = re.search(r"raw GETs from this process's threads: (.*); (\d) in flight taken into the rounds", out)
    assert sweep, out
    rates = dict(re.findall(r"(\d) in flight (\d+\.\d\d) GB/s", sweep.group(1)))
    assert set(rates) == {"1", "2", "4", "8"}, out
    assert float(rates[sweep.group(2)]) == max(map(float, rates.values())), "the best of the sweep is taken"
    for reader in (
        "local disk",
        "local disk, page cache",
        f"server's limit, raw GETs ({sweep.group(2)} in flight)",
        "S3 server, the readers",
        "S3, local cache",
        "S3 via proxy",
        "S3 via proxy, +20 ms",
    ):
        assert re.search(rf"^  {re.escape(reader)} +\d+\.\d\d GB/s", out, re.M), (reader, out)
    figure = re.search(
        r"the store against local disk \(a figure, not a goal\): \d+\.\d\d×\. CPU per GB served: the server "
        r"(\d+\.\d\d) s, the readers (\d+\.\d\d) s; on (\d+) cores these allow at most (\d+\.\d\d) GB/s",
        out,
    )
    assert figure, out
    server_s, readers_s, cores, cap = map(float, figure.groups())
    assert server_s > 0 and readers_s > 0
    assert cap == pytest.approx(cores / (server_s + readers_s), abs=0.02)
    verdicts = re.findall(r"→ (holds|does not hold|inconclusive on this machine):", out)
    assert len(verdicts) == 3, out
    assert "at least 0.8× the server's limit →" in out
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if any("course-bench-store-" in part for part in p.info["cmdline"] or [])
    ]
    assert not left, f"the benchmark left its server running: {left}"


def test_bounded_map_keeps_order_and_at_most_ahead_in_flight() -> None:
    lock = threading.Lock()
    now = peak = 0

    def slow(item: str) -> int:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.01)
        with lock:
            now -= 1
        return int(item)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(store_bench.bounded_map(pool, slow, [str(i) for i in range(20)], ahead=3))
    assert got == list(range(20))
    assert peak == 3


def test_a_round_is_whole_passes_for_at_least_min_seconds() -> None:
    passes = []

    def one_pass() -> int:
        passes.append(time.perf_counter())
        time.sleep(0.02)
        return 10**6

    gbps = store_bench.gbps_for_at_least(one_pass, 0.1)
    assert len(passes) >= 5
    assert gbps == pytest.approx(len(passes) * 1e6 / (len(passes) * 0.02) / 1e9, rel=0.5)


def test_shard_bytes_reads_local_shards_whole_and_refuses_no_in_flight(tmp_path: Path) -> None:
    paths = store_bench.write_shards(tmp_path / "shards", 2, 1.5)
    dataset = store_bench.ShardBytes([str(p) for p in paths])
    assert [dataset[i] for i in range(2)] == [p.stat().st_size for p in paths]
    with pytest.raises(ValueError, match="in_flight must be >= 1"):
        store_bench.ShardStream(["s3://b/k"], in_flight=0)


def test_a_pass_that_reads_the_wrong_bytes_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="read 5 bytes instead of 6: the reader skipped or repeated a shard"):
        store_bench.gbps_for_at_least(lambda: 5, 0.01, expect=6)
