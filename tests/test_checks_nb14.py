"""course_lib.checks.nb14: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint.

The wrong samplers and streams live at module level: the 14.2 and 14.3 checks run them in DataLoader worker
processes. Every wrong answer goes through the real check; the checks that start loaders take under a second each.
"""

from __future__ import annotations

import collections
import gc
import os
import tempfile
from pathlib import Path

import pytest
import torch
from torch.utils.data import IterableDataset, Sampler, get_worker_info

from course_lib import resume
from course_lib.checks import Status, nb14
from course_lib.checks._core import stop_workers
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


def wrong(check, *answer) -> str:
    """The hint of an answer that must be ❌."""
    outcome, message = status(check, *answer)
    assert outcome is Status.WRONG, message
    return message


# ----------------------------------------------------------------- 14.1: twice and never


def seen_twice_and_never(steps, n, epoch):
    """The notebook's solution."""
    counts = collections.Counter()
    for rank_steps in steps.values():
        for step in rank_steps:
            if step["epoch"] == epoch:
                counts.update(step["indices"])
    twice = sorted(i for i, c in counts.items() if c > 1)
    never = sorted(set(range(n)) - set(counts))
    return twice, never


def all_epochs(steps, n, epoch):
    counts = collections.Counter(i for rank_steps in steps.values() for step in rank_steps for i in step["indices"])
    return sorted(i for i, c in counts.items() if c > 1), sorted(set(range(n)) - set(counts))


def twice_per_rank(steps, n, epoch):
    """Duplicates within each rank only: an index both ranks trained is missed."""
    twice, seen = set(), set()
    for rank_steps in steps.values():
        counts = collections.Counter(i for step in rank_steps if step["epoch"] == epoch for i in step["indices"])
        twice |= {i for i, c in counts.items() if c > 1}
        seen |= set(counts)
    return sorted(twice), sorted(set(range(n)) - seen)


def never_from_rank_0(steps, n, epoch):
    twice, _ = seen_twice_and_never(steps, n, epoch)
    held = {i for step in steps[0] if step["epoch"] == epoch for i in step["indices"]}
    return twice, sorted(set(range(n)) - held)


def never_over_all_epochs(steps, n, epoch):
    twice, _ = seen_twice_and_never(steps, n, epoch)
    held = {i for rank_steps in steps.values() for step in rank_steps for i in step["indices"]}
    return twice, sorted(set(range(n)) - held)


def every_occurrence(steps, n, epoch):
    """Every occurrence of an index trained more than once, not the index once."""
    held = [
        i for rank_steps in steps.values() for step in rank_steps if step["epoch"] == epoch for i in step["indices"]
    ]
    return sorted(i for i in held if held.count(i) > 1), sorted(set(range(n)) - set(held))


def as_dict(steps, n, epoch):
    twice, never = seen_twice_and_never(steps, n, epoch)
    return {"twice": twice, "never": never}


def test_14_seen_twice_and_never_right_and_stubs() -> None:
    def stub(steps, n, epoch):
        raise NotImplementedError

    right_and_stubs(nb14.seen_twice_and_never, seen_twice_and_never, stub)


@pytest.mark.parametrize(
    "fn, hints",
    [
        (all_epochs, ["twice should be [3], got [0, 2, 3]", "of that epoch only"]),
        (twice_per_rank, ["twice should be [1], got []", "over every rank's steps"]),
        (every_occurrence, ["twice should be [0, 1, 4, 5], got [0, 0, 1, 1, 4, 4, 5, 5]", "list it once"]),
        (never_from_rank_0, ["never should be [], got [4, 5, 6, 7]", "that no rank's step of that epoch holds"]),
        (never_over_all_epochs, ["never should be [1], got []", "that no rank's step of that epoch holds"]),
        (as_dict, ["return two sorted lists, `return twice, never`", "{'twice': [], 'never': []}"]),
    ],
)
def test_14_seen_twice_and_never_wrong_answers(fn, hints) -> None:
    message = wrong(nb14.seen_twice_and_never, fn)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 14.2: a resumable sampler


