"""Notebook 04: what happens inside DataLoader worker processes, made visible.

Each piece reproduces one behaviour a learner meets once ``num_workers > 0``: seeding in workers,
state that persistent workers do not see, the GIL (Python parsing vs C decoding, with threads and
with processes), copy-on-read memory growth, and the operating system's limits (``/dev/shm``, open
files). They live in a module because ``spawn``/``forkserver`` workers import what they run by name.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ._support import fork_context
from .data import CLASSES, draw_shape
from .datasets import check_index, image_tensor
from .iterable import worker_slot

__all__ = ["EpochTagged", "NoisyDataset", "RandomnessProbe", "SharedEpochTagged", "SlowStorage", "cpu_count",
           "decode_jpeg", "decode_ppm", "jpeg_payloads", "limits", "open_files_demo", "parallel_speedups",
           "ppm_payloads", "private_memory_growth", "shm_needed_mb"]


# --- seeding ------------------------------------------------------------------------------


class RandomnessProbe(Dataset):
    """Notebook 04, section 8: sample ``i`` reports which worker made it and one draw from each global generator."""

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


class NoisyDataset(Dataset):
    """Notebook 04, section 8: A dataset whose "augmentation" draws from a NumPy generator created in ``__init__``.

    Sample ``i`` is ``(i, shift)``, ``shift`` a random crop offset in ``0..999``. Each worker
    gets a *copy* of ``self.rng`` in the same state, so workers repeat each other's shifts
    unless a ``worker_init_fn`` gives each its own generator.
    """

    def __init__(self, n: int = 8, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, int(self.rng.integers(0, 1000))


# --- state and persistent workers ---------------------------------------------------------


class EpochTagged(Dataset):
    """Notebook 04, section 5: sample ``i`` is ``(i, epoch)`` where ``epoch`` is a plain attribute set from the loop."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.epoch = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, self.epoch


class SharedEpochTagged(EpochTagged):
    """Notebook 04, section 5: the same, with the epoch in a shared-memory tensor that worker processes read live.

    ``share_memory_()`` moves the tensor's storage to shared memory before the workers start;
    forked workers inherit the mapping, spawned ones receive a handle to it. Writing to it in
    the main process is then visible to every worker, persistent or not.
    """

    def __init__(self, n: int = 4) -> None:
        super().__init__(n)
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property  # type: ignore[override]
    def epoch(self) -> int:
        return int(self._epoch)

    @epoch.setter
    def epoch(self, value: int) -> None:
        if hasattr(self, "_epoch"):
            self._epoch.fill_(int(value))


# --- the GIL: threads vs processes ---------------------------------------------------------


