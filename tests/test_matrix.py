"""The correctness matrix (issue 14): launch style x start method x ranks x workers, for three kinds of data.

Launch styles: ``torchrun`` (it sets ``RANK``/``WORLD_SIZE``/...), and one process per task with only the
variables ``srun`` sets (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, the node list). Start
methods fork with 1 and 2 workers, spawn and forkserver with 2, and 0 workers (no start method): 5 settings, all at
2 ranks; at 1 and 3 ranks the fresh-interpreter methods are thinned (``CELLS``).
Each rank (tests/matrix_rank.py) joins with the course's ``distributed.start`` and reads, in every setting:

* a map-style dataset through ``DistributedSampler``, the course's ``ShardedStream`` given its rank, and a
  webdataset pipeline split by node and worker: every one of the 36 samples exactly once per epoch over all ranks;
* the course's resampled recipe: exactly ``EPOCH`` samples on every rank, no two ranks drawing the same stream,
  and the same stream for the same (rank, workers) whatever the start method (reproducible).

The negative control runs the srun style with spawn workers *without* the course's start(): webdataset's
``split_by_node`` in the workers then sees world size 1, every rank reads every shard, and the checks above say so.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from course_lib.jobs import launch

pytestmark = pytest.mark.full

DRIVER = Path(__file__).with_name("matrix_rank.py")
N, EPOCH = 36, 10  # as in the driver
SETTINGS = ["-/0", "fork/1", "fork/2", "spawn/2", "forkserver/2"]  # 1 and 2 workers differ in the worker split: fork
# shows both; spawn and forkserver (a fresh interpreter per worker, the costly part) run 2
CELLS = {1: SETTINGS[:3], 2: SETTINGS, 3: SETTINGS[:3] + ["forkserver/2"]}  # the fresh-interpreter methods cost ~3 s
# of CPU per worker: both at 2 ranks (where a rank's RANK must reach its workers), forkserver at 3 (what the
# exported variables give a rank other than 0 and 1), none at 1 (one rank: nothing to split; the srun case's
# empty export is still checked). The multi-epoch matrix below runs spawn and forkserver again at 2 ranks.


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> str:
    """12 shards of 3 samples, keys s000..s035: they divide evenly over 1-3 ranks x 1-2 workers."""
    import webdataset as wds

    folder = tmp_path_factory.mktemp("matrix-shards")
    with wds.ShardWriter(str(folder / "part-%03d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"s{i:03d}", "txt": str(i), "cls": str(i % 10)})
    return str(folder / "part-{000..011}.tar")


def run(style: str, ranks: int, out: Path, *extra: str, urls: str) -> list[dict]:
    args = [urls, str(out), *extra]
    launch(str(DRIVER), *args, nproc=ranks, timeout=150, show=False, style=style)
    gathered = json.loads(out.read_text())
    assert [g["rank"] for g in gathered] == list(range(ranks))
    assert {g["source"] for g in gathered} == {"torchrun" if style == "torchrun" else "slurm"}
    if "--plain" not in extra:  # what spawn/forkserver workers read: set by torchrun, or exported by start()
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        expected = [dict(zip(names, (str(r), str(ranks), str(r), str(ranks)))) for r in range(ranks)]
        if style == "srun" and ranks == 1:  # one task: start() exports nothing, and world size 1 is what workers assume
            expected = [dict.fromkeys(names)]
        assert [g["exported"] for g in gathered] == expected
    return gathered


def faults(gathered: list[dict], setting: str) -> list[str]:
    """What is wrong in one setting, over all ranks: an empty list when every check holds."""
    found = []
    for kind in ("map", "stream", "wds"):
        counts = Counter(i for g in gathered for i in g["cells"][setting][kind])
        repeated = sum(1 for c in counts.values() if c > 1)
        missing = N - len(counts)
        if repeated or missing or sorted(counts) != list(range(N)):
            found.append(f"{kind}: {repeated} samples read more than once, {missing} never")
    streams = [tuple(g["cells"][setting]["resampled"]) for g in gathered]
    if any(len(s) != EPOCH for s in streams):
        found.append(f"resampled: {[len(s) for s in streams]} samples per rank, not {EPOCH}")
    if len(set(streams)) != len(streams):
        found.append("resampled: two ranks drew the same stream")
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_every_sample_once_under_every_launch_style_start_method_and_worker_count(
    style: str, ranks: int, urls: str, tmp_path: Path
) -> None:
    settings = CELLS[ranks]
    gathered = run(
        style, ranks, tmp_path / "matrix.json", "--cells=" + ",".join(settings), urls=urls
    )  # "-/0" is no option
    assert sorted(gathered[0]["cells"]) == sorted(settings)
    problems = {s: faults(gathered, s) for s in settings}
    assert not any(problems.values()), {s: p for s, p in problems.items() if p}
    for g in gathered:  # reproducible: the start method changes nothing that a rank reads, for the same workers
        cells = [g["cells"][f"{m}/2"] for m in ("fork", "spawn", "forkserver") if f"{m}/2" in settings]
        assert all(c == cells[0] for c in cells), f"rank {g['rank']}, 2 workers: the start method mattered"


@pytest.mark.timeout(300)
def test_the_matrix_catches_srun_with_spawn_workers_and_no_exported_rank(urls: str, tmp_path: Path) -> None:
    """The negative control: a script that joins with Slurm's numbers but exports no RANK/WORLD_SIZE."""
    gathered = run("srun", 2, tmp_path / "plain.json", "--plain", "--cells", "fork/1,spawn/1", urls=urls)
    assert faults(gathered, "fork/1") == []  # fork workers inherit the process group: still right
    wrong = faults(gathered, "spawn/1")
    assert "wds: 36 samples read more than once, 0 never" in wrong  # every rank read every shard
    assert "resampled: two ranks drew the same stream" in wrong  # both seeded as rank 0
    assert not any(f.startswith(("map", "stream")) for f in wrong)  # rank given in the main process: right anyway


