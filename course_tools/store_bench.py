"""``python -m course_lib bench store``: shards from a real S3 server on this machine, judged against that server's
own limit measured in the same run, and against local disk as a figure.

A fixed workload, stated in the output: ``--shards`` tar shards of ``--shard-mib`` MiB, read whole as raw bytes
into a reused buffer: nothing is decoded, so decoding cannot hide what the store costs. The readers are a
DataLoader of ``--workers`` worker processes; each worker reads its own shards (``urls[worker::workers]``) with
``--in-flight`` whole-shard GETs at once, across shards, as notebook 10 teaches. Every variant is read once to warm
up (workers started, page cache and store warm); then each round reads it for at least ``--min-seconds`` (whole
passes over the shards), the variants interleaved (A B C, then C B A), and judged by the course's one rule for
measured claims (:mod:`course_lib.claims`):

* the readers at least 0.8x **the server's limit**: raw GETs of the same bytes from the benchmark's own threads,
  swept over concurrency (1, 2, 4, 8 in flight) before the rounds, the best taken into the rounds;
* a local cache of the store (its second epoch) at least 0.95x local disk;
* 20 ms more per request, through :class:`course_lib.s3server.Proxy`, at least 0.8x the same proxy without it:
  the requests in flight across shards hide the latency (the proxy's own cost is in both).

The store against local disk is a figure, not a goal, printed with its explanation: the CPU seconds per GB that the
server and the readers spend (measured on one extra pass), and the rate those allow on this machine's cores. On
2 cores a server that spends about 1.5 CPU-s per GB caps the store below half of a fast disk, whatever the client.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from course_lib import claims

from course_lib import s3server

PIECE = 1 << 20  # bytes read at a time, into the reused buffer
GOALS = {"readers": 0.8, "cache": 0.95, "latency": 0.8}
SWEEP = (1, 2, 4, 8)  # GETs in flight for the server's limit


def write_shards(folder: Path, count: int, shard_mib: float, seed: int = 0) -> list[Path]:
    """``count`` WebDataset shards of about ``shard_mib`` MiB each: notebook 12's tensor shards (seeded float32
    samples of about 1 MiB, :func:`course_lib.shards.write_tensor_shards`)."""
    from course_lib.shards import write_tensor_shards

    per_shard = max(1, round(shard_mib))
    sample_bytes = int(shard_mib * PIECE / per_shard) // 4 * 4
    return list(
        write_tensor_shards(folder, count * per_shard, sample_bytes=sample_bytes, maxcount=per_shard, seed=seed).paths
    )


class _Reader:
    """Reads a local file or an ``s3://bucket/key`` object whole into a reused buffer and returns its byte count.
    One S3 client per process and thread (boto3 clients are not shared across a fork); keys from the AWS variables
    (:meth:`course_lib.s3server.S3Server.use`), ``endpoint`` default ``AWS_ENDPOINT_URL``."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoint"])

    def _client(self) -> Any:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            import boto3

            local.client, local.pid = boto3.session.Session().client("s3", endpoint_url=self.endpoint), os.getpid()
        return local.client

    def file(self, path: str | Path) -> int:
        if not hasattr(self._local, "buffer"):
            self._local.buffer = bytearray(PIECE)
        total = 0
        view = memoryview(self._local.buffer)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
        return total

    def get(self, url: str, keep: Path | None = None) -> int:
        """One GET of the whole object; ``keep``: also write it there (under a temporary name, then renamed)."""
        bucket, key = url[5:].split("/", 1)
        body = self._client().get_object(Bucket=bucket, Key=key)["Body"]
        total = 0
        tmp = keep.with_name(f".{keep.name}.tmp-{os.getpid()}-{threading.get_ident()}") if keep else None
        with open(tmp, "wb") if tmp else _nowhere() as sink:
            while chunk := body.read(PIECE):
                total += len(chunk)
                sink.write(chunk)
        if keep is not None and tmp is not None:
            os.replace(tmp, keep)
        return total


class _nowhere:
    def __enter__(self) -> "_nowhere":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def write(self, chunk: bytes) -> None:
        pass


class ShardBytes(Dataset):
    """Item ``i``: shard ``i``'s raw bytes, read whole; returns how many. ``urls``: local paths or ``s3://`` URLs;
    ``cache_dir``: an S3 shard is read from its cached copy there if one is, else fetched and kept (the name derived
    from the whole key, so that ``val/`` and ``train/`` never share a copy)."""

    def __init__(self, urls: list[str], endpoint: str | None = None, cache_dir: str | None = None) -> None:
        self.urls, self.cache_dir, self.reader = list(urls), cache_dir, _Reader(endpoint)

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> int:
        url = self.urls[i]
        if not url.startswith("s3://"):
            return self.reader.file(url)
        if self.cache_dir is None:
            return self.reader.get(url)
        cached = Path(self.cache_dir) / url[5:].replace("/", "__")
        return self.reader.file(cached) if cached.exists() else self.reader.get(url, keep=cached)


