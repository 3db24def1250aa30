"""Notebook 13, section 5: the capstone's Slurm script, written from the settings tuned in the notebook.

:func:`write_slurm_script` fills ``templates/capstone.sbatch`` (a bash script with ``@NAME@`` placeholders) with
the settings a learner tuned, in the style of ``hpc/train_1node.sbatch``: one task per node runs ``torchrun``,
which starts that node's ranks of ``python -m course_lib.capstone train``; ``--cpus-per-task`` is derived from
the number of DataLoader workers (:func:`course_lib.capstone.cpus_per_task`), never the other way round. The job
requeues itself before its time limit and resumes at its last finished epoch (notebook 14).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .support import write_atomic
from .capstone import cpus_per_task

__all__ = ["render_slurm_script", "write_slurm_script"]

TEMPLATE = Path(__file__).with_name("templates") / "capstone.sbatch"
_TIME = re.compile(r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$")
_SAFE = re.compile(r"^[\w$/.{}\-~+:,]+$")  # a shard path or pattern: no quotes, spaces or newlines


def render_slurm_script(
    *,
    shards: str,
    num_workers: int,
    prefetch_factor: int = 2,
    nodes: int = 1,
    gpus_per_node: int = 4,
    cpus_per_node: int | None = None,
    batch_size: int = 64,
    epochs: int = 2,
    time_limit: str = "00:20:00",
    job_name: str = "course-capstone",
    stage: bool = False,
    stage_why: str = "",
) -> str:
    """Notebook 13, section 5: a Slurm batch script that trains ``course_lib.capstone`` with these settings.

    One task per node runs torchrun (as in ``hpc/train_1node.sbatch``; with several nodes they meet
    at a c10d rendezvous on the first, as in ``hpc/train_multinode.sbatch``). ``--cpus-per-task``
    is derived from ``num_workers`` (:func:`cpus_per_task`), never the other way round: the tuned
    number of workers is what the job needs. ``shards`` is the path *on the cluster* (``$USER`` and
    other variables are expanded there). ``stage=True`` copies the shards to each node's local disk before
    training (timed, printed with ``stage_why``, the reason: notebook 09's rule, ``storage.stage_or_stream``), reads
    them there, and removes the copy when the job ends. Raises ``ValueError`` naming a bad setting, e.g. more CPUs
    than ``cpus_per_node`` has.
    """
    for name, value, low in (
        ("nodes", nodes, 1),
        ("gpus_per_node", gpus_per_node, 1),
        ("num_workers", num_workers, 0),
        ("prefetch_factor", prefetch_factor, 1),
        ("batch_size", batch_size, 1),
        ("epochs", epochs, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    if not isinstance(shards, str) or not _SAFE.match(shards):
        raise ValueError(f"shards must be a path or brace pattern without spaces or quotes, got {shards!r}")
    if not _TIME.match(time_limit):
        raise ValueError(f"time_limit must look like HH:MM:SS or D-HH:MM:SS, got {time_limit!r}")
    if not re.fullmatch(r"[\w.-]+", job_name):
        raise ValueError(f"job_name may hold letters, digits, '.', '_' and '-' only, got {job_name!r}")
    if not isinstance(stage, bool):
        raise ValueError(f"stage must be True or False, got {stage!r}")
    if not isinstance(stage_why, str) or not re.fullmatch(r"[\w .,:;()/+=-]*", stage_why):
        raise ValueError(
            f"stage_why is one line of plain text (letters, digits, spaces and .,:;()/+=-: the script prints it), "
            f"got {stage_why!r}"
        )
    cpus = cpus_per_task(gpus_per_node, num_workers)
    if cpus_per_node is not None and cpus > cpus_per_node:
        most = max(0, cpus_per_node // gpus_per_node - 1)
        raise ValueError(
            f"{gpus_per_node} ranks per node × ({num_workers} workers + 1 training process) = {cpus} CPUs, but a node "
            f"has {cpus_per_node}: use at most {most} workers per rank, or fewer ranks per node"
        )
    world = nodes * gpus_per_node
    if nodes == 1:
        rendezvous = "--standalone"
        srun = "srun --ntasks=1"
        on_each_node = ""  # the batch script runs on the one node
        head = ""
    else:
        rendezvous = (
            '--nnodes="$SLURM_NNODES" --rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:$MASTER_PORT" '
            '--rdzv-id="$SLURM_JOB_ID"'
        )
        srun = 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1'
        on_each_node = 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 '  # the batch script runs on the first node
        head = (
            "# The first node hosts the rendezvous; a port derived from the job id keeps jobs sharing it apart.\n"
            'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            'MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 20000 ))}"\n'
        )
    # the comments of the #SBATCH lines start in one column, whatever the numbers' widths
    gres_line, cpus_line = f"#SBATCH --gres=gpu:{gpus_per_node}".ljust(37), f"#SBATCH --cpus-per-task={cpus}".ljust(37)
    why = stage_why or "set by hand"
    if stage:
        staging = (
            f"# ---- staging ({why}): the shards copied to each node's local disk, timed, and read from there.\n"
            "# Removed when the job ends; after scancel or the time limit the OTHER nodes' copies stay (no new job step\n"
            "# can start then): a per-job $SLURM_TMPDIR or $TMPDIR, which the site wipes, is the clean place.\n"
            'LOCAL_SHARDS="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/course-shards-$SLURM_JOB_ID"\n'
            "copy_started=$(date +%s%N)\n"
            f'{on_each_node}bash -c \'part="$0.part-$(hostname)"; mkdir -p "$part" && cp -r "$1"/. "$part"/ &&\n'
            '    { mv -T "$part" "$0" 2> /dev/null || rm -rf "$part"; }\' "$LOCAL_SHARDS" "$SHARDS"\n'
            "copy_ms=$(( ($(date +%s%N) - copy_started) / 1000000 ))\n"
            f'echo "staging ({why}): $(du -sm "$LOCAL_SHARDS" | cut -f1) MB copied to the node\'s local disk in " \\\n'
            '     "$copy_ms ms; it pays when the epochs read from there save more than that (the rank reports" \\\n'
            '     "give the epoch times: compare them with an unstaged run)"\n'
            'SHARDS="$LOCAL_SHARDS"\n'
        )
    else:
        staging = f"# ---- no staging ({why}): the shards are read where they are, on the shared file system\n"
    values = {
        "STAGE": staging,
        "LOCAL_SHARDS": ' "${LOCAL_SHARDS:-}"' if stage else "",
        "LOCAL_SHARDS_TEXT": " ${LOCAL_SHARDS:-}" if stage else "",
        "JOB_NAME": job_name,
        "NODES": nodes,
        "GPUS_PER_NODE": gpus_per_node,
        "WORLD": world,
        "CPUS": cpus,
        "NUM_WORKERS": num_workers,
        "READERS_PER_RANK": max(1, num_workers),
        "PREFETCH_FACTOR": prefetch_factor,
        "TIME_LIMIT": time_limit,
        "SHARDS": shards,
        "EPOCHS": epochs,
        "BATCH_SIZE": batch_size,
        "GRES_LINE": gres_line,
        "CPUS_LINE": cpus_line,
        "HEAD": head,
        "SRUN": srun,
        "RENDEZVOUS": rendezvous,
        "ON_EACH_NODE": on_each_node,
    }
    return _fill_template(TEMPLATE.read_text(), values)


def _fill_template(text: str, values: dict[str, Any]) -> str:
    """Replace every ``@NAME@`` in ``text`` by ``values[NAME]``; a placeholder without a value, or a value without
    a placeholder, is an error (a template and its code out of step)."""
    names = set(re.findall(r"@([A-Z_]+)@", text))
    if names != set(values):
        raise ValueError(f"the template's placeholders {sorted(names)} and the values {sorted(values)} differ")
    return re.sub(r"@([A-Z_]+)@", lambda m: str(values[m.group(1)]), text)


def write_slurm_script(path: str | os.PathLike[str], **settings: Any) -> Path:
    """Notebook 13, section 5: render the script (see :func:`render_slurm_script`) and write it to ``path``,
    creating its folder; written to a temporary name first, so a reader never finds half a script."""
    text = render_slurm_script(**settings)
    path = Path(path)
    if path.suffix != ".sbatch":
        raise ValueError(f"name the script *.sbatch, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    path.chmod(0o755)
    return path
