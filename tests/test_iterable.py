"""course_lib.iterable: the streams behave as notebook 08 says, in real DataLoaders.

Sharding is tested in this process with torch's worker information set by hand (fast, so
hypothesis can try many cases), and in a few real DataLoaders with worker processes. The batch
arithmetic (``epoch_batch_sizes``) is held to real DataLoaders, also under hypothesis with few
examples, since every example starts worker processes.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from course_lib import iterable
from course_lib.checks.nb08 import as_worker
from course_lib.iterable import (
    BufferShuffled,
    EndlessStream,
    ImageStream,
    RangeStream,
    ShardedStream,
    buffer_shuffle,
    contiguous_share,
    count_copies,
    epoch_batch_sizes,
    loader_batches,
    split_range_per_worker,
    strided_share,
    worker_shares,
)

pytestmark = [
    pytest.mark.quick,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]


def numbers(loader) -> list[int]:
    return [int(i) for i in loader]


def in_workers(dataset_factory, num_workers: int) -> list[list]:
    """Iterate fresh copies of a dataset as each worker of ``num_workers``, in this process."""
    out = []
    for w in range(num_workers):
        ds = dataset_factory()
        with as_worker(w, num_workers, ds):
            out.append(list(ds))
    return out


# ------------------------------------------------------------------ shares


@given(n=st.integers(0, 200), k=st.integers(1, 9))
def test_shares_partition_the_range(n: int, k: int) -> None:
    for share in (contiguous_share, strided_share):
        parts = [list(share(n, w, k)) for w in range(k)]
        assert sorted(i for p in parts for i in p) == list(range(n))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == worker_shares(n, k)
    blocks = [list(contiguous_share(n, w, k)) for w in range(k)]
    assert [i for b in blocks for i in b] == list(range(n))  # consecutive blocks, in worker order


@pytest.mark.parametrize("args", [(-1, 0, 1), (5, 2, 2), (5, 0, 0), (5, -1, 2), (5.0, 0, 1), (True, 0, 1)])
def test_shares_reject_bad_arguments(args) -> None:
    with pytest.raises(ValueError):
        contiguous_share(*args)
    with pytest.raises(ValueError):
        strided_share(*args)


def test_unknown_sharding_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="sharding must be one of"):
        ShardedStream(5, "random")
    with pytest.raises(ValueError, match="n must be"):
        RangeStream(-1)
    with pytest.raises(ValueError, match="size must be"):
        list(buffer_shuffle(range(3), 0, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="lie in"):
        count_copies([0, 5], 3)


# ------------------------------------------------------------------ the pitfall and the fix, in this process


@given(
    n=st.integers(0, 60),
    k=st.integers(1, 4),
    sharding=st.sampled_from(["strided", "contiguous"]),
    shuffle=st.booleans(),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
def test_sharded_stream_yields_each_item_once_over_workers(n, k, sharding, shuffle, seed, epoch) -> None:
    def make():
        ds = ShardedStream(n, sharding, shuffle=shuffle, seed=seed)
        ds.set_epoch(epoch)
        return ds

    parts = in_workers(make, k)
    assert sorted(i for p in parts for i in p) == list(range(n))
    assert sorted(make()) == list(range(n))  # the main process alone takes everything
    assert len(make()) == n


@given(n=st.integers(1, 40), k=st.integers(2, 4))
def test_the_naive_stream_is_repeated_by_every_worker(n: int, k: int) -> None:
    parts = in_workers(lambda: RangeStream(n), k)
    assert all(p == list(range(n)) for p in parts)
    assert count_copies([i for p in parts for i in p], n).tolist() == [k] * n


def test_a_seed_per_worker_loses_and_repeats_samples() -> None:
    parts = in_workers(lambda: ShardedStream(12, shuffle=True, seed=0, seed_per_worker=True), 3)
    counts = count_copies([i for p in parts for i in p], 12)
    assert counts.sum() == 12 and counts.max() > 1 and (counts == 0).any()


def test_shuffle_changes_with_the_epoch_and_repeats_with_the_seed() -> None:
    a, b = ShardedStream(20, shuffle=True, seed=0), ShardedStream(20, shuffle=True, seed=0)
    assert list(a) == list(b) != list(range(20))
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(20))


@given(n=st.integers(0, 300), size=st.integers(1, 50), seed=st.integers(0, 5))
def test_buffer_shuffle_is_a_permutation_with_bounded_backward_moves(n: int, size: int, seed: int) -> None:
    out = list(buffer_shuffle(range(n), size, np.random.default_rng(seed)))
    assert sorted(out) == list(range(n))
    assert all(i - pos < size for pos, i in enumerate(out))  # an item moves back by less than the buffer
    if size == 1:
        assert out == list(range(n))


def test_buffer_shuffled_dataset_is_seeded_per_worker_and_epoch() -> None:
    make = lambda: BufferShuffled(ShardedStream(40), size=8, seed=0)
    parts = in_workers(make, 2)
    assert sorted(parts[0] + parts[1]) == list(range(40))
    ds = make()
    first = list(ds)
    assert list(make()) == first
    ds.set_epoch(1)
    assert ds.source.epoch == 1 and list(ds) != first and len(ds) == 40


def test_endless_stream_is_deterministic_per_worker() -> None:
    def take(worker: int, epoch: int = 0, count: int = 5):
        ds = EndlessStream(seed=0, dim=3)
        ds.set_epoch(epoch)
        with as_worker(worker, 2, ds):
            return list(itertools.islice(iter(ds), count))

    a, b = take(0), take(0)
    assert [s for _, _, s in a] == list(range(5)) and {w for _, w, _ in a} == {0}
    assert all(torch.equal(x, y) for (x, _, _), (y, _, _) in zip(a, b))
    assert not torch.equal(a[0][0], take(1)[0][0])
    assert not torch.equal(a[0][0], take(0, epoch=1)[0][0])
    with pytest.raises(TypeError):
        len(EndlessStream())


def test_endless_stream_differs_between_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded by (seed, epoch, worker) alone, every DDP rank would draw the very same batches."""

    def first(rank: str) -> torch.Tensor:
        monkeypatch.setenv("RANK", rank)
        return next(iter(EndlessStream(seed=0)))[0]

    assert torch.equal(first("1"), first("1"))
    assert not torch.equal(first("0"), first("1"))