class ShardStream(IterableDataset):
    """Each DataLoader worker reads its own shards (``urls[worker::workers]``), ``in_flight`` whole-shard GETs at
    once across shards (a thread pool, at most ``in_flight`` submitted ahead), and yields each shard's byte count."""

    def __init__(self, urls: list[str], endpoint: str | None = None, in_flight: int = 4) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.urls, self.in_flight, self.reader = list(urls), in_flight, _Reader(endpoint)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        mine = self.urls if info is None else self.urls[info.id :: info.num_workers]
        if self._pool is None:  # one pool per worker process, kept across epochs (persistent workers)
            self._pool = concurrent.futures.ThreadPoolExecutor(self.in_flight, thread_name_prefix="shard-get")
        yield from bounded_map(self._pool, self.reader.get, mine, self.in_flight)


def bounded_map(
    pool: concurrent.futures.Executor, fn: Callable[[str], int], items: list[str], ahead: int
) -> Iterator[int]:
    """``fn`` over ``items`` in order, at most ``ahead`` calls submitted at once (``Executor.map`` would submit all)."""
    pending: list[concurrent.futures.Future[int]] = []
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.pop(0).result()
    for future in pending:
        yield future.result()


def raw_gets(reader: _Reader, urls: list[str], in_flight: int, pool: concurrent.futures.Executor) -> int:
    """The server's side of the limit: every shard GET whole by this process's threads, ``in_flight`` at once."""
    return sum(bounded_map(pool, reader.get, urls, in_flight))


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


def gbps_for_at_least(
    one_pass: Callable[[], int], min_seconds: float, cold: Path | None = None, expect: int | None = None
) -> float:
    """GB/s over whole passes (``one_pass()`` returns the bytes it read) repeated until ``min_seconds`` have passed,
    so that a round is long enough to be stable; ``cold``: a folder whose page cache is dropped before each pass
    (the time that takes is not counted); ``expect``: the bytes a pass must read (else an error: a reader that
    skipped or repeated a shard would look faster or slower than it is)."""
    total = elapsed = 0.0
    while elapsed < min_seconds or total == 0:
        if cold is not None:
            evict(cold)
        start = time.perf_counter()
        read = one_pass()
        elapsed += time.perf_counter() - start
        if expect is not None and read != expect:
            raise RuntimeError(f"a pass read {read} bytes instead of {expect}: the reader skipped or repeated a shard")
        total += read
    return total / elapsed / 1e9


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    seconds = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            seconds += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return seconds


def cpu_per_gb(one_pass: Callable[[], int], server_pid: int, min_seconds: float = 1.0) -> dict[str, float]:
    """CPU seconds per GB of passes lasting ``min_seconds`` at least (the CPU clock ticks every 10 ms: a small pass
    alone may read as 0): the server's process tree, and the readers (this process and its other children: the
    DataLoader's workers). Children are counted while they live (persistent workers)."""
    me = psutil.Process()
    server = psutil.Process(server_pid)
    server_tree = [server, *server.children(recursive=True)]
    server_pids = {p.pid for p in server_tree}
    readers = [me, *(p for p in me.children(recursive=True) if p.pid not in server_pids)]
    before = _cpu_seconds(server_tree), _cpu_seconds(readers)
    read, start = 0, time.perf_counter()
    while not read or time.perf_counter() - start < min_seconds:
        read += one_pass()
    after = _cpu_seconds(server_tree), _cpu_seconds(readers)
    gb = read / 1e9
    return {"server": (after[0] - before[0]) / gb, "readers": (after[1] - before[1]) / gb}


