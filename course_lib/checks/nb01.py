"""Checks for notebook 01 (map-style datasets)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import multiprocessing as mp
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset, random_split

from ._core import Hint, attempted, drain, exercise, require


@exercise("01.1", "Squares follows the Dataset protocol: length, items, and IndexError past the end.")
def squares_dataset(squares_cls: Any) -> None:
    """``Squares(n)[i] == (i, i**2)``, ``len == n``, ``IndexError`` out of range."""
    attempted(squares_cls)
    require(isinstance(squares_cls, type), "pass the class itself, `Squares`, not an instance such as `Squares(5)`.")
    ds = squares_cls(5)
    require(hasattr(ds, "__len__") and hasattr(ds, "__getitem__"), "Squares needs both __len__ and __getitem__.")
    n = len(ds)
    require(n == 5, f"len(Squares(5)) should be 5, got {n}: __len__ must return the n given to __init__.")
    item = ds[3]
    require(
        isinstance(item, tuple) and len(item) == 2,
        f"Squares(5)[3] should be the tuple (3, 9), got {item!r}: return i, i ** 2.",
    )
    require(
        int(item[0]) == 3 and int(item[1]) == 9,
        f"Squares(5)[3] should be (3, 9), got {item!r}: return (index, index ** 2).",
    )
    require(len(squares_cls(12)) == 12, "len() must follow the n given to __init__, not a fixed number.")
    for past in (5, -6):
        try:
            ds[past]
        except IndexError:
            pass
        except NotImplementedError:
            raise
        except Exception as exc:
            raise Hint(
                f"Squares(5)[{past}] raised {type(exc).__name__}; raise IndexError instead so that loops know "
                "where the data ends."
            ) from None
        else:
            raise Hint(f"Squares(5)[{past}] returned a value; an index outside -5..4 must raise IndexError.")
    try:
        last = ds[-1]
    except IndexError:
        raise Hint(
            "Squares(5)[-1] raised IndexError: a negative index counts from the end, as in a list "
            "(add n to it), so Squares(5)[-1] is (4, 16)."
        ) from None
    require(
        isinstance(last, tuple) and [int(v) for v in last] == [4, 16],
        f"Squares(5)[-1] should be the last item, (4, 16), got {last!r}: add n to a negative index first.",
    )
    items = list(itertools.islice(iter(ds), 20))  # bounded, in case iteration never ends
    require(len(items) == 5, f"`for x in Squares(5)` should yield 5 items, it yielded {len(items)}.")


# ----------------------------------------------------------------- 01.2: labels from an annotation file

_ANNOTATIONS = [
    ("pics/p0.png", "dog"),
    ("pics/p1.png", "cat"),
    ("pics/sub/p2.png", "dog"),
    ("pics/p3.png", "bird"),
    ("pics/p4.png", "cat"),
    ("pics/p5.png", "dog"),
]


def _colour(k: int, version: int) -> tuple[int, int, int]:
    return (40 * k + 10, 200 - 30 * k, 90 + 100 * version)


def _write_pictures(root: Path, version: int) -> None:
    """Six tiny solid-colour images; image 2 is greyscale (a file that is not RGB)."""
    for k, (rel, _) in enumerate(_ANNOTATIONS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img = Image.new("RGB", (4, 3), _colour(k, version))
        (img.convert("L") if k == 2 else img).save(root / rel)


def _refuses(build: Any, name: str, hint: str) -> None:
    """``build()`` must raise ValueError or OSError (FileNotFoundError is one) whose message contains ``name``."""
    try:
        build()
    except NotImplementedError:
        raise
    except (ValueError, OSError) as exc:
        require(name in str(exc), f"good, __init__ refused bad input, but say which: {hint}")
    else:
        raise Hint(hint)


def _class_number(value: Any) -> int | None:
    """``value`` as an int if it is one class number (a Python or NumPy int, or a one-element integer tensor)."""
    if (
        isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not value.is_floating_point()
        and value.dtype != torch.bool
    ):
        return int(value.item())
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return None


def _pixel(img: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(img)[0, 0])


@exercise("01.2", "AnnotatedImages reads its labels from the CSV file and opens each image only when asked for it.")
def annotated_images(dataset_cls: Any) -> None:
    """``dataset_cls(root, csv_path)``: ``classes`` sorted, ``targets`` ints, items ``(RGB PIL image, int)``, lazy."""
    attempted(dataset_cls)
    require(isinstance(dataset_cls, type), "pass the class itself, `AnnotatedImages`, not an instance.")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write_pictures(root, version=0)
        csv_path = root / "labels.csv"
        csv_path.write_text("file,label\n" + "".join(f"{rel},{label}\n" for rel, label in _ANNOTATIONS))
        ds = dataset_cls(root, csv_path)
        _write_pictures(root, version=1)  # new pixels after __init__: a lazy dataset shows them
        n = len(ds)
        require(
            n != len(_ANNOTATIONS) + 1,
            "len() counts the header line `file,label` as a sample: skip it "
            "(csv.DictReader does, and gives each row as a dict).",
        )
        require(
            n == len(_ANNOTATIONS), f"a CSV file with {len(_ANNOTATIONS)} rows gave len() == {n}: one sample per row."
        )
        classes = list(getattr(ds, "classes", None) or [])
        require(
            sorted(classes) == ["bird", "cat", "dog"],
            f"ds.classes should list each label name once, got {classes or 'nothing'}: e.g. sorted(set(labels)).",
        )
        require(
            classes == ["bird", "cat", "dog"],
            f"ds.classes is {classes}: sort it, as ImageFolder does, so that "
            "class numbers do not depend on the order of the rows.",
        )
        want = [classes.index(label) for _, label in _ANNOTATIONS]
        raw_targets = getattr(ds, "targets", [])
        targets = [_class_number(t) for t in raw_targets]  # a list, a NumPy array or a tensor of ints
        require(
            len(targets) == n and None not in targets,
            f"ds.targets should hold one class number per row, got {list(raw_targets)[:6]!r}: use "
            "classes.index(label) or a class_to_idx dict.",
        )
        require(targets == want, f"ds.targets is {targets}, expected {want}.")
        for k, (rel, _) in enumerate(_ANNOTATIONS):
            item = ds[k]
            require(
                isinstance(item, tuple) and len(item) == 2,
                f"ds[{k}] should be a pair (image, label), got {type(item).__name__}.",
            )
            img, label = item
            require(
                isinstance(img, Image.Image),
                f"ds[{k}][0] should be a PIL image (Image.open), got {type(img).__name__}.",
            )
            require(
                img.mode == "RGB",
                f"ds[{k}] is a {img.mode!r} image ({rel} is greyscale on disk): "
                "return Image.open(path).convert('RGB') so that every sample has 3 channels.",
            )
            require(
                _class_number(label) == want[k],
                f"ds[{k}][1] should be the class number {want[k]} ({_ANNOTATIONS[k][1]}), got {label!r}.",
            )
            on_disk = [
                _pixel(Image.new("RGB", (1, 1), _colour(k, v)).convert("L" if k == 2 else "RGB").convert("RGB"))
                for v in (0, 1)
            ]
            require(
                _pixel(img) != on_disk[0],
                f"ds[{k}] shows the image as it was when the dataset was built: __init__ "
                "decoded (or kept) the images. Store only the file names there, and open the file in __getitem__.",
            )
            require(
                _pixel(img) == on_disk[1],
                f"ds[{k}] is not the image of row {k} ({rel}): open root / the file column of that row.",
            )
        try:
            ds[n]
        except IndexError:
            pass
        else:
            raise Hint(f"ds[{n}] returned a sample: an index past the end must raise IndexError.")
        (root / "broken.csv").write_text(csv_path.read_text() + "pics/gone.png,cat\n")
        _refuses(
            lambda: dataset_cls(root, root / "broken.csv"),
            "pics/gone.png",
            "a row names pics/gone.png, which "
            "is not there: check in __init__ that every listed file exists (Path.is_file, no decoding) and raise "
            "FileNotFoundError naming it, so the error comes at once and not in the middle of an epoch.",
        )


# ----------------------------------------------------------------- 01.3: one big file, one handle per worker


def _fds_to(path: str) -> frozenset[int] | None:
    """The file descriptors this process has open on ``path`` (None where /proc is missing)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    found = set()
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == path:
                found.add(int(name))
    return frozenset(found)


