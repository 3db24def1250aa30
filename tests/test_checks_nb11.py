"""The checks of notebook 11: right answers pass, stubs are 'not attempted', wrong ones get a specific hint."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from course_lib import alternatives as alt
from course_lib import data
from course_lib.further import highrate
from course_lib.checks import Status, nb11
from exercise_status import right_and_stubs, status
from course_tools.bench import write_mds

pytestmark = pytest.mark.quick

N = 40


@pytest.fixture(scope="module")
def mds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    items = alt.image_items(data.prepare_data(progress=False), "train", limit=N)
    return write_mds(items, tmp_path_factory.mktemp("mds") / "mds", size_limit=20_000)


@pytest.mark.timeout(120)
def test_mds_loader(mds: Path) -> None:
    def right(folder, batch_size):
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size, num_workers=2)

    def mismatched(folder, batch_size):
        return DataLoader(alt.mds_images(folder, 4), batch_size=batch_size, num_workers=2)

    def no_workers(folder, batch_size):
        return DataLoader(alt.mds_images(folder, batch_size), batch_size=batch_size)

    def stub(folder, batch_size):
        raise NotImplementedError

    assert nb11.mds_loader.evaluate(right, mds, N).passed
    result = nb11.mds_loader.evaluate(mismatched, mds, N)
    assert result.status is Status.WRONG and "same number" in result.message
    assert "num_workers=0" in nb11.mds_loader.evaluate(no_workers, mds, N).message
    assert "DataLoader" in nb11.mds_loader.evaluate(lambda f, b: list(right(f, b)), mds, N).message
    assert nb11.mds_loader.evaluate(stub, mds, N).status is Status.NOT_ATTEMPTED
    assert nb11.mds_loader.evaluate(..., mds, N).status is Status.NOT_ATTEMPTED


@pytest.mark.timeout(120)
def test_first_batches() -> None:
    def right(loader, n):
        return [b.clone() for b in itertools.islice(loader, n)]

    def views(loader, n):
        return list(itertools.islice(loader, n))

    def too_few(loader, n):
        return right(loader, n - 1)

    assert nb11.first_batches.evaluate(right).passed
    result = nb11.first_batches.evaluate(views)
    assert result.status is Status.WRONG and "clone" in result.message
    assert "got 3" in nb11.first_batches.evaluate(too_few).message
    assert nb11.first_batches.evaluate(...).status is Status.NOT_ATTEMPTED


def test_ring_bytes() -> None:
    def right(b, s, w, slots):
        return (slots or 2 * w + 1) * b * s

    assert nb11.ring_bytes.evaluate(right).passed
    assert "training loop" in nb11.ring_bytes.evaluate(lambda b, s, w, slots: 2 * w * b * s).message
    assert "one batch" in nb11.ring_bytes.evaluate(lambda b, s, w, slots: b * s).message
    assert "slots=2 was given" in nb11.ring_bytes.evaluate(lambda b, s, w, slots: (2 * w + 1) * b * s).message
    assert "whole" in nb11.ring_bytes.evaluate(lambda b, s, w, slots: right(b, s, w, slots) + 0.5).message
    assert nb11.ring_bytes.evaluate(...).status is Status.NOT_ATTEMPTED


def mapped_right(path, record_bytes, batch_size, shuffle=True, seed=0):
    return highrate.MappedBatches(path, record_bytes, batch_size, shuffle, seed)


class _Mapped:
    """A learner's MappedBatches with one knob turned wrong."""

    def __init__(self, path, record_bytes, batch_size, shuffle=True, seed=0, wrong=""):
        self.n, self.len = os.path.getsize(path) // record_bytes, record_bytes // 4
        self.records = torch.from_file(str(path), size=self.n * self.len).view(self.n, self.len)
        self.buffer = torch.empty(batch_size, self.len)
        self.batch_size, self.shuffle, self.seed, self.epoch, self.wrong = batch_size, shuffle, seed, 0, wrong

    def __len__(self):
        return self.n // self.batch_size if self.wrong == "drop_last" else -(-self.n // self.batch_size)

    def __iter__(self):
        seed = self.seed if self.wrong == "same_order" else self.seed + self.epoch
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(self.n, generator=g) if self.shuffle else torch.arange(self.n)
        self.epoch += 1
        for start in range(0, self.n, self.batch_size):
            rows = order[start:start + self.batch_size]
            if self.wrong == "fresh":
                yield self.records[rows]
            elif self.wrong == "numpy":
                yield self.records[rows].numpy()
            elif self.wrong == "offset":
                yield torch.index_select(self.records, 0, (rows + 1) % self.n, out=self.buffer[: len(rows)])
            elif self.wrong == "drop_last" and len(rows) < self.batch_size:
                return
            else:
                yield torch.index_select(self.records, 0, rows, out=self.buffer[: len(rows)])


def wrong_mapped(kind):
    return lambda *args, **kw: _Mapped(*args, **kw, wrong=kind)


@pytest.mark.timeout(60)
def test_mapped_batches() -> None:
    def stub(path, record_bytes, batch_size, shuffle=True, seed=0):
        raise NotImplementedError

    right_and_stubs(nb11.mapped_batches, mapped_right, stub)
    assert status(nb11.mapped_batches, wrong_mapped(""))[0] is Status.SOLVED
    expected = {"fresh": "Allocate one buffer", "same_order": "seed + epoch", "numpy": "torch tensors",
                "offset": "file order", "drop_last": "len() is 6"}
    for kind, words in expected.items():
        outcome, message = status(nb11.mapped_batches, wrong_mapped(kind))
        assert outcome is Status.WRONG and words in message, (kind, message)


def measure_right(make_batches, nbytes, step):
    start, start_cpu = time.perf_counter(), time.process_time()
    seen = 0
    for batch in make_batches():
        step(batch)
        seen += batch.numel() * batch.element_size()
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if seen != nbytes:
        raise RuntimeError(f"{seen} bytes delivered, {nbytes} expected")
    return nbytes / wall / 1e9, cpu / (nbytes / 1e9)


@pytest.mark.timeout(60)
def test_measure() -> None:
    def stub(make_batches, nbytes, step):
        raise NotImplementedError

    def gib(make_batches, nbytes, step):
        rate, cpu = measure_right(make_batches, nbytes, step)
        return rate * 1e9 / 2**30, cpu

    def wall_for_cpu(make_batches, nbytes, step):
        start = time.perf_counter()
        rate, _ = measure_right(make_batches, nbytes, step)
        return rate, (time.perf_counter() - start) / (nbytes / 1e9)

    def no_step(make_batches, nbytes, step):
        return measure_right(make_batches, nbytes, lambda batch: None)

    def unchecked(make_batches, nbytes, step):
        start, start_cpu = time.perf_counter(), time.process_time()
        for batch in make_batches():
            step(batch)
        return nbytes / (time.perf_counter() - start) / 1e9, (time.process_time() - start_cpu) / (nbytes / 1e9)

    right_and_stubs(nb11.measure, measure_right, stub)
    expected = {gib: "GiB/s", wall_for_cpu: "process_time", no_step: "step ran 0 times", unchecked: "no error"}
    for wrong, words in expected.items():
        outcome, message = status(nb11.measure, wrong)
        assert outcome is Status.WRONG and words in message, (wrong.__name__, message)
