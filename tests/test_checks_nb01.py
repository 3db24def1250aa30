"""course_lib.checks.nb01: right answers pass, stubs are "not attempted", and each wrong answer gets its own hint."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset, random_split

from course_lib.checks import Status, nb01
from course_lib.datasets import ImageFileDataset
from exercise_status import status

pytestmark = pytest.mark.quick


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i, i * i


class SquaresNoNegative(Squares):
    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i, i * i


class SquaresNegativeWraps(Squares):
    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return super().__getitem__(i % self.n)


class SquaresNoIndexError(Squares):
    def __getitem__(self, i):
        return i, i * i


class SquaresFixedLength(Squares):
    def __len__(self):
        return 5


class SquaresWrongValue(Squares):
    def __getitem__(self, i):
        i, _ = super().__getitem__(i)
        return i, 2 * i


class SquaresList(Squares):
    def __getitem__(self, i):
        return [i, i * i]


class SquaresStubGetitem(Squares):
    def __getitem__(self, i):
        raise NotImplementedError


def test_01_squares() -> None:
    assert status(nb01.squares_dataset, Squares)[0] is Status.SOLVED
    assert status(nb01.squares_dataset, ...)[0] is Status.NOT_ATTEMPTED
    assert "must raise IndexError" in status(nb01.squares_dataset, SquaresNoIndexError)[1]
    assert "follow the n given" in status(nb01.squares_dataset, SquaresFixedLength)[1]
    assert "should be (3, 9)" in status(nb01.squares_dataset, SquaresWrongValue)[1]
    assert "counts from the end" in status(nb01.squares_dataset, SquaresNoNegative)[1]
    assert "Squares(5)[-6] returned a value" in status(nb01.squares_dataset, SquaresNegativeWraps)[1]
    assert "the tuple (3, 9), got [3, 9]" in status(nb01.squares_dataset, SquaresList)[1]
    assert "not an instance" in status(nb01.squares_dataset, Squares(5))[1]
    stub = status(nb01.squares_dataset, SquaresStubGetitem)
    assert stub[0] is Status.NOT_ATTEMPTED and "NotImplementedError in `__getitem__`" in stub[1]


def split_with(fractions, seed, objects=2):
    """A split_holdout: the solution's recipe (split the indices, then one dataset object per part), varied."""

    def split_holdout(ds):
        idx = random_split(range(len(ds)), fractions, generator=torch.Generator().manual_seed(seed))
        views = [ImageFileDataset(ds.root, "train") for _ in range(objects)]
        return Subset(views[0], idx[0].indices), Subset(views[-1], idx[1].indices)

    return split_holdout


def test_01_split(tiny_set: Path) -> None:
    train = ImageFileDataset(tiny_set, "train")
    assert len(train) == 80
    check = nb01.seeded_split
    assert status(check, split_with([0.8, 0.2], 42), train)[0] is Status.SOLVED
    assert status(check, ..., train)[0] is Status.NOT_ATTEMPTED
    assert "views of one dataset object" in status(check, split_with([0.8, 0.2], 42, objects=1), train)[1]
    assert "seed 42" in status(check, split_with([0.8, 0.2], 1), train)[1]
    assert "[0.8, 0.2]" in status(check, split_with([0.5, 0.5], 42), train)[1]
    assert "the function itself" in status(check, split_with([0.8, 0.2], 42)(train), train)[1]
    assert "should return two Subsets" in status(check, lambda ds: split_with([0.8, 0.2], 42)(ds)[0], train)[1]
    assert (
        "should be a Subset" in status(check, lambda ds: (list(range(64)), split_with([0.8, 0.2], 42)(ds)[1]), train)[1]
    )
    val = ImageFileDataset(tiny_set, "val")
    assert (
        "over the same files"
        in status(check, lambda ds: (split_with([0.8, 0.2], 42)(ds)[0], Subset(val, range(16))), train)[1]
    )

    def overlap(ds):
        good = split_with([0.8, 0.2], 42)(ds)
        return good[0], Subset(good[1].dataset, good[0].indices[:16])

    assert "in both parts" in status(check, overlap, train)[1]


