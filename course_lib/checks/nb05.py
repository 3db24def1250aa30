"""Checks for notebook 05 (workers are processes)."""

from __future__ import annotations

import gc
import importlib
import re
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from ..support import fork_context
from ..datasets import InMemoryDataset
from ..workers import NoisyDataset, private_memory_growth
from ._core import attempted, drain, exercise, require, solved

# ----------------------------------------------------------------- 05.1: a generator per worker


def _shifts(worker_init_fn: Callable[[int], None], seed: int, context: Any = None) -> tuple[list[int], list[int]]:
    """Shifts made by worker 0 and worker 1 (in-order loading alternates between them)."""
    loader = DataLoader(
        NoisyDataset(n=12, seed=0),
        batch_size=None,
        num_workers=2,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context=context or fork_context(),  # a function defined in a notebook cell needs fork
    )
    shifts = [int(shift) for _, shift in drain(loader)]
    return shifts[0::2], shifts[1::2]


def _require_seeded(worker_init_fn: Callable[[int], None], context: Any = None, where: str = "") -> None:
    """Workers draw different shifts, the same again for the same loader seed, others for another seed."""
    w0, w1 = _shifts(worker_init_fn, seed=1, context=context)
    require(
        w0 != w1, f"worker 0 and worker 1 still draw the same shifts{where}: replace the dataset's rng in each worker."
    )
    require(
        _shifts(worker_init_fn, seed=1, context=context) == (w0, w1),
        f"two runs with the same loader seed give different shifts{where}: seed the new generator from "
        "get_worker_info().seed, not from fresh entropy.",
    )
    require(
        _shifts(worker_init_fn, seed=2, context=context) != (w0, w1),
        f"a different loader seed gives the same shifts{where}: seed from get_worker_info().seed, which follows "
        "the loader's generator (the worker id alone, or a constant, does not).",
    )


@exercise(
    "05.1", "each worker gets its own generator, seeded from the loader: different per worker, reproducible per seed."
)
def seed_workers(worker_init_fn: Any) -> None:
    """``worker_init_fn(worker_id)`` gives each worker's copy of a NoisyDataset its own ``rng``."""
    attempted(worker_init_fn)
    require(callable(worker_init_fn), "pass the function itself (seed_worker), not the result of calling it.")
    _require_seeded(worker_init_fn)


# ----------------------------------------------------------------- 05.2: a module that spawn workers import


