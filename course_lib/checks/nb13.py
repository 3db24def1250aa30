"""Checks for notebook 13 (the capstone).

The measurements differ from machine to machine, so the checks never compare with stored numbers:
they recompute the right answer from the learner's own measurement (as 04.4 does) and parse the
Slurm script the learner wrote.
"""

from __future__ import annotations

import itertools
import numbers
import os
import subprocess
import tempfile
import time
import re
import traceback
from pathlib import Path
from typing import Any, Callable


from ..capstone import DECODE_MS, STALL_TARGET, STEP_MS, EndlessShardCycle, RotatingShardList, ShuffleBuffer
from ..shards import simulated_reader
from ..storage import stage_or_stream
from ..instrument import EpochRecord
from ..workers import cpu_count
from ._core import Hint, attempted, exercise, labelled_shards, require, whole_number

#: Exercise 13.5's cluster: nodes, GPUs per node, CPUs per node, and where the shards are.
NODES, GPUS_PER_NODE, CPUS_PER_NODE = 2, 4, 32
CLUSTER_SHARDS = "/scratch/$USER/course-shards"
#: What the first, unstaged run of the job logged on that cluster (exercise 13.5 decides staging from it, by notebook
#: 09's rule, storage.stage_or_stream): the copy of the shards to a node's local disk, an epoch reading them from the
#: shared file system and from the local copy, the epochs of the training, the shards' size and a node's free space.
CLUSTER_STAGING = dict(
    copy_s=240.0, shared_epoch_s=620.0, local_epoch_s=540.0, epochs=20, need_mb=180_000, free_mb=1_500_000
)


def _validate_results(results: Any) -> dict[int, EpochRecord]:
    """``results`` is a sweep over num_workers measured with the capstone's workload."""
    require(
        isinstance(results, dict) and results and all(isinstance(r, EpochRecord) for r in results.values()),
        "results should be a dict num_workers -> EpochRecord, as capstone.sweep(urls, 'num_workers', [...]) returns.",
    )
    require(
        all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in results),
        "the keys of results should be numbers of workers: sweep over 'num_workers'.",
    )
    require(
        all(r.num_workers == k for k, r in results.items()),
        "each key of results should be the num_workers its record was measured with.",
    )
    for k, r in results.items():
        decode, step = r.settings.get("decode_ms"), r.settings.get("step_ms")
        require(
            decode == DECODE_MS and step == STEP_MS,
            f"num_workers={k} was measured with decode_ms={decode}, step_ms={step}: measure every setting with the "
            f"capstone's workload (decode_ms={DECODE_MS}, step_ms={STEP_MS}, the defaults of capstone.timed_epoch).",
        )
        require(len(r.batches) >= 8, f"num_workers={k} was measured over {len(r.batches)} batches: use at least 8.")
    require(
        len({r.settings.get("batch_size") for r in results.values()}) == 1,
        "measure every setting with the same batch size.",
    )
    return results


def smallest_under_target(results: dict[int, EpochRecord], target: float = STALL_TARGET) -> int:
    """Exercise 13.2's rule: the fewest workers whose measured steady stall is under ``target``, counting at most one
    worker per core but the main process's (``workers.cpu_count() - 1``, at least 1) unless only more get there; where
    none gets there (a busy machine), that budget of workers, or the most measured if fewer."""
    budget = max(1, cpu_count() - 1)
    under = sorted(w for w, r in results.items() if r.steady_stall_fraction < target)
    return ([w for w in under if w <= budget] or under or [min(budget, max(results))])[0]


# --------------------------------------------------------------------------- 13.1: the pipeline, assembled