# --------------------------------------------------------------------------- every epoch a new one
EPOCHS_DRIVER = Path(__file__).with_name("matrix_epochs_rank.py")
EPOCHS, DRAWS, NAMES = 3, 150, 100  # as in the driver


def expected_distinct(draws: int, shards: int = NAMES) -> float:
    """Distinct shards among `draws` drawn uniformly with replacement from `shards`: N(1 - (1 - 1/N)^k)."""
    return shards * (1 - (1 - 1 / shards) ** draws)


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory: pytest.TempPathFactory, tiny_root: Path):
    """The tiny set's 80 training images as 16 shards of 5: 4 readers (2 ranks x 2 workers) get 4 shards each."""
    from course_lib.shards import write_image_shards

    return write_image_shards(
        tmp_path_factory.mktemp("matrix-images") / "shards", size="tiny", root=tiny_root, maxcount=5
    )


def epoch_faults(gathered: list[dict], method: str, shard_of: dict[str, str]) -> list[str]:
    """What is wrong with the recipes of one start method, over all ranks and epochs: [] when all holds."""
    found = []
    cells = [g["cells"][method] for g in gathered]
    for recipe in ("sampler", "stream", "shards", "resampled", "capstone"):
        per_rank = [[e["keys"] if recipe == "capstone" else e for e in c[recipe]] for c in cells]
        if any(len(epochs) != EPOCHS for epochs in per_rank):
            found.append(f"{recipe}: not {EPOCHS} epochs")
            continue
        for rank, epochs in enumerate(per_rank):
            if len({tuple(e) for e in epochs}) != EPOCHS:
                found.append(f"{recipe}: rank {rank} read two epochs in the same order")
        steps = {len(epochs[e]) for epochs in per_rank for e in range(EPOCHS)}
        if len(steps) != 1:
            found.append(f"{recipe}: the ranks' epochs hold {sorted(steps)} samples: unequal steps")
        if recipe in ("sampler", "stream", "shards"):  # the exact recipes: every sample once per epoch
            for e in range(EPOCHS):
                read = sorted(i for epochs in per_rank for i in epochs[e])
                if read != list(range(N)):
                    found.append(f"{recipe}: epoch {e} read {len(read)} samples, {len(set(read))} distinct, of {N}")
    for e in range(EPOCHS):  # the capstone's readers keep to shards of their own within an epoch
        shards_of = [{shard_of[k] for k in keys} for c in cells for keys in c["capstone"][e]["by_worker"].values()]
        if sum(map(len, shards_of)) != len(set().union(*shards_of)):
            found.append(f"capstone: two readers shared a shard in epoch {e}")
    for e in range(EPOCHS):  # resampled: distinct shards after k draws, against N(1 - (1 - 1/N)^k), within 10 %
        draws = [c["draws"][e] for c in cells]
        for rank, mine in enumerate(draws):
            if abs(len(set(mine)) - expected_distinct(DRAWS)) > 0.1 * expected_distinct(DRAWS):
                found.append(
                    f"resampled: rank {rank}, epoch {e}: {len(set(mine))} distinct shards in {DRAWS} draws, "
                    f"expected {expected_distinct(DRAWS):.1f}"
                )
        together = sum(draws, [])
        if abs(len(set(together)) - expected_distinct(len(together))) > 0.1 * expected_distinct(len(together)):
            found.append(f"resampled: epoch {e}: {len(set(together))} distinct over all ranks' {len(together)} draws")
        if len({tuple(d) for d in draws}) != len(draws):
            found.append(f"resampled: two ranks drew the same shards in epoch {e}")
    return found


