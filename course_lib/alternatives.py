"""Beyond WebDataset: the same images as MDS shards (mosaicml-streaming) and litdata chunks.

Notebook 09 writes the course's generated images in three streaming formats and reads them
through the same decoding and the same ``DataLoader``, so that the measured differences are the
formats' and their readers', nothing else:

* **WebDataset**: tar shards (notebook 08), :func:`webdataset_images`;
* **MDS** (mosaicml-streaming): :func:`write_mds` with ``MDSWriter``, read by
  ``streaming.StreamingDataset`` from a local folder (``remote=None``), :func:`mds_images`;
* **litdata**: :func:`write_litdata` with ``litdata.optimize``, read by
  ``litdata.StreamingDataset``, :func:`litdata_images`.

What worker processes must import lives here, not in a notebook cell: ``litdata.optimize``
sends its function to worker processes, and under ``spawn`` they find it only in a module.
:func:`compare_formats` measures samples/s for all three, and ``python -m course_lib bench
formats`` runs it from a shell.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, IterableDataset

Item = tuple[str, int]  # (path of a JPEG file, class number)


class FormatError(RuntimeError):
    """A format's folder is missing or incomplete, or its package is not installed."""


def _require(module: str, package: str) -> Any:
    """Import ``module``, or say which package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FormatError(f"{module} is not importable ({exc}): pip install {package} "
                          "(it is in the course's requirements.txt)") from None


def image_items(folder: str | os.PathLike[str], split: str = "train", limit: int | None = None) -> list[Item]:
    """``(path, class)`` of the images of a generated set's split, in file order (a picklable list)."""
    from .datasets import ImageFileDataset

    ds = ImageFileDataset(folder, split)
    items = [(str(ds.folder / p), int(t)) for p, t in zip(ds.paths, ds.targets)]
    return items[:limit] if limit is not None else items


def encoded_sample(item: Item) -> dict[str, Any]:
    """One sample as stored: the JPEG bytes as they are (no re-encoding) and the class number.

    ``litdata.optimize`` calls this in its worker processes, which is why it is a module-level
    function and not a lambda or a notebook cell.
    """
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": int(label)}


def decode(jpg: bytes | memoryview, label: int) -> tuple[torch.Tensor, int]:
    """JPEG bytes to a float tensor ``[3, H, W]`` in [0, 1]: the same decoding for every format."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(jpg)) as image:
        pixels = np.array(image.convert("RGB"))  # a writable copy: torch wants to own its memory
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255), int(label)


# --------------------------------------------------------------------------- writing


def write_mds(items: Sequence[Item], out_dir: str | os.PathLike[str], size_limit: int = 1 << 20) -> Path:
    """Write ``items`` as MDS shards (``index.json`` + ``shard.NNNNN.mds``) with ``MDSWriter``.

    Columns ``jpg`` (raw bytes) and ``cls`` (int); no compression, as JPEG is compressed already.
    Written into a temporary folder and renamed, so a crash never leaves a half-written set.
    """
    streaming = _require("streaming", "mosaicml-streaming")
    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with streaming.MDSWriter(out=str(tmp), columns={"jpg": "bytes", "cls": "int"}, size_limit=size_limit,
                             progress_bar=False) as writer:
        for item in items:
            writer.write(encoded_sample(item))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def write_litdata(items: Sequence[Item], out_dir: str | os.PathLike[str], chunk_bytes: str | int = "1MB",
                  num_workers: int = 2, start_method: str | None = None) -> Path:
    """Write ``items`` as litdata chunks with ``litdata.optimize(fn=encoded_sample, ...)``.

    ``optimize`` runs ``encoded_sample`` in ``num_workers`` processes and, as a side effect, sets
    the **process-wide** multiprocessing start method (``fork`` in a notebook, ``spawn`` in a
    script); this function puts the previous one back. ``start_method`` defaults to ``fork`` where
    it exists: ``spawn`` would start every worker by importing torch again. ``keep_data_ordered``
    gives each worker a fixed slice, so sample ``i`` of the output is ``items[i]`` on every run.
    """
    litdata = _require("litdata", "litdata")
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    method = start_method or ("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=encoded_sample, inputs=list(items), output_dir=str(out), chunk_bytes=chunk_bytes,
                         num_workers=num_workers, keep_data_ordered=True, mode="overwrite", verbose=False,
                         start_method=method)
    finally:
        multiprocessing.set_start_method(previous, force=True)
    if not (out / "index.json").is_file() or not list(out.glob("*.bin")):
        raise FormatError(f"litdata.optimize wrote no chunks into {out.name}/: see the worker errors above")
    return out


# --------------------------------------------------------------------------- reading


class Decoded(IterableDataset):
    """Any iterable dataset of ``{"jpg": ..., "cls": ...}`` samples, decoded by :func:`decode`.

    MDS's and litdata's ``StreamingDataset`` split their samples among DataLoader workers (and
    ranks) themselves; this wrapper only iterates them inside the worker, so that split stands.
    """

    def __init__(self, inner: Iterable[dict[str, Any]]) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for sample in self.inner:
            yield decode(sample["jpg"], sample["cls"])


def _webdataset_decode(sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
    jpg, cls = sample
    return decode(jpg, int(cls))


def webdataset_images(urls: str) -> IterableDataset:
    """Tar shards (notebook 08) read by webdataset, decoded by :func:`decode`."""
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg", "cls").map(_webdataset_decode)


def mds_images(local: str | os.PathLike[str], batch_size: int) -> IterableDataset:
    """MDS shards in a local folder, read by ``streaming.StreamingDataset(local=..., remote=None)``.

    No download: ``remote=None`` reads the folder in place. ``batch_size`` must be the
    DataLoader's: the dataset deals whole batches to workers and ranks, and refuses to iterate
    without it.
    """
    streaming = _require("streaming", "mosaicml-streaming")
    if not (Path(local) / "index.json").is_file():
        raise FormatError(f"no MDS index.json in {Path(local).name}/: write it with write_mds(items, folder)")
    dataset = streaming.StreamingDataset(local=str(local), remote=None, shuffle=False, batch_size=batch_size)
    _MDS_MADE.append(dataset)
    return Decoded(dataset)


_MDS_MADE: list[Any] = []  # the StreamingDatasets mds_images made, for release_mds()


def release_mds(*datasets: Any) -> int:
    """Unlink the shared memory of MDS ``StreamingDataset``s; return how many segments.

    Each ``StreamingDataset`` creates small named segments in ``/dev/shm`` and unlinks them at
    interpreter exit, which a Jupyter kernel that is shut down or killed may never reach: they stay
    until the machine reboots. Call this when done with ``datasets`` (wrapped or not) and with every
    dataset :func:`mds_images` made; none of them can be iterated afterwards.
    """
    from streaming.base.shared.memory import SharedMemory

    found: dict[int, Any] = {}

    def walk(obj: Any, depth: int) -> None:
        if isinstance(obj, SharedMemory):
            found[id(obj)] = obj
        elif depth < 3 and type(obj).__module__.startswith("streaming") and hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                walk(value, depth + 1)

    for dataset in [*(getattr(d, "inner", d) for d in datasets), *_MDS_MADE]:
        walk(dataset, 0)
    _MDS_MADE.clear()
    for shm in found.values():
        shm.cleanup()
    return len(found)


def litdata_images(folder: str | os.PathLike[str]) -> IterableDataset:
    """litdata chunks in a local folder, read by ``litdata.StreamingDataset``."""
    litdata = _require("litdata", "litdata")
    if not (Path(folder) / "index.json").is_file():
        raise FormatError(f"no litdata index.json in {Path(folder).name}/: write it with write_litdata(items, folder)")
    return Decoded(litdata.StreamingDataset(str(folder)))


# --------------------------------------------------------------------------- measuring


def samples_per_second(make_loader: Callable[[], Iterable[Any]], expected: int | None = None) -> float:
    """Samples/s of one pass over a fresh loader of ``(images, labels)`` batches, workers' start-up included."""
    loader = make_loader()
    start = time.perf_counter()
    seen = sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - start
    if expected is not None and seen != expected:
        raise RuntimeError(f"a pass yielded {seen} samples instead of {expected}")
    return seen / seconds


