"""Checks for notebook 10 (the capstone).

The measurements differ from machine to machine, so the checks never compare with stored numbers:
they recompute the right answer from the learner's own measurement (as 04.4 does) and parse the
Slurm script the learner wrote.
"""

from __future__ import annotations

import numbers
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

from course_tools.slurm import sbatch_options, script_settings

from ..capstone import DECODE_MS, STALL_TARGET, STEP_MS
from ..instrument import EpochRecord
from ._core import Hint, attempted, exercise, require, whole_number

#: Exercise 10.3's cluster: nodes, GPUs per node, CPUs per node, and where the shards are.
NODES, GPUS_PER_NODE, CPUS_PER_NODE = 2, 4, 32
CLUSTER_SHARDS = "/scratch/$USER/course-shards"


def _validate_results(results: Any) -> dict[int, EpochRecord]:
    """``results`` is a sweep over num_workers measured with the capstone's workload."""
    require(
        isinstance(results, dict) and results and all(isinstance(r, EpochRecord) for r in results.values()),
        "results should be a dict num_workers -> EpochRecord, as capstone.sweep(urls, 'num_workers', [...]) returns.",
    )
    require(all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in results),
            "the keys of results should be numbers of workers: sweep over 'num_workers'.")
    require(all(r.num_workers == k for k, r in results.items()),
            "each key of results should be the num_workers its record was measured with.")
    for k, r in results.items():
        decode, step = r.settings.get("decode_ms"), r.settings.get("step_ms")
        require(decode == DECODE_MS and step == STEP_MS,
                f"num_workers={k} was measured with decode_ms={decode}, step_ms={step}: measure every setting with the "
                f"capstone's workload (decode_ms={DECODE_MS}, step_ms={STEP_MS}, the defaults of capstone.measure).")
        require(len(r.batches) >= 8, f"num_workers={k} was measured over {len(r.batches)} batches: use at least 8.")
    require(len({r.settings.get("batch_size") for r in results.values()}) == 1, "measure every setting with the same batch size.")
    return results


def smallest_under_target(results: dict[int, EpochRecord], target: float = STALL_TARGET) -> int | None:
    """The fewest workers whose measured steady stall is under ``target``, if all smaller ones were measured."""
    for workers in sorted(results):
        if results[workers].steady_stall_fraction < target:
            return workers
    return None


@exercise("10.1", f"the fewest workers that keep the training loop waiting under {STALL_TARGET * 100:.0f} % of the time, "
                  "from your own measurement.")
def tuned_workers(answer: Any, results: Any) -> None:
    """``answer`` is the smallest num_workers in ``results`` with a steady stall under the target."""
    attempted(answer, results)
    results = _validate_results(results)
    require(isinstance(answer, numbers.Integral) and not isinstance(answer, bool),
            f"answer should be a number of workers (an int), got {answer!r}.")
    require(answer in results, f"you did not measure num_workers={answer}: include it in the sweep.")
    stall = results[answer].steady_stall_fraction
    require(stall < STALL_TARGET, f"with {answer} workers the loop still waits {stall:.0%} of the time after the first "
                                  f"batch (steady_stall_fraction), above the {STALL_TARGET * 100:.0f} % target: try more.")
    missing = [w for w in range(answer) if w not in results]
    require(not missing, f"measure every smaller setting too ({', '.join(map(str, missing))}) to be sure {answer} is the fewest.")
    best = smallest_under_target(results)
    require(best == answer, f"num_workers={best} already stays under {STALL_TARGET * 100:.0f} % "
                            f"({results[best].steady_stall_fraction:.0%}): each extra worker costs a core, pick the fewest.")


@exercise("10.2", "ranks per node × (workers + 1): every rank's training process needs a core besides its workers.")
def cpus_per_task(fn: Callable[[int, int], Any]) -> None:
    """``fn(ranks_per_node, num_workers)`` is the ``--cpus-per-task`` of a one-task-per-node job."""
    attempted(fn)
    for ranks, workers in [(4, 7), (1, 0), (2, 2), (8, 3), (1, 5), (4, 0)]:
        call = f"cpus_per_task({ranks}, {workers})"
        got = whole_number(fn(ranks, workers), call, "a number of CPUs is a whole number.")
        want = ranks * (workers + 1)
        if got == want:
            continue
        if got == ranks * workers:
            raise Hint(f"{call} = {got}: that counts the workers only; each rank's training process needs a core too.")
        if got == workers + 1:
            raise Hint(f"{call} = {got}: that is one rank's share; the node's one task runs torchrun with all {ranks} ranks.")
        if got == ranks + workers:
            raise Hint(f"{call} = {got}: every rank has its own {workers} workers, so the counts multiply.")
        raise Hint(f"{call} = {got}, expected {want}: {ranks} rank{'s' if ranks > 1 else ''}, each 1 training process "
                   f"+ {workers} worker{'s' if workers != 1 else ''}.")


@exercise("10.3", "a Slurm script for 2 nodes × 4 GPUs with your tuned workers, the CPUs they need and the cluster's shards.")
def slurm_script(path: Any, results: Any) -> None:
    """The script at ``path`` trains on NODES × GPUS_PER_NODE with the workers ``results`` call for."""
    attempted(path, results)
    require(isinstance(path, (str, os.PathLike)), f"pass the path of the script you wrote, got {path!r}: "
                                                  "write_slurm_script(...) returns it.")
    path = Path(path)
    require(path.is_file(), f"there is no file {path}: run the cell that writes it first.")
    require(path.parts[-3:-1] == ("runs", "capstone"), f"write the script into runs/capstone/ next to the notebook, not {path.parent}.")
    text = path.read_text()
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    require(done.returncode == 0, f"bash cannot parse the script: {done.stderr.strip()[:200]}")
    workers = smallest_under_target(_validate_results(results))
    require(workers is not None, f"no setting in results stays under {STALL_TARGET * 100:.0f} %: finish exercise 10.1 first.")
    options, settings = sbatch_options(text), script_settings(text)
    require(options.get("nodes") == str(NODES), f"the job should ask for {NODES} nodes (nodes=...), got {options.get('nodes')}.")
    require(options.get("gres") == f"gpu:{GPUS_PER_NODE}" and settings.get("GPUS_PER_NODE", "").endswith(f"{GPUS_PER_NODE}}}\""),
            f"the nodes have {GPUS_PER_NODE} GPUs, one rank each: gpus_per_node={GPUS_PER_NODE}.")
    require(settings.get("WORKERS") == str(workers),
            f"the script runs {settings.get('WORKERS')} workers per rank, but your measurement calls for {workers} "
            "(the answer of 10.1): num_workers=tuned.")
    want_cpus = GPUS_PER_NODE * (workers + 1)
    require(options.get("cpus-per-task") == str(want_cpus),
            f"--cpus-per-task is {options.get('cpus-per-task')}, expected {want_cpus}.")
    require(want_cpus <= CPUS_PER_NODE, "unreachable: the nodes have enough CPUs")
    require(f'SHARDS="${{SHARDS:-{CLUSTER_SHARDS}}}"' in text,
            f"the shards on the cluster are at {CLUSTER_SHARDS} (shards=...); the notebook's own are in a temporary folder "
            "that the cluster cannot see.")
    require("CHANGE_ME" in text, "keep the account and partition placeholders (CHANGE_ME) for the cluster's own values.")
