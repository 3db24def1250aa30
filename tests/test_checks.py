"""course_lib.checks: the machinery, and notebooks 08-09; notebooks 01-07 and 11-14 have a test file each."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

from course_lib.checks import Status, exercise, require
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


# ----------------------------------------------------------------- the machinery


def test_a_check_prints_one_line_and_never_raises(capsys: pytest.CaptureFixture[str]) -> None:
    @exercise("99.1", "well done")
    def demo(answer):
        require(answer == 42, "the answer is 42")

    assert demo(42) is None
    assert capsys.readouterr().out == "✅ Exercise 99.1 solved: well done\n"
    demo(41)
    assert capsys.readouterr().out == "❌ Exercise 99.1 not yet: the answer is 42\n"


def test_outcomes_of_the_machinery() -> None:
    @exercise("99.2", "ok")
    def demo(fn):
        from course_lib.checks import attempted

        attempted(fn)
        require(fn() == 1, "return 1")

    def stub():
        raise NotImplementedError

    def broken():
        return 1 / 0

    assert demo.evaluate(...).status is Status.NOT_ATTEMPTED
    assert demo.evaluate(stub).status is Status.NOT_ATTEMPTED
    crashed = demo.evaluate(broken)
    assert crashed.status is Status.WRONG and "ZeroDivisionError: division by zero" in crashed.message
    assert demo.evaluate(lambda: 2).message == "return 1"
    assert demo.evaluate(lambda: 1).passed


# --------------------------------------------------------------------------- notebook 08

from torch.utils.data import IterableDataset

from course_lib import iterable
from course_lib.checks import nb08


class _Stream08(IterableDataset):
    """Exercise 08.1's answers, right and wrong; ``share(n, info)`` is what ``__iter__`` yields."""

    share = staticmethod(lambda n, info: range(n) if info is None else range(info.id, n, info.num_workers))

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(self.share(self.n, get_worker_info()))


def _stream(share):
    return type("ShardedRange", (_Stream08,), {"share": staticmethod(share)})


