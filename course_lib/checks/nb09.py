"""Checks for notebook 09 (streaming shards).

The loader check runs the learner's loader on real shards and looks at what comes out, then at
the stages of its pipeline, to say which one is missing or misplaced. The counting checks compare
with webdataset's own splitters and with what ``with_epoch`` does in webdataset 1.0.2.
"""

from __future__ import annotations

import gc
import itertools
from collections import Counter
from typing import Any, Callable

import numpy as np
import torch

from .. import data as _data
from ..shards import ShardSet, reader_shares
from ..storage import stage_or_stream as stage_or_stream_rule
from ._core import Hint, attempted, exercise, labelled_shards, require


def _stage_names(pipeline: Any) -> list[str]:
    """Readable names of a webdataset pipeline's stages, e.g. ['DataLoader', 'unbatched', 'shuffle']."""
    names = []
    for stage in getattr(pipeline, "pipeline", []):
        f = getattr(stage, "f", None)  # webdataset's curried filters keep the function in .f
        if f is not None:
            names.append(f.__name__.lstrip("_"))
        elif hasattr(stage, "__name__"):
            names.append(stage.__name__)
        else:
            names.append(type(stage).__name__)
    return names


def _as_list(x: Any) -> list:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return list(x)


@exercise("09.1", "batches made in the workers, then unbatched, shuffled across workers and rebatched on the loader.")
def make_loader(fn: Callable[[str, int], Any], shardset: ShardSet, batch_size: int = 16) -> None:
    """``fn(urls, batch_size)`` returns a ``wds.WebLoader`` yielding ``(images, labels)`` batches."""
    from torch.utils.data import DataLoader

    attempted(fn)
    loader = fn(shardset.urls, batch_size)
    attempted(loader)
    require(loader is not None, "make_loader returned None: end the function with `return loader`.")
    first = getattr(loader, "pipeline", [None])[0] if hasattr(loader, "pipeline") else None
    require(
        isinstance(first, DataLoader),
        f"make_loader returned a {type(loader).__name__}; return wds.WebLoader(dataset, num_workers=2, batch_size=None) "
        "followed by .unbatched().shuffle(...).batched(batch_size).",
    )
    require(first.num_workers >= 1, "the WebLoader has num_workers=0: give it worker processes (num_workers=2).")
    require(
        first.num_workers <= 2, f"num_workers={first.num_workers}: this course runs on 2 cores, use 2 workers at most."
    )
    require(
        first.batch_size is None,
        f"the WebLoader batches again (batch_size={first.batch_size}): the dataset already makes batches in the workers, "
        "so pass batch_size=None.",
    )
    inner = _stage_names(first.dataset)
    require(
        "batched" in inner,
        "the dataset does not batch in the workers, so every sample crosses to the main process on its own "
        "(section 5 measured that cost): end the dataset with .batched(...).",
    )
    outer = _stage_names(loader)[1:]
    require(
        "unbatched" in outer,
        "the loader never unbatches: the workers' batches arrive as they are, each from one worker's shards. "
        "Follow the WebLoader with .unbatched().shuffle(...).batched(batch_size).",
    )
    require(
        "shuffle" in outer[outer.index("unbatched") :],
        "nothing shuffles after .unbatched(): every batch still comes from one worker's shards. "
        "Put .shuffle(n) between .unbatched() and .batched(batch_size).",
    )
    require(
        "batched" in outer[outer.index("unbatched") :],
        "after .unbatched() the loader yields single samples: add .batched(batch_size) at the end.",
    )
    limit = shardset.samples // batch_size + 10
    gc.collect()  # earlier half-read loaders must not be copied into this loader's forked workers
    it = iter(loader)
    try:
        batches = list(itertools.islice(it, limit))
    finally:
        close = getattr(it, "close", None)  # stop the workers of a loader that is not exhausted
        if close is not None:
            close()
        del it
        gc.collect()
    require(
        len(batches) < limit,
        f"the loader yields more than {limit - 1} batches for {shardset.samples} samples: "
        "is it resampled, or repeated with with_epoch? Read each shard once here.",
    )
    labels: list[int] = []
    sizes = []
    for batch in batches:
        require(
            isinstance(batch, (tuple, list)) and len(batch) == 2,
            'each batch should be (images, labels): use .to_tuple("jpg", "cls") in the dataset.',
        )
        images, ys = batch
        require(
            isinstance(images, torch.Tensor)
            and images.dim() == 4
            and images.shape[1] == 3
            and images.is_floating_point(),
            f"the images of a batch should be a float tensor [batch, 3, H, W], got "
            f"{type(images).__name__}{list(images.shape) if isinstance(images, torch.Tensor) else ''}: "
            'decode with .decode("torchrgb").',
        )
        ys = _as_list(ys)
        require(len(ys) == images.shape[0], "a batch has different numbers of images and labels.")
        labels += [int(y) for y in ys]
        sizes.append(images.shape[0])
    total = sum(sizes)
    require(
        total != 2 * shardset.samples,
        f"{total} samples for {shardset.samples} in the shards: every sample came "
        "twice. Keep webdataset's split_by_worker (the default workersplitter).",
    )
    require(total == shardset.samples, f"{total} samples came out, but the shards hold {shardset.samples}.")
    short = [s for s in sizes[:-1] if s != batch_size]
    require(not short, f"{len(short)} batches before the last are not full ({short[:4]}): rebatch on the loader.")
    truth = Counter(_data.CLASSES.index(k.split("-")[0]) for k in shardset.all_keys())
    require(Counter(labels) == truth, 'the labels do not match the shards\' .cls members: is the tuple ("jpg", "cls")?')