def run_store_bench(args: argparse.Namespace, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    slow = f"S3 via proxy, +{args.latency_ms:g} ms"
    with tempfile.TemporaryDirectory(prefix="course-bench-store-") as where:
        folder = Path(where)
        paths = write_shards(folder / "local", args.shards, args.shard_mib)
        size = sum(p.stat().st_size for p in paths)
        server = s3server.S3Server(folder / "server").start()
        try:
            urls = s3server.upload(server, paths, "bench", "shards/")
            server.use("learner")
            (folder / "cache").mkdir()
            stored = server.folder / "data"
            log(
                f"{len(paths)} shards of {args.shard_mib:g} MiB ({size / 2**20:.0f} MiB in all), read whole as raw "
                f"bytes (no decoding) by {args.workers} DataLoader workers, {args.in_flight} shards in flight per "
                f"worker from S3; {args.rounds} rounds of at least {args.min_seconds:g} s each after one warm-up pass; "
                f"the page cache of the files read (local, the server's, the cache's) dropped before each pass, but "
                f"for 'page cache'; SeaweedFS started in {server.seconds_to_start:.1f} s"
            )
            with (
                s3server.Proxy(server.endpoint) as plain_proxy,
                s3server.Proxy(server.endpoint, latency_s=args.latency_ms / 1000) as slow_proxy,
                concurrent.futures.ThreadPoolExecutor(max(SWEEP), thread_name_prefix="raw-get") as pool,
            ):
                reader = _Reader(server.endpoint)
                raw = {c: (lambda c=c: raw_gets(reader, urls, c, pool)) for c in SWEEP}
                for one_pass in raw.values():  # every thread's client made; the server's files in memory
                    one_pass()
                sweep = {c: gbps_for_at_least(raw[c], args.min_seconds, cold=stored, expect=size) for c in SWEEP}
                best = max(sweep, key=sweep.__getitem__)
                log(
                    "the server's limit, raw GETs from this process's threads: "
                    + ", ".join(f"{c} in flight {g:.2f} GB/s" for c, g in sweep.items())
                    + f"; {best} in flight taken into the rounds"
                )
                limit = f"server's limit, raw GETs ({best} in flight)"

                def loader(ds: Dataset | IterableDataset) -> Callable[[], int]:
                    dl = DataLoader(ds, batch_size=None, num_workers=args.workers, persistent_workers=True)
                    return lambda: sum(dl)

                variants = {  # each with the folder whose page cache goes before its passes: the disk is read
                    "local disk": (loader(ShardBytes([str(p) for p in paths])), folder / "local"),
                    "local disk, page cache": (loader(ShardBytes([str(p) for p in paths])), None),
                    limit: (raw[best], stored),
                    "S3 server, the readers": (
                        loader(ShardStream(urls, endpoint=server.endpoint, in_flight=args.in_flight)),
                        stored,
                    ),
                    "S3, local cache": (
                        loader(ShardBytes(urls, endpoint=server.endpoint, cache_dir=str(folder / "cache"))),
                        folder / "cache",
                    ),
                    "S3 via proxy": (
                        loader(ShardStream(urls, endpoint=plain_proxy.endpoint, in_flight=args.in_flight)),
                        stored,
                    ),
                    slow: (loader(ShardStream(urls, endpoint=slow_proxy.endpoint, in_flight=args.in_flight)), stored),
                }
                for one_pass, _ in variants.values():  # workers started; the cache filled (its first epoch)
                    one_pass()
                rounds = claims.interleave(
                    {
                        name: (
                            lambda pair=pair: gbps_for_at_least(pair[0], args.min_seconds, cold=pair[1], expect=size)
                        )
                        for name, pair in variants.items()
                    },
                    rounds=args.rounds,
                )
                evict(stored)
                cpu = cpu_per_gb(variants["S3 server, the readers"][0], server.pid)
                del variants
        finally:
            server.stop(graceful=False)  # its folder goes with the temporary directory
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    verdicts = {
        "readers": claims.claim(
            f"the readers ({args.workers} workers, {args.in_flight} shards in flight each) at least "
            f"{GOALS['readers']}× the server's limit",
            rounds.ratio("S3 server, the readers", limit),
            above=GOALS["readers"],
            load=rounds,
        ),
        "cache": claims.claim(
            f"the local cache's second epoch at least {GOALS['cache']}× local disk",
            rounds.ratio("S3, local cache", "local disk"),
            above=GOALS["cache"],
            load=rounds,
        ),
        "latency": claims.claim(
            f"+{args.latency_ms:g} ms per request, {args.in_flight} shards in flight per worker: at "
            f"least {GOALS['latency']}× the same proxy without it",
            rounds.ratio(slow, "S3 via proxy"),
            above=GOALS["latency"],
            load=rounds,
        ),
    }
    return {
        "medians": {name: rounds.median(name) for name in rounds.values},
        "sweep": sweep,
        "store_vs_disk": rounds.median("S3 server, the readers") / rounds.median("local disk"),
        "cpu_per_gb": cpu,
        "cores": cores,
        "cap_gbps": cores / (cpu["server"] + cpu["readers"]),
        "claims": verdicts,
        "goals": {str(c): c.holds is True for c in verdicts.values()},
    }


def store_report(result: dict[str, Any]) -> list[str]:
    local = result["medians"]["local disk"]
    cpu = result["cpu_per_gb"]
    lines = ["", "GB/s (median of rounds), and against local disk:"]
    lines += [f"  {name:<40} {gbps:6.2f} GB/s  {gbps / local:.2f}×" for name, gbps in result["medians"].items()]
    lines += [
        "",
        f"the store against local disk (a figure, not a goal): {result['store_vs_disk']:.2f}×. CPU per GB served: "
        f"the server {cpu['server']:.2f} s, the readers {cpu['readers']:.2f} s; on {result['cores']} cores these "
        f"allow at most {result['cap_gbps']:.2f} GB/s, whatever the client does",
        "goals (the course's rule: conclusive only beyond twice the rounds' spread):",
    ]
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
        help="whole-shard GETs at once per worker, across shards (default: %(default)s)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="added to every request by the slow proxy (default: %(default)s)"
    )
    parser.add_argument("--rounds", type=at_least(3), default=5, help="(default: %(default)s)")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=1.0,
        help="each round reads a variant in whole passes for at least this long (default: %(default)s)",
    )
    parser.add_argument("--check", action="store_true", help="exit with status 1 if a goal is not shown to hold")
