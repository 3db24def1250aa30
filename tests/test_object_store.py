"""course_lib.object_store against a real S3 server (SeaweedFS on 127.0.0.1) and a proxy that fails as told."""

from __future__ import annotations

import io
import random
import tarfile
import threading
import time
from pathlib import Path

import pytest

from course_lib import object_store as store
from course_lib import s3server

pytestmark = [pytest.mark.full, pytest.mark.timeout(120)]


def _shard(path: Path, keys: list[str]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key in keys:
            for ext, payload in (("txt", key.encode() * 1000), ("cls", key[-1].encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("store")
    with s3server.S3Server(folder / "s3") as running:
        paths = [_shard(folder / f"shard-{s:02d}.tar", [f"s{s:02d}k{k}" for k in range(3)]) for s in range(6)]
        s3server.upload(running, paths, "course", "train/")
        yield running


@pytest.fixture
def learner(server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch) -> s3server.S3Server:
    for name, value in server.environment("learner").items():
        monkeypatch.setenv(name, value)
    return server


def _via(proxy: s3server.Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


def test_list_and_read(learner: s3server.S3Server) -> None:
    listed = store.list_objects("s3://course/train/")
    assert [url for url, _ in listed] == [f"s3://course/train/shard-{s:02d}.tar" for s in range(6)]
    assert len(store.read_object(listed[0][0])) == listed[0][1]
    with pytest.raises(FileNotFoundError, match="no such object"):
        store.read_object("s3://course/train/missing.tar")
    with pytest.raises(ValueError, match="expected s3://bucket/key"):
        store.split_url("course/train/shard-00.tar")


def test_webdataset_reads_the_bucket_through_the_registered_scheme(learner: s3server.S3Server) -> None:
    import webdataset as wds

    store.register_s3_scheme()
    urls = [url for url, _ in store.list_objects("s3://course/train/")]
    keys = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]
    assert keys == [f"s{s:02d}k{k}" for s in range(6) for k in range(3)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_of_every_start_method_read_the_bucket(learner: s3server.S3Server, method: str) -> None:
    """A spawn worker starts a fresh interpreter: without register_in_worker its webdataset knows no s3://."""
    import torch.multiprocessing as mp
    import webdataset as wds
    from torch.utils.data import DataLoader

    store.register_s3_scheme()
    urls = [url for url, _ in store.list_objects("s3://course/train/")]
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False, workersplitter=wds.split_by_worker).to_tuple(
        "__key__"
    )
    loader = DataLoader(
        pipeline,
        batch_size=None,
        num_workers=2,
        worker_init_fn=store.register_in_worker,
        multiprocessing_context=mp.get_context(method),
    )
    assert sorted(key for (key,) in loader) == sorted(f"s{s:02d}k{k}" for s in range(6) for k in range(3))
    if method == "spawn":  # the negative control: without it, a spawn worker's webdataset cannot open s3://
        bare = DataLoader(pipeline, batch_size=None, num_workers=1, multiprocessing_context=mp.get_context(method))
        with pytest.raises(Exception, match="s3"):
            list(bare)


def test_read_object_retries_a_503_and_a_cut_connection(learner: s3server.S3Server, monkeypatch) -> None:
    url = "s3://course/train/shard-01.tar"
    whole = store.read_object(url)
    with s3server.Proxy(learner.endpoint) as proxy:
        _via(proxy, monkeypatch)
        proxy.fail_next(2)
        assert store.read_object(url) == whole and proxy.requests == 3
        proxy.cut_next(1, after_bytes=1000)
        assert store.read_object(url) == whole and proxy.requests == 5
        proxy.fail_next(10)
        with pytest.raises(
            store.ObjectReadError, match=r"shard-01.tar: not read whole after 3 attempts; the last error"
        ):
            store.read_object(url, attempts=3, backoff_s=0.01)


def test_an_outage_mid_epoch_reads_every_shard_exactly_once_or_names_the_shard(learner: s3server.S3Server) -> None:
    urls = [url for url, _ in store.list_objects("s3://course/train/")]
    read, back = [], threading.Timer(0.3, learner.start)
    for i, url in enumerate(urls):
        if i == 2:  # the server goes down, and comes back 0.3 s later, while the reader waits between attempts
            learner.stop()
            back.start()
        read.append(store.read_object(url, attempts=8, backoff_s=0.05, rng=random.Random(0)))
    back.join(timeout=60)  # S3 answers a moment before the restart is done: stopping it now would cut that short
    assert [len(r) for r in read] == [size for _, size in store.list_objects("s3://course/train/")]
    learner.stop()
    try:
        with pytest.raises(store.ObjectReadError, match=r"shard-03.tar: not read whole after 2 attempts"):
            store.read_object(urls[3], attempts=2, backoff_s=0.01)
    finally:
        learner.start()


def test_the_cache_keeps_its_budget_and_counts(learner: s3server.S3Server, tmp_path: Path) -> None:
    urls = [url for url, size in store.list_objects("s3://course/train/")]
    size = store.list_objects("s3://course/train/")[0][1]
    with pytest.raises(FileNotFoundError, match="create it first"):
        store.ShardCache(tmp_path / "missing", 10 * size)
    cache = store.ShardCache(tmp_path, budget_bytes=3 * size)
    for _ in range(2):  # two epochs over 4 shards, 3 fit: least recently used goes first
        for url in urls[:4]:
            assert cache.path(url).read_bytes() == store.read_object(url)
    assert (cache.hits, cache.misses, cache.evicted) == (0, 8, 5)
    assert cache.used <= 3 * size and len(list(tmp_path.iterdir())) == 3
    cache.path(urls[3])
    assert cache.hits == 1
    with pytest.raises(ValueError, match="more than the cache's whole budget"):
        store.ShardCache(tmp_path, budget_bytes=10).path(urls[0])


def _sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds each time.sleep of this thread asks for from now on (none is slept: the test runs at once)."""
    me, seen, real = threading.get_ident(), [], time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: seen.append(s) if threading.get_ident() == me else real(s))
    return seen


def test_read_object_backs_off_exponentially_with_full_jitter(learner: s3server.S3Server, monkeypatch) -> None:
    """After failure n it waits uniform(0, backoff_s * 2 ** (n - 1)), drawn from the rng it is given (AWS's full
    jitter): the waits repeat with a seed, differ between seeds, and are not the caps themselves."""
    url = "s3://course/train/shard-00.tar"
    with s3server.Proxy(learner.endpoint) as proxy:
        _via(proxy, monkeypatch)
        waits = _sleeps(monkeypatch)
        runs = {}
        for seed in (1, 1, 2):
            waits.clear()
            proxy.fail_next(100)
            with pytest.raises(store.ObjectReadError, match="after 6 attempts"):
                store.read_object(url, attempts=6, backoff_s=0.1, rng=random.Random(seed))
            runs.setdefault(seed, []).append(list(waits))
        caps = [0.1 * 2**k for k in range(5)]
        first = runs[1][0]
        assert len(first) == 5, "a wait after every failure but the last"
        assert all(0 <= w <= cap for w, cap in zip(first, caps)), (first, caps)
        expected = random.Random(1)
        assert first == [expected.uniform(0, cap) for cap in caps], "uniform(0, cap) from the given rng"
        assert runs[1][1] == first and runs[2][0] != first
        assert sum(first) < sum(caps) * 0.9, "jittered, not the caps"
        assert proxy.requests == 18
        waits.clear()  # without an rng: the module's own, unseeded, still within the caps
        proxy.fail_next(100)
        with pytest.raises(store.ObjectReadError):
            store.read_object(url, attempts=6, backoff_s=0.1)
        assert len(waits) == 5 and all(0 <= w <= cap for w, cap in zip(waits, caps)) and waits != first
        proxy.fail_next(0)
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        store.read_object(url, attempts=0)


def test_forked_workers_draw_their_own_waits() -> None:
    """The module's generator is seeded anew in a forked child: workers that a 503 refused together do not come
    back together (a plain random.Random() would hand every child its parent's sequence)."""
    import multiprocessing as mp

    def draw(queue) -> None:
        queue.put([store._JITTER.random() for _ in range(3)])

    context = mp.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=draw, args=(queue,)) for _ in range(2)]
    for child in children:
        child.start()
    draws = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert draws[0] != draws[1]


def test_cache_names_are_derived_from_the_whole_key(learner: s3server.S3Server, tmp_path: Path) -> None:
    """val/shard-00.tar and train/shard-00.tar get files of their own; a name by the key's last part alone (what
    webdataset 1.0.2's cache_dir does, webdataset#471) serves one for the other."""
    other = _shard(tmp_path / "val-00.tar", ["v00k0", "v00k1"])
    s3server.upload(learner, [other], "course", "val/", names=["shard-00.tar"])
    train, val = "s3://course/train/shard-00.tar", "s3://course/val/shard-00.tar"
    assert store.cache_name(train) != store.cache_name(val)
    assert store.cache_name(train).endswith("-shard-00.tar") and "/" not in store.cache_name(train)
    assert (
        store.cache_name("s3://b/a/b.tar") != store.cache_name("s3://b/a__b.tar") != store.cache_name("s3://c/a/b.tar")
    )
    (tmp_path / "key").mkdir()
    cache = store.ShardCache(tmp_path / "key", budget_bytes=10_000_000)
    assert cache.path(train).read_bytes() == store.read_object(train)
    assert cache.path(val).read_bytes() == other.read_bytes() and cache.misses == 2
    (tmp_path / "base").mkdir()
    by_basename = store.ShardCache(tmp_path / "base", 10_000_000, url_to_name=lambda url: url.rsplit("/", 1)[-1])
    by_basename.path(train)
    assert by_basename.path(val).read_bytes() == store.read_object(train), "the negative control: train's bytes"
    with pytest.raises(ValueError, match="one file name, without '/'"):
        store.ShardCache(tmp_path / "key", 10_000_000, url_to_name=lambda url: url[5:]).path(train)
    with pytest.raises(TypeError, match="url_to_name must be a function"):
        store.ShardCache(tmp_path / "key", 10_000_000, url_to_name="shard.tar")


def test_check_version_fetches_a_changed_object_again(learner: s3server.S3Server, tmp_path: Path, monkeypatch) -> None:
    """An object overwritten in the bucket: a plain cache serves its old copy; check_version=True sees the new ETag in
    one HEAD request, fetches the new bytes, and within the budget. Both versions have the same size."""
    old = _shard(tmp_path / "old.tar", ["a00k0", "a00k1"])
    new = _shard(tmp_path / "new.tar", ["b00k0", "b00k1"])
    assert old.stat().st_size == new.stat().st_size and old.read_bytes() != new.read_bytes()
    url = s3server.upload(learner, [old], "course", "changing/", names=["shard.tar"])[0]
    folders = [tmp_path / "plain", tmp_path / "checked"]
    for folder in folders:
        folder.mkdir()
    plain = store.ShardCache(folders[0], budget_bytes=old.stat().st_size)
    checked = store.ShardCache(folders[1], budget_bytes=old.stat().st_size, check_version=True)
    assert plain.path(url).read_bytes() == old.read_bytes() == checked.path(url).read_bytes()
    with s3server.Proxy(learner.endpoint) as proxy:
        _via(proxy, monkeypatch)
        assert checked.path(url).read_bytes() == old.read_bytes() and proxy.requests == 1, "a hit costs one HEAD"
        assert (checked.hits, checked.misses, checked.replaced) == (1, 1, 0)
        s3server.upload(learner, [new], "course", "changing/", names=["shard.tar"])
        proxy.reset_counts()
        assert plain.path(url).read_bytes() == old.read_bytes() and proxy.requests == 0, "stale: the old copy"
        assert checked.path(url).read_bytes() == new.read_bytes() and proxy.requests == 2, "a HEAD, then the GET"
        assert (checked.hits, checked.misses, checked.replaced, checked.evicted) == (1, 2, 1, 0)
        assert [f.name for f in folders[1].iterdir()] == [store.cache_name(url)] and checked.used == new.stat().st_size
        assert checked.path(url).read_bytes() == new.read_bytes() and checked.hits == 2


@pytest.mark.timeout(240)
def test_two_ranks_read_the_bucket_every_sample_once_per_epoch_each_epoch_new(
    learner: s3server.S3Server, tmp_path: Path
) -> None:
    """A real 2-rank torchrun job, 2 workers per rank, reads the bucket for 3 epochs with notebook 09's reader: every
    sample exactly once per epoch over both ranks, and each epoch in a new order on every rank."""
    from course_lib.distributed import read_reports
    from course_lib.jobs import launch

    urls = "s3://course/train/shard-{00..05}.tar"
    launch(
        "course_lib.shard_reader",
        "--urls",
        urls,
        "--workers",
        "2",
        "--batch-size",
        "3",
        "--epochs",
        "3",
        "--buffer",
        "5",
        "--report",
        str(tmp_path / "r"),
        nproc=2,
        timeout=180,
        show=False,
    )
    reports = read_reports(tmp_path / "r")
    everything = sorted(f"s{s:02d}k{k}" for s in range(6) for k in range(3))
    orders = []
    for epoch in range(3):
        keys = [k for r in reports for ks in r["epochs"][epoch]["keys_by_worker"].values() for k in ks]
        assert sorted(keys) == everything, f"epoch {epoch}: every sample exactly once"
        orders.append([k for ks in reports[0]["epochs"][epoch]["keys_by_worker"].values() for k in ks])
    assert len({tuple(o) for o in orders}) == 3, "rank 0 read two epochs alike"


def test_read_many_keeps_the_order_and_its_requests_in_flight(learner: s3server.S3Server) -> None:
    urls = [url for url, _ in store.list_objects("s3://course/train/")] * 2
    expected = [store.read_object(url) for url in urls]
    with s3server.Proxy(learner.endpoint, latency_s=0.02) as proxy, store.using_endpoint(proxy.endpoint):
        assert store.read_many(urls, in_flight=4) == expected
        assert proxy.peak_in_flight == 4 and proxy.requests == len(urls)
        proxy.reset_counts()
        assert store.read_many(urls, in_flight=1) == expected and proxy.peak_in_flight == 1
    with pytest.raises(ValueError, match="in_flight must be >= 1"):
        store.read_many(urls, in_flight=0)


def test_using_endpoint_restores_the_endpoint(learner: s3server.S3Server) -> None:
    import os

    before = os.environ["AWS_ENDPOINT_URL"]
    with store.using_endpoint("http://127.0.0.1:9"):
        assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert os.environ["AWS_ENDPOINT_URL"] == before


def test_cat_writes_the_object_for_a_pipe_url(learner: s3server.S3Server) -> None:
    import subprocess
    import sys

    url = "s3://course/train/shard-02.tar"
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.object_store", "cat", url], capture_output=True, timeout=60, check=True
    )
    assert done.stdout == store.read_object(url)
    missing = subprocess.run(
        [sys.executable, "-m", "course_lib.object_store", "cat", "s3://course/train/no.tar"],
        capture_output=True,
        timeout=60,
    )
    assert missing.returncode != 0 and b"NoSuchKey" in missing.stderr