def _min_shards(world: int, workers: int) -> int:
    """The fewest shards for which webdataset's own splitters leave no reader empty."""
    for n in itertools.count(1):
        shares = reader_shares([f"s-{i:06d}.tar" for i in range(n)], world, workers)
        if all(w for rank in shares for w in rank):
            return n
    raise AssertionError("unreachable")


SHARD_CASES = [(1, 0), (1, 1), (1, 4), (2, 0), (2, 2), (3, 4), (4, 1), (8, 6)]


@exercise("09.2", "ranks × workers: every DataLoader worker of every rank reads at least one shard.")
def shards_needed(fn: Callable[[int, int], Any]) -> None:
    """``fn(world_size, num_workers)`` is the fewest shards that leave no rank's worker without data."""
    attempted(fn)
    for world, workers in SHARD_CASES:
        call = f"shards_needed({world}, {workers})"
        got = fn(world, workers)
        require(
            isinstance(got, (int, np.integer)) and not isinstance(got, bool),
            f"{call} should return a whole number of shards, got {got!r}.",
        )
        truth = _min_shards(world, workers)
        if got == truth:
            continue
        if workers == 0 and got == 0:
            raise Hint(
                f"{call} = 0: with num_workers=0 the rank's main process reads the shards itself, so each rank "
                "still needs one."
            )
        if got == world and workers > 1:
            raise Hint(
                f"{call} = {got}: one shard per rank, but each rank's {workers} workers split its shards again "
                f"(split_by_worker): {workers - 1} of them would read nothing."
            )
        if got == max(1, workers) and world > 1:
            raise Hint(
                f"{call} = {got}: that covers one rank's workers; split_by_node first gives each of the {world} "
                "ranks its own shards."
            )
        if got == world + workers:
            raise Hint(
                f"{call} = {got}: the splits nest (every rank's shards are split again among its workers), so "
                "the numbers multiply."
            )
        if got > truth:
            raise Hint(f"{call} = {got}: more than needed; with {truth} shards every reader already gets one.")
        raise Hint(f"{call} = {got}, but with {got} shards some worker reads nothing; webdataset needs {truth}.")


