"""course_lib.loaders.pad_collate: padding variable-length samples."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from course_lib.datasets import RandomSequences
from course_lib.loaders import pad_collate

pytestmark = pytest.mark.quick


def test_pads_to_the_longest_and_keeps_lengths_and_labels() -> None:
    batch = [(torch.tensor([1, 2, 3]), 0), (torch.tensor([4]), 1), (torch.tensor([5, 6]), 1)]
    padded, lengths, labels = pad_collate(batch)
    assert padded.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert lengths.tolist() == [3, 1, 2] and labels.tolist() == [0, 1, 1]
    padded, _, _ = pad_collate(batch, padding_value=-1)
    assert padded[1].tolist() == [4, -1, -1]


def test_as_a_dataloader_collate_fn() -> None:
    ds = RandomSequences(n=30, seed=0)
    for padded, lengths, labels in DataLoader(ds, batch_size=8, collate_fn=pad_collate):
        assert padded.shape == (len(labels), int(lengths.max()))
        for row, n in zip(padded, lengths):
            assert bool((row[n:] == 0).all()) and bool((row[:n] > 0).all())


def test_bad_batches() -> None:
    with pytest.raises(ValueError, match="empty batch"):
        pad_collate([])
    with pytest.raises(TypeError, match=r"\(sequence_tensor, label\)"):
        pad_collate([torch.tensor([1, 2])])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="pads 1-D sequences"):
        pad_collate([(torch.zeros(2, 2), 0)])
