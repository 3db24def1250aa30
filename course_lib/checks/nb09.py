"""Checks for notebook 09 (beyond WebDataset).

09.1 runs the learner's MDS loader on real MDS shards; 09.2 runs their batch-keeping code on a
real :class:`~course_lib.highrate.RingLoader` (whose slots are overwritten, so kept batches must
be copies); 09.3 compares their shared-memory arithmetic with what a RingLoader allocates.
"""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ._core import Hint, attempted, exercise, require, whole_number


@exercise("09.1", "MDS deals whole batches, so the StreamingDataset and the DataLoader agree on batch_size.")
def mds_loader(fn: Callable[[Any, int], Any], folder: Any, samples: int, batch_size: int = 16) -> None:
    """``fn(folder, batch_size)`` returns a DataLoader of ``(images, labels)`` over the MDS shards in ``folder``."""
    from torch.utils.data import DataLoader

    attempted(fn)
    loader = fn(folder, batch_size)
    attempted(loader)
    require(isinstance(loader, DataLoader), f"mds_loader returned a {type(loader).__name__}: return a torch DataLoader.")
    require(loader.num_workers >= 1, "the DataLoader has num_workers=0: give it worker processes (num_workers=2).")
    inner = getattr(loader.dataset, "inner", loader.dataset)
    ds_batch = getattr(inner, "batch_size", None)
    require(ds_batch is not None, "the StreamingDataset has no batch_size: MDS refuses to iterate without it. "
            "Pass batch_size to alternatives.mds_images(folder, batch_size).")
    require(loader.batch_size == batch_size, f"the DataLoader makes batches of {loader.batch_size}, not {batch_size}.")
    require(ds_batch == loader.batch_size, f"the StreamingDataset was told batch_size={ds_batch} but the DataLoader "
            f"makes batches of {loader.batch_size}: MDS plans which worker reads which samples in batches of the "
            "dataset's batch_size, so the loader's batches no longer follow its planned order (and resuming "
            "mid-epoch points at the wrong samples). Use the same number for both.")
    gc.collect()
    labels: list[int] = []
    for images, ys in loader:
        require(isinstance(images, torch.Tensor) and images.dim() == 4, "each batch should be (images [B, 3, H, W], labels).")
        labels += [int(y) for y in ys]
    require(len(labels) == samples, f"{len(labels)} samples came out of {samples} in the shards.")


@exercise("09.2", "a reused buffer is overwritten by the next batch: keep a copy (.clone()), not the view.")
def first_batches(fn: Callable[[Any, int], Any]) -> None:
    """``fn(loader, n)`` returns a list of the first ``n`` batches of ``loader``, kept intact."""
    from ..highrate import RingLoader, write_raw_tensors

    attempted(fn)
    with tempfile.TemporaryDirectory(prefix="check09-") as tmp:
        raw = write_raw_tensors(Path(tmp) / "raw.f32", 24, sample_bytes=4096, seed=9)
        truth = torch.from_numpy(np.fromfile(raw.path, dtype=np.float32).reshape(24, -1))
        with RingLoader(raw, batch_size=4, num_workers=1, slots=2) as ring:
            got = fn(ring, 4)
            attempted(got)
            require(isinstance(got, (list, tuple)), f"first_batches should return a list of batches, got {type(got).__name__}.")
            require(len(got) == 4, f"asked for 4 batches, got {len(got)}.")
            same = {b.data_ptr() for b in got if isinstance(b, torch.Tensor)}
            if len(same) < 4:
                raise Hint(f"the 4 batches kept share {len(same)} buffer(s): they are the loader's slots, which the next "
                           "batches overwrite. Keep batch.clone().")
            for i, batch in enumerate(got):
                require(isinstance(batch, torch.Tensor) and batch.shape == (4, truth.shape[1]),
                        f"batch {i} should be a [4, {truth.shape[1]}] tensor.")
                require(torch.equal(batch, truth[4 * i: 4 * i + 4]), f"batch {i} does not hold samples {4 * i}-{4 * i + 3}.")
            again = [b.clone() for b in ring]  # the loader still works: a stopped loop left no slot behind
            require(torch.equal(torch.cat(again), truth), "after your function the loader no longer yields the whole file.")


RING_CASES = [(64, 1 << 20, 2, None), (32, 1 << 20, 4, None), (16, 4096, 1, 3), (8, 2 << 20, 2, 2)]


@exercise("09.3", "slots × batch_size × sample bytes, allocated once: (2 × workers + 1) slots unless given.")
def ring_bytes(fn: Callable[[int, int, int, Any], Any]) -> None:
    """``fn(batch_size, sample_bytes, num_workers, slots)``: bytes of shared memory a RingLoader allocates."""
    attempted(fn)
    for batch, sample, workers, slots in RING_CASES:
        call = f"ring_bytes({batch}, {sample}, {workers}, slots={slots})"
        got = whole_number(fn(batch, sample, workers, slots), call, "a number of bytes is whole.")
        n_slots = slots or 2 * workers + 1
        truth = n_slots * batch * sample
        if got == truth:
            continue
        if slots is None and got == 2 * workers * batch * sample:
            raise Hint(f"{call} = {got}: 2 slots per worker, but one more is held by the training loop "
                       "(the batch it is working on).")
        if got == batch * sample:
            raise Hint(f"{call} = {got}: that is one batch; the ring holds {n_slots} of them at once.")
        if slots is not None and got == (2 * workers + 1) * batch * sample:
            raise Hint(f"{call} = {got}: slots={slots} was given, so the ring has {slots} slots.")
        raise Hint(f"{call} = {got}, but the ring holds {n_slots} slots of {batch} × {sample} bytes = {truth}.")