class MyResumableShuffle(Sampler):
    """The notebook's solution."""

    def __init__(self, n, seed=0):
        self.n, self.seed = n, seed
        self.epoch, self.yielded, self.skip = 0, 0, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=generator).tolist()
        self.yielded, self.skip = self.skip, 0
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.skip = state["yielded"]


class ShuffleStub(Sampler):
    """The notebook's stub."""

    def __init__(self, n, seed=0):
        raise NotImplementedError


class NoEpochInState(MyResumableShuffle):
    """Saves the position only: the resumed loader skips into the order of the epoch it was built for (0)."""

    def state_dict(self):
        return {"yielded": self.yielded}

    def load_state_dict(self, state):
        self.skip = state["yielded"]


class CountsAfterYield(MyResumableShuffle):
    """``yield index; self.yielded += 1``: the state taken after a batch's last index misses that index."""

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded, self.skip = self.skip, 0
        for index in order[self.yielded :]:
            yield index
            self.yielded += 1


class SkipsEveryPass(MyResumableShuffle):
    """The skip is never reset: every later epoch is short too."""

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded = self.skip
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index


class CountsFromTheResume(MyResumableShuffle):
    """Skips the restored count, then counts from 0: a second resume in the same epoch skips too few."""

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        skip, self.skip, self.yielded = self.skip, 0, 0
        for index in order[skip:]:
            self.yielded += 1
            yield index


class IgnoresLoad(MyResumableShuffle):
    def load_state_dict(self, state):
        pass


class AlwaysFromTheStart(MyResumableShuffle):
    """Restores epoch and position, but ``__iter__`` starts every pass at index 0."""

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.yielded = 0
        for index in order:
            self.yielded += 1
            yield index


class RestoresTheRunningCount(MyResumableShuffle):
    """The notebook's solution with ``self.yielded = state["yielded"]`` in load_state_dict (a learner's slip seen in
    JupyterLab): ``__iter__`` then sets the count from ``self.skip``, 0, and the resumed pass starts over."""

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.yielded = state["yielded"]


class GlobalRng(MyResumableShuffle):
    def __iter__(self):
        order = torch.randperm(self.n).tolist()
        self.yielded, self.skip = self.skip, 0
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index


class GeneratorInInit(MyResumableShuffle):
    """One generator for the sampler's life: the order depends on how many passes it made before."""

    def __init__(self, n, seed=0):
        super().__init__(n, seed)
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        self.yielded, self.skip = self.skip, 0
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index


class SameOrderEveryEpoch(MyResumableShuffle):
    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed)).tolist()
        self.yielded, self.skip = self.skip, 0
        for index in order[self.yielded :]:
            self.yielded += 1
            yield index


class LenInBatches(MyResumableShuffle):
    def __len__(self):
        return self.n // 4


