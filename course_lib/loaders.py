"""Notebook 03: batching helpers; ``pad_collate`` batches variable-length samples (the default collate needs equal shapes)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = ["pad_collate"]


def pad_collate(
    batch: Sequence[tuple[torch.Tensor, int]], padding_value: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Notebook 03, section 4: collate ``(sequence, label)`` samples of different lengths into padded tensors.

    Returns ``(padded, lengths, labels)``: ``padded`` is ``[batch, longest]`` with
    ``padding_value`` after each sequence's end, ``lengths`` the true lengths (so a model can
    mask or pack the padding), ``labels`` a 1-D tensor.
    """
    if len(batch) == 0:
        raise ValueError("pad_collate got an empty batch")
    if not all(isinstance(sample, (tuple, list)) and len(sample) == 2 for sample in batch):
        raise TypeError("pad_collate expects samples of the form (sequence_tensor, label)")
    seqs, labels = zip(*batch)
    seqs = [torch.as_tensor(s) for s in seqs]
    if any(s.dim() != 1 for s in seqs):
        raise ValueError(
            "pad_collate pads 1-D sequences; got shapes " + ", ".join(str(tuple(s.shape)) for s in seqs[:3])
        )
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    padded = pad_sequence(seqs, batch_first=True, padding_value=padding_value)
    return padded, lengths, torch.as_tensor(labels)
