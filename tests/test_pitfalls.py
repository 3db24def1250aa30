"""course_lib.pitfalls.expect_error: shows an expected error, and fails when it stops happening."""

from __future__ import annotations

import psutil
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from course_lib.pitfalls import PitfallDidNotHappen, expect_error

pytestmark = pytest.mark.quick


def test_prints_the_error_as_a_learner_sees_it(capsys: pytest.CaptureFixture[str]) -> None:
    with expect_error(KeyError):
        {}["missing"]
    with expect_error(ValueError, lines=2):
        raise ValueError("first line\nsecond line\nthird line")
    assert capsys.readouterr().out == "KeyError: 'missing'\nValueError: first line\nsecond line\n"


def test_fails_when_the_pitfall_no_longer_happens() -> None:
    with pytest.raises(PitfallDidNotHappen, match="expected IndexError or KeyError"):
        with expect_error(IndexError, KeyError):
            pass


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(ZeroDivisionError):
        with expect_error(KeyError):
            1 / 0


class _FailsInWorker1(IterableDataset):
    def __iter__(self):
        if get_worker_info().id == 1:
            raise ValueError("worker 1 fails")
        yield from range(1000)


def test_a_failed_loaders_workers_are_stopped_when_the_block_ends() -> None:
    """Left in the traceback's frames, the iterator would reach the garbage collector, whose clean-up waits 5 s for
    each worker (notebook 13 waited 15 s in the cell after such a block)."""
    before = {p.pid for p in psutil.Process().children()}
    with expect_error(ValueError):
        for _ in DataLoader(_FailsInWorker1(), num_workers=2):
            pass
    left = [p for p in psutil.Process().children() if p.pid not in before and _running(p)]
    assert not left, f"worker processes still running after the block: {left}"


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ended between the listing and the look
        return False
