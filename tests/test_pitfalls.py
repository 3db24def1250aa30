"""course_lib.pitfalls.expect_error: shows an expected error, and fails when it stops happening."""

from __future__ import annotations

import multiprocessing as mp
import sys

import psutil
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from course_lib import pitfalls
from course_lib.pitfalls import PitfallDidNotHappen, expect_error, fork_with_a_held_lock

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


# --- fork with a thread holding a lock (notebook 05, section 3) ----------------------------------------------------
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_a_forked_child_hangs_on_a_lock_another_thread_held_and_is_killed() -> None:
    before = {p.pid for p in psutil.Process().children()}
    outcome = fork_with_a_held_lock("fork", timeout=0.5)
    assert outcome.hung and outcome.method == "fork"
    assert str(outcome) == (
        "the child hung on the lock (its copy was locked, with no thread of its own to release it): killed after 0.5 s"
    )
    left = [p for p in psutil.Process().children() if p.pid not in before and _running(p)]
    assert not left, f"the hung child is still running: {left}"
    assert pitfalls._LIBRARY_LOCK.acquire(blocking=False), "the parent's lock was left held"
    pitfalls._LIBRARY_LOCK.release()


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_python_312_and_later_warn_about_forking_a_threaded_process() -> None:
    warning = fork_with_a_held_lock("fork", timeout=0.2).warning
    if sys.version_info >= (3, 12):
        assert warning is not None and "multi-threaded" in warning
    else:
        assert warning is None


@pytest.mark.parametrize("method", [m for m in ("spawn", "forkserver") if m in mp.get_all_start_methods()])
def test_spawn_and_forkserver_children_take_a_lock_of_their_own(method: str) -> None:
    outcome = fork_with_a_held_lock(method, timeout=30)
    assert not outcome.hung, outcome
    assert str(outcome) == "the child took the lock at once (its own lock, new and unlocked)"


def test_bad_arguments_say_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="start method 'vfork' is not available here; this platform has"):
        fork_with_a_held_lock("vfork")
    with pytest.raises(ValueError, match="timeout and start_timeout must be > 0 seconds"):
        fork_with_a_held_lock("spawn", timeout=0)