def _stub_stream(n, info):
    raise NotImplementedError


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_08_sharded_stream() -> None:
    assert status(nb08.sharded_stream, _Stream08)[0] is Status.SOLVED
    blocks = _stream(
        lambda n, info: range(n) if info is None else iterable.contiguous_share(n, info.id, info.num_workers)
    )
    assert status(nb08.sharded_stream, blocks)[0] is Status.SOLVED
    assert status(nb08.sharded_stream, ...)[0] is Status.NOT_ATTEMPTED
    assert status(nb08.sharded_stream, _stream(_stub_stream))[0] is Status.NOT_ATTEMPTED
    assert "every worker yielded all" in status(nb08.sharded_stream, _stream(lambda n, info: range(n)))[1]
    no_none = _stream(lambda n, info: range(info.id, n, info.num_workers))
    assert "returns None" in status(nb08.sharded_stream, no_none)[1]
    floor_blocks = _stream(
        lambda n, info: (
            range(n)
            if info is None
            else range(info.id * (n // info.num_workers), (info.id + 1) * (n // info.num_workers))
        )
    )
    assert "never arrived" in status(nb08.sharded_stream, floor_blocks)[1]
    overlap = _stream(lambda n, info: range(n) if info is None else range(info.id, n))
    assert "more than once" in status(nb08.sharded_stream, overlap)[1]
    pairs = _stream(lambda n, info: [(i, 0) for i in range(n)])
    assert "ints 0..n-1" in status(nb08.sharded_stream, pairs)[1]
    assert "class itself" in status(nb08.sharded_stream, _Stream08(3))[1]
    outside = _stream(lambda n, info: range(1, n + 1))
    assert "outside" in status(nb08.sharded_stream, outside)[1]


def _batches08(n, batch_size, num_workers, drop_last):
    return len(iterable.epoch_batch_sizes(n, batch_size, num_workers, drop_last))


def ranked_stream(
    perm_seed=lambda s: [s.seed, s.epoch],
    noise_seed=lambda s, w: [s.seed, s.epoch, s.rank, w],
    share=lambda s, w, workers: s.rank * workers + w,
    total=lambda s, workers: s.world_size * workers,
    global_noise=False,
    shuffle=True,
    set_epoch=True,
    stub=False,
):
    """Exercise 08.2's answer (the notebook's solution with the defaults), and its wrong forms through the keywords."""

    class RankedStream(IterableDataset):
        def __init__(self, n, rank, world_size, seed=0):
            self.n, self.rank, self.world_size, self.seed, self.epoch = n, rank, world_size, seed, 0

        def __iter__(self):
            if stub:
                raise NotImplementedError
            info = get_worker_info()
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            order = np.random.default_rng(perm_seed(self)).permutation(self.n) if shuffle else np.arange(self.n)
            noise = np.random.default_rng(noise_seed(self, worker))
            for i in order[share(self, worker, workers) :: total(self, workers)].tolist():
                yield i, float(np.random.random() if global_noise else noise.random())

    if set_epoch:
        RankedStream.set_epoch = lambda self, epoch: setattr(self, "epoch", epoch)
    return RankedStream


def test_08_ranked_stream() -> None:
    check = nb08.ranked_stream
    assert status(check, ranked_stream())[0] is Status.SOLVED
    assert status(check, ranked_stream(share=lambda s, w, workers: w * s.world_size + s.rank))[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, ranked_stream(stub=True))[0] is Status.NOT_ATTEMPTED
    assert (
        "every rank yielded the same"
        in status(check, ranked_stream(share=lambda s, w, workers: w, total=lambda s, workers: workers))[1]
    )
    assert (
        "every worker yielded all"
        in status(check, ranked_stream(share=lambda s, w, workers: s.rank, total=lambda s, workers: s.world_size))[1]
    )
    assert "different permutations" in status(check, ranked_stream(perm_seed=lambda s: [s.seed, s.epoch, s.rank]))[1]
    assert (
        "epochs 0 and 1"
        in status(check, ranked_stream(perm_seed=lambda s: [s.seed], noise_seed=lambda s, w: [s.seed, s.rank, w]))[1]
    )
    assert "rank, worker" in status(check, ranked_stream(noise_seed=lambda s, w: [s.seed, s.epoch, w]))[1]
    assert "not from the global ones" in status(check, ranked_stream(global_noise=True))[1]
    assert "order 0, 1, 2" in status(check, ranked_stream(shuffle=False))[1]
    assert "set_epoch(epoch) method" in status(check, ranked_stream(set_epoch=False))[1]


def test_08_batches_per_epoch() -> None:
    assert status(nb08.batches_per_epoch, _batches08)[0] is Status.SOLVED
    assert status(nb08.batches_per_epoch, ...)[0] is Status.NOT_ATTEMPTED
    assert "len(loader)" in status(nb08.batches_per_epoch, lambda n, b, w, d: n // b if d else math.ceil(n / b))[1]
    per_worker = lambda n, b, w, d: sum(
        (s // b if d else math.ceil(s / b)) for s in [n // w + (i < n % w) for i in range(w)]
    )
    assert "num_workers=0" in status(nb08.batches_per_epoch, per_worker)[1]

    def ceil_shares(n, b, w, d):
        k = max(w, 1)
        per = math.ceil(n / k)
        return k * (per // b if d else math.ceil(per / b))

    assert "not every share" in status(nb08.batches_per_epoch, ceil_shares)[1]
    assert "drops its own short" in status(nb08.batches_per_epoch, lambda n, b, w, d: _batches08(n, b, w, False))[1]
    assert "whole number" in status(nb08.batches_per_epoch, lambda n, b, w, d: _batches08(n, b, w, d) + 0.5)[1]
    assert "whole number" in status(nb08.batches_per_epoch, lambda n, b, w, d: "3")[1]
    assert (
        "the loader yields" in status(nb08.batches_per_epoch, lambda n, b, w, d: _batches08(n, b, w, d) + (n == 100))[1]
    )


def test_08_eviction_policy() -> None:
    from course_lib.growing import evict_oldest

    assert status(nb08.eviction_policy, evict_oldest)[0] is Status.SOLVED
    assert status(nb08.eviction_policy, ...)[0] is Status.NOT_ATTEMPTED
    assert "newest" in status(nb08.eviction_policy, lambda e, b: evict_oldest(e[::-1], b))[1]
    by_count = lambda e, b: [name for name, _ in e[: max(0, len(e) - b // 100)]]
    assert "add up bytes, not files" in status(nb08.eviction_policy, by_count)[1]
    assert "delete nothing" not in status(nb08.eviction_policy, lambda e, b: [])[1]
    assert "Keep deleting" in status(nb08.eviction_policy, lambda e, b: [])[1]
    assert (
        "only the names" in status(nb08.eviction_policy, lambda e, b: [x for x in e if x[0] in evict_oldest(e, b)])[1]
    )
    assert "returned None" in status(nb08.eviction_policy, lambda e, b: None)[1]
    assert "not names" in status(nb08.eviction_policy, lambda e, b: ["x"] if e else [])[1]
    assert "twice" in status(nb08.eviction_policy, lambda e, b: evict_oldest(e, b) * 2 if evict_oldest(e, b) else [])[1]
    everything = lambda e, b: [name for name, _ in e]
    assert "is enough" in status(nb08.eviction_policy, everything)[1]
    biggest_first = lambda e, b: evict_oldest(sorted(e, key=lambda x: -x[1]), b)
    assert "the oldest-first choice is" in status(nb08.eviction_policy, biggest_first)[1]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_08_checks_leave_the_learners_random_state_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    nb08.batches_per_epoch.evaluate(_batches08)
    nb08.sharded_stream.evaluate(_Stream08)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------- notebook 09

import warnings

import webdataset as wds

from course_lib import shards as shards09
from course_lib.checks import nb09


@pytest.fixture(scope="module")
def val09(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> shards09.ShardSet:
    """The tiny set's 20 validation images in 4 shards of 5."""
    return shards09.write_image_shards(
        tmp_path_factory.mktemp("nb09") / "val", split="val", size="tiny", root=tiny_root, maxcount=5
    )


def _loader09(
    urls,
    batch_size,
    *,
    workers=2,
    loader_batch=None,
    in_workers=True,
    unbatch=True,
    shuffle=True,
    rebatch=True,
    decode="torchrgb",
    fields=("jpg", "cls"),
    labels=None,
    resampled=False,
    workersplitter=wds.split_by_worker,
    final=None,
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = wds.WebDataset(
            urls, shardshuffle=False if resampled else 10, seed=0, resampled=resampled, workersplitter=workersplitter
        )
    ds = ds.shuffle(20, seed=0).decode(decode).to_tuple(*fields)
    if labels is not None:
        ds = ds.map_tuple(lambda x: x, labels)
    if in_workers:
        ds = ds.batched(batch_size)
    loader = wds.WebLoader(ds, num_workers=workers, batch_size=loader_batch)
    if unbatch:
        loader = loader.unbatched()
    if shuffle:
        loader = loader.shuffle(20, seed=0)
    if rebatch:
        loader = loader.batched(final or batch_size)
    return loader


def _wrong09(val09, **kwargs) -> str:
    result = nb09.make_loader.evaluate(lambda u, b: _loader09(u, b, **kwargs), val09)
    assert result.status is Status.WRONG, result
    return result.message


@pytest.mark.timeout(120)  # the loaders start worker processes
def test_09_make_loader(val09) -> None:
    assert status(nb09.make_loader, _loader09, val09)[0] is Status.SOLVED
    assert status(nb09.make_loader, ..., val09)[0] is Status.NOT_ATTEMPTED
    assert status(nb09.make_loader, lambda u, b: ..., val09)[0] is Status.NOT_ATTEMPTED

    def stub(urls, batch_size):
        raise NotImplementedError

    assert status(nb09.make_loader, stub, val09)[0] is Status.NOT_ATTEMPTED
    assert "return loader" in status(nb09.make_loader, lambda u, b: None, val09)[1]
    assert "WebLoader" in status(nb09.make_loader, lambda u, b: wds.WebDataset(u, shardshuffle=False), val09)[1]
    assert "num_workers=0" in _wrong09(val09, workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about 3 workers on 2 cores: the point of the hint
        assert "2 workers at most" in _wrong09(val09, workers=3)
    assert "batch_size=None" in _wrong09(val09, loader_batch=4)
    assert "does not batch in the workers" in _wrong09(val09, in_workers=False)
    assert "never unbatches" in _wrong09(val09, unbatch=False, shuffle=False)
    assert "nothing shuffles" in _wrong09(val09, shuffle=False)
    assert "add .batched(batch_size)" in _wrong09(val09, rebatch=False)
    assert "came twice" in _wrong09(val09, workersplitter=None)
    assert "resampled" in _wrong09(val09, resampled=True)
    assert "torchrgb" in _wrong09(val09, decode="pil")
    assert "(images, labels)" in _wrong09(val09, fields=("jpg", "cls", "json"))
    assert "not full" in _wrong09(val09, final=3)
    assert "labels do not match" in _wrong09(val09, labels=lambda y: 0)


def test_09_shards_needed() -> None:
    assert status(nb09.shards_needed, lambda w, k: w * max(1, k))[0] is Status.SOLVED
    assert status(nb09.shards_needed, ...)[0] is Status.NOT_ATTEMPTED
    assert "main process reads" in status(nb09.shards_needed, lambda w, k: w * k)[1]
    assert "split its shards again" in status(nb09.shards_needed, lambda w, k: w)[1]
    assert "each of the" in status(nb09.shards_needed, lambda w, k: max(1, k))[1]
    assert "multiply" in status(nb09.shards_needed, lambda w, k: w + k if k else w)[1]
    assert "more than needed" in status(nb09.shards_needed, lambda w, k: 2 * w * max(1, k))[1]
    assert "whole number" in status(nb09.shards_needed, lambda w, k: w * max(1, k) / 1)[1]
    assert "webdataset needs" in status(nb09.shards_needed, lambda w, k: w * max(1, k) - (w == 8))[1]


def _epoch09(n, b, w, on):
    return n if on == "loader" or w == 0 else n // w


def test_09_with_epoch_value() -> None:
    assert status(nb09.with_epoch_value, _epoch09)[0] is Status.SOLVED
    assert status(nb09.with_epoch_value, ...)[0] is Status.NOT_ATTEMPTED
    assert "not samples" in status(nb09.with_epoch_value, lambda n, b, w, on: _epoch09(n, b, w, on) * b)[1]
    assert "counts per worker" in status(nb09.with_epoch_value, lambda n, b, w, on: n)[1]
    assert (
        "per worker is per rank"
        in status(
            nb09.with_epoch_value,
            lambda n, b, w, on: n // max(1, w) if on == "dataset" and w else (0 if on == "dataset" else n),
        )[1]
    )
    assert "whole rank's epoch" in status(nb09.with_epoch_value, lambda n, b, w, on: n // max(1, w))[1]
    assert (
        "whole number" in status(nb09.with_epoch_value, lambda n, b, w, on: n / max(1, w) if on == "dataset" else n)[1]
    )


class _FailsAtZero(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 0:
            raise ValueError("sample 0 is broken")
        return index


def rank_loader(node=True, worker=True, epoch_on="loader", seed="epoch", rebatch=True):
    """Exercise 09.4's answer (the notebook's solution with the defaults), and its wrong forms through the keywords:
    ``seed`` is "epoch" (every shuffle), "shards" (the shard shuffle only), a number (the epoch ignored) or None."""

    def fn(urls, batch_size, steps, epoch):
        shard_seed = epoch if seed in ("epoch", "shards") else seed
        buffer_seed = epoch if seed == "epoch" else (0 if seed == "shards" else seed)
        options = dict(shardshuffle=100, seed=shard_seed, workersplitter=wds.split_by_worker if worker else None)
        if node:
            options["nodesplitter"] = wds.split_by_node
        dataset = (
            wds.WebDataset(urls, **options).shuffle(100, seed=buffer_seed).decode("torchrgb").to_tuple("jpg", "cls")
        )
        dataset = dataset.batched(batch_size)
        if epoch_on == "dataset":
            dataset = dataset.with_epoch(steps)
        loader = wds.WebLoader(dataset, num_workers=2, batch_size=None)
        if rebatch:
            loader = loader.unbatched().shuffle(200, seed=buffer_seed).batched(batch_size)
        return loader.with_epoch(steps) if epoch_on == "loader" else loader

    return fn


def test_09_rank_loader() -> None:
    check = nb09.rank_loader

    def stub(urls, batch_size, steps, epoch):
        raise NotImplementedError

    right_and_stubs(check, rank_loader(), stub)
    wrong = {
        "nodesplitter=wds.split_by_node": rank_loader(node=False),
        "workersplitter=wds.split_by_worker": rank_loader(worker=False),
        "counts each worker's batches": rank_loader(epoch_on="dataset"),
        "waiting in a collective": rank_loader(epoch_on=None),
        "rebatch to batch_size": rank_loader(rebatch=False),
        "your loader ignores `epoch`": rank_loader(seed=0),
        "a worker that holds a single shard": rank_loader(seed="shards"),
        "instead of leaving seed= out": rank_loader(seed=None),
    }
    for words, fn in wrong.items():
        outcome, message = status(check, fn)
        assert outcome is Status.WRONG and words in message, (words, message)


def test_drain_stops_the_workers_even_when_a_worker_fails() -> None:
    """Left to the garbage collector, the workers of a failed pass outlive the check, and stop in a later cell."""
    import multiprocessing

    from course_lib.checks._core import drain

    assert [b.tolist() for b in drain(torch.utils.data.DataLoader(range(6), batch_size=2, num_workers=2))] == [
        [0, 1],
        [2, 3],
        [4, 5],
    ]
    loader = torch.utils.data.DataLoader(_FailsAtZero(), num_workers=2, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="sample 0 is broken"):
        drain(loader)
    assert multiprocessing.active_children() == []


class _Persistent08(torch.utils.data.IterableDataset):
    """Exercise 08.4's answer (the notebook's solution with the defaults), and its wrong forms through the keywords."""

    def __init__(self, n, seed, shared=True, split=True, rng="seeded", with_epoch=True):
        self.n, self.seed, self.shared, self.split, self.rng, self.with_epoch = n, seed, shared, split, rng, with_epoch
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_() if shared else 0

    def set_epoch(self, epoch):
        if self.shared:
            self.epoch.fill_(epoch)
        else:
            self.epoch = epoch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None or not self.split else (info.id, info.num_workers)
        key = [self.seed, int(self.epoch)] if self.with_epoch else [self.seed]
        order = (np.random.default_rng(key) if self.rng == "seeded" else np.random.default_rng()).permutation(self.n)
        return iter(order[worker::workers].tolist())


def _persistent(**wrong):
    return lambda n, seed: _Persistent08(n, seed, **wrong)


@pytest.mark.timeout(120)
def test_persistent_stream() -> None:
    def stub(n, seed):
        raise NotImplementedError

    assert status(nb08.persistent_stream, _persistent())[0] is Status.SOLVED
    assert status(nb08.persistent_stream, ...)[0] is Status.NOT_ATTEMPTED
    assert status(nb08.persistent_stream, stub)[0] is Status.NOT_ATTEMPTED
    wrong = {
        "share_memory_": dict(shared=False),
        "arrived more than once": dict(split=False),
        "global random state": dict(rng="global"),
        "seed the permutation with the epoch": dict(with_epoch=False),
    }
    for words, kw in wrong.items():
        outcome, message = status(nb08.persistent_stream, _persistent(**kw))
        assert outcome is Status.WRONG and words in message, (words, message)


def test_stop_workers_reaches_torchs_own_clean_up() -> None:
    """``checks._core.stop_workers`` calls torch's private ``_shutdown_workers`` through ``getattr``: a torch that
    renamed it would silently leave the checks' worker processes running. Its iterators still have it, and it stops
    persistent workers at once."""
    import torch.utils.data.dataloader as dataloader
    from torch.utils.data import DataLoader

    from course_lib.checks._core import stop_workers

    assert callable(getattr(dataloader._MultiProcessingDataLoaderIter, "_shutdown_workers", None)), torch.__version__
    batches = iter(DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True))
    next(batches)
    worker = batches._workers[0]
    stop_workers(batches)
    worker.join(timeout=10)
    assert not worker.is_alive()