class _Probe(Dataset):
    """Item ``i`` of a dataset, with the handles on its file that the reading process holds afterwards."""

    def __init__(self, inner: Any, path: str) -> None:
        self.inner, self.path = inner, path

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[int, Any, frozenset[int] | None, int]:
        return i, self.inner[i], _fds_to(self.path), os.getpid()


def _records(n: int, shape: tuple[int, int, int]) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def _check_packed_item(k: int, item: Any, records: np.ndarray, labels: np.ndarray) -> None:
    require(
        isinstance(item, tuple) and len(item) == 2,
        f"ds[{k}] should be a pair (image, label), got {type(item).__name__}.",
    )
    img, label = item
    require(
        isinstance(img, torch.Tensor),
        f"ds[{k}][0] should be a tensor, got {type(img).__name__}: torch.from_numpy(...).",
    )
    h, w, c = records.shape[1:]
    require(
        tuple(img.shape) != (h, w, c),
        f"ds[{k}][0] has shape {tuple(img.shape)}, height × width × channels as stored: "
        "PyTorch wants channels first, .permute(2, 0, 1).",
    )
    require(tuple(img.shape) == (c, h, w), f"ds[{k}][0] should have shape {(c, h, w)}, got {tuple(img.shape)}.")
    require(
        img.dtype == torch.uint8,
        f"ds[{k}][0] is {img.dtype}: keep the bytes as torch.uint8 (a transform scales them later).",
    )
    truth = torch.from_numpy(records[k]).permute(2, 0, 1)
    if not torch.equal(img, truth):
        matches = [j for j in range(len(records)) if torch.equal(img, torch.from_numpy(records[j]).permute(2, 0, 1))]
        raise Hint(
            f"ds[{k}] holds the pixels of record {matches[0]}: seek to index × bytes per record before reading."
            if matches
            else f"ds[{k}] is not record {k} of the file: read height × width × channels bytes at "
            "offset index × that size, and reshape them to (height, width, channels)."
        )
    require(
        isinstance(label, (int, np.integer)) and int(label) == int(labels[k]),
        f"ds[{k}][1] should be the label {int(labels[k])}, got {label!r}.",
    )


