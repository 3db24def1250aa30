"""Notebook 10: shards in an object store (S3): open them for webdataset, read them back whole despite a bad
network, and keep a local cache within a size budget.

An object store has buckets and keys, not folders and files: a request lists keys under a prefix, or reads one
object, whole or a byte range. Every request pays a round trip, which is why shards (a few large objects) beat
many small ones there even more than on a file system. The clients here take the endpoint and the keys from the
standard AWS variables (``AWS_ENDPOINT_URL``, a profile): the course's server sets them
(``course_lib.s3server``), and so would a site's S3, MinIO or SeaweedFS.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from .support import write_atomic

__all__ = [
    "ObjectReadError",
    "ShardCache",
    "cache_name",
    "list_objects",
    "read_many",
    "read_object",
    "register_in_worker",
    "register_s3_scheme",
    "s3_client",
    "split_url",
    "using_endpoint",
]


class ObjectReadError(RuntimeError):
    """Notebook 10, section 5: an object could not be read whole; the message names it, the attempts made and the last
    error."""

    def __init__(self, url: str, attempts: int, error: BaseException) -> None:
        super().__init__(
            f"{url}: not read whole after {attempts} attempt{'s' if attempts != 1 else ''}; the last "
            f"error: {type(error).__name__}: {error}"
        )
        self.url, self.attempts, self.error = url, attempts, error


_CLIENTS: dict[tuple[int, str | None, str | None], Any] = {}


def s3_client() -> Any:
    """Notebook 10: a boto3 S3 client set up from the AWS variables, one per process (a client must not cross a
    fork into DataLoader workers: each worker makes its own on first use), and a new one when the variables name
    another server. It tries each request once: retrying is this module's job, so that every failure is seen and
    counted."""
    where = (os.getpid(), os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_PROFILE"))
    client = _CLIENTS.get(where)
    if client is None:
        import boto3
        import botocore.config

        config = botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30
        )
        client = _CLIENTS[where] = boto3.session.Session().client("s3", config=config)
    return client


@contextlib.contextmanager
def using_endpoint(url: str) -> Iterator[None]:
    """Notebook 10, section 3: in this block, every S3 client made by this process (and by the processes it starts)
    talks to ``url``, e.g. a proxy in front of the server; the previous endpoint comes back afterwards."""
    before = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = before


def split_url(url: str) -> tuple[str, str]:
    """Notebook 10: ``s3://bucket/key`` → ``("bucket", "key")``."""
    if not url.startswith("s3://") or "/" not in url[5:] or url.endswith("/"):
        raise ValueError(f"expected s3://bucket/key, got {url!r}")
    bucket, key = url[5:].split("/", 1)
    return bucket, key