@pytest.mark.timeout(420)
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_every_epoch_is_a_new_one_for_every_recipe(style: str, urls: str, image_shards, tmp_path: Path) -> None:
    """2 ranks x 2 workers, 3 epochs of each recipe, fork workers under torchrun and forkserver workers under srun: each
    epoch in a new order, every rank the same number of steps, the exact recipes every sample once per epoch,
    resampled draws as many distinct shards as drawing with replacement should."""
    out = tmp_path / "epochs.json"
    # torchrun with fork workers, srun with forkserver workers (a fresh interpreter per worker, like spawn: the pair
    # that needs RANK exported, and Linux's default from Python 3.14; it starts workers from a preloaded server, 15
    # loaders' worth in half spawn's time): both launch styles, and both kinds of start method; the single-epoch
    # matrix above runs every pair, spawn included
    methods = ["fork"] if style == "torchrun" else ["forkserver"]
    launch(
        str(EPOCHS_DRIVER),
        urls,
        image_shards.urls,
        str(out),
        "--methods",
        ",".join(methods),
        nproc=2,
        timeout=400,
        show=False,
        style=style,
    )
    gathered = json.loads(out.read_text())
    assert [g["rank"] for g in gathered] == [0, 1]
    shard_of = {key: name for name, keys in zip(image_shards.names, image_shards.keys) for key in keys}
    problems = {m: epoch_faults(gathered, m, shard_of) for m in methods}
    assert not any(problems.values()), problems
    for g in gathered:  # reproducible: the start method changes nothing a rank reads
        cells = [{k: v for k, v in g["cells"][m].items() if k != "capstone"} for m in methods]
        assert all(c == cells[0] for c in cells)


def test_the_epoch_checks_catch_a_recipe_that_repeats_its_epoch() -> None:
    """The negative control of the checks above: a recipe that reads the same epoch again is caught."""
    good = [list(range(r, N, 2)) for r in range(2)]
    rank_cell = {"sampler": None, "stream": None, "shards": None, "resampled": None, "capstone": None, "draws": None}
    gathered = []
    for r in range(2):
        cell = dict(rank_cell)
        for recipe in ("sampler", "stream", "shards", "resampled"):
            cell[recipe] = [good[r][::-1] if e == 1 else good[r] for e in range(EPOCHS)]  # epochs 0 and 2: the same
        cell["capstone"] = [
            {"keys": [f"k{r}{e}{i}" for i in range(4)], "by_worker": {"0": [f"k{r}{e}0"]}} for e in range(EPOCHS)
        ]
        rng = __import__("random").Random(r)
        cell["draws"] = [[f"s{rng.randrange(NAMES)}" for _ in range(DRAWS)] for _ in range(EPOCHS)]
        gathered.append({"rank": r, "cells": {"fork": cell}})
    faults = epoch_faults(gathered, "fork", {f"k{r}{e}0": f"shard{r}" for r in range(2) for e in range(EPOCHS)})
    assert "sampler: rank 0 read two epochs in the same order" in faults
    assert "shards: rank 1 read two epochs in the same order" in faults
    assert not any("distinct shards" in f for f in faults)  # honest draws pass the 10 % check
