"""Checks for notebook 12 (the high-rate question).

12.1 runs the learner's batch-keeping code on a real :class:`~course_lib.highrate.RingLoader` (whose slots
are overwritten, so kept batches must be copies); 12.2 compares their shared-memory arithmetic with what a RingLoader
allocates; 12.3 runs their memory-mapped batch reader over a real raw file for two epochs; 12.4 times their rate meter
against loops whose wall and CPU time are known, and reads a file of known values with their raw reader; 12.5 runs their thread reader over a real raw file, compares every
batch with the file, counts the buffers and the bytes read ahead of the loop.
"""

from __future__ import annotations

import gc
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.utils._python_dispatch

from ._core import Hint, attempted, exercise, require, solved, whole_number

__all__ = ["first_batches", "mapped_batches", "measure", "ring_bytes", "solved", "thread_batches"]


@exercise("12.1", "a reused buffer is overwritten by the next batch: keep a copy (.clone()), not the view.")
def first_batches(fn: Callable[[Any, int], Any]) -> None:
    """``fn(loader, n)`` returns a list of the first ``n`` batches of ``loader``, kept intact."""
    from ..highrate import RingLoader, write_raw_tensors

    attempted(fn)
    with tempfile.TemporaryDirectory(prefix="check12-") as tmp:
        raw = write_raw_tensors(Path(tmp) / "raw.f32", 24, sample_bytes=4096, seed=9)
        truth = torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(24, -1))
        with RingLoader(raw, batch_size=4, num_workers=1, slots=2) as ring:
            got = fn(ring, 4)
            attempted(got)
            require(
                isinstance(got, (list, tuple)),
                f"first_batches should return a list of batches, got {type(got).__name__}.",
            )
            require(len(got) == 4, f"asked for 4 batches, got {len(got)}.")
            kinds = {type(b).__name__ for b in got if not isinstance(b, torch.Tensor)}
            require(
                not kinds,
                f"the batches kept are {', '.join(sorted(kinds))}: keep torch tensors, as the loader gives "
                "them (batch.clone() copies one).",
            )
            same = {b.data_ptr() for b in got}
            if len(same) < 4:
                raise Hint(
                    f"the 4 batches kept share {len(same)} buffer(s): they are the loader's slots, which the next "
                    "batches overwrite. Keep batch.clone()."
                )
            for i, batch in enumerate(got):
                require(
                    isinstance(batch, torch.Tensor) and batch.shape == (4, truth.shape[1]),
                    f"batch {i} should be a [4, {truth.shape[1]}] tensor.",
                )
                require(
                    torch.equal(batch, truth[4 * i : 4 * i + 4]),
                    f"batch {i} does not hold samples {4 * i}-{4 * i + 3}.",
                )
            again = [b.clone() for b in ring]  # the loader still works: a stopped loop left no slot behind
            require(
                torch.equal(torch.cat(again), truth), "after your function the loader no longer yields the whole file."
            )


RING_CASES = [(64, 1 << 20, 2, None), (32, 1 << 20, 4, None), (16, 4096, 1, 3), (8, 2 << 20, 2, 2)]


@exercise("12.2", "slots × batch_size × sample bytes, allocated once: (2 × workers + 1) slots unless given.")
def ring_bytes(fn: Callable[[int, int, int, Any], Any]) -> None:
    """``fn(batch_size, sample_bytes, num_workers, slots)``: bytes of shared memory a RingLoader allocates."""
    attempted(fn)
    for batch, sample, workers, slots in RING_CASES:
        call = f"ring_bytes({batch}, {sample}, {workers}, slots={slots})"
        got = whole_number(fn(batch, sample, workers, slots), call, "a number of bytes is whole.")
        n_slots = slots or 2 * workers + 1
        truth = n_slots * batch * sample
        if got == truth:
            continue
        if slots is None and got == 2 * workers * batch * sample:
            raise Hint(
                f"{call} = {got}: 2 slots per worker, but one more is held by the training loop "
                "(the batch it is working on)."
            )
        if got == batch * sample:
            raise Hint(f"{call} = {got}: that is one batch; the ring holds {n_slots} of them at once.")
        if slots is not None and got == (2 * workers + 1) * batch * sample:
            raise Hint(f"{call} = {got}: slots={slots} was given, so the ring has {slots} slots.")
        raise Hint(f"{call} = {got}, but the ring holds {n_slots} slots of {batch} × {sample} bytes = {truth}.")