@exercise("01.3", "PackedImages reads any record of the big file, and each worker opens it once, on first use.")
def packed_images(dataset_cls: Any) -> None:
    """``dataset_cls(path, labels, shape)``: record ``i`` as a ``[C, H, W]`` uint8 tensor; one handle per process."""
    attempted(dataset_cls)
    require(isinstance(dataset_cls, type), "pass the class itself, `PackedImages`, not an instance.")
    shape = (5, 4, 3)
    records = _records(12, shape)
    labels = np.arange(12) % 3
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.realpath(os.path.join(tmp, "records.u8"))
        records.tofile(path)
        ds = dataset_cls(path, labels, shape)
        require(
            not _fds_to(path),
            "__init__ opened the file. Workers cannot share that handle (spawn cannot pickle it; after "
            "fork all workers move one shared read position): set self.file = None and open it in __getitem__.",
        )
        try:
            pickle.dumps(ds)
        except Exception as exc:
            raise Hint(
                f"the dataset cannot be pickled ({exc}), so spawn workers could not receive it: keep only the "
                "path, labels and shape in __init__, and open the file in __getitem__."
            ) from None
        require(len(ds) == 12, f"len() should be 12 (one per label), got {len(ds)}.")
        for k in (7, 0, 11, 3, 7):
            _check_packed_item(k, ds[k], records, labels)
        try:
            ds[12]
        except IndexError:
            pass
        else:
            raise Hint("ds[12] returned a value for a file of 12 records: raise IndexError past the end.")
        _refuses(
            lambda: dataset_cls(path, np.arange(13) % 3, shape),
            "",
            "13 labels for a file of 12 records: "
            "check in __init__ that the file size is len(labels) × bytes per record (os.path.getsize), and raise "
            "ValueError saying both, so a truncated file is found at once.",
        )
        if _fds_to(path) is None or "fork" not in mp.get_all_start_methods():
            return  # no /proc/self/fd here: the per-worker part needs Linux
        counts = _handles_in_workers(dataset_cls(path, labels, shape), path, records, labels)
        require(
            counts != {0},
            "each read opens and closes the file again: open it once per worker, keep the handle "
            "in self.file, and reuse it (opening per sample costs a system call or more, each time).",
        )
        require(
            counts == {1},
            f"a worker held {max(counts)} handles on the file: you open a new one for every sample "
            "and never close it. Open it only when self.file is None.",
        )
        used = dataset_cls(path, labels, shape)
        _check_packed_item(0, used[0], records, labels)  # the main process reads first, then the workers start
        require(
            _handles_in_workers(used, path, records, labels) == {1},
            "after the main process read a sample, the "
            "workers kept using its handle: fork copies it, and all processes then move one shared read position. "
            "Remember which process opened the file (os.getpid()) and open it again in any other process.",
        )


