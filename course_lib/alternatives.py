"""Notebook 11: beyond WebDataset, the same images as MDS shards (mosaicml-streaming) and litdata chunks.

The images are written in three streaming formats (WebDataset, MDS, litdata) and read through the same decoding and
the same ``DataLoader``, so that measured differences are the formats' own. What worker processes must import lives
here: ``litdata.optimize`` sends its function to worker processes, which under ``spawn`` find it only in a module.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from .datasets import ImageFileDataset, image_tensor
from .timing import medians

__all__ = [
    "compare_formats",
    "dali_available",
    "encoded_sample",
    "train_steps",
    "folder_bytes",
    "image_items",
    "litdata_images",
    "mds_dataset",
    "mds_images",
    "plot_formats",
    "release_mds",
    "webdataset_images",
]

Item = tuple[str, int]  # (path of a JPEG file, class number)


class FormatError(RuntimeError):
    """A format's folder is missing or incomplete, or its package is not installed."""


def require_package(module: str, package: str) -> Any:
    """Import ``module``, or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FormatError(
            f"{module} is not importable ({exc}): pip install {package} (it is in the course's requirements.txt)"
        ) from None


def image_items(folder: str | os.PathLike[str], split: str = "train", limit: int | None = None) -> list[Item]:
    """Notebook 11, section 1: ``(path, class)`` of the images of a generated set's split, in file order (a picklable list)."""
    ds = ImageFileDataset(folder, split)
    items = [(str(ds.folder / p), int(t)) for p, t in zip(ds.paths, ds.targets)]
    return items[:limit] if limit is not None else items


def encoded_sample(item: Item) -> dict[str, Any]:
    """Notebook 11, section 3: one sample as stored, the JPEG bytes as they are (no re-encoding) and the class number.

    ``litdata.optimize`` calls this in its worker processes, which is why it is a module-level
    function and not a lambda or a notebook cell.
    """
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": int(label)}


# --------------------------------------------------------------------------- reading
class _Decoded(IterableDataset):
    """Any iterable dataset of ``{"jpg": ..., "cls": ...}`` samples, decoded by :func:`image_tensor`.

    MDS's and litdata's ``StreamingDataset`` split their samples among DataLoader workers (and
    ranks) themselves; this wrapper only iterates them inside the worker, so that split stands.
    """

    def __init__(self, inner: Iterable[dict[str, Any]]) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for sample in self.inner:
            yield image_tensor(sample["jpg"]), int(sample["cls"])