def order(epoch: int, n: int = 40, seed: int = 7) -> list[int]:
    """Epoch ``epoch``'s order in the 14.2 check (n=40, seed=7, batches of 4)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def test_14_resumable_sampler_right_and_stubs() -> None:
    right_and_stubs(nb14.resumable_sampler, MyResumableShuffle, ShuffleStub)
    assert status(nb14.resumable_sampler, resume.ResumableShuffle)[0] is Status.SOLVED  # the course's reference


@pytest.mark.parametrize(
    "cls, hints",
    [
        # the check stops after 3 batches of epoch 1: 12 indices drawn, and resumes in a sampler set to epoch 0
        (NoEpochInState, [f"{[order(0)[12:16], order(0)[16:20]]}... came next", "Save the epoch"]),
        (CountsAfterYield, [f"{[order(1)[11:15], order(1)[15:19]]}... came next", "count before each yield"]),
        (IgnoresLoad, [f"{[order(0)[0:4], order(0)[4:8]]}... came next", "stopped after 3 batches"]),
        (AlwaysFromTheStart, [f"{[order(1)[0:4], order(1)[4:8]]}... came next", "started the epoch over"]),
        (RestoresTheRunningCount, [f"{[order(1)[0:4], order(1)[4:8]]}... came next", "restore into another attribute"]),
        (SkipsEveryPass, ["it had 20 indices", "skip only once"]),
        (
            CountsFromTheResume,  # the second state says 8 yielded: epoch 1's order from its 9th index again
            [f"{[order(1)[8:12], order(1)[12:16]]}... came next", "since the epoch began, the skipped ones included"],
        ),
        (GlobalRng, ["two samplers with the same seed and epoch gave different orders", "not the global random state"]),
        (
            GeneratorInInit,
            ["two samplers with the same seed and epoch gave different orders", "seeded from (seed, epoch)"],
        ),
        (SameOrderEveryEpoch, ["set_epoch(1) gave the same order as epoch 0"]),
        (LenInBatches, ["len(sampler) should be 40, got 10"]),
    ],
)
def test_14_resumable_sampler_wrong_answers(cls, hints) -> None:
    message = wrong(nb14.resumable_sampler, cls)
    assert all(hint in message for hint in hints), message


def test_14_resumable_sampler_wants_the_class() -> None:
    assert "pass the class itself" in wrong(nb14.resumable_sampler, MyResumableShuffle(40, 7))


# ----------------------------------------------------------------- 14.3: a resumable stream


class MyResumableStream(IterableDataset):
    """The notebook's solution: a restored position serves one pass only."""

    def __init__(self, n):
        self.n, self.done, self.start = n, 0, 0

    def load(self, i):
        return i

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        self.done, self.start = self.start, 0
        for i in range(worker, self.n, workers)[self.done :]:
            self.done += 1
            yield self.load(i)

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.done = self.start = state["done"]


class ResetsAfterThePass(IterableDataset):
    """Another right answer: one count, set back to 0 when the share is exhausted."""

    def __init__(self, n):
        self.n, self.done = n, 0

    def load(self, i):
        return i

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(worker, self.n, workers)[self.done :]:
            self.done += 1
            yield self.load(i)
        self.done = 0

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.done = state["done"]


class NeverResetsItsCount(ResetsAfterThePass):
    """The course's first solution: the count outlives the pass, and the next epoch of the same object is empty."""

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(worker, self.n, workers)[self.done :]:
            self.done += 1
            yield self.load(i)


class StreamStub(IterableDataset):
    """The notebook's stub: it raises in a DataLoader worker."""

    def __init__(self, n):
        self.n = n

    def load(self, i):
        return i

    def __iter__(self):
        raise NotImplementedError


def _share(self) -> range:
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info else (0, 1)
    return range(worker, self.n, workers)


class NoWorkerSplit(MyResumableStream):
    """Every worker yields all of range(n)."""

    def __iter__(self):
        self.done, self.start = self.start, 0
        for i in range(self.n)[self.done :]:
            self.done += 1
            yield self.load(i)


class StreamCountsAfterYield(MyResumableStream):
    def __iter__(self):
        self.done, self.start = self.start, 0
        for i in _share(self)[self.done :]:
            yield self.load(i)
            self.done += 1


class LoadsAndDiscards(MyResumableStream):
    """Right batches, but it reads every skipped sample and throws it away."""

    def __iter__(self):
        skip, self.start, self.done = self.start, 0, 0
        for k, i in enumerate(_share(self)):
            sample = self.load(i)
            if k < skip:
                continue
            self.done = k + 1
            yield sample


class StreamIgnoresLoad(MyResumableStream):
    def load_state_dict(self, state):
        pass


class StreamRestartsItsCount(MyResumableStream):
    """``self.done = 0`` at the top of ``__iter__``: the restored position is never used."""

    def __iter__(self):
        self.done = 0
        for i in _share(self)[self.done :]:
            self.done += 1
            yield self.load(i)