def _as_is(sample: Any) -> Any:
    return sample  # no collation: the worker's sample exactly as the dataset returned it


def _handles_in_workers(ds: Any, path: str, records: np.ndarray, labels: np.ndarray) -> set[int]:
    """Read every item in 2 forked workers; how many handles of their own on ``path`` they held after each read
    (not counting those inherited from this process)."""
    inherited = _fds_to(path) or frozenset()
    loader = DataLoader(
        _Probe(ds, path), batch_size=None, collate_fn=_as_is, num_workers=2, multiprocessing_context="fork"
    )
    counts = set()
    for k, item, fds, _ in drain(loader):
        _check_packed_item(k, item, records, labels)
        counts.add(len(fds - inherited))
    return counts


def _split_under(fn: Any, dataset: Any, global_seed: int) -> tuple[Any, bool]:
    """``fn(dataset)`` called with torch's global generator seeded with ``global_seed``; whether the call used or
    reseeded that generator. The learner's global generator is left as it was."""
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        parts = fn(dataset)
        touched = not torch.equal(before, torch.get_rng_state())
    finally:
        torch.set_rng_state(saved)
    return parts, touched


@exercise(
    "01.4", "a reproducible 80/20 split over two dataset objects: 640 + 160 disjoint samples, the same on every run."
)
def seeded_split(fn: Any, dataset: Any) -> None:
    """``fn(dataset)`` returns the seed-42 ``random_split`` of its indices as ``Subset``s of two dataset objects over
    its files, whatever state torch's global generator is in (the check calls it under two global seeds)."""
    attempted(fn)
    require(callable(fn), f"pass the function itself, `split_holdout`, not what it returns ({type(fn).__name__}).")
    parts, touched = _split_under(fn, dataset, global_seed=0)
    require(
        isinstance(parts, (tuple, list)) and len(parts) == 2,
        f"split_holdout(ds) should return two Subsets, (train_part, holdout), got {type(parts).__name__}.",
    )
    train_part, holdout = parts
    for name, part in (("train_part", train_part), ("holdout", holdout)):
        require(
            isinstance(part, Subset),
            f"{name} should be a Subset (what random_split returns), got {type(part).__name__}.",
        )
        same_files = list(getattr(part.dataset, "paths", [])) == list(dataset.paths)
        require(same_files, f'{name} should be a Subset of a dataset over the same files as `train`: shapes("train").')
    require(
        train_part.dataset is not holdout.dataset,
        "both parts are views of one dataset object, and one object has "
        "one transform: augmenting training (notebook 02) would augment the hold-out too. Make two objects, "
        'shapes("train") twice, and give each its Subset of the indices.',
    )
    n = len(dataset)
    require(
        (len(train_part), len(holdout)) == (int(0.8 * n), n - int(0.8 * n)),
        f"expected {int(0.8 * n)} + {n - int(0.8 * n)} samples, got {len(train_part)} + {len(holdout)}: use the fractions [0.8, 0.2].",
    )
    a, b = set(train_part.indices), set(holdout.indices)
    require(not a & b, f"{len(a & b)} samples are in both parts: each sample must land in exactly one.")
    repeat, _ = _split_under(fn, dataset, global_seed=0)
    require(
        list(repeat[0].indices) == list(train_part.indices),
        "two calls of split_holdout gave two different splits, with torch's global generator in the same state "
        "both times: the generator random_split draws from lives on between calls (made once, outside the "
        "function), and each call goes on from where the last one stopped. Make it inside the function, "
        "generator=torch.Generator().manual_seed(42), so that every call starts from seed 42.",
    )
    again, _ = _split_under(fn, dataset, global_seed=1)
    require(
        list(again[0].indices) == list(train_part.indices),
        "the split changes with the state of torch's global "
        "generator: random_split drew from it (a torch.manual_seed(42) in another cell does not fix that: any random "
        "draw in between, a model or an augmentation, changes the split). Give random_split a generator of its own: "
        "generator=torch.Generator().manual_seed(42).",
    )
    require(
        not touched,
        "the split is reproducible, but split_holdout reseeds or draws from torch's global generator "
        "(torch.manual_seed), which changes every later random draw of the notebook: give random_split a generator "
        "of its own, generator=torch.Generator().manual_seed(42), and leave the global one alone.",
    )
    expected = random_split(range(n), [0.8, 0.2], generator=torch.Generator().manual_seed(42))
    require(
        list(train_part.indices) == list(expected[0].indices),
        "the split is not the one seed 42 gives: pass generator=torch.Generator().manual_seed(42) to random_split.",
    )