def compare_formats(datasets: dict[str, Callable[[], IterableDataset]], samples: int, batch_size: int = 32,
                    num_workers: int = 2, rounds: int = 3, seed: int = 0) -> dict[str, list[float]]:
    """``{format: [samples/s per round]}``: each dataset through the same ``DataLoader`` settings.

    Formats take turns within every round, so drift of the machine hits them alike; each pass
    builds a fresh loader (start-up counted, as in an epoch with non-persistent workers) and must
    yield exactly ``samples`` samples.
    """
    results: dict[str, list[float]] = {name: [] for name in datasets}
    for _ in range(rounds):
        for name, make in datasets.items():
            def loader(make: Callable[[], IterableDataset] = make) -> DataLoader:
                return DataLoader(make(), batch_size=batch_size, num_workers=num_workers,
                                  generator=torch.Generator().manual_seed(seed))
            results[name].append(samples_per_second(loader, samples))
    return results


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in results.items()}


def folder_bytes(folder: str | os.PathLike[str]) -> int:
    """Bytes of the files in a folder (not in subfolders): what a format costs on disk."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def plot_formats(results: dict[str, list[float]], ax: Any = None, title: str = "The same images, three formats") -> Any:
    """Bars of the median samples/s of each format, relative to the first."""
    from .viz import relative_bars

    med = medians(results)
    first = next(iter(med))
    return relative_bars(med, f"samples/s relative to {first} (same decoding, same DataLoader)", title,
                         ["#4C72B0", "#55A868", "#C44E52", "#8172B2"][: len(med)], ax=ax)


def dali_available() -> bool:
    """True where NVIDIA DALI is importable and a CUDA GPU is present (its decoder runs on the GPU)."""
    if not torch.cuda.is_available():
        return False
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def in_notebook() -> bool:
    """True inside a Jupyter kernel (litdata decides its start method by the same test)."""
    return "ipykernel" in sys.modules


def _retry_mds_prefix_race() -> None:
    """Make MDS retry when two processes pick the same ``/dev/shm`` prefix at once.

    mosaicml-streaming's ``StreamingDataset`` scans ``/dev/shm`` for the first free prefix number,
    then creates its segment under it: two processes doing that at the same moment (two notebooks
    on one machine, the course's test run) can pick the same number, and the slower one fails with
    ``FileExistsError``. Looking again then finds the next free number, so retry a few times.
    Installed when this module is imported; a no-op without mosaicml-streaming.
    """
    try:
        from streaming.base import dataset as mds_dataset
    except ImportError:
        return
    original = mds_dataset.get_shm_prefix
    if getattr(original, "retries_races", False):
        return

    def get_shm_prefix(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(10):
            try:
                return original(*args, **kwargs)
            except FileExistsError:
                time.sleep(0.02 * (attempt + 1))
        return original(*args, **kwargs)

    get_shm_prefix.retries_races = True  # type: ignore[attr-defined]
    mds_dataset.get_shm_prefix = get_shm_prefix


_retry_mds_prefix_race()