def _load(path: Path) -> Any:
    """Import (or re-import, after an edit) the learner's module; its folder goes on ``sys.path``, which spawn workers copy."""
    folder = str(path.parent.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(path.stem)
    return importlib.reload(module)


def _raises(exc: type[BaseException], call: Callable[[], Any]) -> str:
    """The message of the ``exc`` that ``call()`` raised, or ``""`` (no such exception: not the answer)."""
    try:
        call()
    except exc as raised:
        return str(raised) or type(raised).__name__
    except NotImplementedError:
        raise
    except Exception:
        return ""
    return ""


_TORCH_ARGUMENT_ERROR = re.compile(r"\w\(\): argument '\w+'")  # "randn_like(): argument 'input' ... must be Tensor"
_CONVERSIONS = ("ToImage", "ToTensor", "to_tensor", "pil_to_tensor", "to_image")


def _tells_what_to_do(message: str, received: Any) -> bool:
    """The rule for 05.2's TypeError: a message helps if it names a conversion that fixes the input (``v2.ToImage()``,
    ``ToTensor``, ``pil_to_tensor``), or says both what it expects (a tensor) and what it got (the type's name, or
    PIL). "wrong type" or "expected a tensor" alone leaves the user to guess."""
    if any(fix in message for fix in _CONVERSIONS):
        return True
    got = type(received).__name__ in message or "PIL" in message
    return "tensor" in message.lower() and got


def _check_noise(noise_cls: Any) -> Any:
    """``GaussianNoise(std)``: N(0, std) noise from torch's generator, a new tensor clamped to [0, 1], checked in-process;
    returns the instance checked, which then goes to the workers (with whatever state the calls left in it)."""
    noise = noise_cls(0.1)
    require(
        bool(_raises(ValueError, lambda: noise_cls(-0.1))),
        "GaussianNoise(-0.1) should raise ValueError: a standard "
        "deviation cannot be negative, and the error should come when the pipeline is built.",
    )
    require(
        "GaussianNoise" in repr(noise) and "0.1" in repr(noise),
        f"repr(GaussianNoise(0.1)) is {repr(noise)[:60]!r}: give it a __repr__ such as GaussianNoise(std=0.1), so "
        "that a printed Compose says what it does.",
    )
    x = torch.full((3, 64, 64), 0.5)
    torch.manual_seed(0)
    first = noise(x)
    require(
        torch.equal(x, torch.full((3, 64, 64), 0.5)),
        "GaussianNoise changed its input in place (add_, +=): the "
        "dataset's stored sample would drift on every read. Return image + noise, a new tensor.",
    )
    require(
        isinstance(first, torch.Tensor) and first.shape == x.shape and first.dtype == x.dtype,
        "GaussianNoise should return a tensor of the input's shape and dtype.",
    )
    spread = float((first - x).std())
    require(
        abs(spread - 0.1) < 0.01 and abs(float((first - x).mean())) < 0.01,
        f"the noise of GaussianNoise(0.1) has a "
        f"standard deviation of {spread:.3f}: it should be 0.1, torch.randn_like(image) * std.",
    )
    torch.manual_seed(0)
    require(
        torch.equal(noise(x), first),
        "with the same torch.manual_seed the noise differs: draw it from torch "
        "(torch.randn_like), not NumPy or random, so that torch's seeds, the DataLoader's per-worker seeds "
        "included, govern it.",
    )
    require(
        not torch.equal(noise(x), first),
        "two calls gave the same noise: draw new noise in __call__, not once in __init__.",
    )
    strong = noise_cls(1.0)(x)
    require(
        0 <= float(strong.min()) and float(strong.max()) <= 1, "with std=1 values left [0, 1]: .clamp(0, 1) the result."
    )
    pil = Image.new("RGB", (4, 4))
    message = _raises(TypeError, lambda: noise(pil))
    require(
        bool(message),
        "GaussianNoise given a PIL image should raise TypeError saying what to do: e.g. that it "
        "expects a tensor, and to put it after v2.ToImage() and v2.ToDtype(torch.float32, scale=True).",
    )
    require(
        not _TORCH_ARGUMENT_ERROR.search(message),
        f"GaussianNoise given a PIL image failed inside torch "
        f"({message[:70]!r}): it should raise TypeError saying what to do itself, before any work: test "
        "isinstance(image, torch.Tensor) first, as Add does.",
    )
    require(
        _tells_what_to_do(message, pil),
        f"GaussianNoise given a PIL image raised TypeError({message!r}), which "
        f"does not tell the user what to do. Name the fix (put it after v2.ToImage() and v2.ToDtype(torch.float32, "
        f"scale=True)), or say that it expects a tensor and what it got (type(image).__name__).",
    )
    return noise


@exercise(
    "05.2",
    "your module's GaussianNoise and seed_worker work in spawn workers, which import them by name: each "
    "worker draws its own noise, and seeds the dataset's generator from the loader.",
)
def worker_module(path: Any) -> None:
    """``path`` is a module defining ``GaussianNoise(std)`` and ``seed_worker(worker_id)``, run in ``spawn`` workers."""
    attempted(path)
    path = Path(path)
    require(path.is_file(), f"there is no {path}: run the %%writefile cell first (it writes the module).")
    module = _load(path)
    noise_cls = getattr(module, "GaussianNoise", None)
    require(isinstance(noise_cls, type), f"{path.name} should define a class GaussianNoise.")
    seed_worker = getattr(module, "seed_worker", None)
    require(
        callable(seed_worker),
        f"{path.name} should define a function seed_worker(worker_id), your answer to 05.1: "
        "under spawn a worker_init_fn defined in a notebook cell cannot be found either.",
    )
    noise = _check_noise(noise_cls)
    # What the seeds do is checked in forked workers first: they start in a moment, where a spawn worker imports torch
    # anew (seconds each), so a wrong seed_worker gets its hint without waiting for the spawn loader.
    _require_seeded(seed_worker, where=" (your module's seed_worker)")
    ds = InMemoryDataset(torch.full((4, 3, 8, 8), 0.5), transform=noise)
    # One spawn loader runs both: the transform and seed_worker must be found by name in the spawn workers' fresh
    # interpreters.
    loader = DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=seed_worker, multiprocessing_context="spawn")
    worker0, worker1 = drain(loader)  # one batch per worker
    require(
        not torch.equal(worker0[0] - 0.5, worker1[0] - 0.5),
        "both spawn workers drew the same noise: a generator "
        "made in __init__ is copied into every worker. Use torch's own (torch.randn_like), which each worker seeds "
        "differently.",
    )