def _reader(
    fn: Callable[..., Any],
    urls: list[str],
    rank: int,
    worker: int,
    take: int,
    seed: int = 0,
    decode_ms: float = 0.0,
    epochs: int = 1,
) -> list[list[tuple[Any, ...]]]:
    """The first ``take`` samples of each epoch that reader (rank ``rank`` of 2, worker ``worker`` of 2) gets from one
    ``fn(urls, seed, decode_ms)``, iterated once per epoch as a persistent worker iterates its pipeline."""
    with simulated_reader(rank, 2, worker, 2):
        pipeline = fn(urls, seed, decode_ms)
        require(pipeline is not None, "my_build_dataset returned None: return the wds.DataPipeline.")
        try:
            return [list(itertools.islice(iter(pipeline), take)) for _ in range(epochs)]
        except Exception as exc:
            raise Hint(_pipeline_error(exc)) from None


def _pipeline_error(exc: Exception) -> str:
    """A hint for an exception raised while the pipeline ran: never the samples' bytes that webdataset puts in it."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, AssertionError) and frames and frames[-1].name == "_decode":
        return (
            "wds.decode got tuples, not samples: it decodes a sample dict's fields by their extension (jpg), so it "
            'comes before wds.to_tuple("jpg", "cls", "__key__"), which turns the dict into (image, label, key).'
        )
    message = " ".join(str(exc).split())
    if len(message) > 200:
        message = message[:200] + " …"
    return f"running your pipeline raised {type(exc).__name__}: {message}"


#: The course's seeded stages, and how each is given its seed.
_SEEDED_STAGES = {
    RotatingShardList: "RotatingShardList(urls, seed)",
    EndlessShardCycle: "EndlessShardCycle(seed)",
    ShuffleBuffer: "ShuffleBuffer(capstone.SHUFFLE_BUFFER, seed)",
}


def _stage_seeds(fn: Callable[..., Any], urls: list[str], seed: int) -> None:
    """Every seeded stage of the course in the pipeline ``fn(urls, seed, 0)`` builds holds that seed."""
    with simulated_reader(0, 2, 0, 2):
        pipeline = fn(urls, seed, 0.0)
    for stage in getattr(pipeline, "pipeline", []):
        call = _SEEDED_STAGES.get(type(stage))
        require(
            call is None or stage.seed == seed,
            f"built with seed={seed}, your pipeline's capstone.{type(stage).__name__} has seed "
            f"{getattr(stage, 'seed', None)!r}: give it the seed you are given, capstone.{call}; a fixed seed gives "
            "every run of the job the same draws, whatever seed it is started with.",
        )


def _shard(item: tuple[Any, ...]) -> int:
    return int(item[1]) // 100  # the check's shards label their samples shard * 100 + i


@exercise(
    "13.1",
    "every epoch the shards are dealt anew; each of 4 readers cycles through its own endlessly, a new "
    "order each pass, decoded to (image, label, key), with the simulated decode cost.",
)
def build_dataset(fn: Callable[..., Any]) -> None:
    """``fn(urls, seed, decode_ms)``: the capstone's pipeline (notebook 13, section 1), assembled by the learner."""
    attempted(fn)
    with tempfile.TemporaryDirectory(prefix="course13-") as folder:
        urls = labelled_shards(folder, shards=16, per_shard=2)  # 2 ranks x 2 workers: 4 shards, 8 samples per reader
        first = _reader(fn, urls, 0, 0, 1)[0]
        require(len(first) == 1, "the pipeline yielded nothing for rank 0's worker 0.")
        image, *rest = first[0]
        require(
            len(rest) == 2 and hasattr(image, "shape") and tuple(image.shape)[0] == 3 and image.is_floating_point(),
            f'each sample should be (image, label, key), the image a float tensor [3, H, W]: wds.decode("torchrgb") '
            f'before wds.to_tuple("jpg", "cls", "__key__"); got {tuple(type(v).__name__ for v in first[0])}.',
        )
        streams = {(r, w): _reader(fn, urls, r, w, 48, epochs=2) for r in range(2) for w in range(2)}
        for epoch in range(2):
            read = {reader: {_shard(item) for item in items[epoch]} for reader, items in streams.items()}
            require(
                read[(0, 0)] != read[(1, 0)],
                "ranks 0 and 1 read the same shards: split them between the ranks "
                "with wds.split_by_node, right after capstone.RotatingShardList(urls, seed).",
            )
            require(
                read[(0, 0)] != read[(0, 1)],
                "the two workers of a rank read the same shards: split the rank's "
                "shards between its workers with wds.split_by_worker, after wds.split_by_node.",
            )
            for (r, w), items in streams.items():
                _one_reader(items[epoch], f"rank {r}'s worker {w}", epoch)
            readers = [sorted(s) for s in read.values()]
            require(
                len(set().union(*read.values())) == 16,
                f"in epoch {epoch} two readers read the same shards "
                f"({readers}): the shard list must be shuffled alike on every rank and worker, from seed and epoch "
                "only (capstone.RotatingShardList(urls, seed)), and then split by node and by worker.",
            )
        require(
            any({_shard(i) for i in items[0]} != {_shard(i) for i in items[1]} for items in streams.values()),
            "every reader read the same shards in epochs 0 and 1: deal the shards anew every epoch, "
            "capstone.RotatingShardList(urls, seed) in place of wds.SimpleShardList(urls).",
        )
        again = _reader(fn, urls, 1, 1, 12, epochs=2)
        require(
            [[item[2] for item in e] for e in again] == [[item[2] for item in e[:12]] for e in streams[(1, 1)]],
            "the same seed gave another order: give the seed you are given to every seeded stage "
            "(RotatingShardList, EndlessShardCycle, and a shuffle buffer's: capstone.ShuffleBuffer(size, seed)).",
        )
        require(
            [item[2] for item in _reader(fn, urls, 1, 1, 48, seed=1)[0]] != [item[2] for item in streams[(1, 1)][0]],
            "seeds 0 and 1 gave the same order: give the seed you are given to RotatingShardList(urls, seed), "
            "EndlessShardCycle(seed) and ShuffleBuffer(capstone.SHUFFLE_BUFFER, seed).",
        )
        _stage_seeds(fn, urls, 1)
        start = time.perf_counter()
        _reader(fn, urls, 0, 0, 4, decode_ms=40.0)
        require(
            time.perf_counter() - start > 0.1,
            "4 samples with decode_ms=40 took no time: end the pipeline with "
            "wds.map(capstone.SimulatedDecode(decode_ms)).",
        )