class SkipsByGlobalIndex(MyResumableStream):
    """Compares the count of its share with the global index: skips about half of what it should."""

    def __iter__(self):
        self.done, self.start = self.start, 0
        for i in _share(self):
            if i < self.done:
                continue
            self.done += 1
            yield self.load(i)


class CountsFromTheResume(MyResumableStream):
    """Counts what it yielded since the resume, not since the epoch began: one resume is right, the second replays."""

    def __iter__(self):
        skip, self.start, self.done = self.start, 0, 0
        for i in _share(self)[skip:]:
            self.done += 1
            yield self.load(i)


class RestoresOnlyTheStart(MyResumableStream):
    """The notebook's first solution: a worker whose state is taken before it yields after the resume reports 0."""

    def load_state_dict(self, state):
        self.start = state["done"]


class SkipsEveryPassStream(MyResumableStream):
    """The restored position is kept for every pass: the epoch after a resumed one is short."""

    def __iter__(self):
        self.done = self.start
        for i in _share(self)[self.done :]:
            self.done += 1
            yield self.load(i)


def stop_leaked_workers() -> None:
    """Stop, now, the workers of StatefulDataLoader iterators that nothing refers to any more, and collect them.

    When a stream's ``__iter__`` raises at once, ``iter(loader)`` raises in the check (the loader waits for each
    worker's first state), before the check holds the iterator to stop it: the half-made iterator lives on in the
    exception's traceback with its 2 workers. Left to a later garbage collection it costs 10 s (two 5 s joins), and
    a forked worker of a later loader that collects its copy can die in the middle of an import."""
    from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter

    for obj in gc.get_objects():
        if type(obj) is _StatefulMultiProcessingDataLoaderIter:  # type(), not isinstance: no lazy attribute runs
            stop_workers(obj)
    gc.collect()


def test_14_resumable_stream_right_and_stubs() -> None:
    check = nb14.resumable_stream
    for right in (MyResumableStream, ResetsAfterThePass, resume.ResumableStream):
        assert status(check, right)[0] is Status.SOLVED, (right, status(check, right)[1])
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    try:
        outcome, message = status(check, StreamStub)
    finally:
        stop_leaked_workers()
    assert outcome is Status.NOT_ATTEMPTED and "in `__iter__`" in message, message  # named from the worker's traceback


@pytest.mark.parametrize(
    "cls, hints",
    [
        (NoWorkerSplit, ["got 60 samples", "range(info.id, n, info.num_workers)"]),
        (
            NeverResetsItsCount,  # fresh workers hide it: each epoch gets new copies of the stream
            ["with 2 persistent workers (persistent_workers=True) the second epoch yielded 0 samples", "one pass only"],
        ),
        (
            SkipsEveryPassStream,
            ["with 2 persistent workers", "the epoch after a resumed one should be whole, but it had 15"],
        ),
        (StreamCountsAfterYield, ["stopped after 4 batches and resumed", "Count a sample before you yield it"]),
        (StreamIgnoresLoad, ["with 2 workers, stopped after 4 batches and resumed: [[0, 2, 4]]... came"]),
        (StreamRestartsItsCount, ["stopped after 4 batches and resumed: [[0, 2, 4]]... came next"]),
        (SkipsByGlobalIndex, ["stopped after 4 batches and resumed", "skip that many of this worker's share"]),
        (CountsFromTheResume, ["stopped again 1 batch later and resumed again", "since the epoch began"]),
        (RestoresOnlyTheStart, ["the second was not", "also in a worker that has not yielded since the resume"]),
        (resume.StaleStateStream, ["One resume was right, the second was not", "huggingface/datasets#8308"]),
        (
            LoadsAndDiscards,
            ["called load() 30 times for 18 samples", "instead of loading samples and throwing them away"],
        ),
    ],
)
def test_14_resumable_stream_wrong_answers(cls, hints) -> None:
    message = wrong(nb14.resumable_stream, cls)
    assert all(hint in message for hint in hints), message


# ----------------------------------------------------------------- 14.4: save and load together