EPOCH_CASES = [(n, b, w, on) for n in (12, 30) for b in (8, 32) for w in (0, 1, 2, 3) for on in ("loader", "dataset")]


@exercise("09.3", "on the loader with_epoch counts the rank's batches; on the dataset it counts each worker's.")
def with_epoch_value(fn: Callable[[int, int, int, str], Any]) -> None:
    """``fn(batches_per_rank, batch_size, num_workers, on)``: the ``n`` in ``.with_epoch(n)`` that gives
    ``batches_per_rank`` batches per rank when the dataset ends with ``.batched(batch_size)`` and
    ``with_epoch`` stands on the ``"loader"`` (a WebLoader) or on the ``"dataset"``."""
    attempted(fn)
    for n, b, w, on in EPOCH_CASES:
        call = f"with_epoch_value({n}, batch_size={b}, num_workers={w}, on={on!r})"
        got = fn(n, b, w, on)
        require(
            isinstance(got, (int, np.integer)) and not isinstance(got, bool),
            f"{call} should return a whole number, got {got!r}.",
        )
        truth = n if on == "loader" or w == 0 else n // w
        if got == truth:
            continue
        if got in (n * b, truth * b):
            raise Hint(
                f"{call} = {got}: with_epoch counts whatever comes out of the end of the pipeline it is set on; "
                "the dataset ends with .batched(...), so that is batches, not samples."
            )
        if on == "dataset" and w > 1 and got == n * w:
            raise Hint(
                f"{call} = {got}: on the dataset, each of the {w} workers stops after that many batches, so the rank "
                f"would get {w * got}: the {n} batches of the rank's epoch are shared among its {w} workers."
            )
        if on == "dataset" and w > 1 and got == n:
            raise Hint(
                f"{call} = {got}: on the dataset, with_epoch counts per worker, and each of the {w} workers "
                f"yields that many, so the rank would get {w * n} batches."
            )
        if on == "dataset" and w == 0:
            raise Hint(
                f"{call} = {got}: with num_workers=0 the main process iterates the dataset once, so per worker "
                "is per rank here."
            )
        if on == "loader" and got != n:
            raise Hint(
                f"{call} = {got}: on the loader, with_epoch counts the batches the loader itself yields, which "
                "is the whole rank's epoch, whatever the number of workers."
            )
        raise Hint(f"{call} = {got}, but the rank would then not get {n} batches.")


# ----------------------------------------------------------------- 09.4: one rank's loader, equal steps on every rank


def _refuses_several_ranks(loader: Any) -> bool:
    """Whether the dataset inside ``loader`` refuses to read as one of several ranks (no ``nodesplitter=``).

    Tried in this process, on the dataset alone: the loader's own workers would raise it too, but a DataLoader whose
    workers failed waits seconds for them to stop."""
    first = getattr(loader, "pipeline", [None])[0]
    dataset = getattr(first, "dataset", None)
    if dataset is None:
        return False
    try:
        next(iter(dataset))
    except ValueError as exc:
        return "nodesplitter" in str(exc)
    except Exception:  # anything else shows up, with the learner's own words, when the loader runs
        return False
    return False


