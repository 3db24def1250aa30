"""The Slurm batch script of the capstone (notebook 11): the tuned settings as a job for a cluster.

:func:`write_slurm_script` renders the settings a learner tuned in notebook 11 into a script in
the style of ``hpc/train_1node.sbatch``: one task per node runs ``torchrun``, which starts that
node's ranks of ``python -m course_lib.capstone train``; ``--cpus-per-task`` is derived from the
number of DataLoader workers (:func:`course_lib.capstone.cpus_per_task`), never the other way round.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from course_lib._support import write_atomic
from course_lib.capstone import cpus_per_task


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
) -> str:
    """A Slurm batch script that trains ``course_lib.capstone`` with these settings.

    One task per node runs torchrun (as in ``hpc/train_1node.sbatch``; with several nodes they meet
    at a c10d rendezvous on the first, as in ``hpc/train_multinode.sbatch``). ``--cpus-per-task``
    is derived from ``num_workers`` (:func:`cpus_per_task`), never the other way round: the tuned
    number of workers is what the job needs. ``shards`` is the path *on the cluster* (``$USER`` and
    other variables are expanded there). Raises ``ValueError`` naming a bad setting, e.g. more CPUs
    than ``cpus_per_node`` has.
    """
    for name, value, low in (("nodes", nodes, 1), ("gpus_per_node", gpus_per_node, 1), ("num_workers", num_workers, 0),
                             ("prefetch_factor", prefetch_factor, 1), ("batch_size", batch_size, 1), ("epochs", epochs, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    if not isinstance(shards, str) or not _SAFE.match(shards):
        raise ValueError(f"shards must be a path or brace pattern without spaces or quotes, got {shards!r}")
    if not _TIME.match(time_limit):
        raise ValueError(f"time_limit must look like HH:MM:SS or D-HH:MM:SS, got {time_limit!r}")
    if not re.fullmatch(r"[\w.-]+", job_name):
        raise ValueError(f"job_name may hold letters, digits, '.', '_' and '-' only, got {job_name!r}")
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
        head = ""
    else:
        rendezvous = ('--nnodes="$SLURM_NNODES" --rdzv-backend=c10d --rdzv-endpoint="$HEAD_NODE:$MASTER_PORT" '
                      '--rdzv-id="$SLURM_JOB_ID"')
        srun = 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1'
        head = ('# The first node hosts the rendezvous; a port derived from the job id keeps jobs sharing it apart.\n'
                'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                'MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 20000 ))}"\n')
    # the comments of the #SBATCH lines start in one column, whatever the numbers' widths
    gres_line, cpus_line = f"#SBATCH --gres=gpu:{gpus_per_node}".ljust(37), f"#SBATCH --cpus-per-task={cpus}".ljust(37)
    return f"""#!/bin/bash
# Written by course_tools.slurm.write_slurm_script (notebook 11) from the settings tuned there.
# {nodes} node(s) x {gpus_per_node} GPUs = {world} ranks; {num_workers} DataLoader workers per rank, prefetch_factor {prefetch_factor}.
# Submit from the course folder:   sbatch path/to/this/file   (notebook 11 prints where it wrote it)
#
# ---- CHANGE THESE TWO LINES for your cluster (`sacctmgr show assoc user=$USER`, `sinfo -s`).
#SBATCH --account=CHANGE_ME
#SBATCH --partition=CHANGE_ME
#
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1          # one task per node: torchrun, which starts that node's ranks itself
{gres_line}# GPUs per node = ranks per node (delete on a CPU partition)
{cpus_line}# {gpus_per_node} ranks x ({num_workers} workers + 1 training process): every worker
#                                    # needs a core of its own, or the data stall comes back
#SBATCH --hint=nomultithread         # count physical cores, not hyper-threads
#SBATCH --time={time_limit}              # each run of the job gets this much; a requeued job gets it again
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append           # a requeued job keeps its id, so its log: append to it (notebook 12)
#SBATCH --signal=B:USR1@120          # USR1 to this script about 120 s before the time limit: see the trap below
#SBATCH --requeue                    # the job may go back to the queue, and then resumes (--ckpt below)

set -euo pipefail
: "${{SLURM_JOB_ID:?submit this script with sbatch (or run it inside salloc), not with plain bash}}"

