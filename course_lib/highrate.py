"""Notebook 12, sections 1-5: a raw, uncompressible tensor stream at GB/s, where the bytes go, and the reused-buffer fix.

Can PyTorch feed a loop at 300-600 MB/s of raw float32 samples, GIL and all? :func:`compare` reads the same bytes
every way in one run (a raw read, a plain ``DataLoader`` with workers, :class:`RingLoader`'s reused shared-memory
slots, as FFCV and DALI do); :func:`compare_shards` does it for ``.npy`` members of tar shards.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import tarfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import numpy.lib.format as npformat
import torch
from torch.utils.data import DataLoader, Dataset

from .support import check_int, new_file, write_atomic
from .shards import load_npy, brace_urls
from .iterable import worker_slot
from .timing import medians

__all__ = [
    "MappedBatches",
    "RingLoader",
    "RawTensorDataset",
    "breakdown",
    "compare",
    "compare_records",
    "compare_shards",
    "gbps",
    "index_tensor_shards",
    "rate_and_cpu",
    "raw_read",
    "plot_main_process",
    "plot_rates",
    "write_raw_tensors",
]

SAMPLE_BYTES = 1 << 20  # 1 MiB per sample: 262,144 float32 values


class RawDataError(RuntimeError):
    """Notebook 12, section 1: a raw tensor file is missing, truncated or does not match its description."""


@dataclass(frozen=True)
class Float32Samples:
    """``n`` float32 samples of ``sample_bytes`` each; sample ``i`` lies at ``locations[i] = (file number, offset)``:
    back to back in one raw tensor file (:func:`write_raw_tensors`), or the ``.npy`` payloads of tar shards
    (:func:`index_tensor_shards`). A :class:`RingLoader` reads either."""

    files: tuple[str, ...]
    locations: tuple[tuple[int, int], ...]
    sample_bytes: int
    seed: int = 0

    @property
    def path(self) -> str:  # the (first) file
        return self.files[0]

    @property
    def n(self) -> int:
        return len(self.locations)

    @property
    def nbytes(self) -> int:
        return self.n * self.sample_bytes

    @property
    def sample_len(self) -> int:  # float32 values per sample
        return self.sample_bytes // 4


def _raw_file(path: str | os.PathLike[str], n: int, sample_bytes: int, seed: int = 0) -> Float32Samples:
    return Float32Samples((str(path),), tuple((0, i * sample_bytes) for i in range(n)), sample_bytes, seed)


def write_raw_tensors(
    path: str | os.PathLike[str], n: int, sample_bytes: int = SAMPLE_BYTES, seed: int = 0
) -> Float32Samples:
    """Notebook 12, section 1: write ``n`` random float32 samples (uniform noise: incompressible) to ``path``, or reuse them.

    Same arguments, same bytes. Written to a temporary name and renamed, the ``.json`` sidecar last, so a
    killed run never leaves a file that looks complete."""
    check_int(n, "n", 1)
    if sample_bytes < 4 or sample_bytes % 4:
        raise ValueError(f"sample_bytes must be a positive multiple of 4 (float32), got {sample_bytes}")
    path = Path(path)
    want = _raw_file(path, n, sample_bytes, seed)
    with contextlib.suppress(RawDataError):
        if _open_raw(path) == want:
            return want
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    try:
        with new_file(path) as f:
            for _ in range(n):
                f.write(rng.random(sample_bytes // 4, dtype=np.float32).tobytes())
    except OSError as exc:
        raise RawDataError(f"could not write {path.name} ({n * sample_bytes / 2**20:.0f} MiB): {exc}") from exc
    write_atomic(Path(f"{path}.json"), json.dumps({"n": n, "sample_bytes": sample_bytes, "seed": seed}))
    return want


def _open_raw(path: str | os.PathLike[str]) -> Float32Samples:
    """Describe an existing raw tensor file, checking its size against its sidecar."""
    path, sidecar = Path(path), Path(f"{path}.json")
    if not path.is_file() or not sidecar.is_file():
        raise RawDataError(
            f"no raw tensor file {path.name} (with its .json description) in {path.parent.name or '.'}: write one with "
            f"course_lib.highrate.write_raw_tensors(path, n) or `python -m course_lib bench highrate --data PATH`"
        )
    meta = json.loads(sidecar.read_text())
    raw = _raw_file(path, int(meta["n"]), int(meta["sample_bytes"]), int(meta.get("seed", 0)))
    if path.stat().st_size != raw.nbytes:
        raise RawDataError(
            f"{path.name} holds {path.stat().st_size} bytes but its description says {raw.nbytes}: "
            "truncated? Write it again."
        )
    return raw


def read_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``fd`` at ``offset``: one ``preadv`` system call (repeated if the OS returns less)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise RawDataError(f"unexpected end of file at byte {offset + done}: the file is shorter than described")
        done += n


class RawTensorDataset(Dataset):
    """Notebook 12, section 1: sample ``i`` of a raw tensor file as a float32 tensor: the plain map-style way.

    Each call reads 1 sample with ``os.preadv`` into a **fresh** array. Each process opens the file itself:
    a descriptor inherited through ``fork`` would share its offset, and ``spawn`` has none."""

    def __init__(self, raw: Float32Samples) -> None:
        self.raw, self._fd, self._pid = raw, None, -1  # the file, opened in each process on first use

    def __len__(self) -> int:
        return self.raw.n

    def _read(self, first: int, count: int, shared: bool = False) -> torch.Tensor:
        """Samples ``first`` to ``first + count - 1`` in a fresh ``[count, sample_len]`` tensor, in one system call;
        ``shared``: born in shared memory, as ``default_collate`` makes a batch in a worker."""
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.raw.path, os.O_RDONLY), os.getpid()
        nbytes = count * self.raw.sample_bytes
        out = _shared_empty(nbytes) if shared else torch.empty(nbytes // 4, dtype=torch.float32)
        read_into(self._fd, memoryview(out.numpy()).cast("B"), first * self.raw.sample_bytes)
        return out.view(count, self.raw.sample_len)

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.raw.n:
            raise IndexError(f"index {index} is out of range for {self.raw.n} samples")
        return self._read(index, 1)[0]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": -1}  # a descriptor means nothing in another process


def _shared_empty(nbytes: int) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` born in shared memory, as ``default_collate`` makes one in a worker
    (``UntypedStorage._new_shared``: private, checked with torch 2.14 and 2.15; ``share_memory_()`` would copy)."""
    return torch.empty(0, dtype=torch.float32).set_(torch.UntypedStorage._new_shared(nbytes))