def _one_reader(items: list[tuple[Any, ...]], reader: str, epoch: int) -> None:
    """One reader's first 48 samples of an epoch: 6 passes over its 4 shards of 2 samples, or their mix by a buffer."""
    require(
        len(items) == 48,
        f"{reader} stopped after {len(items)} samples in epoch {epoch}, its shards' 8: an endless "
        "stream needs capstone.EndlessShardCycle(seed) after the splitters.",
    )
    shards = sorted({_shard(item) for item in items})
    require(
        len(shards) == 4,
        f"{reader} read shards {shards} in epoch {epoch}; each of the 4 readers should read 4 "
        "of the 16: wds.split_by_node, then wds.split_by_worker, right after capstone.RotatingShardList(urls, seed).",
    )
    labels = [int(item[1]) for item in items]
    if any(labels[k] // 100 != labels[k + 1] // 100 for k in range(0, 48, 2)):
        return  # a shuffle buffer mixes samples of several shards (and of one pass with the next): passes blur
    passes = [labels[k : k + 8] for k in range(0, 48, 8)]
    require(
        all(len(set(p)) == 8 for p in passes),
        f"{reader} got a sample twice within one pass over its shards "
        f"in epoch {epoch}: cycle through them (EndlessShardCycle), do not draw shards with replacement.",
    )
    require(
        len({tuple(p) for p in passes}) > 1,
        f"{reader} read its shards in the same order every pass: EndlessShardCycle(seed) draws a new order each pass.",
    )
    raise Hint(
        f"{reader} got its samples shard by shard, each shard's in the order written (labels {labels[:6]}...): "
        "a batch would hold a few shards' runs. Mix them: capstone.ShuffleBuffer(capstone.SHUFFLE_BUFFER, seed) "
        "right after wds.tarfile_to_samples().",
    )


@exercise(
    "13.2",
    f"the fewest workers that keep the training loop waiting under {STALL_TARGET * 100:.0f} % of the time, "
    "from your own measurement, at most one per core but the main process's unless only more get there.",
)
def tuned_workers(answer: Any, results: Any) -> None:
    """``answer`` is the smallest num_workers in ``results`` with a steady stall under the target."""
    attempted(answer, results)
    results = _validate_results(results)
    require(
        isinstance(answer, numbers.Integral) and not isinstance(answer, bool),
        f"answer should be a number of workers (an int), got {answer!r}.",
    )
    require(answer in results, f"you did not measure num_workers={answer}: include it in the sweep.")
    missing = [w for w in range(answer) if w not in results]
    require(
        not missing,
        f"measure every smaller setting too ({', '.join(map(str, missing))}) to be sure {answer} is the fewest.",
    )
    best = smallest_under_target(results)
    if answer == best:
        return
    stall = results[answer].steady_stall_fraction
    require(
        answer > best,
        f"with {answer} workers the loop still waits {stall:.0%} of the time after the first "
        f"batch (steady_stall_fraction), above the {STALL_TARGET * 100:.0f} % target: try more.",
    )
    budget = max(1, cpu_count() - 1)
    if answer > budget:
        require(
            False,
            f"{answer} workers is more than your {cpu_count()} cores leave for workers ({budget}: one core is the "
            f"main process's); more take turns on the same cores, and where they seem to win, the machine was busier "
            f"while the smaller settings ran. By your sweep the answer is {best}"
            + (
                "."
                if results[best].steady_stall_fraction < STALL_TARGET
                else f": no setting within {budget} got under {STALL_TARGET * 100:.0f} %, so the most with a core of their own."
            ),
        )
    require(
        False,
        f"num_workers={best} already stays under {STALL_TARGET * 100:.0f} % "
        f"({results[best].steady_stall_fraction:.0%}): each extra worker costs a core, pick the fewest.",
    )


#: The shards s0..s7 each reader of the check's job (worker w of rank r: reader 2r + w) reads in epochs 0 and 1:
#: dealt anew every epoch, as the capstone's pipeline does.
DEALS = [[[0, 1], [2, 3], [4, 5], [6, 7]], [[5, 2], [7, 0], [3, 6], [1, 4]]]


def _job_reports(fault: str = "") -> tuple[list[dict], dict[str, str]]:
    """Reports of a 2-rank, 2-worker, 2-epoch job over shards s0..s7 of 4 samples each, right or with one ``fault``.

    Each epoch deals the shards anew (:data:`DEALS`), and each reader reads 2 samples of each of its 2 shards, so
    in epoch 1 shards and samples are read again, by other readers: right, and an audit across epochs would call
    it a fault."""
    shard_of = {f"s{s}-{i}": f"s{s}" for s in range(8) for i in range(4)}
    reports = []
    for rank in range(2):
        epochs = []
        for epoch in range(2):
            readers = {str(w): [f"s{s}-{i}" for s in DEALS[epoch][2 * rank + w] for i in range(2)] for w in range(2)}
            batches = 4
            if fault == "steps" and rank == 1 and epoch == 1:
                batches = 3
            if fault == "shared shard" and rank == 1 and epoch == 1:
                readers["1"] = readers["1"][:-1] + ["s5-3"]  # rank 0's worker 0 reads shard s5 in epoch 1
            if fault == "repeat" and rank == 0 and epoch == 1:
                readers["0"] = readers["0"][:-1] + [readers["0"][0]]
            if fault == "idle reader" and rank == 1 and epoch == 0:
                readers["1"] = []
            stall = 0.05
            if fault == "stall" and rank == 1:
                stall = (0.02, 0.25)[epoch]  # over the target in the last epoch only, and not on average
            if fault == "warm-up" and rank == 1:
                stall = (0.4, 0.05)[epoch]  # right: a slow first epoch, under the target by the last
            epochs.append({"batches": batches, "keys_by_worker": readers, "steady_stall": stall})
        digest = "b" * 64 if fault == "weights" and rank == 1 else "a" * 64
        reports.append({"rank": rank, "epochs": epochs, "weights_sha256": digest})
    return reports, shard_of


JOB_FAULTS = {
    "steps": "rank 1 took 3 batches in epoch 1, rank 0 took 4: a collective would hang",
    "shared shard": "shard s5 read by readers of two ranks in epoch 1",
    "repeat": "a sample read twice in epoch 1",
    "idle reader": "worker 1 of rank 1 read nothing in epoch 0",
    "weights": "the ranks' weights differ",
    "stall": "rank 1 waits 25 % of the time in the last epoch (2 % in epoch 0, 13.5 % on average)",
}


@exercise(
    "13.3",
    "one problem for each fault, none for a right job: equal steps, no idle reader, disjoint shards and "
    "no sample twice within each epoch, identical weights, and every rank's stall under the target.",
)
def audit_job(fn: Callable[..., Any]) -> None:
    """``fn(reports, shard_of, stall_target)``: a list of problems found in a job's rank reports, empty if it was right."""
    attempted(fn)
    reports, shard_of = _job_reports()
    got = fn(reports, shard_of, 0.15)
    attempted(got)
    require(isinstance(got, (list, tuple)), f"audit_job should return a list of problems, got {type(got).__name__}.")
    if got:
        raise Hint(
            f"a right job (equal steps, busy readers, disjoint shards, no repeats within an epoch, same weights, low stall) "
            f"got {len(got)} problem(s), the first: {got[0]!r}. In epoch 1 the shards are dealt anew and "
            "every sample is read again: compare shards and samples within one epoch, not across epochs."
        )
    warm_up = fn(*_job_reports("warm-up"), 0.15)
    attempted(warm_up)
    require(
        isinstance(warm_up, (list, tuple)) and not warm_up,
        "a right job whose rank 1 waited 40 % of the time in epoch 0 but 5 % in the last epoch (its workers "
        f"warming up) got {len(warm_up or [])} problem(s), the first: {(list(warm_up or []) or [None])[0]!r}. "
        "Judge each rank's stall on the last epoch only, report['epochs'][-1]['steady_stall'], not on any epoch or on their mean.",
    )
    for fault, what in JOB_FAULTS.items():
        reports, shard_of = _job_reports(fault)
        found = list(fn(reports, shard_of, 0.15))
        require(
            len(found) >= 1,
            f"a job where {what} passed your audit with no problem"
            + (
                ": judge the stall on the last epoch, report['epochs'][-1]['steady_stall'], not the first or the mean."
                if fault == "stall"
                else "."
            ),
        )
        require(len(found) == 1, f"a job where only {what} got {len(found)} problems: {found}. Report each fault once.")


@exercise("13.4", "ranks per node × (workers + 1): every rank's training process needs a core besides its workers.")
def cpus_per_task(fn: Callable[[int, int], Any]) -> None:
    """``fn(ranks_per_node, num_workers)`` is the ``--cpus-per-task`` of a one-task-per-node job."""
    attempted(fn)
    for ranks, workers in [(4, 7), (1, 0), (2, 2), (8, 3), (1, 5), (4, 0)]:
        call = f"cpus_per_task({ranks}, {workers})"
        answer = fn(ranks, workers)
        got = whole_number(answer, call, "a number of CPUs is a whole number.")
        require(
            isinstance(answer, numbers.Integral) and not isinstance(answer, bool),
            f"{call} returned {answer!r}, a {type(answer).__name__}: --cpus-per-task takes a whole number, and "
            f"sbatch refuses --cpus-per-task={answer!r}. Compute with ints (no `/`, no float()), "
            f"so that it returns {got}.",
        )
        want = ranks * (workers + 1)
        if got == want:
            continue
        if got == ranks * workers:
            raise Hint(f"{call} = {got}: that counts the workers only; each rank's training process needs a core too.")
        if got == workers + 1:
            raise Hint(
                f"{call} = {got}: that is one rank's share; the node's one task runs torchrun with all {ranks} ranks."
            )
        if got == ranks + workers:
            raise Hint(f"{call} = {got}: every rank has its own {workers} workers, so the counts multiply.")
        raise Hint(
            f"{call} = {got}, expected {want}: {ranks} rank{'s' if ranks > 1 else ''}, each 1 training process "
            f"+ {workers} worker{'s' if workers != 1 else ''}."
        )


@exercise(
    "13.5", "a Slurm script for 2 nodes × 4 GPUs with your tuned workers, the CPUs they need and the cluster's shards."
)
def slurm_script(path: Any, results: Any) -> None:
    """The script at ``path`` trains on NODES × GPUS_PER_NODE with the workers ``results`` call for."""
    attempted(path, results)
    require(
        isinstance(path, (str, os.PathLike)),
        f"pass the path of the script you wrote, got {path!r}: write_slurm_script(...) returns it.",
    )
    path = Path(path)
    require(path.is_file(), f"there is no file {path}: run the cell that writes it first.")
    require(
        path.parts[-3:-1] == ("runs", "capstone"),
        f"write the script into runs/capstone/ next to the notebook, not {path.parent}.",
    )
    text = path.read_text()
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    require(done.returncode == 0, f"bash cannot parse the script: {done.stderr.strip()[:200]}")
    workers = smallest_under_target(_validate_results(results))
    options, settings = sbatch_options(text), script_settings(text)
    require(
        options.get("nodes") == str(NODES),
        f"the job should ask for {NODES} nodes (nodes=...), got {options.get('nodes')}.",
    )
    require(
        options.get("gres") == f"gpu:{GPUS_PER_NODE}"
        and settings.get("GPUS_PER_NODE", "").endswith(f'{GPUS_PER_NODE}}}"'),
        f"the nodes have {GPUS_PER_NODE} GPUs, one rank each: gpus_per_node={GPUS_PER_NODE}.",
    )
    require(
        settings.get("WORKERS") == str(workers),
        f"the script runs {settings.get('WORKERS')} workers per rank, but your measurement calls for {workers} "
        "(the answer of 13.2): num_workers=tuned.",
    )
    want_cpus = GPUS_PER_NODE * (workers + 1)
    require(
        options.get("cpus-per-task") == str(want_cpus),
        f"--cpus-per-task is {options.get('cpus-per-task')}, expected {want_cpus}.",
    )
    require(want_cpus <= CPUS_PER_NODE, "unreachable: the nodes have enough CPUs")
    require(
        f'SHARDS="${{SHARDS:-{CLUSTER_SHARDS}}}"' in text,
        f"the shards on the cluster are at {CLUSTER_SHARDS} (shards=...); the notebook's own are in a temporary folder "
        "that the cluster cannot see.",
    )
    require(
        "CHANGE_ME" in text, "keep the account and partition placeholders (CHANGE_ME) for the cluster's own values."
    )
    staging = stage_or_stream(**CLUSTER_STAGING) == "stage"
    f = CLUSTER_STAGING
    saved = f["epochs"] * (f["shared_epoch_s"] - f["local_epoch_s"])
    require(
        ("LOCAL_SHARDS=" in text) == staging,
        f"by notebook 09's rule the copy ({f['copy_s']:g} s, once) is repaid by {f['epochs']} faster epochs "
        f"({saved:g} s saved): stage=storage.stage_or_stream(**check.CLUSTER_STAGING) == 'stage'"
        if staging
        else "by notebook 09's rule the copy is not repaid on this cluster: stage=False",
    )


# --------------------------------------------------------------------------- reading a Slurm script
def sbatch_options(text: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` options of a script (comments after them dropped)."""
    options = {}
    for line in text.splitlines():
        m = re.match(r"^#SBATCH\s+--([\w-]+)(?:[= ](\S+))?", line)
        if m:
            options[m.group(1)] = m.group(2) or ""
    return options


def script_settings(text: str) -> dict[str, str]:
    """The ``NAME=value`` assignments at the start of a script's lines, as written (``WORKERS=2``
    gives ``{"WORKERS": "2"}``; a trailing ``# comment`` is dropped)."""
    found = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Z_]+)=(\S*)", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found
