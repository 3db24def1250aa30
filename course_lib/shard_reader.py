"""Notebook 09, section 7: read tar shards on every rank of a job, ``torchrun --nproc-per-node=N -m course_lib.shard_reader``.

Each rank reads the shards split by node and by worker, records which keys each worker saw, and meets the
other ranks in an ``all_reduce`` after every batch, as DDP would; ``--resampled --epoch-batches N`` and
``--no-nodesplitter`` reproduce notebook 09's other cases. Here is each rank's loader; the command's arguments
and its loop are in :mod:`course_tools.rank_scripts`.
"""

from __future__ import annotations

import argparse

from .iterable import worker_slot

__all__ = ["build_loader"]


def _tag_worker(sample: tuple) -> tuple:
    """Append the id of the DataLoader worker that read ``sample`` (-1: the main process)."""
    return (*sample, worker_slot(main=-1)[0])


def build_loader(args: argparse.Namespace):
    """Notebook 09, section 7: this rank's WebLoader of ``(keys, labels, shard urls, worker ids)`` batches."""
    import webdataset as wds

    options = dict(workersplitter=wds.split_by_worker, seed=args.seed)
    if not args.no_nodesplitter:
        options["nodesplitter"] = wds.split_by_node
    if args.resampled:  # WebDataset(resampled=True) ignores seed= (webdataset 1.0.2): a seeded source instead, whose
        # draws depend on (rank, worker, epoch, seed) only: reproducible, and different on every rank and worker
        source = wds.ResampledShards(args.urls, seed=args.seed, deterministic=True)
        dataset = wds.DataPipeline(source, wds.tarfile_to_samples(), wds.to_tuple("__key__", "cls", "__url__"))
    else:  # keys and labels only: nothing to decode, this run is about who reads what
        dataset = wds.WebDataset(args.urls, shardshuffle=args.shardshuffle or False, **options)
        dataset = dataset.to_tuple("__key__", "cls", "__url__")
    dataset = dataset.compose(wds.map(_tag_worker), wds.batched(args.batch_size))
    loader = wds.WebLoader(dataset, num_workers=args.workers, batch_size=None)
    if args.epoch_batches:
        # on the loader, with_epoch counts this rank's batches (on the dataset it would count per worker)
        loader = loader.with_epoch(args.epoch_batches)
    return loader


if __name__ == "__main__":  # the command line and the loop: course_tools.rank_scripts
    from course_tools.rank_scripts import shard_reader_main

    raise SystemExit(shard_reader_main())