def list_objects(url: str) -> list[tuple[str, int]]:
    """Notebook 10: ``(s3 URL, size)`` of every object under the prefix ``s3://bucket/prefix``, sorted by key. A
    listing shows only objects whose upload finished: a PUT is atomic."""
    if not url.startswith("s3://"):
        raise ValueError(f"expected s3://bucket/prefix, got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    found = []
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [(f"s3://{bucket}/{o['Key']}", o["Size"]) for o in page.get("Contents", [])]
    return sorted(found)


def _open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> IO[bytes]:
    """Notebook 10: ``s3://bucket/key`` opened for reading, as a stream of its bytes (one GET), for webdataset's
    ``gopen``. A connection that breaks midway raises in the reader: webdataset then reports the shard."""
    if mode != "rb":
        raise ValueError(f"s3:// objects are opened for reading here (mode 'rb'), got mode {mode!r}")
    bucket, key = split_url(url)
    return s3_client().get_object(Bucket=bucket, Key=key)["Body"]


def register_in_worker(worker_id: int) -> None:
    """Notebook 10: a ``worker_init_fn`` that registers ``s3://`` in each DataLoader worker. Forked workers inherit
    the registration; ``spawn`` and ``forkserver`` workers start a fresh interpreter, whose webdataset knows no
    ``s3://`` until this runs there."""
    register_s3_scheme()


def register_s3_scheme() -> None:
    """Notebook 10: teach webdataset's ``gopen`` the ``s3://`` scheme; webdataset 1.0.2 has none. Its table of
    schemes is ``webdataset.gopen.gopen_schemes``: note that ``wds.gopen`` is the function, not that module."""
    import importlib

    importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = _open_s3


_JITTER = random.Random()  # unseeded on purpose: clients that failed together must not wait alike
os.register_at_fork(after_in_child=_JITTER.seed)  # a forked worker draws anew (from os.urandom), not its parent's waits


def read_object(url: str, attempts: int = 4, backoff_s: float = 0.05, *, rng: random.Random | None = None) -> bytes:
    """Notebook 10: the whole object at ``url``, read again after a failure (a refused or broken connection, a
    ``503 Slow Down``, a body cut short); after ``attempts`` failures, :class:`ObjectReadError`. Never fewer bytes
    than the object has: a short read is a failure.

    Between attempts it backs off exponentially with **full jitter** (AWS Architecture Blog, "Exponential Backoff
    And Jitter"): after failure ``n`` it waits a random time between 0 and ``backoff_s * 2 ** (n - 1)``, drawn from
    ``rng`` (a ``random.Random``; by default one unseeded generator per process, so that the ranks and workers a 503
    refused at the same moment come back at different moments; pass a seeded one where the waits must repeat)."""
    return _get(url, attempts, backoff_s, rng)[0]


def _check_retries(attempts: int, backoff_s: float) -> None:
    if attempts < 1 or backoff_s < 0:
        raise ValueError(f"attempts must be >= 1 and backoff_s >= 0, got {attempts} and {backoff_s}")


def _full_jitter_s(attempt: int, backoff_s: float, rng: random.Random | None) -> float:
    """The wait after failed attempt ``attempt`` (1, 2, ...): uniform between 0 and ``backoff_s * 2 ** (attempt - 1)``."""
    return (rng or _JITTER).uniform(0, backoff_s * 2 ** (attempt - 1))


def _version(response: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies one version of an object in a GET's or a HEAD's answer: its ETag (a digest of the bytes the
    server chose) and size; a store that sends no ETag, its size and LastModified."""
    etag = response.get("ETag")
    return (
        (etag, response.get("ContentLength")) if etag else (response.get("ContentLength"), response.get("LastModified"))
    )


def _retrying(url: str, attempts: int, backoff_s: float, rng: random.Random | None, request: Any) -> Any:
    """``request(bucket, key)`` tried up to ``attempts`` times with full-jitter backoff, as :func:`read_object` does."""
    _check_retries(attempts, backoff_s)
    bucket, key = split_url(url)
    for attempt in range(1, attempts + 1):
        try:
            return request(bucket, key)
        except Exception as exc:  # botocore's, urllib3's and the OS's errors alike; re-raised below
            if _not_found(exc):
                raise FileNotFoundError(f"{url}: no such object (check the bucket and key: list_objects)") from exc
            if attempt == attempts:
                raise ObjectReadError(url, attempts, exc) from exc
            time.sleep(_full_jitter_s(attempt, backoff_s, rng))
    raise AssertionError("unreachable")


def _get(url: str, attempts: int, backoff_s: float, rng: random.Random | None) -> tuple[bytes, tuple[Any, ...]]:
    """The whole object and the version its bytes are (see :func:`_version`)."""

    def get(bucket: str, key: str) -> tuple[bytes, tuple[Any, ...]]:
        response = s3_client().get_object(Bucket=bucket, Key=key)
        payload = response["Body"].read()
        if len(payload) != response["ContentLength"]:
            raise OSError(f"read {len(payload)} of {response['ContentLength']} bytes")
        return payload, _version(response)

    return _retrying(url, attempts, backoff_s, rng, get)


def _head(url: str, attempts: int = 4, backoff_s: float = 0.05) -> tuple[Any, ...]:
    """The object's version now, from a HEAD request (no body: one round trip)."""
    return _retrying(url, attempts, backoff_s, None, lambda b, k: _version(s3_client().head_object(Bucket=b, Key=k)))


def read_many(urls: list[str], in_flight: int = 8) -> list[bytes]:
    """Notebook 10, section 3: every object of ``urls``, whole and in order, with up to ``in_flight`` requests
    waiting on the network at once. Threads suffice: a thread waiting for a reply holds no lock (no GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        return list(pool.map(read_object, urls))


def _not_found(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)  # botocore's ClientError has one; a broken stream has none
    return isinstance(response, dict) and response.get("Error", {}).get("Code") in ("NoSuchKey", "NoSuchBucket", "404")


def cache_name(url: str) -> str:
    """Notebook 10, section 4: a local file name for the object at ``url`` derived from its bucket and whole key,
    ``<16 hex digits of SHA-256(bucket/key)>-<the key's last part>``: ``s3://course/val/shard-000000.tar`` and
    ``s3://course/train/shard-000000.tar`` get different files (webdataset 1.0.2's ``cache_dir`` names both
    ``shard-000000.tar``: webdataset#471), and so do keys that differ only where a flattened name would not
    (``a/b.tar`` and ``a__b.tar``). Also a ``url_to_name`` for webdataset's ``FileCache``."""
    bucket, key = split_url(url)
    digest = hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()[:16]
    return f"{digest}-{key.rsplit('/', 1)[-1]}"


class ShardCache:
    """Notebook 10: whole shards kept in a local folder, at most ``budget_bytes`` of them; the least recently used
    go first when a new one needs room, **before** it is written, so that the folder never holds more than the
    budget. ``path(url)`` returns a local file for the shard, fetched with :func:`read_object` the first time
    (written under a temporary name, then renamed: a reader never sees half a file). ``hits``, ``misses``,
    ``evicted`` and ``replaced`` count what happened. One cache per process: two processes sharing a folder each
    keep their own accounts.

    Two options against the ways a cache serves the wrong bytes (notebook 10, section 4's pitfall):

    * ``url_to_name`` names each local file; the default, :func:`cache_name`, is derived from the bucket and the
      whole key, so that two prefixes holding the same file names (``val/`` and ``train/``) never share a file;
    * ``check_version=True`` asks the store for the object's version (ETag and size, one HEAD request) before it
      serves a cached copy, and fetches the object again when it changed since it was cached (counted in
      ``replaced``). Without it, a shard overwritten in the bucket is served from the old copy until it is evicted.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        budget_bytes: int,
        *,
        url_to_name: Callable[[str], str] = cache_name,
        check_version: bool = False,
    ) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
        if not callable(url_to_name):
            raise TypeError(
                f"url_to_name must be a function of the URL, such as object_store.cache_name, got {url_to_name!r}"
            )
        self.folder, self.budget = Path(folder), int(budget_bytes)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"the cache folder {self.folder} does not exist: create it first (mkdir)")
        self.url_to_name, self.check_version = url_to_name, bool(check_version)
        self._sizes: OrderedDict[Path, int] = OrderedDict()  # least recently used first
        self._versions: dict[Path, tuple[Any, ...]] = {}  # the version each kept file holds
        self.hits = self.misses = self.evicted = self.replaced = 0

    @property
    def used(self) -> int:
        return sum(self._sizes.values())

    def path(self, url: str) -> Path:
        name = self.url_to_name(url)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"url_to_name({url!r}) gave {name!r}: a cache name is one file name, without '/'")
        local = self.folder / name
        if local in self._sizes and local.exists():
            if not self.check_version or _head(url) == self._versions.get(local):
                self.hits += 1
                self._sizes.move_to_end(local)
                return local
            self.replaced += 1  # the object changed in the store since it was cached: fetch it again
            del self._sizes[local]
            local.unlink()  # first, so that the folder never holds the old copy and the new one together
        self.misses += 1
        payload, version = _get(url, 4, 0.05, None)
        if len(payload) > self.budget:
            raise ValueError(
                f"{url} is {len(payload):,} bytes, more than the cache's whole budget of "
                f"{self.budget:,}: raise budget_bytes"
            )
        while self.used + len(payload) > self.budget:
            oldest, _ = self._sizes.popitem(last=False)
            oldest.unlink(missing_ok=True)
            self._versions.pop(oldest, None)
            self.evicted += 1
        write_atomic(local, payload)
        self._sizes[local], self._versions[local] = len(payload), version
        return local


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.object_store cat s3://bucket/key``: the object's bytes on standard output, for a
    webdataset ``pipe:`` URL (notebook 10, section 5)."""
    import argparse
    import shutil
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m course_lib.object_store",
        description="write an S3 object to standard output (for webdataset's pipe:)",
    )
    parser.add_argument("command", choices=["cat"])
    parser.add_argument("url", help="s3://bucket/key")
    args = parser.parse_args(argv)
    bucket, key = split_url(args.url)
    body = s3_client().get_object(Bucket=bucket, Key=key)["Body"]
    shutil.copyfileobj(body, sys.stdout.buffer, 1 << 16)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