def test_reprs_name_the_stream() -> None:
    assert repr(RangeStream(3)) == "RangeStream(start=0, stop=3)"
    assert "n=4" in repr(ShardedStream(4)) and "BufferShuffled" in repr(BufferShuffled(RangeStream(2), 2))


# ------------------------------------------------------------------ batch arithmetic


def _reference(n: int, b: int | None, k: int, drop_last: bool, sharded: bool = True) -> list[int]:
    """Brute force: run the fetcher rule per worker, interleave round robin."""
    shares = worker_shares(n, k, sharded=sharded)
    per = []
    for s in shares:
        items = list(range(s))
        if b is None:
            per.append([1] * s)
            continue
        batches = [items[i : i + b] for i in range(0, s, b)]
        per.append([len(x) for x in batches if len(x) == b or not drop_last])
    return [p[r] for r in range(max(map(len, per), default=0)) for p in per if r < len(p)]


@given(
    n=st.integers(0, 80),
    b=st.one_of(st.none(), st.integers(1, 12)),
    k=st.integers(0, 5),
    drop_last=st.booleans(),
    sharded=st.booleans(),
)
def test_epoch_batch_sizes_follow_the_per_worker_rule(n, b, k, drop_last, sharded) -> None:
    sizes = epoch_batch_sizes(n, b, k, drop_last, sharded=sharded)
    assert sizes == _reference(n, b, k, drop_last, sharded)
    assert sum(sizes) <= n * max(k, 1)


def test_epoch_batch_sizes_worked_examples() -> None:
    assert epoch_batch_sizes(10, 4, 0) == [4, 4, 2]
    assert epoch_batch_sizes(10, 4, 2) == [4, 4, 1, 1]
    assert epoch_batch_sizes(10, 4, 3) == [4, 3, 3]
    assert epoch_batch_sizes(10, 4, 3, drop_last=True) == [4]
    assert epoch_batch_sizes(10, 4, 2, sharded=False) == [4, 4, 4, 4, 2, 2]
    assert epoch_batch_sizes(0, 4, 3) == []
    with pytest.raises(ValueError):
        epoch_batch_sizes(10, 0, 2)


@pytest.mark.timeout(300)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 23),
    b=st.integers(1, 6),
    k=st.integers(0, 3),
    drop_last=st.booleans(),
    sharding=st.sampled_from(["strided", "contiguous"]),
)
def test_real_dataloader_matches_the_prediction_and_yields_each_item_once(n, b, k, drop_last, sharding) -> None:
    """Property test with real worker processes: few examples, as each one starts up to 3 workers."""
    batches = loader_batches(
        ShardedStream(n, sharding, with_worker=True),
        batch_size=b,
        num_workers=k,
        drop_last=drop_last,
        timeout=60 if k else 0,
    )
    assert [x.size for x in batches] == epoch_batch_sizes(n, b, k, drop_last)
    got = [i for x in batches for i in x.samples]
    assert len(got) == len(set(got))
    if not drop_last:
        assert sorted(got) == list(range(n))
    expected_workers = [-1] * len(batches) if k == 0 else None
    if expected_workers:
        assert [x.worker for x in batches] == expected_workers


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_real_dataloader_naive_vs_sharded_vs_worker_init_fn(k: int) -> None:
    wait = 60 if k else 0  # a timeout needs worker processes
    naive = numbers(DataLoader(RangeStream(12), batch_size=None, num_workers=k, timeout=wait))
    assert count_copies(naive, 12).tolist() == [max(k, 1)] * 12
    sharded = numbers(DataLoader(ShardedStream(12), batch_size=None, num_workers=k, timeout=wait))
    assert sorted(sharded) == list(range(12))
    if k:
        fixed = numbers(
            DataLoader(
                RangeStream(12), batch_size=None, num_workers=k, worker_init_fn=split_range_per_worker, timeout=60
            )
        )
        assert sorted(fixed) == list(range(12))


