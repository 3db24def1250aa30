"""Checks for notebook 10 (object storage).

Every check runs the learner's code against the course's real S3 server. The faults come from the notebook's proxy
(``course_lib.s3server.Proxy``, passed in: this library never imports the tools above it), which the checks make
slow, throttle (503) or cut as each test needs, and which counts the requests it saw and how many it held at once.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
import threading
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


@contextlib.contextmanager
def _on_client(event: str, handler: Callable[..., Any]) -> Iterator[None]:
    """``handler`` on ``event`` (botocore's event names, e.g. ``before-parameter-build.s3.GetObject``) of the client
    ``object_store.s3_client()`` gives in this process now: the one the learner's code gets too, in the block."""
    events = object_store.s3_client().meta.events
    unique = f"course-check-{id(handler)}"
    events.register(event, handler, unique_id=unique)
    try:
        yield
    finally:
        events.unregister(event, handler, unique_id=unique)


def _client_error(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


@exercise("10.1", "webdataset reads the bucket through your s3:// handler: every sample of every shard, in order.")
def open_s3(fn: Callable[..., Any], urls: list[str], keys: list[str]) -> None:
    """``fn(url, mode="rb", bufsize=8192)`` opens an ``s3://bucket/key`` object as a stream of bytes; ``keys`` are
    the sample keys of the shards at ``urls``, in order."""
    import webdataset as wds

    attempted(fn)
    asked: list[str] = []
    try:
        with _on_client("before-parameter-build.s3.GetObject", lambda params, **_: asked.append(params.get("Key"))):
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
    slashed = [key for key in asked if isinstance(key, str) and key.startswith("/")]
    require(
        not slashed,
        f"your handler asked for the key {slashed[0] if slashed else ''!r}, with a leading slash: this server "
        "forgives it, AWS answers NoSuchKey. The key is everything after s3://bucket/, without the slash, "
        "e.g. object_store.split_url(url).",
    )
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
    require(
        not isinstance(stream, io.BytesIO) and not hasattr(stream, "getvalue"),
        f"open_s3 returned an in-memory {type(stream).__name__}: io.BytesIO(body.read()) reads the whole object "
        'into memory before webdataset sees a byte. Return the stream itself, response["Body"], so that the '
        "shard is read piece by piece as it arrives.",
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
    attempts, backoff_s = 9, 0.002  # waits of at most 2, 4, 8, ..., 256 ms: 0.5 s in all, half that with jitter
    with _proxy(proxy) as p, _waits(getattr(fn, "__globals__", {})) as waits:
        p.fail_next(100)
        try:
            fn(url, attempts, backoff_s)
        except Exception as exc:  # what the learner raises is theirs to choose
            message = str(exc)
        else:
            raise Hint(
                "every request failed, yet your function returned: after the last attempt, raise an error "
                "(e.g. object_store.ObjectReadError(url, attempts, error))."
            )
        sent = p.requests
    require(
        sent != attempts + 1,
        f"with attempts={attempts} the proxy saw {sent} requests, one too many: try exactly `attempts` times in all, "
        "for attempt in range(1, attempts + 1).",
    )
    require(
        sent <= attempts,
        f"with attempts={attempts} the proxy saw {sent} requests: your client retries by itself (boto3's "
        "default does, up to 5 tries a request). Use object_store.s3_client(), which tries once, so that your loop "
        "counts every attempt.",
    )
    require(sent == attempts, f"with attempts={attempts} the proxy saw {sent} requests: try exactly `attempts` times.")
    rest = message.replace(url, " ")
    require(
        url in message and re.search(rf"(?<![\w.]){attempts}(?![\w.])", rest) is not None,
        f"the error says {message[:160]!r}: name the object ({url}) and the number of attempts ({attempts}) in it, "
        "so the log says which shard failed and how hard it was tried.",
    )
    require(
        bool(waits),
        f"your function never called time.sleep between its {attempts} attempts: it did not wait, or it waited "
        "another way (a busy loop burns the core a loader needs). Wait backoff_s after the first failure, twice that "
        "after the second, and so on, a random share of it (full jitter): "
        "time.sleep(random.uniform(0, backoff_s * 2 ** (attempt - 1))).",
    )
    require(
        len(waits) in (attempts - 1, attempts),  # a wait after the last failure too costs time, no more
        f"{attempts} attempts, {attempts - 1} failures before the last one, but your function waited {len(waits)} "
        "time(s): wait after every failed attempt but the last, "
        "time.sleep(random.uniform(0, backoff_s * 2 ** (attempt - 1))).",
    )
    early, late = sum(waits[:3]), sum(waits[-3:])
    require(
        late > early + 3.5 * backoff_s,
        f"with backoff_s={backoff_s} your waits were {', '.join(f'{w * 1000:.1f}' for w in waits)} ms: they do not "
        "grow. Wait backoff_s after the first failure, twice that after the second, and so on, "
        "time.sleep(random.uniform(0, backoff_s * 2 ** (attempt - 1))) (full jitter; the cap itself works too): a throttled "
        "server needs the requests to thin out.",
    )


@contextlib.contextmanager
def _waits(namespace: dict[str, Any]) -> Iterator[list[float]]:
    """The seconds each ``time.sleep`` of this thread asked for in the block (it still sleeps them): called as
    ``time.sleep``, or by a name the answer's ``namespace`` bound to it (``from time import sleep``)."""
    real, me, seen = time.sleep, threading.get_ident(), []

    def sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            seen.append(float(seconds))
        real(seconds)

    aliases = [name for name, value in namespace.items() if value is real]
    time.sleep = sleep  # type: ignore[assignment]
    for name in aliases:
        namespace[name] = sleep
    try:
        yield seen
    finally:
        time.sleep = real  # type: ignore[assignment]
        for name in aliases:
            namespace[name] = real


_watched: list[dict[str, Any]] = []  # what the audit hook watches now: a cache folder, its budget, what it saw
_hooked: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook (PEP 578; once added it stays, so it does nothing unless 10.3's check watches a folder): a file
    opened for writing in the watched folder while the files already there plus the object being fetched exceed the
    budget, i.e. written before the eviction."""
    if event != "open" or not _watched or _watched[-1]["busy"]:
        return
    watch = _watched[-1]
    watch["busy"] = True
    try:
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & (os.O_WRONLY | os.O_RDWR))
        target = os.path.abspath(os.fsdecode(os.fspath(path)))
        if not writes or os.path.dirname(target) != watch["folder"]:
            return
        with os.scandir(watch["folder"]) as entries:
            kept = sum(e.stat().st_size for e in entries if e.is_file() and e.path != target)
        if kept + watch["incoming"] > watch["budget"]:
            watch["over"] = max(watch["over"], kept + watch["incoming"])
    except Exception:  # an audit hook must never break the open it watches
        pass
    finally:
        watch["busy"] = False


@contextlib.contextmanager
def _watch_writes(folder: Path, budget: int) -> Iterator[dict[str, Any]]:
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    watch = {"folder": os.path.abspath(folder), "budget": budget, "incoming": 0, "over": 0, "busy": False}
    _watched.append(watch)
    try:
        yield watch
    finally:
        _watched.remove(watch)


@exercise("10.3", "a cache within its budget: least recently used shards go first, files and counts agree.")
def shard_cache(cache_class: Callable[[Path, int], Any], urls: list[str], folder: Path) -> None:
    """``cache_class(folder, budget_bytes)`` makes a cache whose ``path(url)`` returns a local file with the object's
    bytes, fetching it on a miss and evicting the least recently used files beyond the budget; it counts ``hits``,
    ``misses`` and ``evicted``."""
    attempted(cache_class)
    with contextlib.ExitStack() as stack:
        _check_cache(cache_class, list(urls), Path(folder), stack)


def _check_cache(cache_class: Callable[[Path, int], Any], all_urls: list[str], folder: Path, stack: Any) -> None:
    urls = all_urls[:4]
    payloads = {url: object_store.read_object(url) for url in urls}
    budget = 3 * max(len(p) for p in payloads.values())
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    cache = cache_class(folder, budget)
    watch = stack.enter_context(_watch_writes(folder, budget))

    def fetch(url: str) -> None:
        watch["incoming"], watch["over"] = len(payloads[url]), 0
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
        require(
            not watch["over"],
            f"the folder ends within its budget, but while the new shard was written it held {watch['over']:,} "
            f"bytes, over the budget of {budget:,}: you write the new file first and evict afterwards, and a full "
            "disk fails right there. Evict first (while the kept files plus the new one exceed the budget), then "
            "write.",
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
    _two_evictions(cache_class, all_urls, folder, stack)


def _two_evictions(cache_class: Callable[[Path, int], Any], urls: list[str], folder: Path, stack: Any) -> None:
    """A shard that needs two others to go: a small x and some y are kept, then the largest z comes, with a budget
    that holds y + z less one byte. (Needs shards of two sizes; with all of one size one eviction always does.)"""
    sizes = {url: size for url, size in object_store.list_objects(urls[0].rsplit("/", 1)[0] + "/") if url in urls}
    if len(sizes) < 3 or len(set(sizes.values())) < 2:
        return
    z = max(sizes, key=sizes.get)
    x = min(sizes, key=sizes.get)
    y = next(url for url in sizes if url not in (x, z))
    budget = sizes[y] + sizes[z] - 1
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    cache = cache_class(folder, budget)
    watch = stack.enter_context(_watch_writes(folder, budget))
    for url in (x, y, z):
        watch["incoming"], watch["over"] = sizes[url], 0
        cache.path(url)
    left = {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()}
    used = sum(left.values())
    if used > budget and cache.evicted == 1:
        raise Hint(
            f"with a budget of {budget:,} bytes, two kept shards of {sizes[x]:,} and {sizes[y]:,} bytes and a new one "
            f"of {sizes[z]:,}, both old ones must go, but your cache evicted one and now holds {used:,} bytes: evict "
            "in a `while` loop, as long as the kept files plus the new one exceed the budget (an `if` evicts one).",
        )
    require(
        used <= budget and not watch["over"],
        f"with a budget of {budget:,} bytes and shards of {sizes[x]:,}, {sizes[y]:,} and {sizes[z]:,}, the folder "
        f"held {max(used, watch['over']):,} bytes: evict until the kept files plus the new one fit, then write.",
    )
    require(
        cache.evicted == 2,
        f"two shards had to go for the largest one, and your cache counted evicted={cache.evicted}: count each.",
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

    def pages_of_two(params: dict[str, Any], **_: Any) -> None:  # a bucket of a few shards, listed 2 keys a page
        params["MaxKeys"] = min(int(params.get("MaxKeys") or 1000), 2)

    with _on_client("before-parameter-build.s3.ListObjectsV2", pages_of_two):
        got = _shard_list(fn(prefix, 0, 0))
    require(
        not any(not u.endswith(".tar") for u in got),
        "the list has objects that are not shards (e.g. the producer's index.json): keep only keys ending in .tar.",
    )
    if len(got) < len(tars) and len(got) <= 2 and set(got) <= set(tars):
        raise Hint(
            f"{len(got)} shards returned, the bucket lists {len(tars)} under {prefix}: you read only the first "
            "page of the listing. One list_objects_v2 call returns at most 1,000 keys (the check makes it 2, to see "
            "it here): follow NextContinuationToken, use a paginator (client.get_paginator('list_objects_v2')), or "
            "object_store.list_objects(prefix), which does."
        )
    require(
        sorted(got) == tars,
        f"{len(got)} shards returned, the bucket lists {len(tars)} under {prefix}: list "
        "the prefix every time, and keep each shard once.",
    )
    require(
        _shard_list(fn(prefix, 0, 0)) == got,
        "two calls with the same (seed, epoch) gave different orders: draw the order "
        "from np.random.default_rng([seed, epoch]), not from global random state.",
    )
    rank = os.environ.get("RANK")
    os.environ["RANK"] = "1"
    try:
        other_rank = _shard_list(fn(prefix, 0, 0))
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
    orders = {tuple(_shard_list(fn(prefix, epoch, 0))) for epoch in range(6)}
    require(
        len(orders) >= 3,
        f"six epochs gave {len(orders)} different order(s) of {len(got)} shards: put the epoch into the seed.",
    )
    swapped = [((0, 1), (1, 0)), ((0, 2), (2, 0)), ((1, 2), (2, 1)), ((0, 3), (3, 0)), ((2, 3), (3, 2))]
    require(
        not all(_shard_list(fn(prefix, e1, s1)) == _shard_list(fn(prefix, e2, s2)) for (s1, e1), (s2, e2) in swapped),
        "seed 0 at epoch 1 gives the same order as seed 1 at epoch 0 (and so on for every seed + epoch): the "
        "seed you draw from adds them up, so two runs with neighbouring seeds replay each other's epochs. Give both "
        "to the generator, np.random.default_rng([seed, epoch]).",
    )
    new = add_shard()
    for _ in range(4):  # the cell run again: its add_shard starts over, at shards the first try put there already
        if new not in tars:
            break
        try:
            new = add_shard()
        except StopIteration:  # every shard it has is in the bucket already
            break
    now = sorted(url for url, _ in object_store.list_objects(prefix) if url.endswith(".tar"))
    grown = _shard_list(fn(prefix, 3, 0))
    require(
        new in grown,
        "a shard put into the bucket after the first call is missing from the next epoch: list "
        "the bucket inside the function, at every epoch, not once outside it.",
    )
    require(sorted(grown) == now, "the next epoch's list is not the grown bucket's shards.")


def _shard_list(out: Any) -> list[str]:
    """What epoch_shards returned as a list of URLs (a NumPy array of them too), or a :class:`Hint`."""
    require(out is not None, "epoch_shards returned None: return the list of shard URLs.")
    require(
        not isinstance(out, (str, bytes)) and hasattr(out, "__iter__"),
        f"epoch_shards returned {out!r:.80}: return the list of shard URLs.",
    )
    got = list(out)
    require(
        all(isinstance(u, str) and u.startswith("s3://") for u in got),
        f"epoch_shards returned {got[:2]!r}...: return s3:// URLs, as object_store.list_objects gives them "
        "(its items are (url, size) pairs).",
    )
    return [str(u) for u in got]