def _rows_to_index(batches: list[torch.Tensor], truth: torch.Tensor) -> list[int]:
    """Which record of ``truth`` each row of the batches is (records are random floats: the first value names one)."""
    where = {float(v): i for i, v in enumerate(truth[:, 0])}
    found = []
    for batch in batches:
        for row in batch:
            i = where.get(float(row[0]))
            require(
                i is not None and torch.equal(row, truth[i]),
                "a row of a batch is not any record of the file: "
                "record i starts at byte i × record_bytes, and holds record_bytes // 4 float32 values.",
            )
            found.append(i)
    return found


@exercise(
    "12.3",
    "every record once per epoch in a new, reproducible order, the short last batch kept, and every "
    "batch gathered into one buffer allocated once.",
)
def mapped_batches(cls: Any) -> None:
    """``cls(path, record_bytes, batch_size, shuffle=True, seed=0)``: an iterable of ``[rows, record_bytes // 4]`` batches."""
    from ..highrate import write_raw_tensors

    attempted(cls)
    n, size, batch = 50, 256, 8
    with tempfile.TemporaryDirectory(prefix="check12-") as tmp:
        raw = write_raw_tensors(Path(tmp) / "records.f32", n, sample_bytes=size, seed=4)
        truth = torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(n, -1))
        reader = cls(raw.path, size, batch, shuffle=True, seed=0)
        attempted(reader)
        require(
            len(reader) == 7,
            f"len() is {len(reader)}: {n} records in batches of {batch} make 7 batches, the last of 2.",
        )
        epochs, held = [], []  # held: every batch object kept alive, so fresh tensors cannot share an address
        for _ in range(2):
            got, sizes = [], []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batches = list(_kept_views(reader))
            if any("resized" in str(w.message) for w in caught):
                raise Hint(
                    "torch resized your buffer for the short last batch (a deprecated behaviour, with a warning): "
                    "gather the short batch into a slice of the buffer, out=buffer[:len(rows)]."
                )
            for yielded, copy in batches:  # the copy was taken when it was yielded: the batch may be overwritten since
                held.append(yielded)
                sizes.append(copy.shape[0])
                got.append(copy)
            require(
                sizes == [8] * 6 + [2],
                f"batch sizes {sizes}: expected six of 8 and a last one of 2 (keep the "
                "short batch: slice the buffer to its length).",
            )
            epochs.append(_rows_to_index(got, truth))
        for e, order in enumerate(epochs):
            require(
                sorted(order) == list(range(n)),
                f"epoch {e} gave {len(order)} rows, {len(set(order))} distinct "
                f"records of {n}: every record once per epoch.",
            )
        require(epochs[0] != list(range(n)), "the records came in file order: shuffle=True should draw a permutation.")
        require(epochs[0] != epochs[1], "both epochs gave the same order: draw it from seed + epoch, and count epochs.")
        again = _rows_to_index([b.clone() for b in cls(raw.path, size, batch, shuffle=True, seed=0)], truth)
        require(
            again == epochs[0],
            "a second reader with the same seed gave another first epoch: seed a "
            "torch.Generator with seed + epoch rather than using the global random state.",
        )
        plain = _rows_to_index([b.clone() for b in cls(raw.path, size, batch, shuffle=False)], truth)
        require(plain == list(range(n)), "with shuffle=False the records should come in file order.")
        buffers = len({b.untyped_storage().data_ptr() for b in held})
        if buffers > 1:
            raise Hint(
                f"the batches of two epochs used {buffers} different buffers: each batch is a fresh "
                "tensor, so every step allocates and zero-fills new memory. Allocate one buffer of "
                "batch_size rows in __init__ and gather into it: torch.index_select(records, 0, rows, out=...)."
            )
        fresh = cls(raw.path, size, batch, shuffle=True, seed=0)
        state = torch.get_rng_state()
        with _NewTensors() as made:
            for _ in range(2):
                for _b in fresh:
                    pass
        require(
            torch.equal(torch.get_rng_state(), state),
            "iterating your reader changed torch's global random state (torch.manual_seed, or a draw without a "
            "generator, in __iter__): every epoch would reset the training's own randomness (dropout, "
            "augmentations) to the same draws. Draw the order from a generator of your own, "
            "torch.Generator().manual_seed(seed + epoch).",
        )
        big = sorted({op for op, nbytes in made.tensors if nbytes >= batch * size // 2})
        require(
            not big,
            f"each batch was first gathered into a new tensor ({', '.join(big)}), and only then (if at all) copied "
            "into your buffer: every step still allocates a batch. Gather straight into the buffer, "
            "torch.index_select(records, 0, rows, out=buffer[:len(rows)]).",
        )
        _maps_the_file(cls, Path(tmp))


class _NewTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes every torch operation that returns a tensor with storage of its own (not one of its inputs'), and its
    bytes: a gather ``records[rows]`` makes one, ``index_select(..., out=buffer)`` does not."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = [*args, *(kwargs or {}).values()]
        inputs = {a.untyped_storage().data_ptr() for a in given if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.tensors.append((str(func.overloadpacket.__name__), t.untyped_storage().nbytes()))
        return out


def _maps_the_file(cls: Any, folder: Path) -> None:
    """A reader over a 4 MiB file reads (system calls) far less than the file: it maps it, and the pages it gathers
    come in without a read call."""
    from ..highrate import write_raw_tensors

    raw = write_raw_tensors(folder / "mapped.f32", 64, sample_bytes=65536, seed=5)
    start = _bytes_read()
    reader = cls(raw.path, 65536, 8, shuffle=False)
    for _ in range(2):
        for _b in reader:
            pass
    read = _bytes_read() - start
    require(
        read < raw.nbytes // 2,
        f"your reader read {read / 2**20:.1f} MiB with read calls for a {raw.nbytes / 2**20:.0f} MiB file: "
        "np.fromfile and f.read() copy the whole file into memory first (a file of hundreds of GB would not "
        "fit). Map it instead, torch.from_file(str(path), size=n * record_len): the system brings pages in "
        "from its cache as the gathers touch them.",
    )


def _kept_views(reader: Any) -> Iterator[tuple[Any, Any]]:
    """``(batch, its copy)`` for each batch of one pass: the batch as yielded (kept alive, to count buffers) and a clone
    taken before the next one is asked for (a reused buffer is overwritten by then)."""
    for b in reader:
        require(
            isinstance(b, torch.Tensor),
            f"a batch is a {type(b).__name__}: yield torch tensors, "
            "which a training step takes (torch.from_file gives one).",
        )
        yield b, b.clone()


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _raw_read_works(read: Callable[[Any, int], Any]) -> None:
    """``read(path, chunk_bytes)`` yields the file front to back, as float32 tensors of one reused buffer."""
    values = np.arange(10_000, dtype=np.float32)  # 40,000 bytes: chunks of 16 KiB are 4096, 4096 and 1808 values
    with tempfile.TemporaryDirectory(prefix="check12-") as tmp:
        path = Path(tmp) / "values.f32"
        values.tofile(path)
        chunks, held = [], []
        for chunk in read(str(path), 16_384):
            require(
                isinstance(chunk, torch.Tensor) and chunk.dtype == torch.float32,
                f"raw_read yielded a {type(chunk).__name__} ({getattr(chunk, 'dtype', '')}): yield float32 tensors.",
            )
            chunks.append(chunk.clone())
            held.append(chunk)  # kept alive, so that a fresh buffer per chunk cannot reuse a freed one's address
    storages = {chunk.untyped_storage().data_ptr() for chunk in held}
    sizes = [len(c) for c in chunks]
    if sizes and sizes[0] > 4096:
        raise Hint(
            f"the first chunk has {sizes[0]} values, more than 16384 bytes hold: chunk_bytes counts bytes, so "
            "the buffer holds chunk_bytes // 4 float32 values."
        )
    if sizes == [4096, 4096, 4096]:
        raise Hint(
            "the last chunk has 4096 values where readinto filled 1808: yield buffer[: filled // 4], the part it filled."
        )
    require(
        sizes == [4096, 4096, 1808],
        f"raw_read(path, 16384) over 40,000 bytes yielded chunks of {sizes} values: expected 4096, 4096 and 1808.",
    )
    require(
        torch.equal(torch.cat(chunks), torch.from_numpy(values)), "the chunks do not hold the file's values in order."
    )
    if len(storages) > 1:
        raise Hint(
            f"raw_read used {len(storages)} buffers for 3 chunks: allocate one buffer before the loop and readinto "
            "it each time (a fresh buffer per chunk costs what the reference should not)."
        )


@exercise(
    "12.4",
    "GB/s from the wall clock over the bytes the loop received, the loop's own CPU seconds per GB, and a "
    "raw read into one reused buffer.",
)
def measure(fn: Callable[..., Any], read: Callable[[Any, int], Any]) -> None:
    """``fn(make_batches, nbytes, step)`` returns ``(GB/s, CPU seconds per GB)`` of one pass, ``step`` run on each batch;
    ``read(path, chunk_bytes)`` yields a raw file front to back through one reused buffer."""
    attempted(fn, read)
    _raw_read_works(read)
    batch = torch.zeros(250_000)  # 1 MB
    stepped: list[int] = []

    def sleepy():  # 4 MB in about 0.2 s of waiting: no CPU
        for _ in range(4):
            time.sleep(0.05)
            yield batch

    def busy():  # 4 MB in about 0.2 s of CPU
        for _ in range(4):
            _busy(0.05)
            yield batch

    # Three passes, and the least disturbed one counts: on a busy machine the check can be held up between your timer
    # and its own (the rate it sees from outside drops), and other threads of this process add to process_time().
    passes = []
    for _ in range(3):
        stepped.clear()
        start = time.perf_counter()
        got = fn(sleepy, 4_000_000, lambda b: stepped.append(b.numel()))
        truth = 0.004 / (time.perf_counter() - start)  # GB/s as seen from outside: a little slower than from inside
        attempted(got)
        require(
            isinstance(got, tuple) and len(got) == 2, f"measure should return (GB/s, CPU seconds per GB), got {got!r}."
        )
        require(len(stepped) == 4, f"step ran {len(stepped)} times for 4 batches: call step(batch) on every batch.")
        passes.append((float(got[0]), truth, float(got[1])))
    rate, truth, _ = min(passes, key=lambda p: p[0] / p[1])
    cpu = min(p[2] for p in passes)
    if 0.85 < rate / truth < 0.96:  # 10^9 / 2^30 = 0.93
        raise Hint(f"{rate:.4f}: that is GiB/s; GB/s divides by 10^9 bytes, as disks and networks are rated.")
    require(
        0.97 < rate / truth < 1.3,
        f"4 MB arrived in {0.004 / truth:.2f} s, so {truth:.4f} GB/s; you returned "
        f"{rate:.4f}. Count the bytes of each batch (numel() × element_size()) and divide by the wall-clock "
        "seconds (time.perf_counter()).",
    )
    require(
        cpu < 10,
        f"the loop only waited, yet you report {cpu:.3f} CPU s per GB: measure CPU with "
        "time.process_time(), not the wall clock.",
    )
    cpu2 = min(float(fn(busy, 4_000_000, lambda b: None)[1]) for _ in range(2))
    require(
        30 < cpu2 < 80,
        f"the loop burned about 0.2 CPU seconds for 0.004 GB, about 50 CPU s per "
        f"GB; you report {cpu2:.3f}. Divide the process_time() difference by the GB delivered.",
    )

    def threaded():  # 4 MB, each batch made by a thread of its own that burns 0.05 s of CPU, as threaded readers do
        for _ in range(4):
            worker = threading.Thread(target=_busy, args=(0.05,))
            worker.start()
            worker.join()
            yield batch

    cpu3 = float(fn(threaded, 4_000_000, lambda b: None)[1])
    require(
        cpu3 > 30,
        f"the batches were made by another thread of this process, which burned about 50 CPU s per GB; you report "
        f"{cpu3:.3f}. time.thread_time() counts the calling thread only, and a thread reader's work (12.5) would "
        "vanish from your figures: time.process_time() counts every thread of the process.",
    )
    try:
        fn(sleepy, 8_000_000, lambda b: None)
    except Exception:  # any clear error will do
        return
    raise Hint(
        "the loader delivered 4 MB where 8 MB were expected, and no error: check the bytes counted "
        "against nbytes, or a short pass passes for a fast one."
    )


def _bytes_read() -> int:
    """Bytes this process has read so far, all threads together (``rchar`` of ``/proc/self/io``; Linux)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _open_files() -> int:
    """How many file descriptors this process holds (``/proc/self/fd``; Linux)."""
    return len(os.listdir("/proc/self/fd"))


THREAD_CASES = [(2, 2, 4), (2, 3, 4), (4, 4, 1)]  # (threads, in_flight, batch_size): the last, many small reads at once


@exercise(
    "12.5",
    "whole batches read by threads with preadv, in order, into in_flight + 1 buffers allocated once, "
    "never more than in_flight batches ahead of the loop.",
)
def thread_batches(cls: Any) -> None:
    """``cls(raw, batch_size, threads=2, in_flight=2)``: an iterable of ``[rows, raw.sample_len]`` batches of a raw file."""
    from ..highrate import write_raw_tensors

    attempted(cls)
    n, size = 42, 16384  # 42 samples of 16 KiB: with batches of 4, ten and a last one of 2
    with tempfile.TemporaryDirectory(prefix="check12-") as tmp:
        raw = write_raw_tensors(Path(tmp) / "raw.f32", n, sample_bytes=size, seed=12)
        truth = torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(n, -1))
        files = _open_files()
        for threads, in_flight, batch in THREAD_CASES:
            expected = [batch] * (n // batch) + ([n % batch] if n % batch else [])
            reader = cls(raw, batch, threads=threads, in_flight=in_flight)
            attempted(reader)
            require(
                len(reader) == len(expected),
                f"len() is {len(reader)}: {n} samples in batches of {batch} make "
                f"{len(expected)} batches{f', the last of {n % batch}' if n % batch else ''}.",
            )
            held: list[torch.Tensor] = []  # every batch kept alive, so that fresh tensors cannot share an address
            for epoch in range(2):
                start = _bytes_read()
                sizes = []
                for number, b in enumerate(reader):
                    require(isinstance(b, torch.Tensor), f"a batch is a {type(b).__name__}: yield torch tensors.")
                    if number == 0 and batch > 1:  # (bytes read counts every read: small batches leave no margin)
                        time.sleep(0.3)  # the threads have time to read ahead as far as they are allowed
                        ahead = (_bytes_read() - start) / (batch * size) - 1
                        if ahead > in_flight + 0.5:
                            raise Hint(
                                f"with in_flight={in_flight}, the reads ran {ahead:.0f} batches ahead while the "
                                f"loop held its first one; at most in_flight={in_flight} may be pending while the "
                                "loop works. Submit a read, then, as soon as more than in_flight are pending, "
                                "yield the oldest one's result."
                            )
                        if ahead < in_flight - 0.5:
                            raise Hint(
                                f"with in_flight={in_flight}, only {max(ahead, 0):.0f} batch(es) were read ahead while "
                                "the loop held its first one: you yield as soon as in_flight reads are pending "
                                "(`>=`), one too early. Yield the oldest when more than in_flight are pending, "
                                "`if len(pending) > in_flight`."
                            )
                    held.append(b)
                    sizes.append(b.shape[0])
                    first = number * batch
                    rows = truth[first : first + b.shape[0]]
                    left = n - first
                    if b.shape[0] > left:
                        raise Hint(
                            f"batch {number} has {b.shape[0]} rows, but only {left} samples are left: return the "
                            "part of the buffer that was read, buffer[:count]."
                        )
                    if not (b.shape == rows.shape and torch.equal(b, rows)):
                        matches = [
                            i
                            for i in range(0, n, batch)
                            if truth[i : i + b.shape[0]].shape == b.shape and torch.equal(b, truth[i : i + b.shape[0]])
                        ]
                        if matches:
                            raise Hint(
                                f"batch {number} holds samples {matches[0]}-{matches[0] + b.shape[0] - 1}: the "
                                "batches come out of order (yield the oldest pending read first, from a deque, "
                                "not the first one to finish), or its buffer was read into again while the loop "
                                "held it (in_flight reads plus the batch the loop holds need in_flight + 1 "
                                "buffers)."
                            )
                        raise Hint(
                            f"batch {number} does not hold samples {first}-{first + b.shape[0] - 1} of the file: "
                            "read batch b at byte offset b × batch_size × sample_bytes, with os.preadv (threads "
                            "that share one file position, seek then read, mix batches up)."
                        )
                require(
                    sizes == expected,
                    f"epoch {epoch}: batch sizes {sizes}; expected {expected} (slice the buffer "
                    "to the samples that are left).",
                )
            buffers = len({b.untyped_storage().data_ptr() for b in held})
            if buffers > in_flight + 1:
                raise Hint(
                    f"with in_flight={in_flight}, the batches of two epochs used {buffers} different buffers: "
                    f"allocate in_flight + 1 = {in_flight + 1} buffers once, in __init__, and read batch number "
                    "into buffers[number % (in_flight + 1)]."
                )
            del held
            gc.collect()  # a file object nothing refers to any more is closed now; a bare descriptor never is
            left_open = _open_files() - files
            require(
                left_open <= 0,
                f"after 2 passes over your reader, {left_open} more files are open than before: close what "
                "__iter__ opens when the pass ends, os.close(fd) in a finally: block (a job that reads for days "
                "runs out of file descriptors).",
            )
