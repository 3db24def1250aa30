"""Notebooks 04 and 05: what happens inside DataLoader worker processes, made visible.

Each piece reproduces one behaviour a learner meets once ``num_workers > 0``: seeding in workers,
state that persistent workers do not see, the GIL (Python parsing vs C decoding, with threads and
with processes), copy-on-read memory growth, and the operating system's limits (``/dev/shm``, open
files). They live in a module because ``spawn``/``forkserver`` workers import what they run by name.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import gc
import io
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from . import claims
from .support import cgroup_limits, check_int, fork_context
from .data import CLASSES, draw_shape
from .datasets import check_index
from .iterable import worker_slot

__all__ = [
    "CudaInWorker",
    "EpochTagged",
    "NoisyDataset",
    "RandomnessProbe",
    "SharedEpochTagged",
    "SlowStorage",
    "cpu_count",
    "decode_jpeg",
    "decode_ppm",
    "jpeg_payloads",
    "os_limits",
    "open_files_demo",
    "parallel_rounds",
    "ppm_payloads",
    "private_memory_growth",
    "shm_needed_mb",
]


# --- seeding ------------------------------------------------------------------------------
class RandomnessProbe(Dataset):
    """Notebook 05, section 2: sample ``i`` reports which worker made it and one draw from each global generator."""

    def __init__(self, n: int = 8) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "worker": worker_slot(main=-1)[0],
            "random": round(random.random(), 4),
            "numpy": round(float(np.random.random()), 4),
            "torch": round(float(torch.rand(())), 4),
        }


class CudaInWorker(Dataset):
    """Notebook 05, section 3: two samples made on the GPU inside the worker, as a transform that moves images to the
    GPU would. A worker forked from a process that has already used CUDA cannot: "Cannot re-initialize CUDA in
    forked subprocess"."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((1,), float(index), device="cuda").cpu()


class NoisyDataset(Dataset):
    """Notebook 05, section 2: A dataset whose "augmentation" draws from a NumPy generator created in ``__init__``.
    Sample ``i`` is ``(i, shift)``, ``shift`` a random crop offset in ``0..999``. Each worker gets a *copy* of
    ``self.rng`` in the same state: workers repeat each other's shifts unless a ``worker_init_fn`` reseeds it."""

    def __init__(self, n: int = 8, seed: int = 0) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, int(self.rng.integers(0, 1000))


# --- state and persistent workers ---------------------------------------------------------
class EpochTagged(Dataset):
    """Notebook 04, section 5: sample ``i`` is ``(i, epoch)`` where ``epoch`` is a plain attribute set from the loop."""

    def __init__(self, n: int = 4) -> None:
        self.n, self.epoch = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, self.epoch


class SharedEpochTagged(EpochTagged):
    """Notebook 04, section 5: the same, with the epoch in a shared-memory tensor that worker processes read live.

    ``share_memory_()`` moves the tensor's storage to shared memory before the workers start (forked workers
    inherit it, spawned ones get a handle): the main process's writes reach every worker, persistent or not.
    """

    def __init__(self, n: int = 4) -> None:
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        super().__init__(n)

    @property  # type: ignore[override]
    def epoch(self) -> int:
        return int(self._epoch)

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch.fill_(int(value))


# --- the GIL: threads vs processes ---------------------------------------------------------
def _payloads(encode: Callable[[Image.Image], bytes], n: int, side: int, seed: int, distinct: int) -> list[bytes]:
    """``n`` encoded images of the shapes, ``distinct`` different ones repeated in turn."""
    rng = np.random.default_rng(seed)
    made = [encode(draw_shape(int(rng.integers(len(CLASSES))), rng, side)) for _ in range(min(n, distinct))]
    return [made[i % len(made)] for i in range(n)]