def test_01_split_from_the_global_seed(tiny_set: Path) -> None:
    """torch.manual_seed(42) in an earlier cell + an unseeded random_split: right indices in that cell, yet the check
    (which calls the function under other global seeds) sees the split follow the global generator."""
    train = ImageFileDataset(tiny_set, "train")
    check = nb01.seeded_split

    def from_global(ds):
        idx = random_split(range(len(ds)), [0.8, 0.2])
        return Subset(ImageFileDataset(ds.root, "train"), idx[0].indices), Subset(
            ImageFileDataset(ds.root, "train"), idx[1].indices
        )

    torch.manual_seed(42)
    right_here = from_global(train)
    assert right_here[0].indices == split_with([0.8, 0.2], 42)(train)[0].indices  # the answer that used to pass
    state = torch.get_rng_state()
    assert "changes with the state of torch's global generator" in status(check, from_global, train)[1]
    assert torch.equal(state, torch.get_rng_state())  # the check leaves the learner's generator as it was

    def reseeds_global(ds):
        torch.manual_seed(42)
        return from_global(ds)

    assert "reseeds or draws from torch's global generator" in status(check, reseeds_global, train)[1]


def test_01_split_with_a_generator_made_outside(tiny_set: Path) -> None:
    """issue 51: a generator made once outside the function is used up by the first call; the hint says so, and does
    not blame torch's global generator."""
    train = ImageFileDataset(tiny_set, "train")
    outside = torch.Generator().manual_seed(42)

    def split_holdout(ds):
        idx = random_split(range(len(ds)), [0.8, 0.2], generator=outside)
        return Subset(ImageFileDataset(ds.root, "train"), idx[0].indices), Subset(
            ImageFileDataset(ds.root, "train"), idx[1].indices
        )

    message = status(nb01.seeded_split, split_holdout, train)[1]
    assert "lives on between calls (made once, outside the function)" in message, message
    assert "global generator: random_split drew from it" not in message


def class_counts(ds):
    """The notebook's solution."""
    return {name: int((ds.targets == label).sum()) for label, name in enumerate(ds.classes)}


def test_01_counts(tiny_set: Path) -> None:
    val = ImageFileDataset(tiny_set, "val")
    check = nb01.class_counts
    assert status(check, class_counts, val)[0] is Status.SOLVED
    assert status(check, lambda ds: dict(zip(ds.classes, np.bincount(ds.targets).tolist())), val)[0] is Status.SOLVED
    assert status(check, ..., val)[0] is Status.NOT_ATTEMPTED
    by_decoding = lambda ds: {c: sum(ds[i][1] == k for i in range(len(ds))) for k, c in enumerate(ds.classes)}
    assert "indexed the dataset" in status(check, by_decoding, val)[1]
    assert "class names as keys" in status(check, lambda ds: {i: 2 for i in range(10)}, val)[1]
    assert "the count for 'star' is 3" in status(check, lambda ds: dict(class_counts(ds), star=3), val)[1]
    assert "should return a dict" in status(check, lambda ds: [2] * 10, val)[1]
    assert "a function of a dataset" in status(check, class_counts(val), val)[1]
    assert "not those of `val`" in status(check, lambda ds: class_counts(val), val)[1]


# ----------------------------------------------------------------- 01.2: labels from a CSV file, images read lazily


class AnnotatedImages(Dataset):
    """The notebook's solution."""

    def __init__(self, root, annotations):
        self.root = Path(root)
        with open(annotations, newline="") as f:
            rows = list(csv.DictReader(f))
        self.files = [row["file"] for row in rows]
        self.classes = sorted({row["label"] for row in rows})
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = [self.class_to_idx[row["label"]] for row in rows]
        missing = [name for name in self.files if not (self.root / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} files listed in {annotations} are not in {root}, e.g. {missing[0]}"
            )

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.root / self.files[i]) as img:
            return img.convert("RGB"), self.targets[i]