def test_split_range_per_worker_only_runs_in_workers() -> None:
    with pytest.raises(RuntimeError, match="worker_init_fn"):
        split_range_per_worker(0)


def test_batches_arrive_round_robin_with_short_ones_per_worker() -> None:
    batches = loader_batches(ShardedStream(10, "contiguous", with_worker=True), batch_size=4, num_workers=2, timeout=60)
    assert [(b.worker, b.samples) for b in batches] == [(0, (0, 1, 2, 3)), (1, (5, 6, 7, 8)), (0, (4,)), (1, (9,))]
    assert len(DataLoader(ShardedStream(10), batch_size=4)) == 3  # what len(loader) claims


def test_len_warning_fires_only_without_batching() -> None:
    def run(batch_size):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(RangeStream(6), batch_size=batch_size, num_workers=2, timeout=60)
            reported, received = len(loader), len(list(loader))
        return reported, received, [w for w in caught if "Length of IterableDataset" in str(w.message)]

    reported, received, caught = run(None)
    assert (reported, received, len(caught)) == (6, 12, 6)
    assert "RangeStream(start=0, stop=6)" in str(caught[0].message)
    reported, received, caught = run(4)
    assert (reported, received, caught) == (2, 4, [])


def test_shuffle_and_sampler_are_refused() -> None:
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(RangeStream(4), shuffle=True)


def test_one_iterator_continues_and_a_new_one_replays() -> None:
    loader = DataLoader(EndlessStream(seed=0), batch_size=4, num_workers=2, timeout=60)
    it = iter(loader)
    first = list(itertools.islice(it, 3))
    second = list(itertools.islice(it, 3))
    del it
    assert [(int(w[0]), int(s[0])) for _, w, s in first] == [(0, 0), (1, 0), (0, 4)]
    assert [(int(w[0]), int(s[0])) for _, w, s in second] == [(1, 4), (0, 8), (1, 8)]
    again = list(itertools.islice(loader, 3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))


def test_persistent_workers_keep_the_first_epoch() -> None:
    def orders(persistent: bool) -> int:
        ds = ShardedStream(12, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent, timeout=60)
        seen = set()
        for epoch in range(3):
            ds.set_epoch(epoch)
            seen.add(tuple(numbers(loader)))
        return len(seen)

    assert orders(False) == 3
    assert orders(True) == 1


def test_loader_batches_refuses_a_batch_mixing_workers() -> None:
    def mixed(batch):
        return torch.tensor([0, 1]), torch.tensor([0, 1])

    with pytest.raises(RuntimeError, match="mixes"):
        loader_batches(RangeStream(2, with_worker=True), batch_size=2, collate_fn=mixed)


# ------------------------------------------------------------------ real files


def test_image_stream_reads_each_file_once_over_workers(tiny_set: Path) -> None:
    from torchvision.transforms import v2

    stream = ImageStream(tiny_set, "train", transform=v2.PILToTensor())
    assert len(stream) == 80 and "shapes-tiny-seed0" in repr(stream)
    in_process = [int(y) for _, y in stream]
    labels = torch.cat([y for _, y in DataLoader(stream, batch_size=16, num_workers=2, timeout=60)])
    assert sorted(labels.tolist()) == sorted(in_process) and np.bincount(labels.numpy()).tolist() == [8] * 10
    shuffled = ImageStream(tiny_set, "train", shuffle=True, seed=1)
    parts = in_workers(lambda: ImageStream(tiny_set, "train", transform=v2.PILToTensor(), shuffle=True, seed=1), 3)
    assert sorted(int(y) for p in parts for _, y in p) == sorted(in_process)
    assert [int(y) for _, y in shuffled] != in_process


def test_plots_draw(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = iterable.plot_copies([(0, 0), (1, 0), (0, 1), (1, 1)], 2, title="t")
    assert len(ax.patches) == 4
    batches = loader_batches(ShardedStream(5, with_worker=True), batch_size=2)
    ax = iterable.plot_batches({"a": batches}, 2, title="t")
    assert len(ax.patches) == 3
    plt.close("all")
