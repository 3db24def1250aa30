"""course_lib.instrument: the recorder changes nothing it measures, and its timeline is consistent."""

from __future__ import annotations

import math
import traceback
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.transforms import v2

from course_lib.datasets import ImageFileDataset, InMemoryDataset
from course_lib.instrument import _MAIN, EpochRecord, InstrumentedLoader, timed_loader, plot_sweep, plot_timeline, sweep

pytestmark = [pytest.mark.quick, pytest.mark.timeout(120)]

AUGMENT = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip(), v2.PILToTensor()])


@pytest.fixture(scope="module")
def images(tiny_set: Path) -> ImageFileDataset:
    return ImageFileDataset(tiny_set, "train", transform=AUGMENT)


def _batches(loader, epochs: int = 1) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        len(ea) == len(eb) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(ea, eb))
        for ea, eb in zip(a, b)
    )


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_same_batches_in_the_same_order_as_a_plain_loader(images, num_workers: int, persistent: bool) -> None:
    kwargs = dict(batch_size=8, shuffle=True, num_workers=num_workers, persistent_workers=persistent)
    torch.manual_seed(0)  # random augmentations in the main process draw from the global generator
    plain = _batches(DataLoader(images, generator=torch.Generator().manual_seed(3), **kwargs), epochs=2)
    torch.manual_seed(0)
    loader = InstrumentedLoader(images, generator=torch.Generator().manual_seed(3), **kwargs)
    recorded = _batches(loader, epochs=2)
    assert _same(plain, recorded)
    assert len(loader.history) == 2 and all(e.complete for e in loader.history)


def _check_consistent(epoch: EpochRecord, n_samples: int, batch_size: int, workers: int) -> None:
    batches = epoch.batches
    assert [b.number for b in batches] == list(range(len(batches)))  # every batch recorded once, in order
    assert epoch.samples == n_samples and len(batches) == math.ceil(n_samples / batch_size)
    expected_workers = {_MAIN} if workers == 0 else set(range(workers))
    assert {b.worker for b in batches} <= expected_workers
    for b in batches:
        assert 0 <= b.start <= b.end, b  # worker times are on the same clock as the loop's
        assert b.requested <= b.received and b.step >= 0
        assert b.end <= b.received + 1e-3, b  # a batch is received after it was made
        assert b.step_end is not None and b.step_end <= epoch.end
    for w in expected_workers:  # one worker makes one batch at a time
        mine = sorted((b for b in batches if b.worker == w), key=lambda b: b.start)
        assert all(p.end <= q.start + 1e-6 for p, q in zip(mine, mine[1:]))
    for earlier, later in zip(batches, batches[1:]):  # the loop is sequential
        assert earlier.received <= earlier.step_end <= later.requested + 1e-9
    # the loop is always either waiting in next() or running its step: the two add up to the wall time
    assert math.isclose(epoch.waited + sum(b.step for b in batches), epoch.wall, rel_tol=1e-9, abs_tol=1e-9)
    assert epoch.stall_fraction == epoch.waited / epoch.wall
    assert all(0.0 <= share <= 1.0 + 1e-6 for share in epoch.worker_busy.values())
    assert epoch.first_batch_s == batches[0].received and batches[0].requested == 0.0


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_timeline_is_consistent(images, num_workers: int) -> None:
    loader = timed_loader(images, step_s=0.002, batch_size=16, num_workers=num_workers)
    epoch = loader.last
    _check_consistent(epoch, len(images), 16, num_workers)
    assert epoch.nbytes == sum(
        x.numel() * x.element_size() + y.numel() * y.element_size() for x, y in DataLoader(images, batch_size=16)
    )
    assert epoch.samples_per_s > 0 and epoch.mb_per_s > 0
    assert all(b.step >= 0.002 for b in epoch.batches)
    if num_workers:
        assert set(epoch.worker_started) == set(range(num_workers))  # start-up is visible per worker
        assert all(t >= 0 for t in epoch.worker_started.values())  # started for this epoch
        # the worker that made the first batch was up before it arrived (another may come up later, on a busy machine)
        assert epoch.worker_started[epoch.batches[0].worker] <= epoch.first_batch_s
    text = epoch.summary()
    assert "samples/s" in text and "waiting for data" in text


def test_persistent_workers_start_once(images) -> None:
    loader = timed_loader(images, epochs=3, batch_size=16, num_workers=2, persistent_workers=True, prefetch_factor=4)
    assert [bool(e.worker_started) for e in loader.history] == [True, False, False]
    fresh = timed_loader(images, epochs=2, batch_size=16, num_workers=2)
    assert [bool(e.worker_started) for e in fresh.history] == [True, True]
    for e in loader.history:
        _check_consistent(e, len(images), 16, 2)


def test_breaking_off_keeps_what_was_seen(images) -> None:
    loader = timed_loader(images, max_batches=2, batch_size=8, num_workers=0)
    assert not loader.last.complete and len(loader.last.batches) == 2
    assert loader.last.wall > 0


