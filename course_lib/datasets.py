"""Notebook 01: map-style datasets, used throughout the course.

A map-style dataset is anything with ``__len__`` and ``__getitem__(index)``. The classes are short enough to read
whole, and live in a module (not a notebook cell) so that DataLoader workers can pickle them under any start method.
"""

from __future__ import annotations

import io
import operator
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from . import data as _data
from .support import check_int

__all__ = [
    "DataNotFoundError",
    "ImageFileDataset",
    "InMemoryDataset",
    "RandomSequences",
    "WithIndex",
    "check_index",
    "image_tensor",
    "shapes",
]

_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class DataNotFoundError(FileNotFoundError):
    """Notebook 01, section 2: a data folder is missing or holds no images; the message says how to create it."""


def check_index(index: Any, length: int) -> int:
    """Notebook 01, section 1: turn ``index`` into a valid non-negative position, as a Python sequence would.
    Raises ``IndexError`` (with the dataset's length) when it is out of range: ``for x in
    dataset`` relies on that error to know where the data ends."""
    try:
        i = operator.index(index)  # accepts int, numpy ints and 0-d integer tensors
    except TypeError:
        raise TypeError(
            f"dataset indices must be integers, got {type(index).__name__}; "
            "to take several samples use torch.utils.data.Subset or a DataLoader"
        ) from None
    if i < 0:
        i += length
    if not 0 <= i < length:
        raise IndexError(f"index {index} is out of range for a dataset of length {length} (valid: 0..{length - 1})")
    return i


class InMemoryDataset(Dataset):
    """Notebook 01, section 1: samples (and optional targets) already held in memory, the classic first Dataset.

    ``dataset[i]`` is ``transform(data[i])``, or ``(transform(data[i]), target_transform(targets[i]))`` with targets.
    """

    def __init__(
        self,
        data: Sequence[Any] | torch.Tensor | np.ndarray,
        targets: Sequence[Any] | torch.Tensor | np.ndarray | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if targets is not None and len(targets) != len(data):
            raise ValueError(f"data has {len(data)} samples but targets has {len(targets)}; they must match")
        self.data = data
        self.targets = targets
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        i = check_index(index, len(self))
        x = self.data[i]
        if self.transform is not None:
            x = self.transform(x)
        if self.targets is None:
            return x
        y = self.targets[i]
        if self.target_transform is not None:
            y = self.target_transform(y)
        return x, y

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={len(self)}, targets={self.targets is not None}, transform={self.transform!r})"