def _rank_run(
    fn: Callable[..., Any], urls: list[str], rank: int, world: int, batch_size: int, steps: int, epoch: int
) -> list[list[int]]:
    """The labels of every batch rank ``rank`` of ``world`` gets from ``fn(urls, batch_size, steps, epoch)``."""
    from ..shards import simulated_reader

    with simulated_reader(rank, world):
        loader = fn(list(urls), batch_size, steps, epoch)
        require(loader is not None, "rank_loader returned None: return the loader.")
        if epoch == 0:  # the first run of each rank: a missing nodesplitter shows there, or never
            require(
                not _refuses_several_ranks(loader),
                "webdataset refused to read: with several ranks it needs "
                "nodesplitter=wds.split_by_node in WebDataset(...), or every rank would read every shard.",
            )
        error = ""
        try:
            batches = list(itertools.islice(loader, 4 * steps))  # a loader that never ends stops here
        except ValueError as exc:
            error = str(exc)
        del loader
    if error:
        gc.collect()  # once the error is dropped: the workers of a loader that failed stop here, not in a later check
    require(
        "nodesplitter" not in error,
        "webdataset refused to read: with several ranks it needs "
        "nodesplitter=wds.split_by_node in WebDataset(...), or every rank would read every shard.",
    )
    require(not error, f"your loader raised {error.strip().splitlines()[-1] if error.strip() else 'ValueError'}")
    labels = []
    for batch in batches:
        require(isinstance(batch, (tuple, list)) and len(batch) == 2, "each batch should be a pair (images, labels).")
        labels.append([int(v) for v in _as_list(batch[1])])
    return labels


def _require_steps(counts: list[int], steps: int, epoch: int) -> None:
    """Every rank took ``steps`` batches in ``epoch``, or a hint about ``with_epoch``."""
    if counts == [steps] * len(counts):
        return
    hint = (
        f"in epoch {epoch} the ranks took {counts[0]} and {counts[1]} steps, where each should take steps={steps}: "
        "end the pipeline with .with_epoch(steps) on the loader, after rebatching"
    )
    if all(c > steps for c in counts):
        hint += " (on the dataset, with_epoch counts each worker's batches, not the rank's)"
    elif counts[0] != counts[1]:
        hint += "; unequal steps leave the longer rank waiting in a collective forever (notebook 07)"
    raise Hint(hint + ".")


