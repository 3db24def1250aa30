"""The Slurm job scripts in hpc/: well-formed, and their failure paths against a fake Slurm.

The scripts' successful runs are the Slurm stage's (tests/test_slurm.py: a real cluster on this
machine, one and two nodes). Here a fake ``srun`` and ``scontrol show hostnames`` go first on PATH,
the variables sbatch would set are set by hand, and ``bash hpc/X.sbatch`` shows how a job stops
early without data, when training fails, outside sbatch, and without hpc/common.sh (the steps all the scripts
share), and how train_resumable.sbatch's trap answers the time-limit notice (a fake training step, a scontrol
that records its arguments). hpc/class_sbatch, which submits them with a learner's share for a class, runs against a
fake ``sbatch`` that records what it was given.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.jobs import free_ports

pytestmark = pytest.mark.full


ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "hpc").glob("*.sbatch"))
CLASS_SBATCH = ROOT / "hpc" / "class_sbatch"  # a script's class variant (hpc/README.md, "For a class")
COMMON = ROOT / "hpc" / "common.sh"  # sourced by every script: the steps they share
JOB_ID = "4242"
LIMIT = 40  # images of the tiny set's 80 used for training: 20 per rank
TRAIN_ARGS = f"--limit {LIMIT} --epochs 1 --batch-size 8 --timeout 30 --device cpu"

FAKE_SRUN = r'''"""Fake srun for one node: start the step's tasks as local processes, wait for them all."""
import os, subprocess, sys, time

args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    arg = args.pop(0)
    if arg == "--":
        break
    if arg == "--label":
        opts[arg] = "1"
    elif arg.startswith("--") and "=" in arg:
        name, value = arg.split("=", 1)
        opts[name] = value
    else:
        sys.exit(f"fake srun: option {arg!r} is not emulated (write --name=value)")
if not args:
    sys.exit("fake srun: no command")
env = os.environ
nnodes = int(env.get("SLURM_NNODES", "1"))
if nnodes != 1:
    sys.exit("fake srun: emulates one node only")
if "--ntasks" in opts:
    ntasks = int(opts["--ntasks"])
elif "--ntasks-per-node" in opts:
    ntasks = int(opts["--ntasks-per-node"]) * nnodes
else:
    ntasks = int(env["SLURM_NTASKS"])
with open(env["FAKE_SLURM_LOG"], "a") as log:
    log.write(f"srun ntasks={ntasks} {' '.join(sys.argv[1:])}\n")
procs = []
for task in range(ntasks):
    task_env = dict(
        env, SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_NODEID="0", SLURM_NTASKS=str(ntasks),
        SLURM_STEP_NUM_TASKS=str(ntasks), SLURM_NNODES=str(nnodes), SLURM_JOB_ID=env["SLURM_JOB_ID"],
        SLURM_JOB_NODELIST=env["SLURM_JOB_NODELIST"],
        SLURM_CPUS_PER_TASK=opts.get("--cpus-per-task", env.get("SLURM_CPUS_PER_TASK", "1")),
    )
    procs.append(subprocess.Popen(args, env=task_env))
kill_on_bad_exit = opts.get("--kill-on-bad-exit") == "1"
while any(p.poll() is None for p in procs):
    if kill_on_bad_exit and any(p.returncode not in (None, 0) for p in procs):
        for p in procs:
            if p.poll() is None:
                p.terminate()
    time.sleep(0.05)
sys.exit(0 if all(p.returncode == 0 for p in procs) else 1)
'''

FAKE_SCONTROL = r'''"""Fake scontrol: only `scontrol show hostnames [LIST]`, for plain comma-separated lists."""
import os, sys

if sys.argv[1:3] != ["show", "hostnames"]:
    sys.exit(f"fake scontrol: {' '.join(sys.argv[1:])} is not emulated")
nodelist = sys.argv[3] if len(sys.argv) > 3 else os.environ["SLURM_JOB_NODELIST"]
if "[" in nodelist:
    sys.exit("fake scontrol: bracketed node lists are not emulated")