# ---- settings (each can be overridden at submission: SHARDS=/other/path sbatch ...)
SHARDS="${{SHARDS:-{shards}}}"   # written once on a login node: python -m course_lib.capstone shards --out DIR
GPUS_PER_NODE="${{GPUS_PER_NODE:-{gpus_per_node}}}"     # ranks per node; keep it equal to --gres above
WORKERS={num_workers}                           # tuned in notebook 11 for its simulated workload (9 ms decode per sample,
#                                   100 ms step); real images and a real GPU step differ: compare the stall in the
#                                   rank reports with the notebook's, and re-tune (more workers, up to the cores) if it is higher
PREFETCH_FACTOR={prefetch_factor}
CPUS_PER_TASK={cpus}                     # = the --cpus-per-task above; srun gets it again below
TRAIN_ARGS="${{TRAIN_ARGS:-"--epochs {epochs} --batch-size {batch_size}"}}"
RUNS_DIR="${{RUNS_DIR:-$PWD/runs}}"               # reports go to $RUNS_DIR/<job name>-<job id>/ (a shared file system)
COURSE_VENV="${{COURSE_VENV-$HOME/venvs/pytorch-data-course}}"
if [[ -n "$COURSE_VENV" && -f "$COURSE_VENV/bin/activate" ]]; then
    set +u; source "$COURSE_VENV/bin/activate"; set -u
else
    echo "no virtual environment at COURSE_VENV='$COURSE_VENV': using $(command -v python || echo 'no python!')"
fi

# ---- enough shards for every reader? ({world} ranks x {max(1, num_workers)} workers); fails here, with the fix, if not
python -m course_lib.capstone check --shards "$SHARDS" --ranks "$(( SLURM_NNODES * GPUS_PER_NODE ))" --workers "$WORKERS"

# ---- /dev/shm: workers hand every batch to their rank through shared memory; containers and
# some nodes allow only 64 MB, and workers then die with "Bus error". Needed: about
# ranks x workers x prefetch_factor x bytes per batch, plus slack.
shm_mb=$(df -Pm /dev/shm 2> /dev/null | awk 'NR == 2 {{print $4}}' || true)
if [[ -z "$shm_mb" ]]; then
    echo "WARNING: no /dev/shm on $(hostname): DataLoader workers cannot pass batches on Linux" >&2
elif (( shm_mb < 1024 )); then
    echo "WARNING: /dev/shm has $shm_mb MB free (under 1 GB): on 'Bus error' use fewer workers or smaller batches" >&2
fi

export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-1}}"   # one thread per training process; the workers do the CPU work
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${{rank}}]:'
RUN_DIR="$RUNS_DIR/${{SLURM_JOB_NAME:-capstone}}-$SLURM_JOB_ID"   # a requeued job keeps its id: the same folder
CKPT_DIR="$RUN_DIR/ckpt"     # saved at every epoch's end; a requeued run resumes from the last one
RANKS=$(( SLURM_NNODES * GPUS_PER_NODE ))
if (( ${{SLURM_RESTART_COUNT:-0}} == 0 )); then
    # A first run. Job ids start again at 1 on a reinstalled cluster: an earlier job's reports and
    # checkpoints here are removed, anything else stops the job (hpc/README.md)
    mkdir -p "$RUN_DIR"
    ours='^\\./(\\.?rank[0-9]+\\.json(\\.tmp-.*)?|ckpt/(\\.?latest(\\.tmp-.*)?|step[0-9]+/\\.?rank[0-9]+\\.pt(\\.tmp-.*)?))$'
    listed=$(cd "$RUN_DIR" && find . -mindepth 1 ! -type d)
    if [[ -n "$listed" ]] && grep -Evq "$ours" <<< "$listed"; then
        echo "ERROR: $RUN_DIR holds files that are not rank reports; move them away, or set RUNS_DIR" >&2
        exit 1
    elif [[ -n "$listed" ]]; then
        (cd "$RUN_DIR" && rm -rf -- ckpt rank[0-9]*.json .rank[0-9]*.tmp-*)
        echo "removed $(grep -c json <<< "$listed") rank reports an earlier job of the same name and id left in $RUN_DIR"
    fi
else
    echo "restarted ${{SLURM_RESTART_COUNT}} time(s): resuming from the last finished epoch in $CKPT_DIR"
fi

