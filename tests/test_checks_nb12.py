"""The checks of notebook 12: right answers pass, stubs are 'not attempted', wrong ones get a specific hint."""

from __future__ import annotations

import collections
import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import numpy as np
import torch

from course_lib import highrate, threads
from course_lib.checks import Status, nb12
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick


@pytest.mark.timeout(120)
def test_first_batches() -> None:
    def right(loader, n):
        return [b.clone() for b in itertools.islice(loader, n)]

    def views(loader, n):
        return list(itertools.islice(loader, n))

    def too_few(loader, n):
        return right(loader, n - 1)

    assert nb12.first_batches.evaluate(right).passed
    result = nb12.first_batches.evaluate(views)
    assert result.status is Status.WRONG and "clone" in result.message
    assert "got 3" in nb12.first_batches.evaluate(too_few).message
    assert (
        "keep torch tensors"
        in nb12.first_batches.evaluate(lambda loader, n: [b.numpy().copy() for b in right(loader, n)]).message
    )
    assert nb12.first_batches.evaluate(...).status is Status.NOT_ATTEMPTED


def test_ring_bytes() -> None:
    def right(b, s, w, slots):
        return (slots or 2 * w + 1) * b * s

    assert nb12.ring_bytes.evaluate(right).passed
    assert "training loop" in nb12.ring_bytes.evaluate(lambda b, s, w, slots: 2 * w * b * s).message
    assert "one batch" in nb12.ring_bytes.evaluate(lambda b, s, w, slots: b * s).message
    assert "slots=2 was given" in nb12.ring_bytes.evaluate(lambda b, s, w, slots: (2 * w + 1) * b * s).message
    assert "whole" in nb12.ring_bytes.evaluate(lambda b, s, w, slots: right(b, s, w, slots) + 0.5).message
    assert nb12.ring_bytes.evaluate(...).status is Status.NOT_ATTEMPTED


def mapped_right(path, record_bytes, batch_size, shuffle=True, seed=0):
    return highrate.MappedBatches(path, record_bytes, batch_size, shuffle, seed)


class _Mapped:
    """A learner's MappedBatches with one knob turned wrong."""

    def __init__(self, path, record_bytes, batch_size, shuffle=True, seed=0, wrong=""):
        self.n, self.len = os.path.getsize(path) // record_bytes, record_bytes // 4
        if wrong == "fromfile":  # the whole file read into memory, not mapped
            self.records = torch.from_numpy(np.fromfile(path, dtype=np.float32)).view(self.n, self.len)
        else:
            self.records = torch.from_file(str(path), size=self.n * self.len).view(self.n, self.len)
        self.buffer = torch.empty(batch_size, self.len)
        self.batch_size, self.shuffle, self.seed, self.epoch, self.wrong = batch_size, shuffle, seed, 0, wrong

    def __len__(self):
        return self.n // self.batch_size if self.wrong == "drop_last" else -(-self.n // self.batch_size)

    def __iter__(self):
        seed = self.seed if self.wrong == "same_order" else self.seed + self.epoch
        if self.wrong == "global_seed":  # reproducible, but it resets torch's global generator every epoch
            torch.manual_seed(seed)
            g = None
        else:
            g = torch.Generator().manual_seed(seed)
        order = torch.randperm(self.n, generator=g) if self.shuffle else torch.arange(self.n)
        self.epoch += 1
        for start in range(0, self.n, self.batch_size):
            rows = order[start : start + self.batch_size]
            if self.wrong == "fresh":
                yield self.records[rows]
            elif self.wrong == "fresh_copy":  # one buffer, but a fresh gather copied into it
                yield self.buffer[: len(rows)].copy_(self.records[rows])
            elif self.wrong == "numpy":
                yield self.records[rows].numpy()
            elif self.wrong == "offset":
                yield torch.index_select(self.records, 0, (rows + 1) % self.n, out=self.buffer[: len(rows)])
            elif self.wrong == "resized":
                yield torch.index_select(self.records, 0, rows, out=self.buffer)
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

    right_and_stubs(nb12.mapped_batches, mapped_right, stub)
    assert status(nb12.mapped_batches, wrong_mapped(""))[0] is Status.SOLVED
    expected = {
        "fresh": "Allocate one buffer",
        "same_order": "seed + epoch",
        "numpy": "torch tensors",
        "offset": "file order",
        "drop_last": "len() is 6",
        "resized": "out=buffer[:len(rows)]",
        "global_seed": "changed torch's global random state",
        "fresh_copy": "first gathered into a new tensor (index)",
        "fromfile": "np.fromfile and f.read() copy the whole file",
    }
    for kind, words in expected.items():
        outcome, message = status(nb12.mapped_batches, wrong_mapped(kind))
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

    assert status(nb12.measure, measure_right, raw_read_right)[0] is Status.SOLVED
    for stubs in ((..., raw_read_right), (measure_right, ...), (stub, raw_read_right)):
        assert status(nb12.measure, *stubs)[0] is Status.NOT_ATTEMPTED

    def thread_time(make_batches, nbytes, step):
        start, start_cpu, seen = time.perf_counter(), time.thread_time(), 0
        for batch in make_batches():
            step(batch)
            seen += batch.numel() * batch.element_size()
        if seen != nbytes:
            raise RuntimeError(f"{seen} bytes delivered, {nbytes} expected")
        return nbytes / (time.perf_counter() - start) / 1e9, (time.thread_time() - start_cpu) / (nbytes / 1e9)

    expected = {
        gib: "GiB/s",
        wall_for_cpu: "process_time",
        no_step: "step ran 0 times",
        unchecked: "no error",
        thread_time: "time.thread_time() counts the calling thread only",
    }
    for wrong, words in expected.items():
        outcome, message = status(nb12.measure, wrong, raw_read_right)
        assert outcome is Status.WRONG and words in message, (wrong.__name__, message)