def save(path, model, optimizer, loader, step):
    """The notebook's solution."""
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": loader.state_dict(),
        "step": step,
    }
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path, model, optimizer, loader):
    """The notebook's solution."""
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    return state["step"]


def save_in_place(path, model, optimizer, loader, step):
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(), "step": step},
        path,
    )


def save_without_optimizer(path, model, optimizer, loader, step):
    save(path, model, torch.optim.SGD([torch.zeros(1)]), loader, step)


def load_without_optimizer(path, model, optimizer, loader):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    loader.load_state_dict(state["loader"])
    return state["step"]


def load_without_loader(path, model, optimizer, loader):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def load_returns_nothing(path, model, optimizer, loader):
    load(path, model, optimizer, loader)


def load_returns_the_next_step(path, model, optimizer, loader):
    return load(path, model, optimizer, loader) + 1


def save_swallowing_errors(path, model, optimizer, loader, step):
    try:
        save(path, model, optimizer, loader, step)
    except Exception:
        pass


def save_leaving_tmp(path, model, optimizer, loader, step):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(), "step": step},
        tmp,
    )
    os.replace(tmp, path)


def save_in_system_temp(path, model, optimizer, loader, step):
    """Atomic on one file system only: the temporary file is in the system's temporary folder."""
    fd, tmp = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    try:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(),
                "step": step,
            },
            tmp,
        )
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def save_with_a_named_temporary_file(path, model, optimizer, loader, step):
    """Another right answer: tempfile beside the checkpoint, moved with Path.replace."""
    path = Path(path)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
        tmp = Path(f.name)
    try:
        torch.save({**state, "step": step}, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def load_unsafe(path, model, optimizer, loader):
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    return state["step"]


def test_14_checkpoint_right_and_stubs() -> None:
    def save_stub(path, model, optimizer, loader, step):
        raise NotImplementedError

    def load_stub(path, model, optimizer, loader):
        raise NotImplementedError

    check = nb14.checkpoint
    assert status(check, save, load)[0] is Status.SOLVED, status(check, save, load)[1]
    assert status(check, save_with_a_named_temporary_file, load)[0] is Status.SOLVED
    assert status(check, ..., ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, save, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, save_stub, load_stub)[0] is Status.NOT_ATTEMPTED
    assert status(check, save, load_stub)[0] is Status.NOT_ATTEMPTED


@pytest.mark.parametrize(
    "save_fn, load_fn, hints",
    [
        (save_in_place, load, ["destroyed the previous checkpoint", "os.replace(tmp, path)"]),
        (save_without_optimizer, load_without_optimizer, ["gave different weights", "optimizer's state too"]),
        (save, load_without_optimizer, ["gave different weights", "optimizer's state too"]),
        (save, load_without_loader, ["the next batches started with samples", "loader.load_state_dict()"]),
        (save, load_returns_nothing, ["load(...) should return a whole number, got None"]),
        (save, load_returns_the_next_step, ["load should return the saved step, 3; got 4"]),
        (save_swallowing_errors, load, ["save() returned normally although torch.save raised OSError"]),
        (save_leaving_tmp, load, ["the failed save left ['ckpt.pt.tmp'] behind"]),
        (lambda path, *rest: None, load, ["should write the file ckpt.pt; nothing is there"]),
        (save_in_system_temp, load, ["your temporary file was in", "EXDEV", "path.with_name(path.name + '.tmp')"]),
        (save, load_unsafe, ["ran the code it carried", "weights_only=True"]),
    ],
)
def test_14_checkpoint_wrong_answers(save_fn, load_fn, hints) -> None:
    message = wrong(nb14.checkpoint, save_fn, load_fn)
    assert all(hint in message for hint in hints), message


def test_14_checks_leave_the_learners_random_state_alone() -> None:
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    nb14.seen_twice_and_never.evaluate(seen_twice_and_never)
    nb14.resumable_sampler.evaluate(GlobalRng)
    nb14.checkpoint.evaluate(save, load)
    assert torch.equal(torch.rand(3), expected)