def test_bad_settings_give_torchs_error_at_once(images) -> None:
    with pytest.raises(ValueError, match="prefetch_factor"):
        InstrumentedLoader(images, num_workers=0, prefetch_factor=2)
    with pytest.raises(ValueError, match="num_workers"):
        InstrumentedLoader(images, num_workers=-1)
    with pytest.raises(ValueError, match="persistent_workers"):
        InstrumentedLoader(images, persistent_workers=True)
    with pytest.raises(RuntimeError, match="iterate over the loader first"):
        InstrumentedLoader(images).last


class _Broken(InMemoryDataset):
    def __getitem__(self, index: int):
        if index == 5:
            raise ValueError("bad record")
        return super().__getitem__(index)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_failing_sample_shows_the_original_error_and_its_index(num_workers: int) -> None:
    loader = InstrumentedLoader(
        _Broken(torch.arange(10)),
        batch_size=4,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    with pytest.raises(ValueError) as info:
        list(loader)
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "bad record" in text and "sample index 5" in text
    traceback.clear_frames(info.tb)  # its frames hold the loader's iterator: stop the worker now, not 5 s in a later gc


class _Counting(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_datasets_and_unbatched_loading(num_workers: int) -> None:
    plain = [int(v) for b in DataLoader(_Counting(20), batch_size=3, num_workers=num_workers) for v in b]
    loader = InstrumentedLoader(_Counting(20), batch_size=3, num_workers=num_workers)
    assert [int(v) for b in loader for v in b] == plain
    assert loader.last.samples == 20
    single = InstrumentedLoader(InMemoryDataset(torch.arange(6)), batch_size=None)
    assert [int(v) for v in single] == list(range(6)) and single.last.samples == 6


def _tag_dataset(worker_id: int) -> None:
    get_worker_info().dataset.tag = f"set by worker {worker_id}"


class _Tagged(InMemoryDataset):
    tag = "unset"

    def __getitem__(self, index: int):
        return self.tag


def test_worker_init_fn_sees_and_changes_the_real_dataset() -> None:
    loader = InstrumentedLoader(_Tagged(torch.arange(2)), batch_size=None, num_workers=1, worker_init_fn=_tag_dataset)
    assert list(loader) == ["set by worker 0"] * 2
    assert loader.dataset.tag == "unset" and loader.batch_size is None  # attributes are the inner loader's


@pytest.mark.timeout(180)
def test_works_under_spawn(tiny_set: Path) -> None:
    ds = ImageFileDataset(tiny_set, "val", transform=v2.PILToTensor())
    loader = InstrumentedLoader(ds, batch_size=10, num_workers=1, multiprocessing_context="spawn")
    assert sum(len(y) for _, y in loader) == len(ds) and loader.last.worker_started


def test_pin_memory(images) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when pinning is asked for without an accelerator
        loader = InstrumentedLoader(images, batch_size=16, pin_memory=True)
        x, _ = next(iter(loader))
    assert x.is_pinned() == torch.accelerator.is_available()


def test_pictures(images) -> None:
    loader = timed_loader(images, epochs=2, batch_size=16, num_workers=2, persistent_workers=True)
    fig = plot_timeline(loader)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["worker 1", "worker 0", "training loop"]
    fig = plot_timeline(timed_loader(images, batch_size=16).last, title="one lane")
    assert fig.axes[0].get_title() == "one lane"
    results = sweep(images, "num_workers", [0, 1], batch_size=16, prefetch_factor=2)
    assert list(results) == [0, 1] and all(r.complete for r in results.values())
    assert plot_sweep(results, "num_workers").axes
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_timeline([])


def test_whole_batches_of_indices_count_their_samples() -> None:
    from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

    ds = TensorDataset(torch.arange(64.0))  # indexing with a list returns the whole batch at once
    loader = InstrumentedLoader(ds, batch_size=None, sampler=BatchSampler(SequentialSampler(ds), 16, False))
    assert [len(b[0]) for b in loader] == [16] * 4 and loader.last.samples == 64


def test_positional_arguments_and_originals_are_kept() -> None:
    ds = InMemoryDataset(torch.arange(10))
    loader = InstrumentedLoader(ds, 4, False)
    assert loader.batch_size == 4 and len(loader) == 3
    assert loader.collate_fn is torch.utils.data.default_collate and loader.worker_init_fn is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_no_stale_start_after_a_skipped_error_or_the_end_of_a_stream(num_workers: int) -> None:
    import time

    class SlowFirst(_Counting):
        def __iter__(self):
            for v in super().__iter__():
                yield v

    loader = InstrumentedLoader(
        SlowFirst(12), batch_size=3, num_workers=num_workers, persistent_workers=num_workers > 0
    )
    list(loader)
    time.sleep(0.3)  # a gap between epochs must not count as loading time of the next epoch's first batch
    list(loader)
    # a start stamped before the gap would lie before this epoch began (negative), and its load would include the gap
    assert all(0 <= b.start and b.load <= b.received for b in loader.last.batches)
    assert all(share <= 1.0 + 1e-6 for share in loader.last.worker_busy.values())


def test_the_end_of_an_epoch_counts_as_waiting(images) -> None:
    epoch = timed_loader(images, batch_size=16, num_workers=1).last
    assert epoch.shutdown_s > 0 and epoch.waited > sum(b.wait for b in epoch.batches)