def raw_read_right(path, chunk_bytes):
    buffer = torch.empty(chunk_bytes // 4)
    with open(path, "rb", buffering=0) as f:
        while filled := f.readinto(memoryview(buffer.numpy()).cast("B")):
            yield buffer[: filled // 4]


def test_raw_read_in_measure() -> None:
    def values_as_bytes(path, chunk_bytes):
        yield from raw_read_right(path, chunk_bytes * 4)

    def unsliced(path, chunk_bytes):
        buffer = torch.empty(chunk_bytes // 4)
        with open(path, "rb", buffering=0) as f:
            while f.readinto(memoryview(buffer.numpy()).cast("B")):
                yield buffer

    def fresh(path, chunk_bytes):
        for chunk in raw_read_right(path, chunk_bytes):
            yield chunk.clone()

    assert (
        highrate.raw_read is not raw_read_right
        and status(nb12.measure, measure_right, highrate.raw_read)[0] is Status.SOLVED
    )
    expected = {values_as_bytes: "chunk_bytes // 4", unsliced: "filled // 4", fresh: "used 3 buffers"}
    for wrong, words in expected.items():
        outcome, message = status(nb12.measure, measure_right, wrong)
        assert outcome is Status.WRONG and words in message, (wrong.__name__, message)


class _Threads:
    """A learner's ThreadBatches with one knob turned wrong."""

    def __init__(self, raw, batch_size, threads=2, in_flight=2, wrong=""):
        self.raw, self.batch_size, self.threads, self.in_flight, self.wrong = raw, batch_size, threads, in_flight, wrong
        count = {"too_few_buffers": in_flight, "one_ahead": in_flight + 2}.get(wrong, in_flight + 1)
        self.buffers = [torch.empty(batch_size, raw.sample_len) for _ in range(count)]

    def __len__(self):
        return self.raw.n // self.batch_size if self.wrong == "drop_last" else -(-self.raw.n // self.batch_size)

    def _read(self, fd, number, buffer):
        first = number * self.batch_size
        if self.wrong == "fresh":
            buffer = torch.empty(self.batch_size, self.raw.sample_len)
        batch = buffer if self.wrong == "unsliced" else buffer[: min(self.batch_size, self.raw.n - first)]
        offset = (first + 1 if self.wrong == "offset" else first) * self.raw.sample_bytes
        os.preadv(fd, [memoryview(batch.numpy()).cast("B")], offset)
        return batch

    def __iter__(self):
        fd = os.open(self.raw.path, os.O_RDONLY)
        if self.wrong == "leaks_fd":  # never closed
            yield from self._batches(fd)
            return
        try:
            yield from self._batches(fd)
        finally:
            os.close(fd)

    def _batches(self, fd):
        if True:
            with ThreadPoolExecutor(self.threads) as pool:
                pending = collections.deque()
                if self.wrong == "unbounded":  # every read submitted at once, each into its own buffer
                    pending.extend(
                        pool.submit(self._read, fd, k, torch.empty(self.batch_size, self.raw.sample_len))
                        for k in range(len(self))
                    )
                for number in range(0 if self.wrong == "unbounded" else len(self)):
                    buffer = self.buffers[number % len(self.buffers)]
                    pending.append(pool.submit(self._read, fd, number, buffer))
                    limit = self.in_flight + (self.wrong == "one_ahead") - (self.wrong == "early")
                    if len(pending) > limit:  # "early": `>=` for `>`
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()


def wrong_threads(kind):
    return lambda *args, **kw: _Threads(*args, **kw, wrong=kind)


@pytest.mark.timeout(60)
def test_thread_batches() -> None:
    def stub(raw, batch_size, threads=2, in_flight=2):
        raise NotImplementedError

    right_and_stubs(nb12.thread_batches, threads.ThreadBatches, stub)
    assert status(nb12.thread_batches, wrong_threads(""))[0] is Status.SOLVED
    expected = {
        "fresh": "different buffers",
        "unbounded": "batches ahead while the loop held",
        "offset": "byte offset",
        "drop_last": "len() is 10",
        "too_few_buffers": "in_flight + 1 buffers",
        "one_ahead": "ran 3 batches ahead",
        "unsliced": "only 2 samples are left",
        "early": "only 1 batch(es) were read ahead",
        "leaks_fd": "after 2 passes over your reader, 2 more files are open",
    }
    for kind, words in expected.items():
        outcome, message = status(nb12.thread_batches, wrong_threads(kind))
        assert outcome is Status.WRONG and words in message, (kind, message)
    # a file opened for each read may seek: its position is its own (judged by the data, not by the word seek)
    assert status(nb12.thread_batches, _SeekingOwnFile)[0] is Status.SOLVED, status(
        nb12.thread_batches, _SeekingOwnFile
    )
    # one file object shared by threads that seek: a race, caught when it mixes a batch up (not every time)
    outcome, message = status(nb12.thread_batches, _Seeking)
    assert outcome is Status.SOLVED or "mix batches up" in message or "out of order" in message, message


class _Seeking(_Threads):
    """Two threads that seek and read one shared file object: a race that passes now and then, refused by reading."""

    def _read(self, f, number, buffer):
        batch = buffer[: min(self.batch_size, self.raw.n - number * self.batch_size)]
        f.seek(number * self.batch_size * self.raw.sample_bytes)
        f.readinto(memoryview(batch.numpy()).cast("B"))
        return batch

    def __iter__(self):
        with open(self.raw.path, "rb", buffering=0) as f, ThreadPoolExecutor(self.threads) as pool:
            pending = collections.deque()
            for number in range(len(self)):
                pending.append(pool.submit(self._read, f, number, self.buffers[number % len(self.buffers)]))
                if len(pending) > self.in_flight:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


class _SeekingOwnFile(_Threads):
    """Right: each read opens the file, seeks and reads; nothing is shared between threads."""

    def _read(self, fd, number, buffer):
        batch = buffer[: min(self.batch_size, self.raw.n - number * self.batch_size)]
        with open(self.raw.path, "rb", buffering=0) as f:
            f.seek(number * self.batch_size * self.raw.sample_bytes)
            f.readinto(memoryview(batch.numpy()).cast("B"))
        return batch


def test_solved_remembers_the_last_check_in_this_process(capsys: pytest.CaptureFixture[str]) -> None:
    nb12.ring_bytes(lambda b, s, w, slots: 0)
    assert not nb12.solved("12.2")
    nb12.ring_bytes(lambda b, s, w, slots: (slots or 2 * w + 1) * b * s)
    assert nb12.solved("12.2")
    nb12.ring_bytes(...)
    assert not nb12.solved("12.2")
    assert "12.2" in capsys.readouterr().out