class NoMissingCheck(AnnotatedImages):
    def __init__(self, root, annotations):
        with open(annotations, newline="") as f:
            rows = list(csv.DictReader(f))
        self.root, self.files = Path(root), [row["file"] for row in rows]
        self.classes = sorted({row["label"] for row in rows})
        self.targets = [self.classes.index(row["label"]) for row in rows]


class VagueMissingCheck(AnnotatedImages):
    def __init__(self, root, annotations):
        try:
            super().__init__(root, annotations)
        except FileNotFoundError:
            raise FileNotFoundError("some files are missing") from None


class HeaderAsSample(NoMissingCheck):
    def __init__(self, root, annotations):
        super().__init__(root, annotations)
        self.files.insert(0, "file")
        self.targets.insert(0, 0)


class RowOrderClasses(NoMissingCheck):
    def __init__(self, root, annotations):
        super().__init__(root, annotations)
        with open(annotations, newline="") as f:
            labels = [row["label"] for row in csv.DictReader(f)]
        self.classes = list(dict.fromkeys(labels))
        self.targets = [self.classes.index(label) for label in labels]


class NameTargets(AnnotatedImages):
    def __getitem__(self, i):
        img, t = super().__getitem__(i)
        return img, self.classes[t]


class Eager(AnnotatedImages):
    def __init__(self, root, annotations):
        super().__init__(root, annotations)
        self.images = [super(Eager, self).__getitem__(i)[0] for i in range(len(self))]

    def __getitem__(self, i):
        return self.images[i], self.targets[i]


class NoConvert(AnnotatedImages):
    def __getitem__(self, i):
        img = Image.open(self.root / self.files[i])
        img.load()
        return img, self.targets[i]


class RelativeToCwd(AnnotatedImages):
    def __getitem__(self, i):
        return Image.new("RGB", (4, 3)), self.targets[i]  # the file read from the wrong folder: any other image


class TensorTargets(AnnotatedImages):
    """A valid answer: the targets kept as a tensor, each item's label a 0-d tensor."""

    def __init__(self, root, annotations):
        super().__init__(root, annotations)
        self.targets = torch.tensor(self.targets)


class FloatTensorTargets(AnnotatedImages):
    def __init__(self, root, annotations):
        super().__init__(root, annotations)
        self.targets = torch.tensor(self.targets, dtype=torch.float32)


class StubInit(AnnotatedImages):
    def __init__(self, root, annotations):
        raise NotImplementedError


def test_01_annotated_images() -> None:
    check = nb01.annotated_images
    assert status(check, AnnotatedImages)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, StubInit)[0] is Status.NOT_ATTEMPTED
    assert "check in __init__ that every listed file exists" in status(check, NoMissingCheck)[1]
    assert "but say which" in status(check, VagueMissingCheck)[1]
    assert "counts the header line" in status(check, HeaderAsSample)[1]
    assert "sort it, as ImageFolder does" in status(check, RowOrderClasses)[1]
    assert "should be the class number 2 (dog), got 'dog'" in status(check, NameTargets)[1]
    assert "as it was when the dataset was built" in status(check, Eager)[1]
    assert "is a 'L' image" in status(check, NoConvert)[1]
    assert "is not the image of row 0" in status(check, RelativeToCwd)[1]
    assert status(check, TensorTargets)[0] is Status.SOLVED
    assert "one class number per row" in status(check, FloatTensorTargets)[1]


# ----------------------------------------------------------------- 01.3: one big binary file, a handle per worker