def _images(n: int, side: int, seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [draw_shape(int(rng.integers(len(CLASSES))), rng, side) for _ in range(n)]


def jpeg_payloads(n: int = 200, side: int = 512, seed: int = 0, distinct: int = 8) -> list[bytes]:
    """Notebook 04, section 7: ``n`` images of the shapes as JPEG bytes (``distinct`` different ones, repeated): decoding is C code."""
    out = []
    for img in _images(min(n, distinct), side, seed):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return [out[i % len(out)] for i in range(n)]


def ppm_payloads(n: int = 100, side: int = 96, seed: int = 0, distinct: int = 8) -> list[bytes]:
    """Notebook 04, section 7: ``n`` images as ASCII PPM ("P3": every pixel value written as decimal text), ``distinct`` different ones."""
    out = []
    for img in _images(min(n, distinct), side, seed):
        pixels = np.asarray(img).reshape(-1)
        out.append(f"P3\n{side} {side}\n255\n".encode() + " ".join(map(str, pixels.tolist())).encode())
    return [out[i % len(out)] for i in range(n)]


def decode_jpeg(payload: bytes) -> torch.Tensor:
    """Notebook 04, section 7: decode a JPEG with Pillow, which releases the GIL while libjpeg works."""
    return image_tensor(payload)


def decode_ppm(payload: bytes) -> np.ndarray:
    """Notebook 04, section 7: parse an ASCII PPM in Python. Every step is Python bytecode, so the GIL is held throughout."""
    magic, width, height, _maxval, body = payload.split(maxsplit=4)
    if magic != b"P3":
        raise ValueError("not an ASCII PPM (P3) payload")
    width, height = int(width), int(height)
    values = [int(v) for v in body.split()]
    return np.array(values, dtype=np.uint8).reshape(height, width, 3)


def _warm(_: int) -> None:
    return None


class _Discard:
    """Calls ``fn`` and drops its result: what is measured is the work, not sending results back."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> None:
        self.fn(item)


def parallel_speedups(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 2) -> dict[str, float]:
    """Notebook 04, section 7: how much faster ``fn`` runs over ``items`` with ``workers`` threads, and with processes.

    Returns ``{"threads": x, "processes": y}``: serial time divided by parallel time. The pools
    are started (and warmed up) before the clock starts, as a DataLoader's workers are before
    an epoch's steady state. Processes are forked where the platform can.
    """
    fn = _Discard(fn)
    start = time.perf_counter()
    for item in items:
        fn(item)
    serial = time.perf_counter() - start
    ctx = fork_context()
    result = {}
    for kind in ("threads", "processes"):
        pool: cf.Executor = (
            cf.ThreadPoolExecutor(workers) if kind == "threads" else cf.ProcessPoolExecutor(workers, mp_context=ctx)
        )
        with pool:
            list(pool.map(_warm, range(workers)))
            start = time.perf_counter()
            list(pool.map(fn, items, chunksize=max(1, len(items) // (4 * workers))))
            result[kind] = serial / (time.perf_counter() - start)
    return result


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
        total = 0.0
        for x in self.items:  # only reads, yet touching a Python object writes its refcount
            total += x
        return _private_mb() - before


def private_memory_growth(items: Any) -> float:
    """Notebook 04, section 10: MB a forked DataLoader worker copies from the parent just by iterating over ``items``.

    Linux only (it reads ``/proc/self/smaps_rollup``, and copy-on-write needs ``fork``).
    """
    if not os.path.exists("/proc/self/smaps_rollup") or "fork" not in mp.get_all_start_methods():
        raise RuntimeError("measuring copy-on-read needs Linux (fork and /proc/self/smaps_rollup)")
    from torch.utils.data import DataLoader

    loader = DataLoader(_CopyOnReadProbe(items), batch_size=None, num_workers=1, multiprocessing_context="fork")
    return float(next(iter(loader)))


# --- operating-system limits ----------------------------------------------------------------


class _ManyTensors(Dataset):
    """``n`` tiny tensors: each one a worker sends is a shared-memory handle (a file descriptor)."""

    def __init__(self, n: int = 400) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), index)


def _open_files_child(strategy: str, limit: int) -> None:
    """Runs in a child process: keep every batch while the open-file limit is low."""
    import resource

    from torch.utils.data import DataLoader

    torch.multiprocessing.set_sharing_strategy(strategy)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    kept = []
    try:
        for batch in DataLoader(_ManyTensors(), batch_size=None, num_workers=2):
            kept.append(batch)  # a kept tensor keeps its shared memory (and, by default, its fd) open
    except RuntimeError as exc:
        print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        return
    print(f"kept all {len(kept)} tensors from the workers")


def open_files_demo(strategy: str = "file_descriptor", limit: int = 128, timeout: float = 120) -> str:
    """Notebook 04, section 10: run a loader in a child process whose open-file limit is ``limit``; return what it printed.

    A child process, so the notebook's own kernel keeps its limit. ``strategy`` is torch's
    sharing strategy: ``"file_descriptor"`` (Linux default) or ``"file_system"``.
    """
    if sys.platform == "win32":
        raise RuntimeError("open-file limits are a Linux/macOS topic; Windows has none to show here")
    code = f"from course_lib.workers import _open_files_child; _open_files_child({strategy!r}, {int(limit)})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the demo process failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return lines[-1]


def cpu_count() -> int:
    """Notebook 04, section 3: CPUs this process may run on (a Slurm or container allocation, not the whole node)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def limits() -> dict[str, Any]:
    """Notebook 04, section 10: the operating-system limits that decide how many workers and how large batches can be."""
    out: dict[str, Any] = {
        "cpus": cpu_count(),
        "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
        "start_method": mp.get_start_method(allow_none=False),
    }
    try:
        import resource

        out["open_files_soft"], out["open_files_hard"] = resource.getrlimit(resource.RLIMIT_NOFILE)
    except ImportError:  # Windows
        out["open_files_soft"] = out["open_files_hard"] = None
    if os.path.isdir("/dev/shm"):
        usage = shutil.disk_usage("/dev/shm")
        out["shm_total_mb"], out["shm_free_mb"] = usage.total / 2**20, usage.free / 2**20
    else:
        out["shm_total_mb"] = out["shm_free_mb"] = None
    return out


def shm_needed_mb(batch_mb: float, num_workers: int, prefetch_factor: int = 2) -> float:
    """Notebook 04, section 10: shared memory the batches in flight need: each worker holds up to ``prefetch_factor`` batches."""
    return batch_mb * num_workers * prefetch_factor


# --- uneven loading times ---------------------------------------------------------------------


class SlowStorage(Dataset):
    """Notebook 04, section 4: samples that take time to *arrive* rather than to compute, like files on network storage.

    Most samples wait ``base_s``; one in ``slow_every`` (chosen at random, fixed by ``seed``)
    waits ``slow_s`` instead: a cache miss, a cold file. Waiting uses no CPU, so the effect of
    prefetching shows even on a machine with few cores. Sample ``i`` is a small tensor holding ``i``.
    """

    def __init__(self, n: int = 1024, base_s: float = 0.0, slow_every: int = 256, slow_s: float = 0.15, seed: int = 0) -> None:
        if n < 0 or base_s < 0 or slow_s < 0 or slow_every < 1:
            raise ValueError("need n >= 0, base_s >= 0, slow_s >= 0 and slow_every >= 1")
        self.n, self.base_s, self.slow_s = n, base_s, slow_s
        rng = np.random.default_rng(seed)
        self.slow = np.zeros(n, dtype=bool)  # a NumPy array: shared by forked workers without copies
        self.slow[rng.choice(n, size=n // slow_every, replace=False)] = True

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        i = check_index(index, self.n)
        wait = self.slow_s if self.slow[i] else self.base_s
        if wait > 0:
            time.sleep(wait)
        return torch.full((8,), i)