def _require_own_shards(
    batches: list[list[int]], rank: int, world: int, shards: int, per_shard: int, batch_size: int
) -> None:
    """Rank ``rank`` read only its own shards, each once before any twice, in batches of ``batch_size``."""
    read = {label // 100 for batch in batches for label in batch}
    mine = set(range(rank, shards, world))
    require(
        read <= mine,
        f"rank {rank} read shards {sorted(read - mine)} of the other rank: split the shards "
        "between ranks with nodesplitter=wds.split_by_node.",
    )
    sizes = {len(batch) for batch in batches[:-1]}
    require(
        sizes <= {batch_size},
        f"rank {rank}'s batches have sizes {sorted(sizes)}: rebatch to batch_size "
        "(.unbatched().shuffle(...).batched(batch_size) on the loader).",
    )
    labels = [label for batch in batches for label in batch]
    first_pass = labels[: per_shard * len(mine)]
    require(
        len(set(first_pass)) == len(first_pass),
        f"rank {rank} got samples twice before it had read all of its "
        "shards: every worker read all of the rank's shards. Add workersplitter=wds.split_by_worker.",
    )


@exercise(
    "09.4",
    "every rank reads only its own shards, each worker its part of them, all ranks take the same number "
    "of steps (with_epoch on the loader), and every epoch is a new one that a rerun repeats: the epoch "
    "is in the seed.",
)
def rank_loader(fn: Callable[..., Any]) -> None:
    """``fn(urls, batch_size, steps, epoch)``: this rank's loader for ``epoch``, split by node and worker, exactly
    ``steps`` batches long, every shuffle seeded with the epoch."""
    import tempfile

    attempted(fn)
    world, batch_size, steps, shards, per_shard = 2, 4, 7, 5, 10
    with tempfile.TemporaryDirectory(prefix="course09-") as folder:
        urls = labelled_shards(folder, shards=shards, per_shard=per_shard)  # rank 0 gets 3 shards, rank 1 gets 2
        runs: list[list[list[list[int]]]] = [[] for _ in range(world)]  # per rank, per epoch: the batches' labels
        for epoch in range(3):
            for rank in range(world):
                runs[rank].append(_rank_run(fn, urls, rank, world, batch_size, steps, epoch))
            _require_steps([len(r[epoch]) for r in runs], steps, epoch)
            if epoch == 0:  # a share is a share in every epoch: checked once
                for rank in range(world):
                    _require_own_shards(runs[rank][0], rank, world, shards, per_shard, batch_size)
        if all(r[0] == r[1] == r[2] for r in runs):
            raise Hint(
                f"each rank read the same {steps} batches in epochs 0, 1 and 2: your loader ignores `epoch`. "
                "Seed the shard shuffle and both shuffle buffers with it (seed=epoch), so that every epoch is "
                "a new one."
            )
        for rank, epochs in enumerate(runs):
            for a, b in itertools.combinations(range(3), 2):
                require(
                    epochs[a] != epochs[b],
                    f"rank {rank} read the same batches in epochs {a} and {b}: seed every "
                    "shuffle with the epoch, the shard shuffle and both buffers (a worker that holds a single "
                    "shard gets a new order from its buffers only).",
                )
        again = _rank_run(fn, urls, 0, world, batch_size, steps, 1)
    require(
        again == runs[0][1],
        "epoch 1 run twice gave rank 0 different batches: a rerun of an epoch (a restarted "
        "job, a comparison) must repeat it. Seed every shuffle with the epoch (seed=epoch) instead of leaving "
        "seed= out.",
    )


def _rotation_run(fn: Callable[..., Any], urls: list[str], rank: int, world: int, seed: int, epoch: int) -> list[int]:
    """The labels rank ``rank`` of ``world`` reads in ``epoch`` from ``fn(urls, seed, epoch)``, in order."""
    from ..shards import simulated_reader

    with simulated_reader(rank, world_size=world):
        dataset = fn(list(urls), seed, epoch)
        attempted(dataset)
        samples = list(dataset)
    labels = []
    for sample in samples:
        require(
            isinstance(sample, (tuple, list)) and len(sample) == 2,
            'each sample should be a pair (key, label): end the pipeline with wds.to_tuple("__key__", "cls").',
        )
        labels.append(int(sample[1]))
    return labels


@exercise(
    "09.5",
    "the shard list shuffled alike on every rank from (seed, epoch), then split: every shard read once per "
    "epoch over the ranks, a new share for each rank every epoch, the same one on a rerun.",
)
def rotating_dataset(fn: Callable[..., Any]) -> None:
    """``fn(urls, seed, epoch)``: this rank's ``(key, label)`` samples for ``epoch``, its shards drawn anew every epoch."""
    import tempfile

    attempted(fn)
    world, n = 2, 6
    with tempfile.TemporaryDirectory(prefix="course09-") as folder:
        urls = labelled_shards(folder, shards=n, per_shard=3)
        shares = []  # per epoch, per rank: the set of shards read
        for epoch in range(4):
            runs = [_rotation_run(fn, urls, rank, world, 0, epoch) for rank in range(world)]
            read = [label // 100 for labels in runs for label in labels]
            mine = [{label // 100 for label in labels} for labels in runs]
            twice = sorted(mine[0] & mine[1])
            if twice:
                raise Hint(
                    f"in epoch {epoch} both ranks read shards {twice}: "
                    + (
                        "split the shuffled list between the ranks with wds.split_by_node"
                        if len(twice) == n
                        else "every rank must shuffle the list identically, from (seed, epoch) only, never the rank"
                    )
                    + "."
                )
            require(
                sorted(read) == sorted(s for s in range(n) for _ in range(3)),
                f"in epoch {epoch} the ranks read shards {sorted(set(read))} ({len(read)} samples): every shard "
                f"once, all {n} of them, 3 samples each.",
            )
            shares.append(mine)
            require(len(runs[0]) == len(set(runs[0])), f"rank 0 read a sample twice in epoch {epoch}.")
        if all(s[0] == shares[0][0] for s in shares):
            if shares[0][0] == set(range(0, n, world)):  # rank 0's share of the list as given: shuffled after the split
                raise Hint(
                    f"rank 0 read shards {sorted(shares[0][0])} of the check's {n} in every one of 4 epochs, its share "
                    "of the list as given: a shuffle after the split changes the order, the share does not. Shuffle "
                    "the URL list itself, from (seed, epoch), before wds.split_by_node."
                )
            raise Hint(
                f"rank 0 read shards {sorted(shares[0][0])} of the check's {n} in every one of 4 epochs: the list is "
                "shuffled, but alike in every epoch. Draw the permutation from (seed, epoch), e.g. "
                "np.random.default_rng([seed, epoch]), not from the seed alone."
            )
        again = _rotation_run(fn, urls, 0, world, 0, 1)
        first = _rotation_run(fn, urls, 0, world, 0, 1)
        require(
            again == first,
            "the same (seed, epoch) gave rank 0 another order on a rerun: draw the permutation "
            "from a generator seeded with (seed, epoch), e.g. np.random.default_rng([seed, epoch]).",
        )


# (copy_s, shared_epoch_s, local_epoch_s, epochs, need_mb, free_mb): each separates the rule from one wrong form
STAGE_CASES = [
    (40.0, 10.0, 2.0, 20, 5000, 20000),  # pays after a few epochs: stage
    (40.0, 10.0, 2.0, 3, 5000, 20000),  # the copy costs more than 3 epochs save: stream
    (40.0, 10.0, 2.0, 20, 50000, 20000),  # would pay, but does not fit: stream
    (12.0, 10.0, 2.0, 2, 100, 20000),  # less than one epoch's saving per epoch, but repaid over 2: stage
    (5.0, 10.0, 9.8, 10, 100, 20000),  # the copy is cheap, but the local epochs are barely faster: stream
    (0.5, 1.0, 1.0, 50, 100, 20000),  # no faster from the copy: stream
]


@exercise("09.6", "stage when the copy fits and, paid once, is repaid by the faster epochs; else stream.")
def stage_or_stream(fn: Callable[..., Any]) -> None:
    """``fn(copy_s, shared_epoch_s, local_epoch_s, epochs, need_mb, free_mb)`` returns ``"stage"`` or ``"stream"``."""
    attempted(fn)
    for copy_s, shared, local, epochs, need, free in STAGE_CASES:
        call = f"stage_or_stream({copy_s:g}, {shared:g}, {local:g}, {epochs}, {need:g}, {free:g})"
        got = fn(copy_s, shared, local, epochs, need, free)
        require(got in ("stage", "stream"), f'{call} should return "stage" or "stream", got {got!r}.')
        truth = stage_or_stream_rule(copy_s, shared, local, epochs, need, free)
        if got == truth:
            continue
        if need > free:
            raise Hint(
                f"{call} = {got!r}: {need:g} MB do not fit in the {free:g} MB free on the node: check the room first "
                "(a copy that fills /dev/shm takes the workers' shared memory with it)."
            )
        if got == "stage" and copy_s >= epochs * (shared - local):
            if local >= shared * 0.95:
                raise Hint(
                    f"{call} = {got!r}: the epochs from the copy take time too ({epochs} × {local:g} s): compare the "
                    f"whole job both ways, copy_s + epochs × local_epoch_s against epochs × shared_epoch_s."
                )
            raise Hint(
                f"{call} = {got!r}: the copy costs {copy_s:g} s and {epochs} epochs save only "
                f"{epochs * (shared - local):g} s: the copy must be repaid."
            )
        if got == "stream" and copy_s + local >= shared:
            raise Hint(
                f"{call} = {got!r}: the copy is made once per job, not once per epoch: over {epochs} epochs it saves "
                f"{epochs * (shared - local):g} s for {copy_s:g} s."
            )
        raise Hint(f"{call} = {got!r}, but the whole job takes less time {truth}ing ({truth!r}).")
