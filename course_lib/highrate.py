"""Feeding a raw, uncompressible tensor stream at GB/s: where the bytes go, and the reused-buffer fix.

The question (asked about scientific data at 300-600 MB/s): can PyTorch feed a training loop that
fast when the GIL is in the way? Notebook 09 answers it by measuring, in one run, on the same
bytes:

* the physical limit: :func:`read_sequential` with ``reuse=True``, a plain sequential read from
  the page cache into one buffer reused for every batch;
* the same read into a **fresh** buffer per batch (``reuse=False``): the cost of allocating, and
  of the kernel zeroing new pages, every time;
* a plain ``DataLoader`` over :class:`RawTensorDataset` with worker processes: each sample read
  into a fresh array, stacked into a fresh shared-memory batch, handed to the main process;
* :class:`RingLoader`: worker processes read straight into a small ring of shared-memory batch
  slots allocated once, the way FFCV and DALI reuse their buffers. One copy (page cache to slot),
  no allocation per batch, no pickling of data.

Built on the standard library and torch only; :func:`compare` runs them all and
``python -m course_lib.bench highrate`` runs it from a shell on any file system.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE_BYTES = 1 << 20  # 1 MiB per sample: 262,144 float32 values
PAGE = 4096


class RawDataError(RuntimeError):
    """A raw tensor file is missing, truncated or does not match its description."""


# --------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class RawTensorFile:
    """A file of ``n`` float32 samples of ``sample_bytes`` each, back to back, and its JSON sidecar."""

    path: str
    n: int
    sample_bytes: int
    seed: int = 0

    @property
    def nbytes(self) -> int:
        return self.n * self.sample_bytes

    @property
    def sample_len(self) -> int:
        """float32 values per sample."""
        return self.sample_bytes // 4


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_raw_tensors(path: str | os.PathLike[str], n: int, sample_bytes: int = SAMPLE_BYTES, seed: int = 0) -> RawTensorFile:
    """Write ``n`` random float32 samples (uniform noise: incompressible) to ``path``, or reuse them.

    Written to a temporary name and renamed, the sidecar last, so a killed run never leaves a
    file that looks complete. Same arguments, same bytes.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if sample_bytes < 4 or sample_bytes % 4:
        raise ValueError(f"sample_bytes must be a positive multiple of 4 (float32), got {sample_bytes}")
    path = Path(path)
    want = RawTensorFile(str(path), n, sample_bytes, seed)
    try:
        if open_raw(path) == want:
            return want
    except RawDataError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rng = np.random.default_rng(seed)
    try:
        with open(tmp, "wb") as f:
            for _ in range(n):
                f.write(rng.random(sample_bytes // 4, dtype=np.float32).tobytes())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RawDataError(f"could not write {path.name} ({n * sample_bytes / 2**20:.0f} MiB): {exc}") from exc
    _sidecar(path).write_text(json.dumps({k: v for k, v in asdict(want).items() if k != "path"}))
    return want


def open_raw(path: str | os.PathLike[str]) -> RawTensorFile:
    """Describe an existing raw tensor file, checking its size against its sidecar."""
    path = Path(path)
    side = _sidecar(path)
    if not path.is_file() or not side.is_file():
        raise RawDataError(
            f"no raw tensor file {path.name} (with its .json description) in {path.parent.name or '.'}: write one with "
            f"course_lib.highrate.write_raw_tensors(path, n) or `python -m course_lib.bench highrate --data PATH`"
        )
    meta = json.loads(side.read_text())
    raw = RawTensorFile(str(path), int(meta["n"]), int(meta["sample_bytes"]), int(meta.get("seed", 0)))
    size = path.stat().st_size
    if size != raw.nbytes:
        raise RawDataError(f"{path.name} holds {size} bytes but its description says {raw.nbytes}: truncated? Write it again.")
    return raw


class RawTensorDataset(Dataset):
    """Sample ``i`` of a raw tensor file as a float32 tensor: the plain map-style way.

    Each call reads 1 sample with ``os.pread`` into a **fresh** array. The file is opened lazily
    in each process (a descriptor inherited through ``fork`` would share its offset; ``pread``
    needs no offset, but a fresh open also works under ``spawn``).
    """

    def __init__(self, raw: RawTensorFile) -> None:
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


def touch(batch: torch.Tensor) -> float:
    """The least a training loop does with a batch: read one value per 4 KiB page.

    It forces every page of the batch into this process (a page handed over from another process
    costs a page fault on first touch) without spending time on arithmetic.
    """
    flat = batch.reshape(-1)
    return float(flat[:: PAGE // flat.element_size()].sum())


# --------------------------------------------------------------------------- the physical limit


def read_sequential(raw: RawTensorFile, batch_size: int, reuse: bool = True) -> Iterator[torch.Tensor]:
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


def _ring_worker(path: str, sample_bytes: int, slots: torch.Tensor, tasks: Any, done: Any) -> None:
    """Worker process: read the samples of each task straight into its slot of the shared ring."""
    memory = memoryview(slots.numpy()).cast("B")
    slot_bytes = len(memory) // slots.shape[0]
    fd = os.open(path, os.O_RDONLY)
    try:
        while (task := tasks.get()) is not None:
            number, slot, indices = task
            try:
                base = slot * slot_bytes
                start = 0
                while start < len(indices):  # consecutive indices: one read for the whole run
                    end = start + 1
                    while end < len(indices) and indices[end] == indices[end - 1] + 1:
                        end += 1
                    view = memory[base + start * sample_bytes: base + end * sample_bytes]
                    _read_into(fd, view, indices[start] * sample_bytes)
                    start = end
                done.put((number, slot, None))
            except Exception as exc:  # report, don't die: the main process raises it with context
                done.put((number, slot, f"{type(exc).__name__}: {exc}"))
    finally:
        os.close(fd)


class RingLoader:
    """Batches of a raw tensor file, read by worker processes into reused shared-memory slots.

    ``slots`` batch buffers (default ``2 * num_workers + 1``) are allocated once, in shared
    memory. Workers read each batch's samples straight into a free slot; the main process yields a
    tensor that **is** the slot, without a copy. The slot goes back to the workers when the next
    batch is requested, so a yielded batch is valid until then: ``.clone()`` it to keep it (FFCV
    and DALI make the same contract). Batches come in order; ``shuffle`` draws a new sample order
    every epoch from ``seed + epoch``.
    """

    def __init__(
        self,
        raw: RawTensorFile,
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
        ctx = torch.multiprocessing.get_context(start_method)
        self._tasks, self._done = ctx.Queue(), ctx.Queue()
        self._in_flight = 0  # tasks sent to the workers whose completion has not been received
        self._procs = [
            ctx.Process(target=_ring_worker, args=(raw.path, raw.sample_bytes, self._slots, self._tasks, self._done), daemon=True)
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


def gbps(make_batches: Callable[[], Iterable[torch.Tensor]], nbytes: int) -> float:
    """GB/s (10^9 bytes per second) of one pass, each batch touched by :func:`touch`."""
    start = time.perf_counter()
    seen = 0
    for batch in make_batches():
        touch(batch)
        seen += batch.numel() * batch.element_size()
    seconds = time.perf_counter() - start
    if seen != nbytes:
        raise RuntimeError(f"a pass delivered {seen} bytes instead of {nbytes}")
    return nbytes / seconds / 1e9


def warm_page_cache(raw: RawTensorFile) -> None:
    """Read the whole file once, so every method reads from memory and none pays the disk."""
    with open(raw.path, "rb", buffering=0) as f:
        buf = bytearray(1 << 24)
        while f.readinto(buf):
            pass


def compare(raw: RawTensorFile, batch_size: int = 64, workers: int = 2, rounds: int = 3) -> dict[str, list[float]]:
    """GB/s of every way of reading the same bytes, interleaved round by round (medians compare).

    Returns ``{method: [GB/s per round]}``. Loaders with workers are built once and kept across
    rounds (persistent workers), so start-up is not counted.
    """
    warm_page_cache(raw)
    dataset = RawTensorDataset(raw)
    plain = DataLoader(dataset, batch_size=batch_size, num_workers=workers, persistent_workers=True)
    single = DataLoader(dataset, batch_size=batch_size, num_workers=0)
    results: dict[str, list[float]] = {k: [] for k in ("raw read, reused buffer", "raw read, fresh buffer",
                                                        "DataLoader, 0 workers", f"DataLoader, {workers} workers",
                                                        f"RingLoader, {workers} workers")}
    with RingLoader(raw, batch_size, num_workers=workers) as ring:
        for _ in (plain, ring):  # one untimed pass each: start the workers, map the slots
            for b in _:
                touch(b)
        for _ in range(rounds):
            results["raw read, reused buffer"].append(gbps(lambda: read_sequential(raw, batch_size, True), raw.nbytes))
            results["raw read, fresh buffer"].append(gbps(lambda: read_sequential(raw, batch_size, False), raw.nbytes))
            results["DataLoader, 0 workers"].append(gbps(lambda: single, raw.nbytes))
            results[f"DataLoader, {workers} workers"].append(gbps(lambda: plain, raw.nbytes))
            results[f"RingLoader, {workers} workers"].append(gbps(lambda: ring, raw.nbytes))
    del plain  # stops its persistent workers
    return results


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in results.items()}


def plot_rates(results: dict[str, list[float]], ax: Any = None, title: str = "Reading the same bytes") -> Any:
    """Horizontal bars of the median GB/s per method, each relative to the reused-buffer read."""
    import matplotlib.pyplot as plt

    med = medians(results)
    names = list(med)
    limit = med[names[0]]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)), dpi=80)
    colours = ["#444444", "#999999", "#4C72B0", "#4C72B0", "#DD8452"]
    ax.barh(range(len(names)), [med[n] / limit for n in names], color=colours[: len(names)])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("throughput relative to the raw read into a reused buffer (1.0 = the physical limit here)")
    ax.set_title(title)
    return ax.figure
