"""The checks of notebook 09: right answers pass, stubs are 'not attempted', wrong ones get a specific hint."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from course_lib import alternatives as alt
from course_lib import data
from course_lib.checks import Status, nb09
from course_tools.bench import write_mds

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

    assert nb09.mds_loader.evaluate(right, mds, N).passed
    result = nb09.mds_loader.evaluate(mismatched, mds, N)
    assert result.status is Status.WRONG and "same number" in result.message
    assert "num_workers=0" in nb09.mds_loader.evaluate(no_workers, mds, N).message
    assert "DataLoader" in nb09.mds_loader.evaluate(lambda f, b: list(right(f, b)), mds, N).message
    assert nb09.mds_loader.evaluate(stub, mds, N).status is Status.NOT_ATTEMPTED
    assert nb09.mds_loader.evaluate(..., mds, N).status is Status.NOT_ATTEMPTED


@pytest.mark.timeout(120)
def test_first_batches() -> None:
    def right(loader, n):
        return [b.clone() for b in itertools.islice(loader, n)]

    def views(loader, n):
        return list(itertools.islice(loader, n))

    def too_few(loader, n):
        return right(loader, n - 1)

    assert nb09.first_batches.evaluate(right).passed
    result = nb09.first_batches.evaluate(views)
    assert result.status is Status.WRONG and "clone" in result.message
    assert "got 3" in nb09.first_batches.evaluate(too_few).message
    assert nb09.first_batches.evaluate(...).status is Status.NOT_ATTEMPTED


def test_ring_bytes() -> None:
    def right(b, s, w, slots):
        return (slots or 2 * w + 1) * b * s

    assert nb09.ring_bytes.evaluate(right).passed
    assert "training loop" in nb09.ring_bytes.evaluate(lambda b, s, w, slots: 2 * w * b * s).message
    assert "one batch" in nb09.ring_bytes.evaluate(lambda b, s, w, slots: b * s).message
    assert "slots=2 was given" in nb09.ring_bytes.evaluate(lambda b, s, w, slots: (2 * w + 1) * b * s).message
    assert "whole" in nb09.ring_bytes.evaluate(lambda b, s, w, slots: right(b, s, w, slots) + 0.5).message
    assert nb09.ring_bytes.evaluate(...).status is Status.NOT_ATTEMPTED
