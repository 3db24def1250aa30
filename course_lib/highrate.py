"""Notebook 09, sections 7-9: a raw, uncompressible tensor stream at GB/s, where the bytes go, and the reused-buffer fix.

The question (asked about scientific data at 300-600 MB/s): can PyTorch feed a training loop that
fast when the GIL is in the way? Notebook 09 answers it by measuring, in one run, on the same
bytes:

* the physical limit: :func:`_read_sequential` with ``reuse=True``, a plain sequential read from
  the page cache into one reused buffer of one sample (small enough to stay in the CPU cache:
  the fastest a process copies bytes out of the page cache);
* the same read into a reused buffer of one **batch** (as large as what the loop receives), and
  into a **fresh** batch buffer every time (``reuse=False``): the cost of allocating, and of the
  kernel zeroing new pages;
* a plain ``DataLoader`` over :class:`RawTensorDataset` with worker processes: each sample read
  into a fresh array, stacked into a fresh shared-memory batch, handed to the main process;
* :class:`RingLoader`: worker processes read straight into a small ring of shared-memory batch
  slots allocated once, the way FFCV and DALI reuse their buffers. One copy (page cache to slot),
  no allocation per batch, no pickling of data.

Built on the standard library and torch only; :func:`compare` runs them all and
``python -m course_lib bench highrate`` runs it from a shell on any file system.
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ._support import new_file, write_atomic
from .timing import medians

__all__ = ["RingLoader", "RawTensorDataset", "breakdown", "compare", "compare_shards", "gbps", "index_tensor_shards",
           "plot_main_process", "plot_rates", "write_raw_tensors"]

SAMPLE_BYTES = 1 << 20  # 1 MiB per sample: 262,144 float32 values
PAGE = 4096


class RawDataError(RuntimeError):
    """A raw tensor file is missing, truncated or does not match its description."""


# --------------------------------------------------------------------------- the data


class _Float32Samples:
    """What a RingLoader needs of a sample source: ``n`` samples of ``sample_bytes`` float32 bytes."""

    n: int
    sample_bytes: int

    @property
    def nbytes(self) -> int:
        return self.n * self.sample_bytes

    @property
    def sample_len(self) -> int:
        """float32 values per sample."""
        return self.sample_bytes // 4


@dataclass(frozen=True)
class _RawTensorFile(_Float32Samples):
    """A file of ``n`` float32 samples of ``sample_bytes`` each, back to back, and its JSON sidecar."""

    path: str
    n: int
    sample_bytes: int
    seed: int = 0


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_raw_tensors(path: str | os.PathLike[str], n: int, sample_bytes: int = SAMPLE_BYTES, seed: int = 0) -> _RawTensorFile:
    """Notebook 09, section 7: write ``n`` random float32 samples (uniform noise: incompressible) to ``path``, or reuse them.

    Written to a temporary name and renamed, the sidecar last, so a killed run never leaves a
    file that looks complete. Same arguments, same bytes.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if sample_bytes < 4 or sample_bytes % 4:
        raise ValueError(f"sample_bytes must be a positive multiple of 4 (float32), got {sample_bytes}")
    path = Path(path)
    want = _RawTensorFile(str(path), n, sample_bytes, seed)
    try:
        if _open_raw(path) == want:
            return want
    except RawDataError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    try:
        with new_file(path) as f:
            for _ in range(n):
                f.write(rng.random(sample_bytes // 4, dtype=np.float32).tobytes())
    except OSError as exc:
        raise RawDataError(f"could not write {path.name} ({n * sample_bytes / 2**20:.0f} MiB): {exc}") from exc
    write_atomic(_sidecar(path), json.dumps({k: v for k, v in asdict(want).items() if k != "path"}))
    return want


def _open_raw(path: str | os.PathLike[str]) -> _RawTensorFile:
    """Describe an existing raw tensor file, checking its size against its sidecar."""
    path = Path(path)
    side = _sidecar(path)
    if not path.is_file() or not side.is_file():
        raise RawDataError(
            f"no raw tensor file {path.name} (with its .json description) in {path.parent.name or '.'}: write one with "
            f"course_lib.highrate.write_raw_tensors(path, n) or `python -m course_lib bench highrate --data PATH`"
        )
    meta = json.loads(side.read_text())
    raw = _RawTensorFile(str(path), int(meta["n"]), int(meta["sample_bytes"]), int(meta.get("seed", 0)))
    size = path.stat().st_size
    if size != raw.nbytes:
        raise RawDataError(f"{path.name} holds {size} bytes but its description says {raw.nbytes}: truncated? Write it again.")
    return raw


class RawTensorDataset(Dataset):
    """Notebook 09, section 7: sample ``i`` of a raw tensor file as a float32 tensor: the plain map-style way.

    Each call reads 1 sample with ``os.pread`` into a **fresh** array. The file is opened lazily
    in each process (a descriptor inherited through ``fork`` would share its offset; ``pread``
    needs no offset, but a fresh open also works under ``spawn``).
    """

    def __init__(self, raw: _RawTensorFile) -> None:
        self.raw = raw
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.raw.n

    def _file(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.raw.path, os.O_RDONLY), os.getpid()
        return self._fd

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.raw.n:
            raise IndexError(f"index {index} is out of range for {self.raw.n} samples")
        out = np.empty(self.raw.sample_len, dtype=np.float32)
        _read_into(self._file(), memoryview(out).cast("B"), index * self.raw.sample_bytes)
        return torch.from_numpy(out)

    def __getstate__(self) -> dict:
        return {"raw": self.raw, "_fd": None, "_pid": -1}  # a descriptor means nothing in another process


def _read_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``fd`` at ``offset`` (one system call when the OS has ``preadv``)."""
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - Windows: no positional read into a buffer
            os.lseek(fd, offset + done, os.SEEK_SET)
            n = os.readv(fd, [view[done:]])
        if n == 0:
            raise RawDataError(f"unexpected end of file at byte {offset + done}: the file is shorter than described")
        done += n


def _shared_empty(nbytes: int) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` allocated directly in shared memory, as ``default_collate`` does in a
    worker (``torch.UntypedStorage._new_shared``: private, checked with torch 2.14 and 2.15). The public
    ``torch.empty(...).share_memory_()`` would allocate, then copy into shared memory."""
    return torch.empty(0, dtype=torch.float32).set_(torch.UntypedStorage._new_shared(nbytes))


def _touch(batch: torch.Tensor) -> float:
    """The least a training loop does with a batch: read one value per 4 KiB page.

    It forces every page of the batch into this process (a page handed over from another process
    costs a page fault on first _touch) without spending time on arithmetic.
    """
    flat = batch.reshape(-1)
    return float(flat[:: PAGE // flat.element_size()].sum())


class _RawBatchDataset(Dataset):
    """Batch ``b`` of a raw tensor file, read whole with one system call: use it with ``batch_size=None``.

    The per-sample :class:`RawTensorDataset` reads ``batch_size`` small arrays and lets collate
    copy them into the batch; here the samples go straight into the batch tensor. In a worker the
    tensor is allocated in shared memory, as ``default_collate`` does, so that it crosses to the
    main process without another copy; but it is still a **fresh** allocation for every batch.
    """

    def __init__(self, raw: _RawTensorFile, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.samples, self.batch_size = RawTensorDataset(raw), batch_size

    def __len__(self) -> int:
        return -(-self.samples.raw.n // self.batch_size)

    def __getitem__(self, index: int) -> torch.Tensor:
        raw = self.samples.raw
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is out of range for {len(self)} batches")
        count = min(self.batch_size, raw.n - index * self.batch_size)
        if torch.utils.data.get_worker_info() is not None:  # born in shared memory: no copy on the way out
            out = _shared_empty(count * raw.sample_bytes).view(count, raw.sample_len)
        else:
            out = torch.empty(count, raw.sample_len, dtype=torch.float32)
        _read_into(self.samples._file(), memoryview(out.numpy()).cast("B"), index * self.batch_size * raw.sample_bytes)
        return out


# --------------------------------------------------------------------------- the same samples in tar shards


@dataclass(frozen=True)
class _TensorShardIndex(_Float32Samples):
    """Where the float32 payload of every ``.npy`` member of some tar shards lies.

    Tar stores members uncompressed, and a ``.npy`` file is a short header followed by the raw
    array: so sample ``i`` is ``sample_bytes`` contiguous bytes at ``locations[i] = (file number,
    offset)``. Built once by :func:`index_tensor_shards`; a :class:`RingLoader` reads by it.
    """

    files: tuple[str, ...]
    locations: tuple[tuple[int, int], ...]
    sample_bytes: int

    @property
    def n(self) -> int:  # type: ignore[override]
        return len(self.locations)


def index_tensor_shards(paths: Iterable[str | os.PathLike[str]]) -> _TensorShardIndex:
    """Notebook 09, section 9: index the ``.npy`` members of tar shards (e.g. from ``shards.write_tensor_shards``), in order.

    Reads only the tar and ``.npy`` headers. Every array must be a little-endian float32 array in
    C order, all of the same size: anything else is a :class:`RawDataError` naming the member.
    """
    import tarfile

    import numpy.lib.format as npformat

    files: list[str] = []
    locations: list[tuple[int, int]] = []
    sample_bytes = None
    for number, path in enumerate(paths):
        files.append(str(path))
        with tarfile.open(path) as tar, open(path, "rb") as f:
            for member in tar:
                if not member.isfile() or not member.name.endswith(".npy"):
                    continue
                f.seek(member.offset_data)
                try:
                    version = npformat.read_magic(f)
                    read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                    shape, fortran, dtype = read_header(f)
                except ValueError as exc:
                    raise RawDataError(f"{Path(path).name}: {member.name} is not a .npy array ({exc})") from None
                if dtype != np.dtype("<f4") or (fortran and len(shape) > 1):
                    raise RawDataError(f"{Path(path).name}: {member.name} holds {dtype} (fortran order: {fortran}); "
                                       "this index reads little-endian float32 arrays in C order only")
                size = int(np.prod(shape)) * 4
                if sample_bytes is None:
                    sample_bytes = size
                elif size != sample_bytes:
                    raise RawDataError(f"{Path(path).name}: {member.name} holds {size} bytes, the first array {sample_bytes}: "
                                       "a batch of slots needs samples of one size")
                locations.append((number, f.tell()))
    if sample_bytes is None:
        raise RawDataError("no .npy members in the shards given: write them with shards.write_tensor_shards(...)")
    return _TensorShardIndex(tuple(files), tuple(locations), sample_bytes)


def _npy_tensor(sample: dict) -> torch.Tensor:
    """A webdataset sample's ``.npy`` member as a tensor (never unpickled: ``allow_pickle=False``)."""
    from .shards import load_npy

    return torch.from_numpy(load_npy(sample["npy"]))


def _stack(samples: list[torch.Tensor]) -> torch.Tensor:
    """Collate a list of equal-sized tensors into a batch (what ``default_collate`` does to tensors)."""
    return torch.stack(samples)


def _shard_loader(urls: str, batch_size: int, num_workers: int = 2, **loader_options: Any) -> Any:
    """The plain webdataset way: workers read the shards, decode ``.npy``, _stack batches, send them over.

    Shards are split among the workers, so give it at least ``num_workers`` shards.
    """
    import webdataset as wds

    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_npy_tensor).batched(batch_size, collation_fn=_stack)
    return wds.WebLoader(dataset, batch_size=None, num_workers=num_workers, **loader_options)


def _read_files(paths: Iterable[str | os.PathLike[str]], chunk_bytes: int) -> Iterator[torch.Tensor]:
    """Read whole files front to back into one reused ``chunk_bytes`` buffer: the limit for shards."""
    buffer = np.empty(chunk_bytes, dtype=np.uint8)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(memoryview(buffer)):
                yield torch.from_numpy(buffer[:n])


# --------------------------------------------------------------------------- the physical limit


def _read_sequential(raw: _RawTensorFile, batch_size: int, reuse: bool = True) -> Iterator[torch.Tensor]:
    """Read the file front to back, ``batch_size`` samples at a time, in one process.

    ``reuse=True`` reads every batch into the same buffer (the yielded tensor is overwritten by
    the next batch); ``reuse=False`` allocates a fresh one per batch, as ``torch.empty`` in a
    loop would.
    """
    batch_bytes = batch_size * raw.sample_bytes
    buffer = np.empty(batch_bytes, dtype=np.uint8) if reuse else None
    with open(raw.path, "rb", buffering=0) as f:
        while True:
            buf = buffer if reuse else np.empty(batch_bytes, dtype=np.uint8)
            n = f.readinto(memoryview(buf))
            if not n:
                return
            yield torch.from_numpy(buf[:n].view(np.float32)).view(-1, raw.sample_len)


# --------------------------------------------------------------------------- the reused-buffer loader


def _ring_worker(files: tuple[str, ...], locations: np.ndarray, sample_bytes: int, slots: torch.Tensor,
                 tasks: Any, done: Any) -> None:
    """Worker process: read the samples of each task straight into its slot of the shared ring.

    ``locations[i]`` is ``(file number, byte offset)`` of sample ``i``; samples that lie back to
    back in one file are read with one system call.
    """
    memory = memoryview(slots.numpy()).cast("B")
    slot_bytes = len(memory) // slots.shape[0]
    fds: dict[int, int] = {}
    try:
        while (task := tasks.get()) is not None:
            number, slot, indices = task
            try:
                base = slot * slot_bytes
                start = 0
                while start < len(indices):
                    file, offset = (int(v) for v in locations[indices[start]])
                    end = start + 1
                    while (end < len(indices) and locations[indices[end], 0] == file
                           and locations[indices[end], 1] == offset + (end - start) * sample_bytes):
                        end += 1
                    if file not in fds:
                        fds[file] = os.open(files[file], os.O_RDONLY)
                    _read_into(fds[file], memory[base + start * sample_bytes: base + end * sample_bytes], offset)
                    start = end
                done.put((number, slot, None))
            except Exception as exc:  # report, don't die: the main process raises it with context
                done.put((number, slot, f"{type(exc).__name__}: {exc}"))
    finally:
        for fd in fds.values():
            os.close(fd)


class RingLoader:
    """Notebook 09, section 8: batches of a raw tensor file, read by worker processes into reused shared-memory slots.

    ``slots`` batch buffers (default ``2 * num_workers + 1``) are allocated once, in shared
    memory. Workers read each batch's samples straight into a free slot; the main process yields a
    tensor that **is** the slot, without a copy. The slot goes back to the workers when the next
    batch is requested, so a yielded batch is valid until then: ``.clone()`` it to keep it (FFCV
    and DALI make the same contract). Batches come in order; ``shuffle`` draws a new sample order
    every epoch from ``seed + epoch``.

    ``raw`` is a raw tensor file, or a :class:`_TensorShardIndex` of the ``.npy`` members of tar
    shards: the same reads, at the offsets the index found (the way MDS and FFCV read: an index
    of where each sample's bytes lie, then positional reads).
    """

    def __init__(
        self,
        raw: "_RawTensorFile | _TensorShardIndex",
        batch_size: int,
        num_workers: int = 2,
        slots: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        timeout: float = 60.0,
        start_method: str | None = None,
    ) -> None:
        if batch_size < 1 or num_workers < 1:
            raise ValueError(f"batch_size and num_workers must be at least 1, got {batch_size} and {num_workers}")
        self.raw, self.batch_size, self.num_workers = raw, batch_size, num_workers
        self.n_slots = slots or 2 * num_workers + 1
        if self.n_slots < 2:
            raise ValueError("a ring needs at least 2 slots: one for the loop, one being filled")
        self.shuffle, self.seed, self.drop_last, self.timeout = shuffle, seed, drop_last, timeout
        self.epoch = 0
        need = self.n_slots * batch_size * raw.sample_bytes
        try:
            self._slots = torch.empty(self.n_slots, batch_size * raw.sample_len, dtype=torch.float32).share_memory_()
        except (RuntimeError, OSError) as exc:
            raise RuntimeError(
                f"could not allocate {need / 2**20:.0f} MiB of shared memory for {self.n_slots} batch slots ({exc}). "
                "Check `df -h /dev/shm` (containers default to 64 MB: docker run --shm-size=...), or use fewer "
                "slots or smaller batches."
            ) from None
        if isinstance(raw, _TensorShardIndex):
            files, locations = raw.files, np.asarray(raw.locations, dtype=np.int64).reshape(-1, 2)
        else:
            files = (raw.path,)
            locations = np.stack([np.zeros(raw.n, np.int64), np.arange(raw.n, dtype=np.int64) * raw.sample_bytes], 1)
        ctx = torch.multiprocessing.get_context(start_method)
        self._tasks, self._done = ctx.Queue(), ctx.Queue()
        self._in_flight = 0  # tasks sent to the workers whose completion has not been received
        self._procs = [
            ctx.Process(target=_ring_worker, args=(files, locations, raw.sample_bytes, self._slots, self._tasks, self._done),
                        daemon=True)
            for _ in range(num_workers)
        ]
        for p in self._procs:
            p.start()

    def __len__(self) -> int:
        full, rest = divmod(self.raw.n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _batches(self) -> list[list[int]]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.raw.n, generator=g).tolist()
        else:
            order = list(range(self.raw.n))
        return [order[i: i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)]

    def _receive(self, timeout: float) -> tuple[int, int, str | None]:
        got = self._done.get(timeout=timeout)
        self._in_flight -= 1
        return got

    def _wait(self, number: int, ready: dict[int, tuple[int, str | None]]) -> int:
        deadline = time.monotonic() + self.timeout
        while number not in ready:
            try:
                got, slot, error = self._receive(timeout=1.0)
                ready[got] = (slot, error)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"a RingLoader worker (pid {dead[0].pid}) exited with code {dead[0].exitcode}; see its error above"
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
        batches = self._batches()
        free = list(range(self.n_slots))
        ready: dict[int, tuple[int, str | None]] = {}
        submitted = 0
        held: int | None = None

        def submit() -> None:
            nonlocal submitted
            while free and submitted < len(batches):
                self._tasks.put((submitted, free.pop(), batches[submitted]))
                self._in_flight += 1
                submitted += 1

        try:
            submit()
            for number, indices in enumerate(batches):
                slot = self._wait(number, ready)
                if held is not None:  # the loop asked for the next batch: the previous slot is free again
                    free.append(held)
                    submit()
                held = slot
                yield self._slots[slot, : len(indices) * self.raw.sample_len].view(len(indices), self.raw.sample_len)
        finally:
            # a loop that stopped early leaves reads in flight: collect them, so that the next
            # epoch starts with every slot free and no stale completion in the queue
            while self._in_flight > 0:
                try:
                    self._receive(timeout=self.timeout)
                except queue.Empty:
                    self.close()  # a worker is stuck or gone: this loader cannot be trusted any more
                    break
            self.epoch += 1

    def close(self) -> None:
        """Stop the workers and release the shared memory."""
        procs = getattr(self, "_procs", [])
        for _ in procs:
            self._tasks.put(None)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []

    def __enter__(self) -> "RingLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------- measuring


def gbps(make_batches: Callable[[], Iterable[torch.Tensor]], nbytes: int, cpu: list[float] | None = None) -> float:
    """Notebook 09, section 7: GB/s (10^9 bytes per second) of one pass, each batch touched by :func:`_touch`.

    With a ``cpu`` list, appends the CPU seconds per GB this process spent (user + system): the
    part of the pass the training loop's own process paid, as opposed to waiting for workers.
    """
    start, start_cpu = time.perf_counter(), time.process_time()
    seen = 0
    for batch in make_batches():
        _touch(batch)
        seen += batch.numel() * batch.element_size()
    seconds = time.perf_counter() - start
    if seen != nbytes:
        raise RuntimeError(f"a pass delivered {seen} bytes instead of {nbytes}")
    if cpu is not None:
        cpu.append((time.process_time() - start_cpu) / (nbytes / 1e9))
    return nbytes / seconds / 1e9


def _warm_page_cache(paths: "_RawTensorFile | Iterable[str | os.PathLike[str]]") -> None:
    """Read the files once, so every method reads from memory and none pays the disk."""
    for path in [paths.path] if isinstance(paths, _RawTensorFile) else paths:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(1 << 24)
            while f.readinto(buf):
                pass


def _one_thread(batches: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Iterate ``batches`` with torch's intra-op threads set to 1, as in a DataLoader worker.

    Workers run with one thread each; in the main process ``torch.stack`` would otherwise start a
    thread per core, whose waiting spins against the workers and other jobs, and the single-process
    measurement would swing by several times from run to run.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield from batches
    finally:
        torch.set_num_threads(before)


def _measure(methods: dict[str, tuple[Callable[[], Iterable[torch.Tensor]], int]], rounds: int,
             cpu: dict[str, list[float]] | None) -> dict[str, list[float]]:
    """Every method once per round, in turn, so that drift of the machine hits them all alike."""
    results: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, (make, nbytes) in methods.items():
            per_round = None if cpu is None else cpu.setdefault(name, [])
            results[name].append(gbps(make, nbytes, per_round))
    return results


def compare(raw: _RawTensorFile, batch_size: int = 64, workers: int = 2, rounds: int = 3,
            cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Notebook 09, section 7: GB/s of every way of reading the same bytes of a raw file, interleaved round by round.

    Returns ``{method: [GB/s per round]}``, the limit first (a read one sample at a time into one
    reused buffer); ``cpu``, if given, receives the main
    process's CPU seconds per GB for each method and round. Loaders with workers are built once
    and kept across rounds (persistent workers), so start-up is not counted.
    """
    _warm_page_cache(raw)
    plain = DataLoader(RawTensorDataset(raw), batch_size=batch_size, num_workers=workers, persistent_workers=True)
    whole = DataLoader(_RawBatchDataset(raw, batch_size), batch_size=None, num_workers=workers, persistent_workers=True)
    single = DataLoader(RawTensorDataset(raw), batch_size=batch_size, num_workers=0)
    with RingLoader(raw, batch_size, num_workers=workers) as ring:
        for loader in (plain, whole, ring):  # one untimed pass each: start the workers, map the slots
            for b in loader:
                _touch(b)
        methods = {
            "raw read, sample-sized reused buffer": (lambda: _read_sequential(raw, 1, True), raw.nbytes),
            "raw read, batch-sized reused buffer": (lambda: _read_sequential(raw, batch_size, True), raw.nbytes),
            "raw read, fresh batch buffer": (lambda: _read_sequential(raw, batch_size, False), raw.nbytes),
            "DataLoader, 0 workers": (lambda: _one_thread(single), raw.nbytes),
            f"DataLoader, {workers} workers": (lambda: plain, raw.nbytes),
            f"DataLoader, batch reads, {workers} workers": (lambda: whole, raw.nbytes),
            f"RingLoader, {workers} workers": (lambda: ring, raw.nbytes),
        }
        results = _measure(methods, rounds, cpu)
    del plain, whole  # stops their persistent workers
    return results


def compare_shards(paths: Iterable[str | os.PathLike[str]], batch_size: int = 64, workers: int = 2, rounds: int = 3,
                   cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Notebook 09, section 9: the same comparison for float32 samples stored as ``.npy`` members of tar shards.

    The limit is a read of the shard files themselves, one sample's size at a time, into a reused
    buffer (headers included: well under 1 % more bytes for 1 MiB samples); the plain way is webdataset with workers
    (:func:`_shard_loader`); the fix is a :class:`RingLoader` reading at the offsets of
    :func:`index_tensor_shards`.
    """
    from .shards import brace_urls

    paths = [str(p) for p in paths]
    if len(paths) < workers:
        raise ValueError(f"{len(paths)} shards for {workers} workers: webdataset splits by shard, give it at least {workers}")
    index = index_tensor_shards(paths)
    file_bytes = sum(os.path.getsize(p) for p in paths)
    _warm_page_cache(paths)
    plain = _shard_loader(brace_urls(paths), batch_size, workers, persistent_workers=True)
    with RingLoader(index, batch_size, num_workers=workers) as ring:
        for loader in (plain, ring):
            for b in loader:
                _touch(b)
        methods = {
            "shard files read, sample-sized reused buffer": (lambda: _read_files(paths, index.sample_bytes), file_bytes),
            f"WebDataset, {workers} workers": (lambda: plain, index.nbytes),
            f"RingLoader on the index, {workers} workers": (lambda: ring, index.nbytes),
        }
        results = _measure(methods, rounds, cpu)
    del plain
    return results


def breakdown(results: dict[str, list[float]], cpu: dict[str, list[float]], workers: int) -> dict[str, float]:
    """Notebook 09, section 8: where the time goes, in seconds per GB, from one :func:`compare` run (with ``cpu``).

    In one process the costs add up, so differences between neighbouring methods isolate them:
    the copy from the page cache (the reused-buffer read), a fresh buffer per batch, per-sample
    arrays plus collate's ``torch.stack`` copy. With workers, what the main process pays is its own
    CPU time: receiving each fresh shared-memory batch (IPC, mapping it, faulting its pages in),
    against a RingLoader whose slots are mapped once.
    """
    wall = {k: 1 / v for k, v in medians(results).items()}
    busy = medians(cpu)
    return {
        "copy from the page cache": wall["raw read, batch-sized reused buffer"],
        "a fresh buffer per batch": wall["raw read, fresh batch buffer"] - wall["raw read, batch-sized reused buffer"],
        "per-sample arrays + collate's copy": wall["DataLoader, 0 workers"] - wall["raw read, fresh batch buffer"],
        "main process, fresh shared batches": busy[f"DataLoader, batch reads, {workers} workers"],
        "main process, RingLoader slots": busy[f"RingLoader, {workers} workers"],
    }


def _colour(name: str) -> str:
    if name.startswith(("raw read, sample", "shard files")):
        return "#444444"
    if name.startswith("raw read, batch"):
        return "#777777"
    if name.startswith("raw read"):
        return "#AAAAAA"
    return "#DD8452" if name.startswith("RingLoader") else "#4C72B0"


def plot_rates(results: dict[str, list[float]], ax: Any = None, title: str = "Reading the same bytes") -> Any:
    """Notebook 09, section 7: horizontal bars of the median GB/s per method, each relative to the first (the limit)."""
    from .viz import relative_bars

    med = medians(results)
    first = next(iter(med))
    return relative_bars(med, f"throughput relative to '{first}' (1.0 = the limit here)", title,
                         [_colour(n) for n in med], ax=ax, width=7, pad=0.5)


def plot_main_process(results: dict[str, list[float]], cpu: dict[str, list[float]], ax: Any = None,
                      title: str = "Where the training loop's process spends its time") -> Any:
    """Notebook 09, section 8: per method, the seconds per GB of the main process: its own CPU time, and the rest (waiting)."""
    import matplotlib.pyplot as plt

    med, busy = medians(results), medians(cpu)
    names = list(med)
    wall = [1 / med[n] for n in names]
    own = [min(busy[n], w) for n, w in zip(names, wall)]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)), dpi=80)
    y = range(len(names))
    ax.barh(y, own, color=[_colour(n) for n in names], label="CPU time of the main process")
    ax.barh(y, [w - o for w, o in zip(wall, own)], left=own, color="white", edgecolor="#888888", hatch="//",
            label="waiting: for workers, or for a free core")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per GB delivered to the loop (shorter is faster)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    return ax.figure