# ----------------------------------------------------------------- 05.3: records that forked workers share


class _ListRecords(Dataset):
    """What exercise 05.3 replaces: the records as a Python list."""

    def __init__(self, records: list) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple:
        return self.records[i]


N_RECORDS = 200_000


@exercise("05.3", "a forked worker reads every record without copying them: paths and labels in NumPy arrays.")
def compact_records(cls: Any) -> None:
    """``cls(records)``: a map-style dataset over ``(path, label)`` records whose reads copy no memory into a forked worker."""
    attempted(cls)
    require(isinstance(cls, type), "pass the class itself (CompactRecords), not an instance of it.")
    records = [(f"train/{i % 10}/{i:07d}.jpg", i % 10) for i in range(N_RECORDS)]
    dataset = cls(records)
    require(len(dataset) == N_RECORDS, f"len() is {len(dataset)} for {N_RECORDS} records.")
    for i in (0, 1, 12_345, N_RECORDS - 1):
        path, label = dataset[i]
        require(
            not isinstance(path, bytes),
            f"dataset[{i}] gives the path as bytes ({path!r}): decode it, .decode(), "
            "or keep the paths as a str array (np.array(paths)), whose items str() turns into a str.",
        )
        require(
            isinstance(path, str) and path == records[i][0],
            f"dataset[{i}][0] is {path!r}, not the path {records[i][0]!r} (a str).",
        )
        require(
            isinstance(label, (int, np.integer)) and not isinstance(label, bool) and label == records[i][1],
            f"dataset[{i}][1] is {label!r}, not the label {records[i][1]}.",
        )
    if not sys.platform.startswith("linux"):
        return  # the measurement needs fork and /proc; the answer's shape was checked above
    mine, listed = private_memory_growth(dataset), private_memory_growth(_ListRecords(records))
    require(
        mine < max(1.0, listed / 10),
        f"a forked worker reading every record copied {mine:.0f} MB (a list of the "
        f"records: {listed:.0f} MB). Something still holds one Python object per record: a list, a dict, or a "
        "NumPy array of dtype=object. Keep the paths in np.array(paths) (a str array) and the labels in an int64 "
        "array, and make each item's str and int in __getitem__.",
    )


# ----------------------------------------------------------------- 05.4: the copy-on-read meter


@exercise("05.4", "your meter sees a forked worker copy a list it reads, and not an array.")
def copied_mb(fn: Any) -> None:
    """``fn(items)``: MB of private memory a forked DataLoader worker gains by reading every item of ``items``."""
    attempted(fn)
    require(callable(fn), "pass the function itself (copied_mb), not the result of calling it.")
    if not sys.platform.startswith("linux"):
        return  # /proc/self/smaps_rollup and fork: Linux only
    listed = [float(i) for i in range(300_000)]
    gc.collect()  # earlier cells' garbage goes here, not in the worker your meter forks (see private_memory_growth)
    on_list, on_array = fn(listed), fn(np.asarray(listed))
    for name, value in (("list", on_list), ("array", on_array)):
        require(
            isinstance(value, (int, float, np.number)) and not isinstance(value, bool),
            f"copied_mb(a {name}) returned {value!r}: return the MB as a number (after - before).",
        )
    reference = private_memory_growth(listed)
    require(
        on_list > reference / 3,
        f"reading a list of 300,000 floats copied {on_list:.2f} MB by your meter, "
        f"{reference:.1f} MB by the course's. Read the items inside the worker (in __getitem__), with the "
        "DataLoader's multiprocessing_context='fork' (a spawned worker gets a pickled copy, private from the "
        "start), and take Private_Dirty from /proc/self/smaps_rollup before and after (Rss counts shared pages too).",
    )
    require(
        on_array < max(1.0, on_list / 10),
        f"your meter says reading an array copied {on_array:.1f} MB (a list: "
        f"{on_list:.1f} MB): measure only the reading, between two Private_Dirty readings in the worker, not "
        "the worker's start.",
    )


__all__ = ["compact_records", "copied_mb", "seed_workers", "solved", "worker_module"]