print("\n".join(nodelist.split(",")))
'''


def clean_env() -> dict[str, str]:
    """This process's environment without anything that would make the child think it is in a job."""
    drop = re.compile(
        r"^(SLURM_|SRUN_|SBATCH_|TORCHELASTIC_|COURSE_)|^(RANK|LOCAL_RANK|WORLD_SIZE|GROUP_RANK|"
        r"LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|GPUS_PER_NODE|DATA_SIZE|STAGE_DATA|TRAIN_ARGS|"
        r"RUNS_DIR|VIRTUAL_ENV)$"
    )
    env = {k: v for k, v in os.environ.items() if not drop.match(k)}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo on the loopback interface: nothing leaves the machine
    return env


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """subprocess.run with a timeout that also stops grandchildren (torchrun, ranks, workers)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s\n--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """A folder for PATH with fake srun and scontrol, and python/torchrun for this interpreter."""
    bin_dir, src_dir = tmp_path / "fake-slurm-bin", tmp_path / "fake-slurm-src"
    bin_dir.mkdir()
    src_dir.mkdir()
    (src_dir / "srun.py").write_text(FAKE_SRUN)
    (src_dir / "scontrol.py").write_text(FAKE_SCONTROL)
    wrappers = {  # sh wrappers rather than "#!<python>" lines, which break on long or odd paths
        "srun": f'exec "{sys.executable}" "{src_dir / "srun.py"}" "$@"',
        "scontrol": f'exec "{sys.executable}" "{src_dir / "scontrol.py"}" "$@"',
        # found when no venv is activated: the interpreter running these tests, under both names
        "python": f'exec "{sys.executable}" "$@"',
        "torchrun": f'exec "{sys.executable}" -m torch.distributed.run "$@"',
    }
    for name, line in wrappers.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def job_env(
    tmp_path: Path, fake_bin: Path, data_root: Path, script: str, ntasks_per_node: int, cpus: int
) -> dict[str, str]:
    """What sbatch would give the batch script for a one-node job, plus the scripts' settings."""
    env = clean_env()
    env.update(
        PATH=f"{fake_bin}{os.pathsep}{env.get('PATH', '')}",
        FAKE_SLURM_LOG=str(tmp_path / "srun.log"),
        SLURM_JOB_ID=JOB_ID,
        SLURM_JOB_NAME=script,
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST="127.0.0.1",
        SLURM_NTASKS=str(ntasks_per_node),
        SLURM_NTASKS_PER_NODE=str(ntasks_per_node),
        SLURM_CPUS_PER_TASK=str(cpus),
        SLURM_SUBMIT_DIR=str(ROOT),
        SLURM_TMPDIR=str(tmp_path / "node-local"),
        COURSE_DATA_DIR=str(data_root),
        DATA_SIZE="tiny",
        GPUS_PER_NODE="2",
        TRAIN_ARGS=TRAIN_ARGS,
        RUNS_DIR=str(tmp_path / "runs"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_ports()[0]),
    )
    (tmp_path / "node-local").mkdir()
    (tmp_path / "srun.log").touch()
    return env


# --------------------------------------------------------------------------- the scripts as text


def _code(text: str) -> list[str]:
    """The lines of a bash file that are not blank and not comments, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _common_functions() -> list[str]:
    return re.findall(r"^(\w+)\(\) \{", COMMON.read_text(), re.M)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_well_formed(script: Path) -> None:
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    assert text.startswith("#!/bin/bash\n")
    lines = text.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    assert "#SBATCH --account=CHANGE_ME" in sbatch and "#SBATCH --partition=CHANGE_ME" in sbatch
    assert "CHANGE THESE TWO LINES" in text
    for option in (
        "--nodes=",
        "--ntasks-per-node=",
        "--time=",
        "--cpus-per-task=",
        "--gres=gpu:",
        "--output=",
        "--hint=nomultithread",
    ):
        assert any(line.split()[1].startswith(option) for line in sbatch), option
    # sbatch stops reading #SBATCH lines at the first command: all must come before it
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    # The steps every job shares come from hpc/common.sh, found in the folder the job was submitted from (sbatch
    # runs a copy of the script from its spool folder), with an error naming the path when it is not there.
    code = _code(text)
    sourcing = [
        'COMMON="${SLURM_SUBMIT_DIR:-$PWD}/hpc/common.sh"',
        f'[[ -f "$COMMON" ]] || {{ echo "ERROR: no $COMMON: submit from the course folder (sbatch hpc/{script.name})" '
        ">&2; exit 1; }",
        'source "$COMMON"',
    ]
    at = code.index(sourcing[0])
    assert code[at : at + 3] == sourcing, code[at : at + 3]
    calls = [(i, line.split()[0]) for i, line in enumerate(code) if line.split()[0] in _common_functions()]
    train = next(i for i, line in enumerate(code) if line.startswith("srun "))
    assert [name for _, name in calls[:3]] == ["course_python", "stage_data", "check_shm"], calls
    assert at < calls[0][0] and calls[2][0] < train, calls  # after sourcing, before training
    assert "show_versions" in [name for _, name in calls]
    # the rank reports are checked: by check_reports, or (train_resumable.sbatch: steps too) by the script itself
    assert code[-2:] == ['check_reports "$RUN_DIR"', "echo \"== done $(date '+%F %T'); reports in $RUN_DIR\""] or (
        "read_reports" in text and "--ckpt" in text
    ), code[-2:]
    job = text + COMMON.read_text()  # what the job runs
    for needed in (
        "set -euo pipefail",
        "course_lib.train",
        "COURSE_DATA_DIR",
        "COURSE_VENV",
        "SLURM_CPUS_PER_TASK",
        "/dev/shm",
        "SLURM_TMPDIR",
        "--report",
        "read_reports",
        "course_lib verify",
    ):
        assert needed in job, needed
    for needed in ("set -euo pipefail", "SLURM_CPUS_PER_TASK", "--report", "$COURSE_DATA_DIR", "$RUNS_DIR"):
        assert needed in text, needed  # in the script itself


def test_common_file_says_what_it_does(tmp_path: Path) -> None:
    """hpc/common.sh is sourced, never run: valid bash, and a header naming each of its functions and each
    setting it gives a default."""
    text = COMMON.read_text()
    subprocess.run(["bash", "-n", str(COMMON)], check=True, timeout=30)
    header = text.split("\n\n", 1)[0]
    assert header.startswith("# hpc/common.sh: ") and all(line.startswith("#") for line in header.splitlines())
    functions = _common_functions()
    assert {"course_python", "stage_data", "check_shm", "clean_run_dir", "show_versions", "check_reports"} <= set(
        functions
    )
    for name in functions:
        assert re.search(rf"^#\s+{name}\b", header, re.M), f"the header does not describe {name}"
    defaults = re.findall(r'^(?:export )?([A-Z_]+)="\$\{\1:?-', text, re.M)
    assert set(defaults) == {
        "COURSE_DATA_DIR",
        "DATA_SIZE",
        "STAGE_DATA",
        "RUNS_DIR",
        "COURSE_VENV",
        "OMP_NUM_THREADS",
        "TRAIN_DEVICE",
    }
    for name in defaults:
        assert re.search(rf"^#\s+{name}\b", header, re.M), f"the header does not list the setting {name}"


def test_sourcing_the_common_file_sets_defaults_and_runs_nothing(tmp_path: Path) -> None:
    """Sourcing it (under the scripts' set -euo pipefail) only fills in the settings not given at submission:
    with no program on PATH, anything it ran would fail."""
    show = (
        'set -euo pipefail; source "$1"; for v in COURSE_DATA_DIR DATA_SIZE STAGE_DATA RUNS_DIR COURSE_VENV '
        'OMP_NUM_THREADS TRAIN_DEVICE; do echo "$v=${!v}"; done; for v in COURSE_DATA_DIR OMP_NUM_THREADS; do d=$(declare -p $v); echo "${d:0:10}"; done'
    )
    nothing = tmp_path / "empty-bin"
    nothing.mkdir()
    base = {"HOME": str(tmp_path / "home"), "PATH": str(nothing)}
    given = dict(
        COURSE_DATA_DIR="/data",
        DATA_SIZE="workshop",
        STAGE_DATA="1",
        RUNS_DIR="/runs",
        COURSE_VENV="",
        OMP_NUM_THREADS="4",
        TRAIN_DEVICE="cpu",
    )
    for env, expected in [
        (
            base,
            dict(
                COURSE_DATA_DIR=f"{tmp_path}/home/.cache/pytorch-data-course",
                DATA_SIZE="small",
                STAGE_DATA="0",
                RUNS_DIR=f"{tmp_path}/runs",
                COURSE_VENV=f"{tmp_path}/home/venvs/pytorch-data-course",
                OMP_NUM_THREADS="1",
                TRAIN_DEVICE="auto",
            ),
        ),
        ({**base, **given}, given),  # given at submission: kept (COURSE_VENV= empty included)
    ]:
        done = subprocess.run(
            ["/bin/bash", "-c", show, "bash", str(COMMON)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        exported = ["declare -x"] * 2  # the two settings python reads itself
        assert done.stdout.splitlines() == [f"{k}={v}" for k, v in expected.items()] + exported, done.stdout


# --------------------------------------------------------------------------- the scripts, run


def test_script_stops_early_without_data(tmp_path, fake_slurm) -> None:
    """Run as sbatch runs it: a copy in a spool folder, started in the submit folder (hpc/common.sh is found there)."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    env = job_env(tmp_path, fake_slurm, empty, "train_1node", 1, 4)
    env["COURSE_VENV"] = ""
    spool = tmp_path / "spool" / f"job{JOB_ID}"
    spool.mkdir(parents=True)
    (spool / "slurm_script").write_text((ROOT / "hpc" / "train_1node.sbatch").read_text())
    result = run_bounded(["bash", str(spool / "slurm_script")], env, timeout=60)
    assert result.returncode != 0
    assert "course_lib prepare --size tiny" in result.stderr, result.stderr
    assert (tmp_path / "srun.log").read_text() == ""  # no job step was started


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_without_the_common_file_says_where_it_looked(tmp_path, fake_slurm, script: Path) -> None:
    """Submitted from another folder than the course's: hpc/common.sh is not there, and the job stops at once."""
    env = job_env(tmp_path, fake_slurm, tmp_path, script.stem, 1, 2)
    env.update(SLURM_SUBMIT_DIR=str(tmp_path), COURSE_VENV="")
    result = run_bounded(["bash", str(script)], env, timeout=30, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == (
        f"ERROR: no {tmp_path}/hpc/common.sh: submit from the course folder (sbatch hpc/{script.name})\n"
    ), result.stderr
    assert result.stdout == "" and (tmp_path / "srun.log").read_text() == ""


def test_script_fails_when_training_fails(tmp_path, fake_slurm, tiny_root) -> None:
    env = job_env(tmp_path, fake_slurm, tiny_root, "train_tasks", 2, 2)
    env.update(COURSE_VENV="", TRAIN_ARGS="--epochs 0")  # every rank stops at once with a usage error
    result = run_bounded(["bash", str(ROOT / "hpc" / "train_tasks.sbatch")], env, timeout=60)
    assert result.returncode != 0
    assert "--epochs must be at least 1" in result.stderr, result.stderr
    assert "check:" not in result.stdout and "== done" not in result.stdout  # set -e stopped the job there


def test_script_refuses_plain_bash(tmp_path) -> None:
    result = run_bounded(["bash", str(ROOT / "hpc" / "train_1node.sbatch")], clean_env(), timeout=30)
    assert result.returncode != 0 and "submit this script with sbatch" in result.stderr


# --------------------------------------------------------------------------- train_resumable.sbatch's trap

# The training step, faked: what `srun ... torchrun ... -m course_lib.resume` does as the batch script sees it. It
# writes a first checkpoint, then waits. On SIGTERM (which the fake scancel sends) it exits 1, as torchrun does once
# its ranks have saved; FAKE_STEP=finish-on-term writes the ranks' final reports first (the training had ended when
# the notice came), FAKE_STEP=fail exits 1 at once, without a signal.
FAKE_STEP = r'''"""Fake srun running course_lib.resume under torchrun: see tests/test_hpc.py."""
import json, os, signal, sys, time