class _RawBatchDataset(RawTensorDataset):
    """Batch ``b`` of a raw tensor file, read whole with one system call (use it with ``batch_size=None``): no
    per-sample arrays, no collate; in a worker born in shared memory, but still **fresh** for every batch."""

    def __init__(self, raw: Float32Samples, batch_size: int) -> None:
        super().__init__(raw)
        self.batch_size = check_int(batch_size, "batch_size", 1)

    def __len__(self) -> int:
        return -(-self.raw.n // self.batch_size)

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is out of range for {len(self)} batches")
        count = min(self.batch_size, self.raw.n - index * self.batch_size)
        return self._read(index * self.batch_size, count, shared=worker_slot(main=-1)[0] >= 0)


def _touch(batch: torch.Tensor) -> float:
    """The least a training loop does with a batch: read one value per 4 KiB page, which brings every page
    into this process (a page handed over from another one costs a page fault on first touch)."""
    flat = batch.reshape(-1)
    return float(flat[:: 4096 // flat.element_size()].sum())


def index_tensor_shards(paths: Iterable[str | os.PathLike[str]]) -> Float32Samples:
    """Notebook 12, section 3: index the ``.npy`` members of tar shards (e.g. from ``shards.write_tensor_shards``), in order.

    Tar stores members uncompressed and a ``.npy`` file is a short header and the raw array, so sample ``i``
    is ``sample_bytes`` contiguous bytes at ``locations[i]``. Reads only the headers; anything but same-sized
    little-endian float32 arrays in C order is a :class:`RawDataError`."""
    files = [str(p) for p in paths]
    locations: list[tuple[int, int]] = []
    sample_bytes = 0
    for number, path in enumerate(files):
        with tarfile.open(path) as tar, open(path, "rb") as f:
            for member in tar:
                if not member.isfile() or not member.name.endswith(".npy"):
                    continue
                where = f"{Path(path).name}: {member.name}"
                f.seek(member.offset_data)
                try:
                    version = npformat.read_magic(f)
                    read_header = (
                        npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                    )
                    shape, fortran, dtype = read_header(f)
                except ValueError as exc:
                    raise RawDataError(f"{where} is not a .npy array ({exc})") from None
                if dtype != np.dtype("<f4") or (fortran and len(shape) > 1):
                    raise RawDataError(
                        f"{where} holds {dtype} (fortran order: {fortran}); "
                        "this index reads little-endian float32 arrays in C order only"
                    )
                size = int(np.prod(shape)) * 4
                if locations and size != sample_bytes:
                    raise RawDataError(
                        f"{where} holds {size} bytes, the first array {sample_bytes}: "
                        "a batch of slots needs samples of one size"
                    )
                sample_bytes = size
                locations.append((number, f.tell()))
    if not locations:
        raise RawDataError("no .npy members in the shards given: write them with shards.write_tensor_shards(...)")
    return Float32Samples(tuple(files), tuple(locations), sample_bytes)


def _npy_tensor(sample: dict) -> torch.Tensor:
    """A webdataset sample's ``.npy`` member as a tensor (never unpickled: ``allow_pickle=False``)."""
    return torch.from_numpy(load_npy(sample["npy"]))


def _shard_loader(urls: str, batch_size: int, num_workers: int = 2, **loader_options: Any) -> Any:
    """The plain webdataset way: workers read their shards (at least one each), decode ``.npy``, stack batches."""
    import webdataset as wds

    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_npy_tensor)
    return wds.WebLoader(
        dataset.batched(batch_size, collation_fn=torch.stack),
        batch_size=None,
        num_workers=num_workers,
        **loader_options,
    )


def _read_files(
    paths: Iterable[str | os.PathLike[str]], chunk_bytes: int, reuse: bool = True, dtype: Any = np.uint8
) -> Iterator[torch.Tensor]:
    """Read files front to back in one process, ``chunk_bytes`` at a time: into one reused buffer (``reuse=True``,
    overwritten by the next chunk), or into a fresh buffer per chunk, as ``np.empty`` in a loop would."""
    itemsize = np.dtype(dtype).itemsize
    buffer = np.empty(chunk_bytes // itemsize, dtype=dtype)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                buf = buffer if reuse else np.empty(chunk_bytes // itemsize, dtype=dtype)
                n = f.readinto(memoryview(buf).cast("B"))
                if not n:
                    break
                yield torch.from_numpy(buf[: n // itemsize])


def _ring_worker(
    raw: Float32Samples,
    slots: torch.Tensor,
    tasks: Any,
    done: Any,
    transform: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """Worker process: read each task's samples (at ``raw.locations``) into its slot; a task is ``(batch, slot, indices)``.
    ``transform``, if given, works on each sample in place, in the slot."""
    size, length = raw.sample_bytes, raw.sample_len
    fds = {}  # file number -> open file descriptor
    while True:
        task = tasks.get()
        if task is None:
            break
        number, slot, indices = task
        memory = memoryview(slots[slot].numpy()).cast("B")  # the slot's bytes, shared with the main process
        try:
            for i, index in enumerate(indices):
                file, offset = raw.locations[index]
                if file not in fds:
                    fds[file] = os.open(raw.files[file], os.O_RDONLY)
                read_into(fds[file], memory[i * size : (i + 1) * size], offset)
                if transform is not None:
                    transform(slots[slot, i * length : (i + 1) * length])
            done.put((number, slot, None))
        except Exception as exc:  # noqa: BLE001 - report, don't die: the main process raises it
            done.put((number, slot, f"{type(exc).__name__}: {exc}"))
    for fd in fds.values():
        os.close(fd)


class RingLoader:
    """Notebook 12, section 2: batches of a raw tensor file, read by worker processes into reused shared-memory slots.

    ``slots`` batch buffers (default ``2 * num_workers + 1``) are allocated once, in shared memory. Workers
    read each batch's samples straight into a free slot; the main process yields a tensor that **is** the
    slot, without a copy, and hands the slot back when the next batch is requested: ``.clone()`` a batch to
    keep it (FFCV's and DALI's contract too). Batches come in order; ``shuffle`` draws a new order every
    epoch from ``seed + epoch``. ``raw`` may also be an index of tar shards (:func:`index_tensor_shards`).
    ``transform`` (a module-level function, sent to the workers) works on each sample in place, in its slot."""

    def __init__(
        self,
        raw: Float32Samples,
        batch_size: int,
        num_workers: int = 2,
        slots: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        timeout: float = 60.0,
        start_method: str | None = None,
        transform: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.raw, self.batch_size = raw, check_int(batch_size, "batch_size", 1)
        self.num_workers = check_int(num_workers, "num_workers", 1)
        self.n_slots = slots or 2 * num_workers + 1
        if self.n_slots < 2:
            raise ValueError("a ring needs at least 2 slots: one for the loop, one being filled")
        self.shuffle, self.seed, self.drop_last, self.timeout = shuffle, seed, drop_last, timeout
        self.epoch = 0
        self._procs: list[Any] = []
        try:
            self._slots = _shared_empty(self.n_slots * batch_size * raw.sample_bytes).view(self.n_slots, -1)
        except (RuntimeError, OSError) as exc:
            raise RuntimeError(
                f"could not allocate {self.n_slots * batch_size * raw.sample_bytes / 2**20:.0f} MiB of shared memory "
                f"for {self.n_slots} batch slots ({exc}). Check `df -h /dev/shm` (containers default to 64 MB: "
                "docker run --shm-size=...), or use fewer slots or smaller batches."
            ) from None
        ctx = torch.multiprocessing.get_context(start_method)
        self._tasks, self._done = ctx.Queue(), ctx.Queue()
        self._in_flight = 0  # tasks sent to the workers whose completion has not been received
        args = (raw, self._slots, self._tasks, self._done, transform)
        self._procs.extend(ctx.Process(target=_ring_worker, args=args, daemon=True) for _ in range(num_workers))
        # stops the workers once: on close(), when this loader is collected, or at exit (a global ring)
        self._finalizer = weakref.finalize(self, _stop_ring_workers, self._procs, self._tasks)
        for p in self._procs:
            p.start()

    _Empty = queue.Empty  # bound here, for __iter__'s cleanup when a generator is closed at interpreter exit

    def __len__(self) -> int:
        return self.raw.n // self.batch_size if self.drop_last else -(-self.raw.n // self.batch_size)

    def _wait(self, number: int, ready: dict[int, tuple[int, str | None]]) -> int:
        """The slot holding batch ``number``, once a worker has read it."""
        deadline = time.monotonic() + self.timeout
        while number not in ready:
            try:
                got, slot, error = self._done.get(timeout=1.0)
                self._in_flight -= 1
                ready[got] = (slot, error)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"a RingLoader worker (pid {dead[0].pid}) exited with code {dead[0].exitcode}; "
                        "see its error above"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batch {number} not read after {self.timeout:.0f} s") from None
        slot, error = ready.pop(number)
        if error:
            raise RuntimeError(f"reading batch {number} failed in a worker: {error}")
        return slot

    def __iter__(self) -> Iterator[torch.Tensor]:
        if not self._procs:
            raise RuntimeError("this RingLoader is closed")
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.raw.n, generator=g).tolist() if self.shuffle else list(range(self.raw.n))
        batches = [order[i : i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)]
        free, ready, sent, held = list(range(self.n_slots)), {}, 0, None
        try:
            for number, indices in enumerate(batches):
                if held is not None:  # the loop asked for the next batch: the slot it held is free again
                    free.append(held)
                while free and sent < len(batches):
                    self._tasks.put((sent, free.pop(), batches[sent]))
                    self._in_flight += 1
                    sent += 1
                held = self._wait(number, ready)
                yield self._slots[held, : len(indices) * self.raw.sample_len].view(len(indices), self.raw.sample_len)
        finally:
            # a loop that stopped early leaves reads in flight: collect them, so that the next epoch
            # starts with every slot free and no stale completion in the queue. A closed loader has no
            # workers left to wait for (at interpreter exit this runs after the finalizer, with module
            # globals such as `queue` possibly gone: `self._Empty` is bound to the class instead)
            try:
                while self._in_flight > 0 and self._procs:
                    self._done.get(timeout=self.timeout)
                    self._in_flight -= 1
            except self._Empty:
                self.close()  # a worker is stuck or gone: this loader cannot be trusted any more
            self.epoch += 1

    def close(self) -> None:
        """Stop the workers and release the shared memory (once; later calls do nothing)."""
        self._finalizer()

    def __enter__(self) -> "RingLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_ring_workers(procs: list[Any], tasks: Any) -> None:
    """Stop a :class:`RingLoader`'s worker processes, and empty ``procs`` (the loader's own list) in place.

    Run once, by ``weakref.finalize``: from ``close()``, when the loader is garbage-collected, or at interpreter exit
    (``atexit``, while modules are still whole; a ``__del__`` there can find module globals already set to None).
    It holds ``procs`` and ``tasks``, never the loader itself. A queue that ``multiprocessing`` closed first at exit
    refuses the stop message; the worker is then killed."""
    for _ in procs:
        try:
            tasks.put(None)
        except (ValueError, OSError):  # the queue is already closed: kill below
            break
    for p in procs:
        if p.pid is None:  # never started (its start failed)
            continue
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    procs.clear()


def _count_records(path: str | os.PathLike[str], record_bytes: int) -> int:
    """How many float32 records of ``record_bytes`` the file at ``path`` holds; a clear error where it does not divide."""
    size = os.path.getsize(path)
    if record_bytes < 4 or record_bytes % 4 or size == 0 or size % record_bytes:
        raise RawDataError(
            f"{Path(path).name} holds {size} bytes, not a whole number of {record_bytes}-byte float32 "
            "records: check record_bytes (a multiple of 4), or write the file again"
        )
    return size // record_bytes


class MappedBatches:
    """Notebook 12, section 4: batches of fixed-size float32 records, gathered from a memory-mapped file.

    The file is mapped, not read: the OS brings pages in from its cache as they are touched. Each batch is one
    ``index_select`` into a buffer allocated once, valid until the next batch is requested (clone what you keep,
    as with :class:`RingLoader`). No workers, no per-record Python. A new order each epoch from ``seed + epoch``."""

    def __init__(self, path, record_bytes, batch_size, shuffle=True, seed=0):
        self.n, self.record_len = _count_records(path, record_bytes), record_bytes // 4
        self.records = torch.from_file(str(path), size=self.n * self.record_len).view(self.n, self.record_len)
        self.buffer = torch.empty(batch_size, self.record_len)
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0

    def __len__(self):
        return -(-self.n // self.batch_size)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g) if self.shuffle else torch.arange(self.n)
        self.epoch += 1
        for start in range(0, self.n, self.batch_size):
            rows = order[start : start + self.batch_size]
            yield torch.index_select(self.records, 0, rows, out=self.buffer[: len(rows)])


def _stack_numpy(samples: list[torch.Tensor]) -> np.ndarray:
    """A collate that returns NumPy: the batch is pickled through the worker's pipe, not sent as a shared-memory handle."""
    return np.stack([sample.numpy() for sample in samples])


def _sum_step(batch: torch.Tensor) -> float:
    """A stand-in for a training step that uses the main process's CPU: it reads every value of the batch."""
    return float(batch.sum())


def raw_read(path: str | os.PathLike[str], chunk_bytes: int) -> Iterator[torch.Tensor]:
    """Notebook 12, exercise 12.4 (the course's version): the file front to back, ``chunk_bytes`` at a time, read into
    **one** reused float32 buffer; each chunk is the part ``readinto`` filled, valid until the next one."""
    buffer = torch.empty(chunk_bytes // 4)
    with open(path, "rb", buffering=0) as f:
        while filled := f.readinto(memoryview(buffer.numpy()).cast("B")):
            yield buffer[: filled // 4]


def rate_and_cpu(
    make_batches: Callable[[], Iterable[torch.Tensor]], nbytes: int, step: Callable[[torch.Tensor], Any] = _touch
) -> tuple[float, float]:
    """Notebook 12, exercise 12.4 (the course's version): ``(GB/s, CPU seconds per GB)`` of one pass of
    ``make_batches()``, each batch given to ``step``: 10^9 bytes per wall-clock second, and the CPU time (user +
    system, all its threads) this process spent per GB: what the training loop's own process paid, as opposed to
    waiting for workers. A pass that delivers other than ``nbytes`` is an error: a short pass would pass for a fast one."""
    start, start_cpu = time.perf_counter(), time.process_time()
    seen = 0
    for batch in make_batches():
        step(batch)
        seen += batch.numel() * batch.element_size()
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if seen != nbytes:
        raise RuntimeError(f"a pass delivered {seen} bytes instead of {nbytes}")
    return nbytes / seconds / 1e9, cpu / (nbytes / 1e9)


def gbps(
    make_batches: Callable[[], Iterable[torch.Tensor]],
    nbytes: int,
    cpu: list[float] | None = None,
    step: Callable[[torch.Tensor], Any] = _touch,
) -> float:
    """Notebook 12, section 1: GB/s of one pass (:func:`rate_and_cpu`); with a ``cpu`` list, appends its CPU seconds per GB."""
    rate, seconds_per_gb = rate_and_cpu(make_batches, nbytes, step)
    if cpu is not None:
        cpu.append(seconds_per_gb)
    return rate


def _measure(
    methods: dict[str, tuple[Callable[[], Iterable[torch.Tensor]], int]],
    rounds: int,
    cpu: dict[str, list[float]] | None,
    step: Callable[[torch.Tensor], Any] = _touch,
) -> dict[str, list[float]]:
    """One untimed pass of every method (page cache, workers, slots), then each method once per round, in turn, so drift
    hits all alike; on one torch thread, as in a worker. With two raw reads or more, their best per round leads ("fastest raw read")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for make, nbytes in methods.values():
            gbps(make, nbytes, step=step)
        results: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(rounds):
            for name, (make, nbytes) in methods.items():
                results[name].append(gbps(make, nbytes, None if cpu is None else cpu.setdefault(name, []), step))
        raw = [name for name in methods if name.startswith("raw read")]
        if len(raw) < 2:
            return results
        return {"fastest raw read": [max(values) for values in zip(*(results[name] for name in raw))], **results}
    finally:
        torch.set_num_threads(threads)


def compare(
    raw: Float32Samples,
    batch_size: int = 64,
    workers: int = 2,
    rounds: int = 3,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Notebook 12, section 1: GB/s of every way of reading the same bytes of a raw file, interleaved round by round.

    Returns ``{method: [GB/s per round]}``, the limit (fastest raw read) first; ``cpu`` receives the main process's CPU
    seconds per GB per method and round. Workers persist across rounds: start-up is not counted."""
    plain = DataLoader(RawTensorDataset(raw), batch_size=batch_size, num_workers=workers, persistent_workers=True)
    whole = DataLoader(_RawBatchDataset(raw, batch_size), batch_size=None, num_workers=workers, persistent_workers=True)
    single = DataLoader(RawTensorDataset(raw), batch_size=batch_size, num_workers=0)
    batch_bytes = batch_size * raw.sample_bytes
    with RingLoader(raw, batch_size, num_workers=workers) as ring:
        return _measure(
            {
                "raw read, sample-sized reused buffer": (lambda: _read_files(raw.files, raw.sample_bytes), raw.nbytes),
                "raw read, batch-sized reused buffer": (lambda: _read_files(raw.files, batch_bytes), raw.nbytes),
                "raw read, fresh batch buffer": (lambda: _read_files(raw.files, batch_bytes, reuse=False), raw.nbytes),
                "DataLoader, 0 workers": (lambda: single, raw.nbytes),
                f"DataLoader, {workers} workers": (lambda: plain, raw.nbytes),
                f"DataLoader, batch reads, {workers} workers": (lambda: whole, raw.nbytes),
                f"RingLoader, {workers} workers": (lambda: ring, raw.nbytes),
            },
            rounds,
            cpu,
        )


def compare_shards(
    paths: Iterable[str | os.PathLike[str]],
    batch_size: int = 64,
    workers: int = 2,
    rounds: int = 3,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Notebook 12, section 3: the same comparison for float32 ``.npy`` members of tar shards (headers included in the
    limit's read: under 1 % more bytes); webdataset against a :class:`RingLoader` at :func:`index_tensor_shards`' offsets."""
    paths = [str(p) for p in paths]
    if len(paths) < workers:
        raise ValueError(
            f"{len(paths)} shards for {workers} workers: webdataset splits by shard, give it at least {workers}"
        )
    index = index_tensor_shards(paths)
    plain = _shard_loader(brace_urls(paths), batch_size, workers, persistent_workers=True)
    with RingLoader(index, batch_size, num_workers=workers) as ring:
        return _measure(
            {
                "shard files read, sample-sized reused buffer": (
                    lambda: _read_files(paths, index.sample_bytes),
                    sum(os.path.getsize(p) for p in paths),
                ),
                f"WebDataset, {workers} workers": (lambda: plain, index.nbytes),
                f"RingLoader on the index, {workers} workers": (lambda: ring, index.nbytes),
            },
            rounds,
            cpu,
        )


def compare_records(
    folder: str | os.PathLike[str],
    record_sizes: Iterable[int] = (4096, 65536, 1 << 20),
    total_bytes: int = 128 << 20,
    batch_bytes: int = 4 << 20,
    workers: int = 2,
    rounds: int = 3,
    cpu: dict[int, dict[str, list[float]]] | None = None,
) -> dict[int, dict[str, list[float]]]:
    """Notebook 12, section 5: for each record size, the same ``total_bytes`` read every way, shuffled, in one run.

    Batches of ``batch_bytes``; every loop runs :func:`_sum_step` on each batch (the main process's own CPU work).
    Returns ``{record_bytes: {method: [GB/s per round]}}``, each led by the fastest raw read (the limit)."""
    out = {}
    for size in record_sizes:
        raw = write_raw_tensors(Path(folder) / f"records-{size}.f32", total_bytes // size, sample_bytes=size)
        batch = max(1, batch_bytes // size)
        shuffled = dict(batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=True)
        tensors = DataLoader(RawTensorDataset(raw), generator=torch.Generator().manual_seed(0), **shuffled)
        arrays = DataLoader(
            RawTensorDataset(raw), generator=torch.Generator().manual_seed(0), collate_fn=_stack_numpy, **shuffled
        )
        mapped = MappedBatches(raw.path, size, batch)
        with RingLoader(raw, batch, num_workers=workers, shuffle=True) as ring:
            out[size] = _measure(
                {
                    "raw read, record-sized reused buffer": (
                        lambda: _read_files(raw.files, size, dtype=np.float32),
                        raw.nbytes,
                    ),
                    "raw read, batch-sized reused buffer": (
                        lambda: _read_files(raw.files, batch * size, dtype=np.float32),
                        raw.nbytes,
                    ),
                    f"DataLoader, {workers} workers, tensors": (lambda: tensors, raw.nbytes),
                    f"DataLoader, {workers} workers, NumPy batches": (
                        lambda: map(torch.from_numpy, arrays),
                        raw.nbytes,
                    ),
                    f"RingLoader, {workers} workers": (lambda: ring, raw.nbytes),
                    "MappedBatches, no workers": (lambda: mapped, raw.nbytes),
                },
                rounds,
                None if cpu is None else cpu.setdefault(size, {}),
                step=_sum_step,
            )
    return out


def breakdown(results: dict[str, list[float]], cpu: dict[str, list[float]], workers: int) -> dict[str, float]:
    """Notebook 12, section 2: where the time goes, in seconds per GB, from one :func:`compare` run (with ``cpu``).

    In one process costs add up, so neighbouring methods' differences isolate them; with workers, the main process's own CPU."""
    wall = {k: 1 / v for k, v in medians(results).items()}
    busy = medians(cpu)
    return {
        "copy from the page cache": wall["raw read, batch-sized reused buffer"],
        # a difference smaller than the noise of a busy machine can come out negative: it reads as 0
        "a fresh buffer per batch": max(
            0.0, wall["raw read, fresh batch buffer"] - wall["raw read, batch-sized reused buffer"]
        ),
        "per-sample arrays + collate's copy": max(
            0.0, wall["DataLoader, 0 workers"] - wall["raw read, fresh batch buffer"]
        ),
        "main process, fresh shared batches": busy[f"DataLoader, batch reads, {workers} workers"],
        "main process, RingLoader slots": busy[f"RingLoader, {workers} workers"],
    }


def _colour(name: str) -> str:
    shades = {
        "fastest raw read": "#222222",
        "raw read, sample": "#444444",
        "shard files": "#444444",
        "raw read, batch": "#777777",
        "raw read": "#AAAAAA",
        "RingLoader": "#DD8452",
    }
    return next((c for prefix, c in shades.items() if name.startswith(prefix)), "#4C72B0")


def plot_rates(results: dict[str, list[float]], ax: Any = None, title: str = "Reading the same bytes") -> Any:
    """Notebook 12, section 1: horizontal bars of the median GB/s per method, each relative to the first (the limit)."""
    from .viz import relative_bars

    med = medians(results)
    first = next(iter(med))
    return relative_bars(
        med,
        f"throughput relative to '{first}' (1.0 = the limit here)",
        title,
        [_colour(n) for n in med],
        ax=ax,
        width=7,
        pad=0.5,
    )


def plot_main_process(
    results: dict[str, list[float]],
    cpu: dict[str, list[float]],
    ax: Any = None,
    title: str = "Where the training loop's process spends its time",
) -> Any:
    """Notebook 12, section 2: per method, the seconds per GB of the main process: its own CPU time, and the rest (waiting)."""
    import matplotlib.pyplot as plt

    med, busy = medians(results), medians(cpu)
    names = [name for name in med if name in busy]  # "fastest raw read" is a best of, not a run of its own
    wall = [1 / med[n] for n in names]
    own = [min(busy[n], w) for n, w in zip(names, wall)]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)), dpi=80)
    y = range(len(names))
    ax.barh(y, own, color=[_colour(n) for n in names], label="CPU time of the main process")
    ax.barh(
        y,
        [w - o for w, o in zip(wall, own)],
        left=own,
        color="white",
        edgecolor="#888888",
        hatch="//",
        label="waiting: for workers, or for a free core",
    )
    ax.set(yticks=y, yticklabels=names, xlabel="seconds per GB delivered to the loop (shorter is faster)", title=title)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    return ax.figure