class PackedImages(Dataset):
    """The notebook's solution."""

    def __init__(self, path, labels, shape):
        self.path = path
        self.labels = labels
        self.shape = tuple(shape)
        self.record_bytes = int(np.prod(shape))
        self.file, self.pid = None, None
        if os.path.getsize(path) != len(labels) * self.record_bytes:
            raise ValueError(
                f"{path} holds {os.path.getsize(path)} bytes, not {len(labels)} records of {self.record_bytes}"
            )

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} is out of range for {len(self)} records")
        if self.file is None or self.pid != os.getpid():
            self.file, self.pid = open(self.path, "rb"), os.getpid()
        self.file.seek(i * self.record_bytes)
        pixels = np.frombuffer(self.file.read(self.record_bytes), dtype=np.uint8).reshape(self.shape)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), int(self.labels[i])


class NoSizeCheck(PackedImages):
    def __init__(self, path, labels, shape):
        self.path, self.labels, self.shape = path, labels, tuple(shape)
        self.record_bytes, self.file, self.pid = int(np.prod(shape)), None, None


class OpenedInInit(PackedImages):
    def __init__(self, path, labels, shape):
        super().__init__(path, labels, shape)
        self.file, self.pid = open(path, "rb"), os.getpid()


class OpenPerSample(PackedImages):
    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        with open(self.path, "rb") as f:
            f.seek(i * self.record_bytes)
            pixels = np.frombuffer(f.read(self.record_bytes), dtype=np.uint8).reshape(self.shape)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), int(self.labels[i])


class LeakPerSample(PackedImages):
    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        fd = os.open(self.path, os.O_RDONLY)  # never closed
        pixels = np.frombuffer(os.pread(fd, self.record_bytes, i * self.record_bytes), dtype=np.uint8)
        return torch.from_numpy(pixels.reshape(self.shape).copy()).permute(2, 0, 1), int(self.labels[i])


class NoPidCheck(PackedImages):
    def __getitem__(self, i):
        if self.file is not None:
            self.pid = os.getpid()  # "only when self.file is None": whoever opened it
        return super().__getitem__(i)


class NoSeek(PackedImages):
    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        with open(self.path, "rb") as f:
            pixels = np.frombuffer(f.read(self.record_bytes), dtype=np.uint8).reshape(self.shape)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), int(self.labels[i])


class ChannelsLast(PackedImages):
    def __getitem__(self, i):
        img, label = super().__getitem__(i)
        return img.permute(1, 2, 0), label


class NumpyOut(PackedImages):
    def __getitem__(self, i):
        img, label = super().__getitem__(i)
        return img.numpy(), label


class NoIndexError(PackedImages):
    def __getitem__(self, i):
        return super().__getitem__(min(i, len(self) - 1))


class WrongReshape(PackedImages):
    def __getitem__(self, i):
        img, label = super().__getitem__(i)
        return img.reshape(-1).reshape(img.shape[0], img.shape[1], img.shape[2]).flip(0), label


class StubGetitem(PackedImages):
    def __getitem__(self, i):
        raise NotImplementedError


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the per-worker part of the check reads /proc/self/fd")
def test_01_packed_images() -> None:
    check = nb01.packed_images
    assert status(check, PackedImages)[0] is Status.SOLVED
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, StubGetitem)[0] is Status.NOT_ATTEMPTED
    assert "check in __init__ that the file size" in status(check, NoSizeCheck)[1]
    assert "__init__ opened the file" in status(check, OpenedInInit)[1]
    assert "opens and closes the file again" in status(check, OpenPerSample)[1]
    assert "you open a new one for every sample" in status(check, LeakPerSample)[1]
    assert "kept using its handle" in status(check, NoPidCheck)[1]
    assert "holds the pixels of record 0: seek" in status(check, NoSeek)[1]
    assert "channels first" in status(check, ChannelsLast)[1]
    assert "should be a tensor, got ndarray" in status(check, NumpyOut)[1]
    assert "raise IndexError past the end" in status(check, NoIndexError)[1]
    assert "is not record 7 of the file" in status(check, WrongReshape)[1]
