"""course_lib.datasets: the protocol, clear errors, and agreement with torchvision."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from course_lib import data
from course_lib.datasets import (
    DataNotFoundError,
    ImageFileDataset,
    InMemoryDataset,
    RandomSequences,
    check_index,
    shapes,
)
from course_lib.transforms import Add

pytestmark = pytest.mark.quick

to_tensor = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


# ----------------------------------------------------------------- check_index


def test_check_index_accepts_integer_types_and_negative_indices() -> None:
    assert check_index(3, 5) == 3
    assert check_index(np.int64(4), 5) == 4
    assert check_index(torch.tensor(2), 5) == 2
    assert check_index(-1, 5) == 4


@pytest.mark.parametrize("bad", [5, 99, -6])
def test_check_index_out_of_range_names_the_length(bad: int) -> None:
    with pytest.raises(IndexError, match=rf"index {bad} is out of range for a dataset of length 5 \(valid: 0..4\)"):
        check_index(bad, 5)


def test_check_index_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match="dataset indices must be integers, got float"):
        check_index(1.5, 5)
    with pytest.raises(TypeError, match="Subset or a DataLoader"):
        check_index([1, 2], 5)


# ----------------------------------------------------------------- InMemoryDataset


def test_in_memory_dataset_items_targets_and_transforms() -> None:
    ds = InMemoryDataset(torch.arange(6.0), [0, 1, 0, 1, 0, 1], transform=Add(10), target_transform=lambda y: y * 2)
    assert len(ds) == 6
    x, y = ds[2]
    assert float(x) == 12.0 and y == 0
    assert ds[-1][1] == 2
    plain = InMemoryDataset([5, 6, 7])
    assert plain[1] == 6 and list(plain) == [5, 6, 7]  # iteration stops at IndexError
    assert "InMemoryDataset(n=3, targets=False" in repr(plain)


def test_in_memory_dataset_errors() -> None:
    with pytest.raises(ValueError, match="data has 3 samples but targets has 2"):
        InMemoryDataset([1, 2, 3], [0, 1])
    with pytest.raises(IndexError, match="length 3"):
        InMemoryDataset([1, 2, 3])[3]


def test_in_memory_dataset_with_a_dataloader() -> None:
    ds = InMemoryDataset(torch.arange(10), torch.arange(10) % 2)
    batches = list(DataLoader(ds, batch_size=4))
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.arange(10))


# ----------------------------------------------------------------- ImageFileDataset


def test_image_file_dataset_matches_torchvision_imagefolder(tiny_set: Path) -> None:
    ours = ImageFileDataset(tiny_set, "train")
    theirs = ImageFolder(tiny_set / "train")
    assert ours.classes == theirs.classes == list(data.CLASSES)
    assert ours.targets.tolist() == theirs.targets
    assert len(ours) == len(theirs) == 80
    img, label = ours[17]
    ref_img, ref_label = theirs[17]
    assert label == ref_label and np.array_equal(np.asarray(img), np.asarray(ref_img))
    assert isinstance(img, Image.Image) and img.mode == "RGB"
    assert isinstance(ours.targets, np.ndarray) and isinstance(ours.paths, np.ndarray)


def test_image_file_dataset_transforms_and_errors(tiny_set: Path) -> None:
    ds = ImageFileDataset(tiny_set, "val", transform=to_tensor, target_transform=lambda y: -y)
    x, y = ds[5]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == -int(ds.targets[5])
    with pytest.raises(IndexError, match="length 20"):
        ds[20]
    assert "shapes-tiny-seed0/val, n=20, classes=10" in repr(ds)


def test_split_none_reads_class_folders_directly(tiny_set: Path) -> None:
    assert len(ImageFileDataset(tiny_set / "val", split=None)) == 20


def test_missing_folder_says_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"prepare_data\(\).*python -m course_lib prepare"):
        ImageFileDataset(tmp_path / "nothing-here")


def test_missing_split_lists_what_is_there(tiny_set: Path) -> None:
    with pytest.raises(DataNotFoundError, match="has no 'test' split; it holds: train, val"):
        ImageFileDataset(tiny_set, "test")


def test_empty_folder_is_explained(tmp_path: Path) -> None:
    (tmp_path / "train" / "cats").mkdir(parents=True)
    (tmp_path / "train" / "cats" / "notes.txt").write_text("no images")
    with pytest.raises(DataNotFoundError, match=r"no images \(.jpg.*prepare_data"):
        ImageFileDataset(tmp_path, "train")


def test_corrupted_image_names_the_file(tmp_path: Path, tiny_set: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_set, copy)
    (copy / "train" / "arrow" / "00003.jpg").write_bytes(b"\xff\xd8 truncated")
    ds = ImageFileDataset(copy, "train")
    with pytest.raises(data.DataError, match=r"cannot decode image 3 \(train/arrow/00003\.jpg\).*force=True"):
        ds[3]
    assert ds[4][1] == 0  # the other samples still load


def test_shapes_before_preparation_says_how(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"has not been generated yet.*prepare_data\(size='small', seed=0\)"):
        shapes(root=tmp_path)


def test_shapes_opens_a_prepared_set(tiny_root: Path) -> None:
    assert len(shapes("val", size="tiny", root=tiny_root)) == 20


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_under_each_start_method(tiny_set: Path, method: str) -> None:
    """The dataset pickles into workers (spawn) and workers return the same batches."""
    ds = ImageFileDataset(tiny_set, "val", transform=v2.Compose([to_tensor, Add(-0.5)]))
    pickle.loads(pickle.dumps(ds))
    single = list(DataLoader(ds, batch_size=8))
    multi = list(DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=method, timeout=60))
    assert len(single) == len(multi) == 3
    for (a, ya), (b, yb) in zip(single, multi):
        assert torch.equal(a, b) and torch.equal(ya, yb)


# ----------------------------------------------------------------- RandomSequences


def test_random_sequences_are_deterministic_and_in_range() -> None:
    ds = RandomSequences(n=50, min_len=3, max_len=9, vocab=20, seed=1)
    lengths = [len(ds[i][0]) for i in range(50)]
    assert min(lengths) >= 3 and max(lengths) <= 9 and len(set(lengths)) > 3
    tokens, label = ds[4]
    assert tokens.dtype == torch.int64 and int(tokens.min()) >= 1 and int(tokens.max()) < 20
    assert label == int(len(tokens) > 6)
    assert torch.equal(ds[4][0], RandomSequences(n=50, min_len=3, max_len=9, vocab=20, seed=1)[4][0])
    assert not torch.equal(ds[4][0], RandomSequences(n=50, min_len=3, max_len=9, vocab=20, seed=2)[4][0])
    with pytest.raises(IndexError):
        ds[50]
    with pytest.raises(ValueError, match="max_len must be a whole number >= 5, got 2"):
        RandomSequences(min_len=5, max_len=2)
    with pytest.raises(ValueError, match="vocab must be a whole number >= 2"):
        RandomSequences(vocab=1)
