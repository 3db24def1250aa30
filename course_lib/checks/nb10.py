"""Checks for notebook 10 (object storage).

Every check runs the learner's code against the course's real S3 server. The faults come from the notebook's proxy
(``course_lib.s3server.Proxy``, passed in: this library never imports the tools above it), which the checks make
slow, throttle (503) or cut as each test needs, and which counts the requests it saw and how many it held at once.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import object_store
from ._core import Hint, attempted, exercise, require


@contextlib.contextmanager
def _proxy(proxy: Any, latency_s: float = 0.0) -> Iterator[Any]:
    """``proxy`` with ``latency_s`` per request and fresh counts, in front of every client made in the block."""
    before = proxy.latency_s
    proxy.latency_s = latency_s
    proxy.fail_next(0)
    proxy.cut_next(0)
    proxy.reset_counts()
    try:
        with object_store.using_endpoint(proxy.endpoint):
            yield proxy
    finally:
        proxy.latency_s = before
        proxy.fail_next(0)
        proxy.cut_next(0)


def _client_error(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


@exercise("10.1", "webdataset reads the bucket through your s3:// handler: every sample of every shard, in order.")
def open_s3(fn: Callable[..., Any], urls: list[str], keys: list[str]) -> None:
    """``fn(url, mode="rb", bufsize=8192)`` opens an ``s3://bucket/key`` object as a stream of bytes; ``keys`` are
    the sample keys of the shards at ``urls``, in order."""
    import webdataset as wds

    attempted(fn)
    try:
        stream = fn(urls[0], mode="rb", bufsize=8192)
    except TypeError as exc:
        raise Hint(
            f"webdataset calls the handler as handler(url, mode='rb', bufsize=8192): give your function "
            f'those parameters, `def open_s3(url, mode="rb", bufsize=8192, **kwargs)` ({exc}).'
        ) from None
    except Exception as exc:  # any client error: say which request it was
        code = _client_error(exc)
        if code in ("NoSuchKey", "NoSuchBucket", "InvalidBucketName"):
            raise Hint(
                f"the server answered {code}: split {urls[0]} into the bucket (before the first / after "
                f"s3://) and the key (everything after it), e.g. object_store.split_url(url)."
            ) from None
        raise
    require(stream is not None, 'open_s3 returned None: return the object\'s stream, response["Body"].')
    require(
        not isinstance(stream, dict),
        'open_s3 returned the whole response (a dict): the object\'s bytes are its "Body", a stream.',
    )
    require(
        not isinstance(stream, (bytes, bytearray)),
        'open_s3 returned bytes: the whole object read into memory first. Return the stream, response["Body"], '
        "so that webdataset reads the shard piece by piece as it arrives.",
    )
    require(
        hasattr(stream, "read"),
        f'open_s3 returned a {type(stream).__name__}, which has no read(): return response["Body"].',
    )
    with contextlib.suppress(Exception):
        stream.close()
    schemes = importlib.import_module("webdataset.gopen").gopen_schemes
    before = schemes.get("s3")
    schemes["s3"] = fn
    try:
        read = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
    except Exception as exc:  # webdataset's tar reader on what the handler gave it
        raise Hint(
            f"webdataset could not read the shards through your handler ({type(exc).__name__}: "
            f"{str(exc)[:80]}): return the whole object's stream, from its first byte (no Range)."
        ) from None
    finally:
        if before is None:
            schemes.pop("s3", None)
        else:
            schemes["s3"] = before
    require(
        len(read) == len(keys),
        f"webdataset read {len(read)} samples through your handler, the shards hold "
        f"{len(keys)}: return the whole object's stream, from its first byte.",
    )
    require(
        read == keys,
        "the samples came in another order than the shards hold them: open the object named by "
        "the url, from its first byte (no Range).",
    )


@exercise("10.2", "every object whole and in order, with up to in_flight requests on their way at once.")
def read_all(fn: Callable[[list[str], int], list[bytes]], urls: list[str], proxy: Any) -> None:
    """``fn(urls, in_flight)`` returns every object's bytes in the order of ``urls``, keeping ``in_flight`` requests
    going at once. Checked through ``proxy`` with 50 ms per request, which sees how many it holds at once (how many
    overlap depends on the machine's load, so the check asks for more than one and at most ``in_flight``)."""
    attempted(fn)
    urls = list(urls)[:12]
    expected = [object_store.read_object(url) for url in urls]
    for in_flight in (4, 1):
        with _proxy(proxy, latency_s=0.05):
            got = fn(urls, in_flight)
            peak = proxy.peak_in_flight
        require(got is not None, "read_all returned None: return the list of the objects' bytes.")
        got = list(got)
        require(len(got) == len(urls), f"read_all returned {len(got)} items for {len(urls)} urls: one per url.")
        require(
            all(isinstance(b, (bytes, bytearray)) for b in got),
            f"read_all returned {type(got[0]).__name__} items: return each object's bytes "
            "(object_store.read_object(url) gives them).",
        )
        if sorted(got) == sorted(expected) and got != expected:
            raise Hint(
                "every object came back, but not in the order of urls (as_completed gives them as they "
                "finish): pool.map(read_object, urls) keeps the order."
            )
        require(got == expected, "some objects came back different from what the bucket holds: read each one whole.")
        if in_flight == 4:
            require(
                peak > 1,
                "the proxy never saw more than one request at a time: the reads ran one after the "
                "other. Run them in a ThreadPoolExecutor(max_workers=in_flight).",
            )
            require(
                peak <= 4,
                f"the proxy held {peak} requests at once for in_flight=4: keep at most in_flight going "
                "(ThreadPoolExecutor(max_workers=in_flight)).",
            )
        else:
            require(peak == 1, f"in_flight=1 still sent {peak} requests at once: use in_flight as the pool's size.")


@exercise(
    "10.4",
    "it survives 503s and cut connections, waits longer after each failure, and gives up loudly, "
    "naming the object and the attempts.",
)
def read_with_retries(fn: Callable[[str, int, float], bytes], url: str, proxy: Any) -> None:
    """``fn(url, attempts, backoff_s)`` returns the object's bytes, trying at most ``attempts`` times and waiting
    ``backoff_s``, ``2 * backoff_s``, ... between tries; after the last failure it raises, naming the url and the
    number of attempts."""
    attempted(fn)
    whole = object_store.read_object(url)
    with _proxy(proxy) as p:
        p.fail_next(2)
        got = fn(url, 4, 0.01)
        sent = p.requests
    require(
        got == whole,
        "after two 503 Slow Down answers, your function did not return the whole object: try "
        "again (up to attempts times) until a read succeeds.",
    )
    require(
        sent <= 3,
        f"two 503s then a success took {sent} requests, not 3: your client retries by itself "
        "(boto3's default does). Use object_store.s3_client(), which tries once, so that your loop "
        "counts every attempt.",
    )
    with _proxy(proxy) as p:
        p.cut_next(1, after_bytes=1000)
        got = fn(url, 4, 0.01)
    require(
        got == whole,
        f"with the connection cut after 1,000 bytes, your function returned {len(got):,} of "
        f"{len(whole):,} bytes: a short body is a failed attempt (read it inside the try, and "
        'compare its length with response["ContentLength"]).',
    )
    with _proxy(proxy) as p:
        p.fail_next(100)
        began = time.monotonic()
        try:
            fn(url, 3, 0.05)
        except Exception as exc:  # what the learner raises is theirs to choose
            message = str(exc)
        else:
            raise Hint(
                "every request failed, yet your function returned: after the last attempt, raise an error "
                "(e.g. object_store.ObjectReadError(url, attempts, error))."
            )
        elapsed = time.monotonic() - began
        sent = p.requests
    require(
        sent <= 3,
        f"with attempts=3 the proxy saw {sent} requests: your client retries by itself (boto3's "
        "default does, up to 5 tries a request). Use object_store.s3_client(), which tries once, so that "
        "your loop counts every attempt.",
    )
    require(sent == 3, f"with attempts=3 the proxy saw {sent} requests: try exactly `attempts` times in all.")
    require(
        url in message and "3" in message,
        f"the error says {message[:160]!r}: name the object ({url}) and the number of attempts (3) in it, so the "
        "log says which shard failed and how hard it was tried.",
    )
    require(
        elapsed >= 0.14,
        f"three attempts with backoff_s=0.05 took {elapsed:.2f} s: wait backoff_s after the "
        "first failure and twice that after the second (0.05 + 0.1 s), time.sleep(backoff_s * "
        "2 ** (attempt - 1)).",
    )


@exercise("10.3", "a cache within its budget: least recently used shards go first, files and counts agree.")
def shard_cache(cache_class: Callable[[Path, int], Any], urls: list[str], folder: Path) -> None:
    """``cache_class(folder, budget_bytes)`` makes a cache whose ``path(url)`` returns a local file with the object's
    bytes, fetching it on a miss and evicting the least recently used files beyond the budget; it counts ``hits``,
    ``misses`` and ``evicted``."""
    attempted(cache_class)
    urls = list(urls)[:4]
    payloads = {url: object_store.read_object(url) for url in urls}
    budget = 3 * max(len(p) for p in payloads.values())
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    cache = cache_class(folder, budget)

    def fetch(url: str) -> None:
        local = cache.path(url)
        require(local is not None, "path(url) returned None: return the local file's path.")
        local = Path(local)
        require(local.is_file(), f"path(url) returned {local}, which is not a file: write the object there first.")
        require(local.read_bytes() == payloads[url], f"the file for {url} does not hold the object's bytes.")
        files = [f for f in folder.iterdir() if f.is_file()]
        used = sum(f.stat().st_size for f in files)
        if used > budget and getattr(cache, "evicted", 0):
            raise Hint(
                f"the cache folder holds {used:,} bytes, over its budget of {budget:,}, although you counted "
                f"{cache.evicted} eviction(s): delete the evicted file from disk (Path.unlink), not only from "
                "your table."
            )
        require(
            used <= budget,
            f"the cache folder holds {used:,} bytes, over its budget of {budget:,}: evict the "
            "least recently used files before you write a new one.",
        )

    a, b, c, d = urls
    for url in (a, b, c):
        fetch(url)
    require(
        (cache.hits, cache.misses) == (0, 3),
        f"three new shards gave hits={cache.hits}, misses={cache.misses}: "
        "count a miss for every shard fetched from the store.",
    )
    fetch(a)
    require(
        cache.hits == 1,
        f"reading a cached shard again gave hits={cache.hits}: a shard already in the folder "
        "is a hit, returned without a request.",
    )
    fetch(d)  # over budget: b is now the least recently used
    left = {Path(f).name for f in folder.iterdir() if f.is_file()}
    require(
        len(left) == 3,
        f"after the fourth shard the folder holds {len(left)} files, not 3: delete the evicted "
        "file from disk (Path.unlink), not only from your table.",
    )
    before = cache.misses
    fetch(a)
    require(
        cache.misses == before,
        "shard a was evicted although it had just been read: a hit makes a shard the "
        "most recently used (OrderedDict.move_to_end), and eviction takes the least "
        "recently used, not the first written.",
    )
    require(cache.evicted == 1, f"evicted={cache.evicted} after one shard had to go: count each eviction.")
    fetch(b)
    require(
        (cache.hits, cache.misses, cache.evicted) == (2, 5, 2),
        f"after a b c a d a b: hits={cache.hits}, misses={cache.misses}, evicted={cache.evicted}; expected 2, 5, "
        "2. Count every path() call as one hit or one miss.",
    )


@exercise(
    "10.5",
    "each epoch lists the bucket anew, keeps the complete shards, and orders them by (seed, epoch), "
    "the same on every rank.",
)
def epoch_shards(fn: Callable[[str, int, int], list[str]], prefix: str, add_shard: Callable[[], str]) -> None:
    """``fn(prefix, epoch, seed)`` lists ``prefix``, keeps the ``.tar`` objects and returns their URLs in an order
    drawn from ``(seed, epoch)``. ``add_shard()`` puts one more shard under ``prefix`` and returns its URL."""
    attempted(fn)
    listed = [url for url, _ in object_store.list_objects(prefix)]
    tars = sorted(url for url in listed if url.endswith(".tar"))
    got = fn(prefix, 0, 0)
    require(got is not None, "epoch_shards returned None: return the list of shard URLs.")
    got = list(got)
    require(
        all(isinstance(u, str) and u.startswith("s3://") for u in got),
        f"epoch_shards returned {got[:2]!r}...: return s3:// URLs, as object_store.list_objects gives them "
        "(its items are (url, size) pairs).",
    )
    require(
        not any(not u.endswith(".tar") for u in got),
        "the list has objects that are not shards (e.g. the producer's index.json): keep only keys ending in .tar.",
    )
    require(
        sorted(got) == tars,
        f"{len(got)} shards returned, the bucket lists {len(tars)} under {prefix}: list "
        "the prefix every time, and keep each shard once.",
    )
    require(
        fn(prefix, 0, 0) == got,
        "two calls with the same (seed, epoch) gave different orders: draw the order "
        "from np.random.default_rng([seed, epoch]), not from global random state.",
    )
    rank = os.environ.get("RANK")
    os.environ["RANK"] = "1"
    try:
        other_rank = fn(prefix, 0, 0)
    finally:
        if rank is None:
            os.environ.pop("RANK", None)
        else:
            os.environ["RANK"] = rank
    require(
        other_rank == got,
        "rank 1 got another order than rank 0: every rank must see the same list, so that "
        "split_by_node gives each its own shards. Do not put the rank into the seed.",
    )
    orders = {tuple(fn(prefix, epoch, 0)) for epoch in range(6)}
    require(
        len(orders) >= 3,
        f"six epochs gave {len(orders)} different order(s) of {len(got)} shards: put the epoch into the seed.",
    )
    new = add_shard()
    grown = fn(prefix, 3, 0)
    require(
        new in grown,
        "a shard put into the bucket after the first call is missing from the next epoch: list "
        "the bucket inside the function, at every epoch, not once outside it.",
    )
    require(sorted(grown) == sorted(tars + [new]), "the next epoch's list is not the grown bucket's shards.")
