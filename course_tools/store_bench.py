"""``python -m course_lib bench store``: shards from a real S3 server on this machine against shards on local disk.

A fixed workload, stated in the output: ``--shards`` tar shards of ``--shard-mib`` MiB, read whole by a DataLoader
of ``--workers`` worker processes, one shard per item. Each item reads its shard's raw bytes into a reused buffer
and returns the byte count: nothing is decoded, so decoding cannot hide what the store costs. Every variant is
read once to warm up (workers started, page cache and store warm), then once per round, the variants interleaved
(A B C, then C B A), and judged by the course's one rule for measured claims (:mod:`course_lib.claims`):

* the store at least 0.8x local disk, at equal workers (both read from the disk: the page cache of the local shards
  and of the server's files is dropped before each epoch; a row with the page cache is shown beside);
* a local cache of the store (its second epoch) at least 0.95x local disk;
* 20 ms more per request, through :class:`course_lib.s3server.Proxy`, at least 0.8x the same proxy without it,
  by concurrency: each shard fetched as ``--in-flight`` ranged GETs at once (the proxy's own cost is in both).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import DataLoader, Dataset

from course_lib import claims

from course_lib import s3server

PIECE = 1 << 20  # bytes read at a time, into the reused buffer
GOALS = {"store": 0.8, "cache": 0.95, "latency": 0.8}


def write_shards(folder: Path, count: int, shard_mib: float, seed: int = 0) -> list[Path]:
    """``count`` WebDataset shards of about ``shard_mib`` MiB each: notebook 12's tensor shards (seeded float32
    samples of about 1 MiB, :func:`course_lib.shards.write_tensor_shards`)."""
    from course_lib.shards import write_tensor_shards

    per_shard = max(1, round(shard_mib))
    sample_bytes = int(shard_mib * PIECE / per_shard) // 4 * 4
    return list(
        write_tensor_shards(folder, count * per_shard, sample_bytes=sample_bytes, maxcount=per_shard, seed=seed).paths
    )


class ShardBytes(Dataset):
    """Item ``i``: shard ``i``'s raw bytes, read whole into a reused buffer; returns how many.

    ``urls`` are local paths or ``s3://bucket/key``. For S3: ``endpoint`` (default: ``AWS_ENDPOINT_URL``), keys from
    the AWS variables (:meth:`course_lib.s3server.S3Server.use`); ``in_flight`` ranged GETs at once per shard;
    ``cache_dir``: read a cached copy there if one is, else fetch and keep one (written under a temporary name)."""

    def __init__(
        self, urls: list[str], endpoint: str | None = None, in_flight: int = 1, cache_dir: str | None = None
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        if in_flight > 1 and cache_dir is not None:
            raise ValueError("a cache is filled by whole-object reads: give in_flight=1 with cache_dir")
        self.urls, self.endpoint, self.in_flight, self.cache_dir = list(urls), endpoint, in_flight, cache_dir
        self._client: Any = None
        self._pid = -1
        self._buffer = bytearray(PIECE)

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> int:
        url = self.urls[i]
        if not url.startswith("s3://"):
            return self._read_file(url)
        if self.cache_dir is not None:
            cached = Path(self.cache_dir) / url[5:].replace("/", "__")
            if cached.exists():
                return self._read_file(str(cached))
            return self._fetch(url, keep=cached)
        return self._fetch(url)

    def _read_file(self, path: str) -> int:
        total = 0
        view = memoryview(self._buffer)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
        return total

    def _s3(self) -> Any:
        if self._client is None or self._pid != os.getpid():  # one client per process: never across a fork
            import boto3

            self._client, self._pid = boto3.session.Session().client("s3", endpoint_url=self.endpoint), os.getpid()
        return self._client

    def _range(self, bucket: str, key: str, first: int, last: int) -> int:
        body = self._s3().get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")["Body"]
        total = 0
        while chunk := body.read(PIECE):
            total += len(chunk)
        return total

    def _fetch(self, url: str, keep: Path | None = None) -> int:
        bucket, key = url[5:].split("/", 1)
        size = self._s3().head_object(Bucket=bucket, Key=key)["ContentLength"] if self.in_flight > 1 else None
        sink = None
        if keep is not None:
            tmp = keep.with_name(f".{keep.name}.tmp-{os.getpid()}")
            sink = open(tmp, "wb")
        try:
            if self.in_flight == 1:
                body = self._s3().get_object(Bucket=bucket, Key=key)["Body"]
                total = 0
                while chunk := body.read(PIECE):
                    total += len(chunk)
                    if sink is not None:
                        sink.write(chunk)
            else:
                assert size is not None
                step = -(-size // self.in_flight)
                ranges = [(a, min(size, a + step) - 1) for a in range(0, size, step)]
                with concurrent.futures.ThreadPoolExecutor(self.in_flight) as pool:
                    total = sum(pool.map(lambda r: self._range(bucket, key, *r), ranges))
        finally:
            if sink is not None:
                sink.close()
        if keep is not None:
            os.replace(tmp, keep)
        return total


def evict(folder: Path) -> None:
    """Drop the page cache of every file under ``folder`` (``posix_fadvise(DONTNEED)``; dirty pages are written first),
    so that the next read comes from the disk: a data set larger than memory, as in training. A no-op where the
    call does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return
    os.sync()
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _epoch_gbps(loader: DataLoader, cold: Path | None = None) -> float:
    """GB/s of one epoch; ``cold``: a folder whose page cache is dropped first."""
    if cold is not None:
        evict(cold)
    start = time.perf_counter()
    total = sum(loader)
    return total / (time.perf_counter() - start) / 1e9