args, log = sys.argv[1:], os.environ["FAKE_SLURM_LOG"]
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
note("srun " + " ".join(args))
ckpt, report = args[args.index("--ckpt") + 1], args[args.index("--report") + 1]
ranks = int(next(a.split("=", 1)[1] for a in args if a.startswith("--nproc-per-node=")))

def finish():
    for rank in range(ranks):  # 2 epochs of 2 steps of 2 samples, 4 samples over the ranks
        with open(os.path.join(report, f"rank{rank}.steps.jsonl"), "a") as f:
            for step in range(1, 5):
                epoch = (step - 1) // 2
                f.write(json.dumps({"run": 0, "epoch": epoch, "step": step,
                                    "indices": [rank + ranks * ((step - 1) % 2)]}) + "\n")
        with open(os.path.join(report, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "step": 4, "weights_sha256": "same"}, f)

def on_term(signum, frame):
    note("step got SIGTERM")
    if os.environ["FAKE_STEP"] == "finish-on-term":
        finish()
    sys.exit(1)  # torchrun's exit status after it forwarded the signal

signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(os.environ["FAKE_SLURM_DIR"], "step.pid"), "w") as f:
    f.write(str(os.getpid()))
if os.environ["FAKE_STEP"] == "fail":
    sys.exit(1)
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, "latest"), "w") as f:
    f.write("2\n")