class ImageFileDataset(Dataset):
    """Notebook 01, section 2: images stored one file per sample, ``root/<split>/<class>/<file>``.

    Only the file list is built in ``__init__``; ``__getitem__`` opens and decodes one image, so memory stays small.
    ``root`` holds the splits (a generated set, or a real one such as ImageNet's ``train/``, ``val/``); ``split=None``
    when it holds the class folders. Paths and targets are NumPy arrays, which forked workers share (notebook 05).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str | None = "train",
        transform: Callable[[Image.Image], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        extensions: Sequence[str] = _IMG_EXTENSIONS,
    ) -> None:
        self.root = Path(root).expanduser()
        self.split = split
        self.transform = transform
        self.target_transform = target_transform
        folder = self.root if split is None else self.root / split
        if not self.root.is_dir():
            raise DataNotFoundError(
                f"no data folder at {str(self.root)!r}. Create the course data with "
                "course_lib.data.prepare_data() (or `python -m course_lib prepare`), "
                "or pass the path of an existing ImageFolder-style dataset."
            )
        if not folder.is_dir():
            splits = sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
            raise DataNotFoundError(
                f"{self.root.name}/ has no {split!r} split; it holds: {', '.join(splits) or 'nothing'}. "
                "Pass split=... (or split=None if the class folders are directly inside)."
            )
        self.classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        exts = tuple(e.lower() for e in extensions)
        paths, targets = [], []
        for cls in self.classes:
            for f in sorted((folder / cls).iterdir()):
                if f.suffix.lower() in exts and f.is_file():
                    paths.append(f"{cls}/{f.name}")
                    targets.append(self.class_to_idx[cls])
        if not paths:
            raise DataNotFoundError(
                f"no images ({', '.join(exts)}) in class folders under {folder.name}/. "
                "Generate the course data with course_lib.data.prepare_data(), or check the path."
            )
        self.folder = folder
        self.paths = np.array(paths)  # relative to self.folder
        self.targets = np.array(targets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.paths)

    def load_image(self, index: int) -> Image.Image:
        """Open and decode one image file as RGB (no transform)."""
        i = check_index(index, len(self))
        rel = str(self.paths[i])
        try:
            with Image.open(self.folder / rel) as img:
                return img.convert("RGB")
        except (UnidentifiedImageError, OSError) as exc:
            raise _data.DataError(
                f"cannot decode image {i} ({self.split or '.'}/{rel}): {exc}. The file is damaged; "
                "re-create the generated set with prepare_data(force=True) or replace the file."
            ) from None

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img = self.load_image(index)
        target: Any = int(self.targets[check_index(index, len(self))])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.root.name}/{self.split or ''}, n={len(self)}, "
            f"classes={len(self.classes)}, transform={self.transform!r})"
        )


def image_tensor(image: bytes | str | os.PathLike[str] | Image.Image, size: int | None = None) -> torch.Tensor:
    """Notebook 01, section 2: an image (JPEG/PNG bytes, a file or a PIL image) as a float tensor ``[3, H, W]`` in [0, 1].
    ``size`` resizes it to ``size`` × ``size`` pixels first. Pillow decodes in C, releasing the GIL."""
    if isinstance(image, Image.Image):
        rgb = image.convert("RGB")
    else:
        with Image.open(io.BytesIO(image) if isinstance(image, (bytes, bytearray, memoryview)) else image) as opened:
            rgb = opened.convert("RGB")
    if size is not None:
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).float().div_(255)


def shapes(
    split: str = "train",
    transform: Callable[[Image.Image], Any] | None = None,
    target_transform: Callable[[int], Any] | None = None,
    *,
    size: str = _data.DEFAULT_SIZE,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
) -> ImageFileDataset:
    """Notebook 01, section 2: the generated shapes set as an :class:`ImageFileDataset` (prepare it first)."""
    folder = _data.data_dir(root) / _data.dataset_name(size, seed)
    if not folder.is_dir():
        raise DataNotFoundError(
            f"the {folder.name} data set has not been generated yet. Run "
            f"course_lib.data.prepare_data(size={size!r}, seed={seed}) or "
            f"`python -m course_lib prepare --size {size}` (set {_data.ENV_VAR} to choose where)."
        )
    return ImageFileDataset(folder, split, transform, target_transform)


class RandomSequences(Dataset):
    """Notebook 03, section 4: integer token sequences of varying length, for batching variable-length samples.

    Sample ``i`` is ``(tokens, label)``: ``tokens`` a 1-D ``int64`` tensor of ``min_len`` to ``max_len`` values in
    ``1..vocab-1`` (0 is kept free for padding), ``label`` 1 if it is longer than the midpoint length, else 0. Sample
    ``i`` is the same on every call and in every worker: it is drawn from its own seeded generator.
    """

    def __init__(self, n: int = 100, min_len: int = 3, max_len: int = 20, vocab: int = 50, seed: int = 0) -> None:
        self.n, self.vocab, self.seed = check_int(n, "n"), check_int(vocab, "vocab", 2), seed
        self.min_len = check_int(min_len, "min_len", 1)
        self.max_len = check_int(max_len, "max_len", self.min_len)  # at least min_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        i = check_index(index, self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        length = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        tokens = torch.randint(1, self.vocab, (length,), generator=g)
        return tokens, int(length > (self.min_len + self.max_len) / 2)


class WithIndex(Dataset):
    """Notebook 07, section 5: wrap a dataset so that sample ``i`` comes out as ``(i, *sample)``.
    The index rides through the DataLoader with the sample: which indices a rank or a worker loaded is then known."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        sample = self.dataset[index]
        return (index, *sample) if isinstance(sample, tuple) else (index, sample)

    def __repr__(self) -> str:
        return f"WithIndex({self.dataset!r})"