def run_store_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="course-bench-store-") as where:
        folder = Path(where)
        paths = write_shards(folder / "local", args.shards, args.shard_mib)
        size = sum(p.stat().st_size for p in paths)
        server = s3server.S3Server(folder / "server").start()
        try:
            urls = s3server.upload(server, paths, "bench", "shards/")
            server.use("learner")
            (folder / "cache").mkdir()
            with (
                s3server.Proxy(server.endpoint) as plain_proxy,
                s3server.Proxy(server.endpoint, latency_s=args.latency_ms / 1000) as slow_proxy,
            ):
                stored = server.folder / "data"
                datasets = {  # each with the folder whose page cache goes before its epochs: the disk is read
                    "local disk": (ShardBytes([str(p) for p in paths]), folder / "local"),
                    "local disk, page cache": (ShardBytes([str(p) for p in paths]), None),
                    "S3 server": (ShardBytes(urls, endpoint=server.endpoint), stored),
                    "S3, local cache": (
                        ShardBytes(urls, endpoint=server.endpoint, cache_dir=str(folder / "cache")),
                        folder / "cache",
                    ),
                    "S3 via proxy": (ShardBytes(urls, endpoint=plain_proxy.endpoint, in_flight=args.in_flight), stored),
                    f"S3 via proxy, +{args.latency_ms:g} ms": (
                        ShardBytes(urls, endpoint=slow_proxy.endpoint, in_flight=args.in_flight),
                        stored,
                    ),
                }
                log(
                    f"{len(paths)} shards of {args.shard_mib:g} MiB ({size / 2**20:.0f} MiB in all), read whole as raw "
                    f"bytes (no decoding) by {args.workers} DataLoader workers, one shard per item; {args.in_flight} "
                    f"ranged GETs in flight per shard through the proxies; {args.rounds} rounds after one warm-up "
                    f"epoch each; the page cache of the files read (local, the server's, the cache's) dropped "
                    f"before each epoch, but for 'page cache'; SeaweedFS started in {server.seconds_to_start:.1f} s"
                )
                loaders = {
                    name: (DataLoader(ds, batch_size=None, num_workers=args.workers, persistent_workers=True), cold)
                    for name, (ds, cold) in datasets.items()
                }
                for loader, _ in loaders.values():  # workers started; the cache filled (its first epoch)
                    _epoch_gbps(loader)
                rounds = claims.interleave(
                    {name: (lambda pair=pair: _epoch_gbps(*pair)) for name, pair in loaders.items()}, rounds=args.rounds
                )
                del loaders
        finally:
            server.stop(graceful=False)  # its folder goes with the temporary directory
    slow = f"S3 via proxy, +{args.latency_ms:g} ms"
    verdicts = {
        "store": claims.claim(
            f"shards from the S3 server at least {GOALS['store']}× local disk, at {args.workers} workers",
            rounds.ratio("S3 server", "local disk"),
            above=GOALS["store"],
            load=rounds,
        ),
        "cache": claims.claim(
            f"the local cache's second epoch at least {GOALS['cache']}× local disk",
            rounds.ratio("S3, local cache", "local disk"),
            above=GOALS["cache"],
            load=rounds,
        ),
        "latency": claims.claim(
            f"+{args.latency_ms:g} ms per request, {args.in_flight} requests in flight per shard: at "
            f"least {GOALS['latency']}× the same proxy without it",
            rounds.ratio(slow, "S3 via proxy"),
            above=GOALS["latency"],
            load=rounds,
        ),
    }
    return {
        "medians": {name: rounds.median(name) for name in rounds.values},
        "claims": verdicts,
        "goals": {str(c): c.holds is True for c in verdicts.values()},
    }


def store_report(result: dict[str, Any]) -> list[str]:
    local = result["medians"]["local disk"]
    lines = ["", "GB/s (median of rounds), and against local disk:"]
    lines += [f"  {name:<28} {gbps:6.2f} GB/s  {gbps / local:.2f}×" for name, gbps in result["medians"].items()]
    lines.append("goals (the course's rule: conclusive only beyond twice the rounds' spread):")
    lines += [f"  {claim}" for claim in result["claims"].values()]
    return lines


def add_arguments(parser: argparse.ArgumentParser, at_least: Callable[[int], Callable[[str], int]]) -> None:
    parser.add_argument("--shards", type=at_least(1), default=16, help="(default: %(default)s)")
    parser.add_argument("--shard-mib", type=float, default=8.0, help="size of one shard (default: %(default)s MiB)")
    parser.add_argument("--workers", type=at_least(1), default=2, help="DataLoader workers (default: %(default)s)")
    parser.add_argument(
        "--in-flight",
        type=at_least(1),
        default=4,
        help="ranged GETs at once per shard through the proxies (default: %(default)s)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="added to every request by the slow proxy (default: %(default)s)"
    )
    parser.add_argument("--rounds", type=at_least(3), default=5, help="(default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit with status 1 if a goal is not shown to hold")