def _no_decoding(dataset: Any) -> Any:
    """A copy of ``dataset`` whose items cannot be read: a function given it may use its labels only."""

    def refuse(self: Any, index: Any) -> Any:
        raise Hint(
            "class_counts indexed the dataset, and every ds[i] opens and decodes an image: count the labels "
            "in ds.targets instead (np.bincount, or == per class)."
        )

    probe = copy.copy(dataset)
    probe.__class__ = type("NoDecoding", (type(dataset),), {"__getitem__": refuse, "load_image": refuse})
    return probe


@exercise("01.5", "the counts match, read from .targets: no image was decoded.")
def class_counts(fn: Any, dataset: Any) -> None:
    """``fn(ds)`` maps each class name of ``ds`` to its number of samples, without indexing ``ds``."""
    attempted(fn)
    require(
        callable(fn),
        f"class_counts should be a function of a dataset, got {type(fn).__name__}: def class_counts(ds): ...",
    )
    counts = fn(_no_decoding(dataset))
    require(
        isinstance(counts, dict),
        f"class_counts(val) should return a dict {{class name: count}}, got {type(counts).__name__}.",
    )
    truth = {c: int(k) for c, k in zip(dataset.classes, np.bincount(dataset.targets, minlength=len(dataset.classes)))}
    keys = {str(k) for k in counts}
    if keys != set(truth):
        if all(isinstance(k, (int, np.integer)) for k in counts):
            raise Hint("use the class names as keys (ds.classes[label]), not the integer labels.")
        raise Hint(f"the keys should be the class names {sorted(truth)}, got {sorted(keys)}.")
    wrong = [c for c in truth if int(counts[c]) != truth[c]]
    if wrong:
        raise Hint(f"the count for {wrong[0]!r} is {counts[wrong[0]]}, but the dataset has {truth[wrong[0]]}.")
    part = copy.copy(dataset)
    part.targets = dataset.targets[: len(dataset.targets) // 2]
    half = fn(_no_decoding(part))
    require(
        {str(k): int(v) for k, v in half.items() if int(v)}
        == {
            c: int(k)
            for c, k in zip(dataset.classes, np.bincount(part.targets, minlength=len(dataset.classes)))
            if int(k)
        },
        "class_counts gives the same counts for another dataset: count the labels of the dataset it is given (ds), "
        "not those of `val`.",
    )


__all__ = ["squares_dataset", "annotated_images", "packed_images", "seeded_split", "class_counts"]