def _jpeg(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _ppm(img: Image.Image) -> bytes:
    pixels = " ".join(map(str, np.asarray(img).reshape(-1).tolist()))
    return f"P3\n{img.width} {img.height}\n255\n{pixels}".encode()


def jpeg_payloads(n: int = 200, side: int = 512, seed: int = 0, distinct: int = 8) -> list[bytes]:
    """Notebook 05, section 1: ``n`` images of the shapes as JPEG bytes (``distinct`` different ones, repeated): decoding is C code."""
    return _payloads(_jpeg, n, side, seed, distinct)


def ppm_payloads(n: int = 100, side: int = 96, seed: int = 0, distinct: int = 8) -> list[bytes]:
    """Notebook 05, section 1: ``n`` images as ASCII PPM ("P3": every pixel value written as decimal text), ``distinct`` different ones."""
    return _payloads(_ppm, n, side, seed, distinct)


def decode_jpeg(payload: bytes) -> np.ndarray:
    """Notebook 05, section 1: decode a JPEG with Pillow, which releases the GIL while libjpeg works. NumPy, not
    torch: it runs in processes forked by a plain pool, where torch's thread pool can deadlock."""
    with Image.open(io.BytesIO(payload)) as img:
        return np.asarray(img.convert("RGB"))


def decode_ppm(payload: bytes) -> np.ndarray:
    """Notebook 05, section 1: parse an ASCII PPM in Python. Every step is Python bytecode, so the GIL is held throughout."""
    magic, width, height, _maxval, body = payload.split(maxsplit=4)
    if magic != b"P3":
        raise ValueError("not an ASCII PPM (P3) payload")
    return np.array([int(v) for v in body.split()], dtype=np.uint8).reshape(int(height), int(width), 3)


def _discard(fn: Callable[[Any], Any], item: Any) -> None:
    """``fn(item)``, its result dropped: what is measured is the work, not sending results back."""
    fn(item)


def parallel_rounds(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 2, rounds: int = 5):
    """Notebook 05, section 1: seconds to run ``fn`` over all ``items`` serially, with ``workers`` threads and with
    ``workers`` processes, measured in interleaved rounds (:func:`course_lib.claims.interleave`): the variants are
    ``"serial"``, ``"threads"`` and ``"processes"``, and e.g. ``.ratio("serial", "threads")`` is the threads' speed-up
    per round. Both pools start before the clock does, as a DataLoader's workers do before an epoch's steady state;
    processes are forked where the platform can."""
    fn = functools.partial(_discard, fn)
    chunksize = max(1, len(items) // (4 * workers))
    with (
        cf.ThreadPoolExecutor(workers) as threads,
        cf.ProcessPoolExecutor(workers, mp_context=fork_context()) as processes,
    ):
        for pool in (threads, processes):
            list(pool.map(int, range(workers)))  # start every worker with a trivial task

        def serial() -> float:
            start = time.perf_counter()
            for item in items:
                fn(item)
            return time.perf_counter() - start

        def in_pool(pool: cf.Executor) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                list(pool.map(fn, items, chunksize=chunksize))
                return time.perf_counter() - start

            return run

        return claims.interleave(
            {"serial": serial, "threads": in_pool(threads), "processes": in_pool(processes)}, rounds=rounds
        )


# --- copy-on-read ---------------------------------------------------------------------------
def _private_mb() -> float:
    """This process's private, written-to memory (Linux): pages it no longer shares."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Private_Dirty line in /proc/self/smaps_rollup")


class _CopyOnReadProbe(Dataset):
    """One sample: how many MB of private memory a worker gained by *reading* every item."""

    def __init__(self, items: Any) -> None:
        self.items = items

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> float:
        before = _private_mb()
        for i in range(len(self.items)):
            self.items[i]  # only reads, yet touching a Python object writes its refcount
        return _private_mb() - before


def private_memory_growth(items: Any) -> float:
    """Notebook 05, section 4: MB a forked DataLoader worker copies from the parent just by reading every item of
    ``items`` (a list, an array, a map-style dataset) by index (Linux)."""
    if not os.path.exists("/proc/self/smaps_rollup") or "fork" not in mp.get_all_start_methods():
        raise RuntimeError("measuring copy-on-read needs Linux (fork and /proc/self/smaps_rollup)")
    # Collect the garbage of earlier cells here, before the fork: collected in the worker instead, an old DataLoader
    # iterator's __del__ fails there ("can only test a child process"), and the collection itself copies pages.
    gc.collect()
    loader = DataLoader(_CopyOnReadProbe(items), batch_size=None, num_workers=1, multiprocessing_context="fork")
    return float(next(iter(loader)))


# --- operating-system limits ----------------------------------------------------------------
def _open_files_child(strategy: str, limit: int, answer: Any) -> None:
    """Runs in a forked child process: keep 400 small tensors from workers (each one a shared-memory handle, a file
    descriptor) while the open-file limit is low; send back what happened."""
    import resource

    os.closerange(3, answer.fileno())  # only what a fresh process has open: the parent's files are not the demo's
    os.closerange(answer.fileno() + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    torch.multiprocessing.set_sharing_strategy(strategy)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    kept = []
    try:
        for batch in DataLoader(SlowStorage(n=400, slow_s=0.0), batch_size=None, num_workers=2):
            kept.append(batch)  # a kept tensor keeps its shared memory (and, by default, its fd) open
    except RuntimeError as exc:
        return answer.send(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    answer.send(f"kept all {len(kept)} tensors from the workers")


def open_files_demo(strategy: str = "file_descriptor", limit: int = 128, timeout: float = 120) -> str:
    """Notebook 05, section 4: run a loader in a forked child process whose open-file limit is ``limit``; return what
    happened. The notebook's kernel keeps its own limit. ``strategy``: torch's ``"file_descriptor"`` (Linux default) or
    ``"file_system"``."""
    if sys.platform == "win32":
        raise RuntimeError("open-file limits are a Linux/macOS topic; Windows has none to show here")
    receive, send = fork_context().Pipe(duplex=False)
    child = fork_context().Process(target=_open_files_child, args=(strategy, int(limit), send))
    child.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise RuntimeError(f"the demo process gave no answer within {timeout} s")
        return receive.recv()
    except EOFError:  # the child ended without sending
        raise RuntimeError("the demo process ended without an answer") from None
    finally:
        child.join(timeout=10)  # it shuts its own workers down first
        child.kill()
        child.join()


def cpu_count() -> int:
    """Notebook 04, section 3: CPUs this process may use: the cores it may run on (its affinity: a Slurm job's or a
    container's cores), or its CPU quota rounded up where that is lower (a container's ``--cpus``, a hub's
    ``cpu_limit``: CPU time, which no core count shows)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_limits()[1]
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def os_limits() -> dict[str, Any]:
    """Notebook 05, section 4: the operating-system limits that decide how many workers and how large batches can be."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except ImportError:  # Windows
        soft = hard = None
    shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    return {
        "cpus": cpu_count(),
        "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
        "start_method": mp.get_start_method(allow_none=False),
        "open_files_soft": soft,
        "open_files_hard": hard,
        "shm_total_mb": shm and shm.total / 2**20,
        "shm_free_mb": shm and shm.free / 2**20,
    }


def shm_needed_mb(batch_mb: float, num_workers: int, prefetch_factor: int = 2) -> float:
    """Notebook 05, section 4: shared memory the batches in flight need: each worker holds up to ``prefetch_factor`` batches."""
    return batch_mb * num_workers * prefetch_factor


# --- uneven loading times ---------------------------------------------------------------------
class SlowStorage(Dataset):
    """Notebook 04, section 4: samples that take time to *arrive* rather than to compute, like files on network storage.

    Most samples wait ``base_s``; one in ``slow_every`` (chosen at random, fixed by ``seed``) waits ``slow_s``
    instead: a cache miss, a cold file. Waiting uses no CPU, so the effect of prefetching shows even on a
    machine with few cores. Sample ``i`` is a small tensor holding ``i``.
    """

    def __init__(
        self, n: int = 1024, base_s: float = 0.0, slow_every: int = 256, slow_s: float = 0.15, seed: int = 0
    ) -> None:
        if base_s < 0 or slow_s < 0:
            raise ValueError(f"base_s and slow_s are seconds to wait: they must be >= 0, got {base_s} and {slow_s}")
        self.n, self.base_s, self.slow_s = check_int(n, "n"), base_s, slow_s
        chosen = np.random.default_rng(seed).choice(n, size=n // check_int(slow_every, "slow_every", 1), replace=False)
        self.slow = np.isin(np.arange(n), chosen)  # a NumPy array: shared by forked workers without copies

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        i = check_index(index, self.n)
        wait = self.slow_s if self.slow[i] else self.base_s
        if wait > 0:
            time.sleep(wait)
        return torch.full((8,), i)