time.sleep(20)
note("step: no signal in 20 s")
sys.exit(3)
'''
FAKE_JOB_COMMANDS = {  # sh: what the trap calls, recorded in FAKE_SLURM_LOG
    "squeue": 'echo "squeue $*" >> "$FAKE_SLURM_LOG"; echo "$SLURM_JOB_ID.0 train"; echo "$SLURM_JOB_ID.batch batch"',
    # slurmstepd signals every process of the step; here the step is one process
    "scancel": 'echo "scancel $*" >> "$FAKE_SLURM_LOG"; kill -TERM "$(cat "$FAKE_SLURM_DIR/step.pid")"',
    "scontrol": 'echo "scontrol $*" >> "$FAKE_SLURM_LOG"; '
    '[ "$1" != show ] || echo "JobId=$4 JobName=x JobState=${FAKE_JOB_STATE:-RUNNING} Reason=None"',
}


@pytest.fixture
def resumable_job(tmp_path: Path, fake_slurm: Path, tiny_root: Path):
    """Start hpc/train_resumable.sbatch as sbatch would, under a fake Slurm; returns (start, log path, run folder)."""
    fake = tmp_path / "fake-job-bin"
    fake.mkdir()
    (fake / "srun.py").write_text(FAKE_STEP)
    commands = dict(FAKE_JOB_COMMANDS, srun=f'exec "{sys.executable}" "{fake / "srun.py"}" "$@"')
    for name, line in commands.items():
        (fake / name).write_text(f"#!/bin/sh\n{line}\n")
        (fake / name).chmod(0o755)
    env = job_env(tmp_path, fake_slurm, tiny_root, "course-train-resumable", 1, 2)
    env.update(PATH=f"{fake}{os.pathsep}{env['PATH']}", FAKE_SLURM_DIR=str(fake), COURSE_VENV="", TRAIN_ARGS="")
    run_dir = tmp_path / "runs" / f"course-train-resumable-{JOB_ID}"
    procs = []

    def start(step: str, **more: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "hpc" / "train_resumable.sbatch")],
            cwd=ROOT,
            env=dict(env, FAKE_STEP=step, **more),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start, tmp_path / "srun.log", run_dir
    for proc in procs:  # the script and what it started (the fake step outlives a script that failed)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _finish(proc: subprocess.Popen, timeout: float = 30) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the batch script still ran after {timeout} s:\n{proc.communicate()[0]}")


def _when_checkpointed(proc: subprocess.Popen, run_dir: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "ckpt" / "latest").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no checkpoint from the fake step:\n{_finish(proc)}")
        time.sleep(0.05)


@pytest.mark.parametrize(
    "signum, state",
    [(signal.SIGUSR1, "RUNNING"), (signal.SIGTERM, "RUNNING"), (signal.SIGTERM, "CANCELLED")],
    ids=["USR1", "TERM", "TERM-scancel"],
)
def test_resumable_trap_stops_the_step_and_requeues(resumable_job, signum, state) -> None:
    """The notice (USR1, to the batch shell only, as --signal=B:USR1 and scancel --batch send it) or a TERM: the trap
    sends SIGTERM to the step found by name, waits for it, and requeues the job while Slurm still runs it; a job
    Slurm is ending (a scancel: every process got TERM) is left to end."""
    start, log, run_dir = resumable_job
    proc = start("wait", FAKE_JOB_STATE=state)
    _when_checkpointed(proc, run_dir)
    os.kill(proc.pid, signum)
    out = _finish(proc)
    assert proc.returncode == 0, out
    calls = log.read_text().splitlines()
    assert calls[0].startswith(
        "srun --ntasks=1 --cpus-per-task=2 --job-name=train torchrun --standalone --nproc-per-node=2"
    ), calls
    assert f"--ckpt {run_dir}/ckpt --report {run_dir} " in calls[0], calls
    requeue = ["scontrol requeue Incomplete 4242"] if state == "RUNNING" else []
    assert calls[1:] == [
        "squeue --steps --noheader --jobs 4242 --format=%i %j",
        "scancel --signal=TERM 4242.0",
        "step got SIGTERM",
        "scontrol show job -o 4242",
        *requeue,
    ], calls
    assert f"SIG{signum.name[3:]} reached the batch script" in out, out
    if requeue:
        assert "== scontrol requeue 4242" in out, out
    else:
        assert "Slurm is ending this job (JobState=CANCELLED): not requeued; to go on: scontrol requeue 4242" in out, (
            out
        )
    assert "SLURM_RESTART_COUNT=unset: a first run" in out and "check:" not in out, out


def test_resumable_trap_does_not_requeue_a_finished_training(resumable_job) -> None:
    """The notice came as the training ended: no requeue; the script checks the reports and succeeds."""
    start, log, run_dir = resumable_job
    proc = start("finish-on-term", SLURM_RESTART_COUNT="2")
    _when_checkpointed(proc, run_dir)
    os.kill(proc.pid, signal.SIGUSR1)
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert "SLURM_RESTART_COUNT=2: restarted 2 time(s)" in out and "the training had finished" in out, out
    assert (
        "check: 2 rank reports, final step 4; the steps come from runs [0]; every step once per rank: yes; samples "
        "twice in a rank's epoch: 0; samples per epoch: [4, 4]; weights identical on every rank: yes"
    ) in out, out
    assert not any(call.startswith("scontrol") for call in log.read_text().splitlines())


def test_resumable_script_fails_with_its_training(resumable_job) -> None:
    start, log, _ = resumable_job
    proc = start("fail")
    out = _finish(proc)
    assert proc.returncode == 1 and "ERROR: the training step failed (exit status 1)" in out, out
    assert "check:" not in out and log.read_text().splitlines()[1:] == [], log.read_text()


def test_resumable_script_refuses_a_folder_it_did_not_write(resumable_job) -> None:
    """A first run removes what an earlier job of the same name and id left (its checkpoint would be resumed), and
    stops at anything else; a requeued run keeps its folder."""
    start, log, run_dir = resumable_job
    (run_dir / "ckpt").mkdir(parents=True)
    (run_dir / "ckpt" / "latest").write_text("7\n")
    (run_dir / "notes.txt").write_text("not the course's\n")
    out = _finish(start("wait"))
    assert "ERROR: " in out and "holds files that are not this course's" in out, out
    assert (run_dir / "notes.txt").exists() and (run_dir / "ckpt" / "latest").exists()
    assert log.read_text() == ""  # stopped before training


@pytest.mark.parametrize("script", [s for s in SCRIPTS if "torchrun " in s.read_text()], ids=lambda p: p.name)
def test_torchrun_keeps_its_logs_in_the_jobs_folder(script: Path) -> None:
    """Without --log-dir, torchrun leaves a new $TMPDIR/torchelastic_* on the node for every run."""
    code = _code(script.read_text())
    commands = [line for line in code if line.startswith("torchrun ")]  # srun's command, on a line of its own
    assert len(commands) == 1 and '--log-dir="$TORCHRUN_LOGS"' in commands[0], commands
    assert "torchrun_logs" in [line.split()[0] for line in code], f"{script.name} does not call torchrun_logs"


def source_common(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash with hpc/common.sh as ``$1`` (the job scripts' ``source "$1"``), in ``cwd``."""
    return subprocess.run(
        ["/bin/bash", "-c", script, "bash", str(COMMON)], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_end_of_job_removes_what_the_job_made_and_nothing_else(tmp_path: Path) -> None:
    """stage_data's copy and torchrun's log folder go when the script ends, on an error too, and its exit status
    stays; folders named in the environment (LOCAL_DIR, TORCHRUN_LOGS, CLEAN_AT_EXIT) are not the job's, and stay."""
    data = tmp_path / "data"
    (data / "shapes-tiny-seed0").mkdir(parents=True)
    (data / "shapes-tiny-seed0" / "manifest.json").write_text("{}")
    node = tmp_path / "node-local"
    node.mkdir()
    foreign = {name: tmp_path / f"not-the-jobs-{name}" for name in ("LOCAL_DIR", "TORCHRUN_LOGS", "CLEAN_AT_EXIT")}
    for folder in foreign.values():
        folder.mkdir()
    env = {
        "HOME": str(tmp_path),
        "PATH": os.environ["PATH"],
        "COURSE_DATA_DIR": str(data),
        "DATA_SIZE": "tiny",
        "STAGE_DATA": "1",
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_NNODES": "1",
        "SLURM_TMPDIR": str(node),
        **{name: str(folder) for name, folder in foreign.items()},
    }
    script = (
        'set -euo pipefail; source "$1"; stage_data; torchrun_logs; '
        'mkdir -p "$TORCHRUN_LOGS/run_0/attempt_0"; echo "$TORCHRUN_LOGS"; false'
    )  # a failed step: set -e ends it
    done = source_common(script, env, tmp_path)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[-1] == f"{node}/course-torchrun-{JOB_ID}", done.stdout
    assert list(node.iterdir()) == []  # the copy of the data and torchrun's folder, both gone
    assert all(folder.is_dir() for folder in foreign.values())


@pytest.mark.parametrize("where", ["SLURM_TMPDIR", "TMPDIR", "neither"])
def test_staging_falls_back_from_slurm_tmpdir_to_tmpdir_to_tmp(tmp_path: Path, where: str) -> None:
    """$SLURM_TMPDIR is a site convention, not set by Slurm itself: stage_data copies to it where it is set, else to
    $TMPDIR, else to /tmp, and removes its copy when the script ends."""
    data = tmp_path / "data"
    (data / "shapes-tiny-seed0" / "train").mkdir(parents=True)
    (data / "shapes-tiny-seed0" / "manifest.json").write_text("{}")
    job = f"fallback{os.getpid()}{where}"
    env = {
        "HOME": str(tmp_path),
        "PATH": os.environ["PATH"],
        "COURSE_DATA_DIR": str(data),
        "DATA_SIZE": "tiny",
        "STAGE_DATA": "1",
        "SLURM_JOB_ID": job,
        "SLURM_NNODES": "1",
    }
    if where != "neither":
        env[where] = str(tmp_path / where.lower())
        (tmp_path / where.lower()).mkdir()
    script = (
        'set -euo pipefail; source "$1"; stage_data; echo "COURSE_DATA_DIR=$COURSE_DATA_DIR"; ls "$COURSE_DATA_DIR"'
    )
    done = source_common(script, env, tmp_path)
    assert done.returncode == 0, done.stderr
    base = {"SLURM_TMPDIR": tmp_path / "slurm_tmpdir", "TMPDIR": tmp_path / "tmpdir", "neither": Path("/tmp")}[where]
    assert f"COURSE_DATA_DIR={base}/course-data-{job}\n" in done.stdout
    assert "shapes-tiny-seed0" in done.stdout.splitlines()
    assert not (base / f"course-data-{job}").exists()  # removed when the script ended (its EXIT trap)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_trains_on_the_device_train_device_names(script: Path) -> None:
    """TRAIN_DEVICE (hpc/common.sh: auto; hpc/class_sbatch's CPU-only jobs: cpu) reaches the training as --device,
    before TRAIN_ARGS, whose own --device wins."""
    code = " ".join(_code(script.read_text())).replace("\\ ", "")
    assert re.search(r' --device "\$TRAIN_DEVICE" (--report "\$RUN_DIR" )?\$TRAIN_ARGS\b', code), script.name


# --------------------------------------------------------------------------- hpc/class_sbatch: a class's share

FAKE_SBATCH = (  # sh: its arguments, one a line, and the settings the job would get, then what sbatch says
    'printf "%s\\n" "$@" > "$FAKE_SBATCH_LOG"; '
    'echo "env GPUS_PER_NODE=$GPUS_PER_NODE TRAIN_DEVICE=$TRAIN_DEVICE" >> "$FAKE_SBATCH_LOG"; '
    'echo "Submitted batch job 7"'
)


def class_sbatch(
    tmp_path: Path, *args: str, cwd: Path = ROOT, **settings: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run hpc/class_sbatch with the class's ``settings`` against a fake sbatch; its result and sbatch's arguments."""
    bin_dir = tmp_path / "fake-sbatch-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\n{FAKE_SBATCH}\n")
    (bin_dir / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    log.unlink(missing_ok=True)
    env = clean_env()
    env = {k: v for k, v in env.items() if not k.startswith("CLASS_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_SBATCH_LOG=str(log), **settings)
    done = subprocess.run([str(CLASS_SBATCH), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    return done, log.read_text().splitlines() if log.exists() else []


#: What sbatch gets after --gres and --time for 4 cores: one task per node, for torchrun and the ranks it starts
#: (GPUS_PER_NODE); train_tasks.sbatch's ranks are its tasks, with the cores split between them.
ONE_TASK = ["--ntasks-per-node=1", "--cpus-per-task=4"]
CLASS_SHARES = {("train_tasks.sbatch", 0): ["--ntasks-per-node=2", "--cpus-per-task=2"]}


@pytest.mark.parametrize("gpus", [1, 0], ids=["one-GPU", "CPU-only"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_class_sbatch_gives_each_script_a_learners_share(tmp_path: Path, script: Path, gpus: int) -> None:
    """One GPU and 4 cores (the defaults), or CPU only: 2 ranks with gloo. The class's options come first, the
    learner's after them (they win), the script last; the job's settings go in the environment sbatch passes on.
    What it ran is printed, ready to copy."""
    settings = dict(CLASS_RESERVATION="pytorch-data-0512", CLASS_QOS="class", CLASS_ACCOUNT="proj42")
    if not gpus:
        settings["CLASS_GPUS"] = "0"
    done, argv = class_sbatch(tmp_path, "--mem-per-cpu=2G", "-o", "my out/%j.out", f"hpc/{script.name}", **settings)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Submitted batch job 7\n"
    ranks, device = (1, "auto") if gpus else (2, "cpu")
    options = [
        "--gres=gpu:1" if gpus else "--gres=none",
        "--time=00:15:00",
        *CLASS_SHARES.get((script.name, gpus), ONE_TASK),
        "--account=proj42",
        "--reservation=pytorch-data-0512",
        "--qos=class",
    ]
    assert argv == [
        *options,
        "--mem-per-cpu=2G",
        "-o",
        "my out/%j.out",
        f"hpc/{script.name}",
        f"env GPUS_PER_NODE={ranks} TRAIN_DEVICE={device}",
    ], argv
    summary, command = done.stderr.splitlines()
    workers = 4 // ranks - 1
    assert summary == (
        f"class job, per node: GPUs {gpus}, ranks {ranks} ({'a GPU each' if gpus else 'gloo on CPU'}), cores 4, "
        f"DataLoader workers per rank {workers}; time limit 00:15:00"
    ), summary
    assert command == (
        f"+ GPUS_PER_NODE={ranks} TRAIN_DEVICE={device} sbatch {' '.join(options)} --mem-per-cpu=2G -o my\\ out/%j.out "
        f"hpc/{script.name}"
    ), command


def test_class_sbatch_follows_the_class_settings(tmp_path: Path) -> None:
    """Two GPUs and 8 cores: 2 ranks of 3 workers; a partition and time limit; no reservation, QOS or account given:
    none passed (the script's #SBATCH lines, or sbatch's SBATCH_* variables, stay)."""
    done, argv = class_sbatch(
        tmp_path, "hpc/train_tasks.sbatch", CLASS_GPUS="2", CLASS_CPUS="8", CLASS_TIME="30", CLASS_PARTITION="gpu"
    )
    assert done.returncode == 0, done.stderr
    assert argv == [
        "--gres=gpu:2",
        "--time=30",
        "--ntasks-per-node=2",
        "--cpus-per-task=4",
        "--partition=gpu",
        "hpc/train_tasks.sbatch",
        "env GPUS_PER_NODE=2 TRAIN_DEVICE=auto",
    ], argv
    assert "ranks 2 (a GPU each), cores 8, DataLoader workers per rank 3; time limit 30" in done.stderr
    done, argv = class_sbatch(tmp_path, "hpc/train_1node.sbatch", CLASS_GPUS="0", CLASS_CPUS="1")
    assert argv[:4] == ["--gres=none", "--time=00:15:00", "--ntasks-per-node=1", "--cpus-per-task=1"], argv
    assert argv[-1] == "env GPUS_PER_NODE=1 TRAIN_DEVICE=cpu" and "workers per rank 0" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args, settings, message",
    [
        ((), {}, "usage: hpc/class_sbatch [sbatch options] hpc/<script>.sbatch"),
        (("hpc/train_1node.sbatch", "--test-only"), {}, "no job script '--test-only' (the last argument)"),
        (("hpc/common.sh",), {}, "hpc/common.sh: it knows the course's hpc/train_*.sbatch only"),
        (("hpc/train_1node.sbatch",), {"CLASS_GPUS": "one"}, "CLASS_GPUS='one': a number of GPUs, 0 for CPU only"),
        (("hpc/train_1node.sbatch",), {"CLASS_CPUS": "0"}, "CLASS_CPUS='0': a number of cores, at least 1"),
        (
            ("hpc/train_1node.sbatch",),
            {"CLASS_GPUS": "5"},
            "CLASS_CPUS=4 is less than one core for each of the 5 ranks",
        ),
    ],
    ids=["no-script", "options-after-the-script", "not-a-job-script", "gpus", "cpus", "cores-per-rank"],
)
def test_class_sbatch_refuses_what_it_cannot_share(tmp_path: Path, args, settings, message) -> None:
    done, argv = class_sbatch(tmp_path, *args, **settings)
    assert done.returncode == 2 and argv == [], done
    assert done.stderr.startswith("hpc/class_sbatch: ") and message in done.stderr, done.stderr


def test_class_sbatch_runs_from_the_course_folder(tmp_path: Path) -> None:
    """The jobs find hpc/common.sh in the folder they were submitted from: it says so before submitting."""
    done, argv = class_sbatch(tmp_path, str(ROOT / "hpc" / "train_1node.sbatch"), cwd=tmp_path)
    assert done.returncode == 2 and argv == [], done
    assert f"run it from the course folder, where the jobs find hpc/common.sh ({tmp_path} has none)" in done.stderr


def _stage_env(tmp_path: Path, stage: str, job: str) -> dict[str, str]:
    data = tmp_path / "data"
    (data / "shapes-tiny-seed0" / "train" / "circle").mkdir(parents=True)
    (data / "shapes-tiny-seed0" / "manifest.json").write_text("{}")
    (data / "shapes-tiny-seed0" / "train" / "circle" / "0.jpg").write_bytes(b"not really a jpeg")
    (tmp_path / "node-local").mkdir()
    return {
        "HOME": str(tmp_path),
        "PATH": os.environ["PATH"],
        "COURSE_DATA_DIR": str(data),
        "DATA_SIZE": "tiny",
        "STAGE_DATA": stage,
        "SLURM_JOB_ID": job,
        "SLURM_NNODES": "1",
        "SLURM_TMPDIR": str(tmp_path / "node-local"),
    }


def test_staging_an_image_mounts_one_file_and_unmounts_it_at_the_end(tmp_path: Path) -> None:
    """STAGE_DATA=image: the set's squashfs image (python -m course_lib.storage image) is copied to the node and
    mounted with squashfuse; the training reads the same files; the EXIT trap unmounts and removes it, on an error
    too."""
    from course_lib import storage

    if os.geteuid() != 0 or not (shutil.which("mksquashfs") and shutil.which("squashfuse")):
        if os.environ.get("CI"):
            pytest.fail("CI runs as root with squashfs-tools and squashfuse (.ci/run): this must run there")
        pytest.skip("needs root, squashfs-tools and squashfuse")
    env = _stage_env(tmp_path, "image", f"img{os.getpid()}")
    storage.make_image(tmp_path / "data" / "shapes-tiny-seed0", tmp_path / "data" / "shapes-tiny-seed0.sqsh")
    script = (
        'set -euo pipefail; source "$1"; stage_data; '
        'findmnt -n -o FSTYPE "$COURSE_DATA_DIR/$SET"; cat "$COURSE_DATA_DIR/$SET/train/circle/0.jpg"; echo; false'
    )
    done = source_common(script, env, tmp_path)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    local = tmp_path / "node-local" / f"course-data-{env['SLURM_JOB_ID']}"
    assert f"mounted read-only with squashfuse: {local}/shapes-tiny-seed0 (" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-2:] == ["fuse.squashfuse", "not really a jpeg"], done.stdout
    assert list((tmp_path / "node-local").iterdir()) == [], "unmounted and removed when the script ended"


@pytest.mark.parametrize(
    ("stage", "nodes", "expected"),
    [
        ("image", "1", "no squashfs image"),
        ("image", "2", "mounts on one node"),
        ("yes", "1", "STAGE_DATA=yes: use 0"),
    ],
)
def test_staging_refuses_what_it_cannot_do_with_what_to_do(
    tmp_path: Path, stage: str, nodes: str, expected: str
) -> None:
    env = _stage_env(tmp_path, stage, f"refuse{os.getpid()}")
    env["SLURM_NNODES"] = nodes
    if nodes == "2":
        (tmp_path / "data" / "shapes-tiny-seed0.sqsh").write_bytes(b"")
        env["PATH"] = f"{tmp_path}:{env['PATH']}"
        (tmp_path / "squashfuse").write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / "squashfuse").chmod(0o755)
    done = source_common('set -euo pipefail; source "$1"; stage_data; echo trained', env, tmp_path)
    assert done.returncode == 1 and "trained" not in done.stdout
    assert expected in done.stderr, done.stderr
    assert list((tmp_path / "node-local").iterdir()) == []