def _decode_pair(sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
    jpg, cls = sample
    return image_tensor(jpg), int(cls)


def webdataset_images(urls: str) -> IterableDataset:
    """Notebook 11, section 4: tar shards (notebook 09) read by webdataset, decoded by :func:`~course_lib.datasets.image_tensor`."""
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg", "cls").map(_decode_pair)


def mds_dataset(**kwargs: Any) -> Any:
    """Notebooks 11 and 14: ``streaming.StreamingDataset(**kwargs)``, released by :func:`release_mds`.

    Retried when two processes pick the same ``/dev/shm`` prefix: mosaicml-streaming 0.13.0 scans for the first
    free number, then creates it, so two notebooks at once can collide (the slower gets ``FileExistsError``).
    What is not released by hand is released when the process exits normally (a script, a test process, a Jupyter
    kernel asked to shut down, see :func:`course_lib.support.let_the_kernel_exit`): otherwise its lock files would
    stay in the temporary folder for good. A kernel that is killed does not get there, so notebook 11 releases its
    datasets in a cell.
    """
    streaming = require_package("streaming", "mosaicml-streaming")
    for attempt in range(10):
        try:
            dataset = streaming.StreamingDataset(**kwargs)
            break
        except FileExistsError:
            time.sleep(0.02 * (attempt + 1))
    else:
        dataset = streaming.StreamingDataset(**kwargs)
    _MDS_MADE.append(dataset)
    return dataset


def mds_images(local: str | os.PathLike[str], batch_size: int) -> IterableDataset:
    """Notebook 11, section 2: MDS shards in a local folder, read by ``streaming.StreamingDataset(local=..., remote=None)``.

    No download: ``remote=None`` reads the folder in place. ``batch_size`` must be the DataLoader's: the dataset deals
    whole batches to workers and ranks, and refuses to iterate without it.
    """
    if not (Path(local) / "index.json").is_file():
        raise FormatError(f"no MDS index.json in {Path(local).name}/: write it with streaming.MDSWriter first")
    return _Decoded(mds_dataset(local=str(local), remote=None, shuffle=False, batch_size=batch_size))


_MDS_MADE: list[Any] = []  # the StreamingDatasets mds_dataset made, for release_mds()


def _shared_memory_of(dataset: Any) -> list[Any]:
    """The ``SharedMemory`` objects one MDS ``StreamingDataset`` holds (private attributes of
    mosaicml-streaming, checked with 0.13.0: they sit at most three attributes deep)."""
    from streaming.base.shared.memory import SharedMemory

    found: dict[int, Any] = {}

    def walk(obj: Any, depth: int) -> None:
        if isinstance(obj, SharedMemory):
            found[id(obj)] = obj
        elif depth < 3 and type(obj).__module__.startswith("streaming") and hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                walk(value, depth + 1)

    walk(dataset, 0)
    return list(found.values())


def release_mds(*datasets: Any, all_live: bool = False) -> int:
    """Notebook 11, section 2: unlink the shared memory of MDS ``StreamingDataset``s; return how many segments.

    Each creates named segments in ``/dev/shm`` and unlinks them at interpreter exit, which a stopped Jupyter
    kernel may never reach. Each also leaves two empty lock files in the temporary folder, for good, and no later
    dataset takes their number again: they go too. Call this when done with ``datasets`` (wrapped or not) and every
    dataset :func:`mds_dataset` made; none of them can be iterated afterwards. ``all_live``: every MDS dataset alive
    in this process too, however made (:mod:`course_lib.kernel`, as a kernel shuts down).
    """
    released = [*(getattr(d, "inner", d) for d in datasets), *_MDS_MADE, *(_live_mds_datasets() if all_live else [])]
    _MDS_MADE.clear()
    for dataset in released:
        _stop_threads_of(dataset)
    segments = {id(s): s for d in released for s in _shared_memory_of(d)}
    for shm in segments.values():
        shm.cleanup()
    for lock in {path for d in released for path in _lock_files_of(d)}:
        Path(lock).unlink(missing_ok=True)
    return len(segments)


atexit.register(release_mds)  # at a normal exit, what was not released by hand (see mds_dataset)


def _live_mds_datasets() -> list[Any]:
    """Every MDS ``StreamingDataset`` alive in this process, made by :func:`mds_dataset` or not (an empty list when
    mosaicml-streaming was never imported). :mod:`course_lib.kernel` releases them before a kernel closes its end
    of the resource tracker's pipe: the tracker reports every segment still registered then as leaked, although
    the datasets' own exit-time clean-up unlinks them a moment later."""
    streaming = sys.modules.get("streaming")
    if streaming is None:
        return []
    return [obj for obj in gc.get_objects() if isinstance(obj, streaming.StreamingDataset)]


def _stop_threads_of(dataset: Any, timeout_s: float = 10.0) -> None:
    """Stop the two threads that prepare the shards of an MDS ``StreamingDataset`` iterated in this process (a loop
    left early goes on preparing): they read the shared memory that :func:`release_mds` unlinks, and would print a
    traceback. Private attributes of mosaicml-streaming, checked with 0.13.0."""
    iterator = getattr(dataset, "_iterator", None)
    if iterator is None:  # never iterated here
        return
    iterator.non_blocking_exit()  # the threads see it within a tick
    deadline = time.monotonic() + timeout_s
    while iterator._num_exited < iterator._num_threads_to_exit and time.monotonic() < deadline:
        time.sleep(0.01)


def _lock_files_of(dataset: Any) -> list[str]:
    """The paths of the barrier and cache lock files of one MDS ``StreamingDataset`` (private attributes of
    mosaicml-streaming, checked with 0.13.0)."""
    barrier = getattr(getattr(dataset, "_shared_barrier", None), "filelock_path", None)
    return [p for p in (barrier, getattr(dataset, "_cache_filelock_path", None)) if isinstance(p, str)]


def litdata_images(folder: str | os.PathLike[str]) -> IterableDataset:
    """Notebook 11, section 3: litdata chunks in a local folder, read by ``litdata.StreamingDataset``."""
    litdata = require_package("litdata", "litdata")
    if not (Path(folder) / "index.json").is_file():
        raise FormatError(
            f"no litdata index.json in {Path(folder).name}/: write it with litdata.optimize(..., output_dir=folder) first"
        )
    return _Decoded(litdata.StreamingDataset(str(folder)))


def train_steps(model: torch.nn.Module, loader: Any, steps: int) -> int:
    """Notebook 11, exercise 11.5 (the course's version): what a framework's training loop does with a loader, iterate
    it and nothing else: ``steps`` SGD steps (lr 0.1, cross-entropy) on ``(images, labels)`` batches; the images seen."""
    import itertools

    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for images, labels in itertools.islice(loader, steps):
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(labels)
    return seen


# --------------------------------------------------------------------------- measuring
def _samples_per_second(make_loader: Callable[[], Iterable[Any]], expected: int | None = None) -> float:
    """Samples/s of one pass over a fresh loader of ``(images, labels)`` batches, workers' start-up included."""
    loader = make_loader()
    start = time.perf_counter()
    seen = sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - start
    if expected is not None and seen != expected:
        raise RuntimeError(f"a pass yielded {seen} samples instead of {expected}")
    return seen / seconds


def compare_formats(
    datasets: dict[str, Callable[[], IterableDataset]],
    samples: int,
    batch_size: int = 32,
    num_workers: int = 2,
    rounds: int = 3,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Notebook 11, section 4: ``{format: [samples/s per round]}``, each dataset through the same ``DataLoader`` settings.

    Formats take turns within every round, so drift of the machine hits them alike; each pass builds a fresh loader
    (start-up counted, as in an epoch with non-persistent workers) and must yield exactly ``samples`` samples.
    """
    results: dict[str, list[float]] = {name: [] for name in datasets}
    for _ in range(rounds):
        for name, make in datasets.items():

            def loader(make: Callable[[], IterableDataset] = make) -> DataLoader:
                return DataLoader(
                    make(),
                    batch_size=batch_size,
                    num_workers=num_workers,
                    generator=torch.Generator().manual_seed(seed),
                )

            results[name].append(_samples_per_second(loader, samples))
    return results


def folder_bytes(folder: str | os.PathLike[str]) -> int:
    """Notebook 11, section 4: bytes of the files in a folder (not in subfolders), what a format costs on disk."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def plot_formats(results: dict[str, list[float]], ax: Any = None, title: str = "The same images, three formats") -> Any:
    """Notebook 11, section 4: bars of the median samples/s of each format, relative to the first."""
    from .viz import relative_bars

    med = medians(results)
    first = next(iter(med))
    return relative_bars(
        med,
        f"samples/s relative to {first} (same decoding, same DataLoader)",
        title,
        ["#4C72B0", "#55A868", "#C44E52", "#8172B2"][: len(med)],
        ax=ax,
    )


def dali_available() -> bool:
    """Notebook 11, section 5: True where NVIDIA DALI is importable and a CUDA GPU is present (its decoder runs on the GPU)."""
    if not torch.cuda.is_available():
        return False
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True