# ---- the time-limit notice (USR1), or a TERM: stop the training and requeue the job. A shard
# stream has no mid-epoch state (notebook 12), so the run resumes from its last finished epoch.
finished() {{  # every rank wrote its final report
    local rank
    for (( rank = 0; rank < RANKS; rank++ )); do [[ -f "$RUN_DIR/rank$rank.json" ]] || return 1; done
}}
wait_for() {{  # wait until process $1 has ended, whatever signals interrupt `wait`; return its status
    local status=0
    while true; do
        wait "$1" && return 0 || status=$?
        kill -0 "$1" 2> /dev/null || return "$status"
    done
}}
on_notice() {{
    trap '' USR1 TERM
    echo "== $(date '+%F %T') SIG$1 reached the batch script: the training stops"
    # SIGTERM to the step's processes (not `kill` to srun, which would SIGKILL the step)
    local step
    step=$(squeue --steps --noheader --jobs "$SLURM_JOB_ID" --format="%i %j" 2> /dev/null | awk '$2 == "train" {{print $1; exit}}') || true
    scancel --signal=TERM "${{step:-$SLURM_JOB_ID}}" 2> /dev/null || true
    wait_for "$srun_pid" || true
    finished && return 0   # it had just finished: on to the check
    local state
    state=$(scontrol show job -o "$SLURM_JOB_ID" 2> /dev/null | grep -o 'JobState=[A-Z_]*') || true
    if [[ "$state" != JobState=RUNNING ]]; then   # scancel, preemption, the time limit itself: let it end
        echo "== Slurm is ending this job (${{state:-JobState unknown}}): not requeued; to go on: scontrol requeue $SLURM_JOB_ID"
        exit 0
    fi
    echo "== scontrol requeue $SLURM_JOB_ID (it starts again in a few minutes, with the same id and folder)"
    scontrol requeue Incomplete "$SLURM_JOB_ID" || {{ echo "ERROR: could not requeue: scontrol requeue $SLURM_JOB_ID" >&2; exit 1; }}
    exit 0
}}
{head}
# ---- train; every rank writes rankN.json with its data stall: compare it with the notebook's.
# --cpus-per-task is repeated for srun because some Slurm versions no longer pass it on. In the
# background, because bash runs a trap only between commands; "train" names the step for the trap.
{srun} --job-name=train --cpus-per-task="${{SLURM_CPUS_PER_TASK:-$CPUS_PER_TASK}}" \\
    torchrun {rendezvous} --nproc-per-node="$GPUS_PER_NODE" --tee=3 \\
    -m course_lib.capstone train --shards "$SHARDS" --workers "$WORKERS" --prefetch-factor "$PREFETCH_FACTOR" \\
        --report "$RUN_DIR" --ckpt "$CKPT_DIR" $TRAIN_ARGS &   # $TRAIN_ARGS unquoted on purpose: several options
srun_pid=$!
trap 'on_notice USR1' USR1
trap 'on_notice TERM' TERM
status=0
wait_for "$srun_pid" || status=$?
trap '' USR1
trap - TERM
if (( status != 0 )) && ! finished; then
    echo "ERROR: the training step failed (exit status $status)" >&2
    exit "$status"
fi

python - "$RUN_DIR" << 'EOF'
import sys
from course_lib.distributed import read_reports

reports = read_reports(sys.argv[1])
stalls = [r["epochs"][-1]["steady_stall"] for r in reports]
print(f"check: {{len(reports)}} rank reports, {{sorted({{r['epochs'][-1]['batches'] for r in reports}})}} batches per rank, "
      f"data stall {{min(stalls):.0%}} to {{max(stalls):.0%}}, weights identical: {{len({{r['weights_sha256'] for r in reports}}) == 1}}")
even = len({{r["epochs"][-1]["batches"] for r in reports}}) == 1 and len({{r["weights_sha256"] for r in reports}}) == 1
sys.exit(0 if even and len(reports) == reports[0]["world_size"] else 1)
EOF
"""


def write_slurm_script(path: str | os.PathLike[str], **settings: Any) -> Path:
    """Render the script (see :func:`render_slurm_script`) and write it to ``path``, creating its
    folder; written to a temporary name first, so a reader never finds half a script."""
    text = render_slurm_script(**settings)
    path = Path(path)
    if path.suffix != ".sbatch":
        raise ValueError(f"name the script *.sbatch, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    path.chmod(0o755)
    return path


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
