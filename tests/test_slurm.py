"""The hpc/ job scripts and notebook 13's Slurm script, submitted to a real Slurm cluster.

tests/test_hpc.py runs the scripts against a fake ``srun``; this stage starts Debian's Slurm 22.05
and munge on this machine (tests/slurm_cluster.py: 2 to 4 nodes, each a slurmd of its own, private
to a temporary folder, everything on 127.0.0.1) and submits the scripts with ``sbatch``, changing nothing in them: the
account, partition, CPUs, ``--gres=none``, time limit and output file are given on the command
line, the scripts' settings in the environment, as hpc/README.md tells participants to do.

All the jobs are submitted at once (the cluster runs them side by side as its nodes allow) and
waited for by polling ``scontrol`` (``sbatch --wait`` backs off to tens of seconds); then each test checks
one job: its final state and exit code, its .out file and the rank reports it left. hpc/train_resumable.sbatch
and notebook 13's script run afterwards, side by side: each gets the time-limit notice, is requeued, and must
resume exactly.

Where Slurm cannot run (not root, no apt-get, not Linux) the stage is skipped with the reason;
under CI (``CI`` set) it fails instead, as the browser tests do without chromium.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

import pytest

import slurm_cluster
from documented_blocks import ELSEWHERE, blocks, entry
from course_lib.distributed import expand_nodelist, read_reports
from course_lib.samplers import coverage
from slurm_cluster import Cluster, JobResult

pytestmark = [pytest.mark.full, pytest.mark.stage]  # a stage of the suite: `pytest -m "not stage"` leaves it out

ROOT = Path(__file__).resolve().parents[1]
HPC = ROOT / "hpc"
LIMIT = 40  # training images of the tiny set's 80: 20 per rank
TRAIN_ARGS = f"--limit {LIMIT} --epochs 1 --batch-size 8 --workers 1 --timeout 60 --device cpu"
CAPSTONE_ARGS = "--epochs 1 --batch-size 8 --timeout 60 --device cpu"
SHARD_SIZE = 10  # samples per shard: the tiny set's 80 training images make 8 shards
MIN_MEMORY_MB = 3000  # two jobs at once: 4 ranks, their DataLoader workers, torchrun
JOB_TIME_LIMIT = "5"  # minutes: Slurm itself ends a job that hangs
WAIT_S = 300.0  # for all the jobs together, on a busy 2-core machine
# hpc/README.md, "For a class": a learner's share, submitted with hpc/class_sbatch as the README says. The class's
# CPU-only line; CLASS_CPUS (4 on a site) is what the machine has, up to 4: a node may not declare more.
CLASS_COMMAND = "CLASS_GPUS=0 hpc/class_sbatch hpc/train_1node.sbatch"
CLASS_TRAIN_ARGS = f"--limit {LIMIT} --epochs 1 --batch-size 8 --timeout 60"  # the workers and device: the class's
#: torch.distributed's native threads, by the names torch and gloo give them
DIST_THREADS = ("gloo", "pt_gloo", "pt_tcpstore", "pt_nccl")

# Put first on a job's PYTHONPATH as sitecustomize.py: every training rank (python -m course_lib.train,
# python -m course_lib.capstone train) says at exit which torch.distributed threads still run. Threads
# of a process group that outlive the interpreter's shutdown are what can abort a rank at exit
# ("terminate called without an active exception"); the course's teardown should leave none.
EXIT_HOOK = r'''"""Written by tests/test_slurm.py: at exit, a training rank lists the torch.distributed threads still running."""
import atexit, os, sys


def distributed_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith(%r))

def _report():
    argv = sys.argv
    if argv and (argv[0].endswith(os.path.join("course_lib", "train.py"))
                 or (argv[0].endswith(os.path.join("course_lib", "capstone.py")) and argv[1:2] == ["train"])):
        print(f"exit-check: torch.distributed threads running at exit: {distributed_threads()}",
              file=sys.stderr, flush=True)

atexit.register(_report)  # registered first, so it runs last of the interpreter's exit handlers
''' % (DIST_THREADS,)


@dataclass
class StageJob:
    """One job of the stage: what is submitted, and (once waited for) what became of it."""

    key: str
    script: Path
    job_name: str
    options: list[str]
    env: dict[str, str]
    hold: Callable[[Path], None] | None = None  # called with the job's run folder before it is released
    command: list[str] | None = None  # submitted with this command (options go before the script) instead of sbatch
    submit_stderr: str = ""  # what the command printed when it submitted the job
    job_id: int = 0
    result: JobResult | None = None
    run_dir: Path = field(default=Path("/nonexistent"))

    def ok(self) -> JobResult:
        r = self.result
        assert r is not None, f"{self.key} was never waited for"
        assert (r.state, r.exit_code) == ("COMPLETED", "0:0"), r.describe()
        return r


@dataclass
class Stage:
    cluster: Cluster
    jobs: dict[str, StageJob]
    node_local: Path  # SLURM_TMPDIR of every job: one folder that all the "nodes" share
    job_tmp: Path  # TMPDIR of every job: where torchrun without --log-dir leaves its torchelastic_* folders
    timings: dict[str, float]
    reservation: str  # the class job's (hpc/README.md, "For a class"), on the cluster's last node

    def __getitem__(self, key: str) -> StageJob:
        return self.jobs[key]


# --------------------------------------------------------------------------- the cluster


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Cluster]:
    """A Slurm cluster of 2 to 4 nodes on this machine, for the whole session (about 1 s to start)."""
    reason = slurm_cluster.unavailable_reason()  # installs slurm-wlm and munge when root and apt-get allow it
    memory = slurm_cluster.available_memory_mb()
    if reason is None and memory < MIN_MEMORY_MB:
        reason = f"only {memory} MB of memory available, the Slurm stage needs {MIN_MEMORY_MB} MB"
    if reason is None and _cpus() < 2:
        # a node may not declare more CPUs than the machine has: task/affinity then cannot bind the tasks
        reason = "the Slurm stage needs 2 CPUs (its jobs run 2 ranks on a node)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm stage cannot run here, and CI must run it: {reason}")
        pytest.skip(f"Slurm stage skipped: {reason}")
    # Every node gets all of the machine's CPUs (the nodes share them, as their jobs do). Nodes beyond
    # the 2 the jobs need only let more jobs run side by side: one per 1.5 GB free, 4 at most.
    nodes = max(2, min(4, memory // 1500))
    cluster = Cluster(nodes=nodes, cpus=_cpus(), memory_mb=max(1000, memory // nodes))
    cluster.start()  # on failure it stops what it started, then raises with the daemons' logs
    try:
        yield cluster
    finally:
        for note in cluster.stop():
            warnings.warn(f"Slurm stage teardown: {note}")


def clean_env() -> dict[str, str]:
    """This process's environment without anything that would make a job think it is in another job."""
    drop = re.compile(
        r"^(SLURM_|SRUN_|SBATCH_|SALLOC_|TORCHELASTIC_|COURSE_|PYTEST_)|^(RANK|LOCAL_RANK|WORLD_SIZE|"
        r"GROUP_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|GPUS_PER_NODE|DATA_SIZE|STAGE_DATA|"
        r"TRAIN_ARGS|RUNS_DIR|SHARDS|VIRTUAL_ENV|LOCAL_DIR|SET)$"
    )
    env = {k: v for k, v in os.environ.items() if not drop.match(k)}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if (Path(sys.prefix) / "bin" / "activate").is_file():
        env["COURSE_VENV"] = sys.prefix  # the environment running the tests: the scripts activate it
    else:
        env["COURSE_VENV"] = ""  # a conda or system python: found first on PATH instead
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _stale_reports(world_size: int) -> Callable[[Path], None]:
    """What an earlier job of the same name and id left: one report per rank of a bigger job."""

    def plant(run_dir: Path) -> None:
        run_dir.mkdir(parents=True)
        for rank in range(world_size):
            (run_dir / f"rank{rank}.json").write_text(
                json.dumps(
                    {
                        "rank": rank,
                        "world_size": world_size,
                        "dataset_len": LIMIT,
                        "source": "slurm",
                        "epochs": [{"indices": list(range(rank, LIMIT, world_size))}],
                        "weights_sha256": "old",
                    }
                )
            )

    return plant


def _foreign_file(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("not the course's\n")


@pytest.fixture(scope="session")
def stage(slurm: Cluster, tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Stage:
    """Every job of the stage, submitted together and waited for."""
    from course_lib.slurm_script import write_slurm_script

    start = time.monotonic()
    base = tmp_path_factory.mktemp("slurm-stage")
    out, runs, node_local, hook, shards, job_tmp = (
        base / name for name in ("out", "runs", "node-local", "exit-hook", "shards", "tmp")
    )
    for folder in (out, runs, node_local, hook, job_tmp):
        folder.mkdir()
    (hook / "sitecustomize.py").write_text(EXIT_HOOK)
    cpus = slurm.cpus
    env = clean_env()
    env.update(
        SLURM_CONF=str(slurm.conf),
        COURSE_DATA_DIR=str(tiny_root),
        DATA_SIZE="tiny",
        RUNS_DIR=str(runs),
        TRAIN_ARGS=TRAIN_ARGS,
        SLURM_TMPDIR=str(node_local),
        TMPDIR=str(job_tmp),
        PYTHONPATH=os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")])),
    )
    common = [
        "-A",
        "course",
        "-p",
        slurm.partition,
        "--gres=none",
        f"--time={JOB_TIME_LIMIT}",
        "-o",
        f"{out}/%x-%j.out",
    ]
    # the set as one squashfs image, made as on a login node (hpc/common.sh's STAGE_DATA=image: the 1node job)
    from course_lib import storage

    if not (tiny_root / "shapes-tiny-seed0.sqsh").exists():
        storage.make_image(tiny_root / "shapes-tiny-seed0", tiny_root / "shapes-tiny-seed0.sqsh")
    # notebook 13's shards, written as on a login node (in the background: the other jobs start meanwhile)
    writing = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "course_lib.capstone",
            "shards",
            "--out",
            str(shards),
            "--size",
            "tiny",
            "--data",
            str(tiny_root),
            "--maxcount",
            str(SHARD_SIZE),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tasks = ["--ntasks-per-node=2", "-c", str(max(1, cpus // 2))]
    # The class's reservation, as a site's admins would make it: the last node, for this user, for a while. Its
    # node is the class job's alone until the job has ended and the reservation is deleted (below).
    reservation = f"course-class-{slurm.tag}"
    user = pwd.getpwuid(os.geteuid()).pw_name
    slurm.run(
        *("scontrol", "create", "reservation", f"ReservationName={reservation}", "StartTime=now", "Duration=30"),
        *(f"Users={user}", f"Nodes={slurm.node_names[-1]}"),
    )
    class_env = dict(
        env,
        STAGE_DATA="0",
        TRAIN_ARGS=CLASS_TRAIN_ARGS,
        CLASS_ACCOUNT="course",
        CLASS_PARTITION=slurm.partition,
        CLASS_RESERVATION=reservation,
        CLASS_QOS="normal",
        CLASS_CPUS=str(min(4, cpus)),
        CLASS_TIME=JOB_TIME_LIMIT,
    )
    variables, command = CLASS_COMMAND.split(" hpc/class_sbatch ")
    class_env.update(v.split("=", 1) for v in variables.split())
    jobs = [  # in the order the scheduler (first in, first out) starts them: the class job first, on its
        # reserved node (it ends soon and frees the node), then the two-node jobs
        StageJob(
            "class",
            HPC / "train_1node.sbatch",
            "course-train-1node",
            [],
            class_env,
            command=[str(HPC / "class_sbatch"), "--parsable", "-o", f"{out}/%x-%j.out", command],
        ),
        StageJob(
            "multinode",
            HPC / "train_multinode.sbatch",
            "course-train-multinode",
            ["-N", "2", "-c", str(cpus)],
            dict(env, GPUS_PER_NODE="1", STAGE_DATA="1"),
        ),
        StageJob(
            "tasks2",
            HPC / "train_tasks.sbatch",
            "course-train-tasks",
            ["-N", "2", "--ntasks-per-node=1", "-c", str(cpus)],
            dict(env, STAGE_DATA="1"),
        ),
        StageJob(
            "1node",
            HPC / "train_1node.sbatch",
            "course-train-1node",
            ["-N", "1", "-c", str(cpus)],
            dict(env, GPUS_PER_NODE="2", STAGE_DATA="image"),  # its squashfs image, mounted with squashfuse
        ),
        StageJob(
            "tasks1",
            HPC / "train_tasks.sbatch",
            "course-train-tasks",
            ["-N", "1", *tasks],
            dict(env, STAGE_DATA="0"),
            hold=_stale_reports(4),
        ),
        StageJob(
            "refuse",
            HPC / "train_tasks.sbatch",
            "course-train-tasks",
            ["-N", "1", *tasks],
            dict(env, STAGE_DATA="0"),
            hold=_foreign_file,
        ),
        StageJob(
            "capstone",
            base / "capstone" / "train.sbatch",
            "course-capstone",
            ["-N", "1", "-c", str(cpus)],
            dict(env, TRAIN_ARGS=CAPSTONE_ARGS),
        ),
    ]
    try:
        for job in jobs:
            if job.key == "capstone":  # notebook 13's script, as the notebook writes it, once its shards exist
                try:
                    written = writing.communicate(timeout=120)[0]
                except subprocess.TimeoutExpired:
                    writing.kill()
                    raise AssertionError(
                        f"python -m course_lib.capstone shards: no shards after 120 s\n{writing.communicate()[0]}"
                    ) from None
                assert writing.returncode == 0, written
                write_slurm_script(
                    job.script,
                    shards=str(shards),
                    num_workers=1,
                    gpus_per_node=2,
                    nodes=1,
                    batch_size=8,
                    epochs=1,
                    time_limit="00:05:00",
                    stage=True,  # the staged variant: the copy to the node's local disk, read there, removed
                    stage_why="the Slurm stage",
                )
            options = common + job.options + (["--hold"] if job.hold else [])
            if job.command:
                job.job_id, job.submit_stderr = slurm.submit(job.command, job.env, cwd=ROOT)
            else:
                job.job_id = slurm.sbatch(job.script, options, job.env, cwd=ROOT)
            job.run_dir = runs / f"{job.job_name}-{job.job_id}"
            if job.hold:  # what an earlier job of this name and id left in its folder
                job.hold(job.run_dir)
                slurm.run("scontrol", "release", str(job.job_id))
        # the class job first: then its reservation goes, and its node serves the other jobs
        results = slurm.wait([jobs[0].job_id], timeout=WAIT_S)
    finally:
        if writing.poll() is None:
            writing.kill()
            writing.wait()
        slurm.run("scontrol", "delete", "reservation", reservation, check=False)
    results.update(slurm.wait([job.job_id for job in jobs[1:]], timeout=WAIT_S))
    for job in jobs:
        job.result = results[job.job_id]
    timings = {"cluster_start_s": slurm.start_s, "stage_s": time.monotonic() - start}
    for job in jobs:
        timings[f"{job.key}_s"] = job.result.waited_s
    return Stage(slurm, {job.key: job for job in jobs}, node_local, job_tmp, timings, reservation)


def check_reports(folder: Path, world_size: int, source: str) -> list[dict]:
    """The rank reports of course_lib.train: one per rank, disjoint complete shares, one weights digest."""
    reports = read_reports(folder)
    assert [r["rank"] for r in reports] == list(range(world_size))
    assert {r["world_size"] for r in reports} == {world_size}
    assert {r["source"] for r in reports} == {source}
    assert {r["dataset_len"] for r in reports} == {LIMIT}
    shares = [r["epochs"][-1]["indices"] for r in reports]
    assert [len(s) for s in shares] == [LIMIT // world_size] * world_size
    assert coverage(shares, LIMIT).exact, coverage(shares, LIMIT)
    assert len({r["weights_sha256"] for r in reports}) == 1, "DDP left different weights on the ranks"
    return reports


# --------------------------------------------------------------------------- one node


def test_train_1node_runs_torchrun_under_slurm(stage: Stage) -> None:
    job = stage["1node"]
    r = job.ok()
    out = r.output()
    cpus = stage.cluster.cpus
    assert f"2 ranks on 1 node, {cpus} CPUs, {max(0, cpus // 2 - 1)} DataLoader workers per rank" in out, out
    assert "[rank0]:epoch 0: 20 samples" in out and "[rank1]:epoch 0: 20 samples" in out, out
    assert "check: 2 rank reports; last epoch: 40 of 40 samples seen" in out, out
    assert "weights identical on every rank: yes" in out, out
    local = stage.node_local / f"course-data-{job.job_id}"
    assert f"image copied to the node's local disk and mounted read-only with squashfuse: {local}/" in out, out
    assert out.count("exit-check:") == 2, out  # the hook ran in both ranks (test_no_threads_outlive_the_ranks)
    check_reports(job.run_dir, 2, "torchrun")
    assert not local.exists(), "the staged image outlived the job"
    assert str(local) not in Path("/proc/mounts").read_text(), "the image is still mounted after the job"


# --------------------------------------------------------------------------- for a class


def _readme_class_section() -> str:
    text = (HPC / "README.md").read_text()
    start = text.index("\n## For a class\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_class_job_runs_with_a_learners_share(stage: Stage) -> None:
    """hpc/README.md, "For a class": ``CLASS_GPUS=0 hpc/class_sbatch hpc/train_1node.sbatch`` submits the unchanged
    script with a learner's share, in the class's reservation: no GPU, CLASS_CPUS cores instead of 32, the class's time
    limit. The script's own settings follow: 2 ranks (GPUS_PER_NODE), gloo on CPU (TRAIN_DEVICE=cpu), one worker
    fewer per rank than its cores. The cluster has no accounting database: the QOS is passed and accepted, not
    enforced."""
    assert CLASS_COMMAND in _readme_class_section()
    job = stage["class"]
    r = job.ok()
    out, info = r.output(), r.info
    cpus, partition = min(4, stage.cluster.cpus), stage.cluster.partition
    # what hpc/class_sbatch ran: the class's options, then the learner's (they win over the script's #SBATCH lines)
    ran = (
        f"+ GPUS_PER_NODE=2 TRAIN_DEVICE=cpu sbatch --gres=none --time={JOB_TIME_LIMIT} --ntasks-per-node=1 "
        f"--cpus-per-task={cpus} --account=course --partition={partition} --reservation={stage.reservation} "
        "--qos=normal --parsable -o "
    )
    assert ran in job.submit_stderr, job.submit_stderr
    # what Slurm gave it: the reserved node, the class's cores and time limit, no GPU
    assert info.get("Reservation") == stage.reservation and r.nodes == stage.cluster.node_names[-1], info
    assert (info.get("NumCPUs"), info.get("TimeLimit"), info.get("TresPerNode")) == (
        str(cpus),
        f"00:{int(JOB_TIME_LIMIT):02d}:00",
        None,
    ), info
    assert (info.get("Account"), info.get("Partition")) == ("course", partition), info
    # what the script made of it
    assert f"2 ranks on 1 node, {cpus} CPUs, {cpus // 2 - 1} DataLoader workers per rank" in out, out
    assert "GPUs: none from Slurm" in out and "training with --device cpu" in out, out
    assert "check: 2 rank reports; last epoch: 40 of 40 samples seen" in out, out
    assert out.count("exit-check:") == 2, out
    check_reports(job.run_dir, 2, "torchrun")


def test_class_sbatch_test_only_checks_the_request_with_slurm(slurm: Cluster) -> None:
    """The README's check before the class, ``hpc/class_sbatch --test-only hpc/train_1node.sbatch``: Slurm says
    where and when the class's default (one GPU: the test cluster's pretend ones) would start, inside the
    reservation, and submits nothing. A reservation that does not exist, or more GPUs than a node has, is refused."""
    reservation = f"course-check-{slurm.tag}"
    node = slurm.node_names[0]
    user = pwd.getpwuid(os.geteuid()).pw_name
    slurm.run(
        *("scontrol", "create", "reservation", f"ReservationName={reservation}", "StartTime=now", "Duration=30"),
        *(f"Users={user}", f"Nodes={node}", "Flags=IGNORE_JOBS"),  # whatever runs there now
    )
    cpus = min(4, slurm.cpus)
    env = dict(
        clean_env(),
        SLURM_CONF=str(slurm.conf),
        CLASS_ACCOUNT="course",
        CLASS_PARTITION=slurm.partition,
        CLASS_RESERVATION=reservation,
        CLASS_CPUS=str(cpus),
    )
    command = [str(HPC / "class_sbatch"), "--test-only", "hpc/train_1node.sbatch"]
    assert "hpc/class_sbatch --test-only hpc/train_1node.sbatch" in _readme_class_section()
    try:
        checks = {
            name: subprocess.run(command, env=dict(env, **more), cwd=ROOT, capture_output=True, text=True, timeout=30)
            for name, more in [
                ("default", {}),
                ("no such reservation", {"CLASS_RESERVATION": "no-such-reservation"}),
                ("too many GPUs", {"CLASS_GPUS": str(slurm.gpus + 1), "CLASS_CPUS": str(slurm.gpus + 1)}),
            ]
        }
        jobs = slurm.jobs()
    finally:
        slurm.run("scontrol", "delete", "reservation", reservation, check=False)
    ok = checks["default"]
    assert ok.returncode == 0 and "+ GPUS_PER_NODE=1 TRAIN_DEVICE=auto sbatch --gres=gpu:1 " in ok.stderr, ok.stderr
    assert re.search(rf"Job \d+ to start at \S+ using {cpus} processors on nodes {node} in partition ", ok.stderr), (
        ok.stderr
    )
    assert ok.stdout == "", ok.stdout  # no job id: nothing submitted
    assert max(jobs, default=0) == max(slurm.submitted, default=0), "--test-only submitted a job"
    refused = checks["no such reservation"]
    assert refused.returncode != 0 and "Requested reservation is invalid" in refused.stderr, refused.stderr
    refused = checks["too many GPUs"]
    assert refused.returncode != 0 and "--gres=gpu:3 " in refused.stderr, refused.stderr
    assert "Requested node configuration is not available" in refused.stderr, refused.stderr


def test_train_tasks_replaces_an_earlier_jobs_reports(stage: Stage) -> None:
    """Job ids start again at 1 on a new cluster: 4 reports of an earlier 4-rank job with this job's
    name and id were in its folder. The script removes them, and the check counts only this job's 2."""
    job = stage["tasks1"]
    r = job.ok()
    out = r.output()
    assert f"removed 4 rank reports an earlier job of the same name and id left in {job.run_dir}" in out, out
    assert "check: 2 rank reports; last epoch: 40 of 40 samples seen, 0 more than once" in out, out
    assert out.count("exit-check:") == 2, out
    reports = check_reports(job.run_dir, 2, "slurm")
    assert "old" not in {rep["weights_sha256"] for rep in reports}


def test_train_tasks_refuses_a_folder_the_course_did_not_write(stage: Stage) -> None:
    job = stage["refuse"]
    r = job.result
    assert (r.state, r.exit_code) == ("FAILED", "1:0"), r.describe()
    out = r.output()
    assert f"ERROR: {job.run_dir} holds files that are not rank reports; move them away, or set RUNS_DIR" in out, out
    assert "epoch 0" not in out and "check:" not in out, out  # stopped before training
    assert (job.run_dir / "notes.txt").read_text() == "not the course's\n"  # nothing deleted


def test_capstone_script_from_notebook_10(stage: Stage) -> None:
    job = stage["capstone"]
    r = job.ok()
    out = r.output()
    assert "8 shards for 2 ranks × 1 readers each" in out, out
    local = stage.node_local / f"course-shards-{job.job_id}"
    assert re.search(r"staging \(the Slurm stage\): \d+ MB copied to the node's local disk in +\d+ ms", out), out
    assert not local.exists(), "the staged shards outlived the job"
    assert "check: 2 rank reports, [5] batches per rank" in out and "weights identical: True" in out, out
    assert out.count("exit-check:") == 2, out
    reports = read_reports(job.run_dir)
    assert [rep["rank"] for rep in reports] == [0, 1] and {rep["source"] for rep in reports} == {"torchrun"}
    assert {rep["epochs"][-1]["batches"] for rep in reports} == {5}
    assert len({rep["weights_sha256"] for rep in reports}) == 1
    keys = [k for rep in reports for ks in rep["epochs"][-1]["keys_by_worker"].values() for k in ks]
    assert len(keys) == 80 and len(set(keys)) == 80, "one pass: every sample read once, by one reader"


# --------------------------------------------------------------------------- two nodes


def _ran_on_both_nodes(stage: Stage, name: str) -> tuple[StageJob, str, list[str]]:
    """Job ``name`` of the 2-node cluster: it succeeded on both nodes, each staging its own copy of the data."""
    job = stage[name]
    r = job.ok()
    out = r.output()
    nodes = expand_nodelist(r.nodes)
    assert len(set(nodes)) == 2 and set(nodes) <= set(stage.cluster.node_names), r.nodes
    # both nodes staged into one shared SLURM_TMPDIR: the copies must not collide
    assert "data copied to every node's local disk" in out and "cannot create" not in out, out
    return job, out, nodes


def test_train_multinode_meets_at_a_rendezvous_on_the_first_node(stage: Stage) -> None:
    job, out, nodes = _ran_on_both_nodes(stage, "multinode")
    assert f"rendezvous: {nodes[0]}:" in out, out
    assert "1 ranks per node" in out and "check: 2 rank reports" in out, out
    assert out.count("exit-check:") == 2, out
    check_reports(job.run_dir, 2, "torchrun")
    assert not (stage.node_local / f"course-data-{job.job_id}").exists(), "the staged copy outlived the job"


def test_train_tasks_on_two_nodes(stage: Stage) -> None:
    job, out, _ = _ran_on_both_nodes(stage, "tasks2")
    assert "2 ranks (tasks)" in out and "check: 2 rank reports" in out, out
    reports = check_reports(job.run_dir, 2, "slurm")
    assert [rep["local_rank"] for rep in reports] == [0, 0]  # SLURM_LOCALID: one task on each node
    assert out.count("exit-check:") == 2, out
    assert not (stage.node_local / f"course-data-{job.job_id}").exists(), "the staged copy outlived the job"


def test_same_weights_whatever_starts_the_ranks(stage: Stage) -> None:
    """torchrun or srun tasks, one node or two: 2 ranks, same data and seed, the same model bit for bit."""
    keys = ("1node", "tasks1", "multinode", "tasks2")
    digests = {
        key: read_reports(stage[key].run_dir)[0]["weights_sha256"]
        for key in keys
        if stage[key].result and stage[key].result.state == "COMPLETED"
    }
    assert len(digests) == len(keys), f"a job failed: only {sorted(digests)} completed"
    assert len(set(digests.values())) == 1, digests


def test_no_threads_outlive_the_ranks(stage: Stage) -> None:
    """Every rank of every job: its process group destroyed and its threads joined before Python shuts
    down. The rare abort at exit ("terminate called without an active exception") needs such threads."""
    left = {}
    for key in ("1node", "tasks1", "capstone", "multinode", "tasks2", "class"):
        lines = [line for line in stage[key].result.output().splitlines() if "exit-check:" in line]
        left[key] = [line for line in lines if not line.endswith(": []")]
    assert not any(left.values()), left


# Runs the course's teardown many times, cheaply: torch, torchvision and course_lib are imported once,
# and every rank is a child forked from this driver that runs course_lib.train's own main and then leaves through the interpreter's normal exit. (Importing them before
# any process group exists is what the patched course does too; the fresh processes of the Slurm jobs
# above cover the import order.)
EXIT_DRIVER = r'''"""Written by tests/test_slurm.py: RUNS runs of 2 ranks of course_lib.train, PARALLEL at a time."""
import gc, json, os, signal, sys, time
import torch, torchvision.transforms.v2  # noqa: F401  what a rank imports anyway; once, here
import course_lib.train as course_train
from course_lib.jobs import free_ports

RUNS, PARALLEL, OUT, DATA = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ARGS = ["--data", DATA, "--size", "tiny", "--limit", "32", "--epochs", "1", "--workers", "1", "--batch-size", "8",
        "--timeout", "60", "--device", "cpu"]


def rank_main(run, rank, port):
    os.setsid()  # a group of its own (with its DataLoader worker): killable as one on a timeout
    fd = os.open(f"{OUT}/run{run}-rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                      SLURM_JOB_NODELIST="127.0.0.1", MASTER_PORT=str(port))
    argv = [*ARGS, "--report", f"{OUT}/reports{run}"]
    sys.argv = [course_train.__file__, *argv]  # as `python -m course_lib.train` sees it (and the exit hook)
    return course_train.main(argv)


def main():
    if len(os.listdir("/proc/self/task")) != 1:
        sys.exit(f"the driver runs threads {os.listdir('/proc/self/task')}: forking it would not be safe")
    gc.freeze()  # the children's exit then does not walk the driver's objects (copy-on-write)
    status, start = {}, time.monotonic()
    for first in range(0, RUNS, PARALLEL):
        children = {}
        for run in range(first, min(RUNS, first + PARALLEL)):
            port = free_ports()[0]
            for rank in (0, 1):
                pid = os.fork()
                if pid == 0:
                    raise SystemExit(rank_main(run, rank, port))  # the child leaves through the normal exit
                children[pid] = f"{run}/{rank}"
        deadline = time.monotonic() + 90
        while children:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid:
                status[children.pop(pid)] = os.waitstatus_to_exitcode(wait_status)
            elif time.monotonic() > deadline:
                for pid, name in children.items():
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    status[name] = "killed after 90 s"
                children = {}
            else:
                time.sleep(0.02)
    print(json.dumps({"status": status, "seconds": time.monotonic() - start}))


main()
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks, and reads thread names from /proc")
def test_no_abort_at_exit_in_20_runs(tiny_root: Path, tmp_path: Path, record_property) -> None:
    """20 runs of 2 ranks, 2 runs at a time, through course_lib.train's own teardown and a real interpreter
    exit: every rank exits with 0, none prints "terminate called", none leaves torch.distributed threads
    running at exit, and every run's 2 reports agree. Independent of Slurm (no cluster needed)."""
    runs = 20
    hook, out = tmp_path / "hook", tmp_path / "out"
    hook.mkdir()
    out.mkdir()
    (hook / "sitecustomize.py").write_text(EXIT_HOOK)
    (tmp_path / "driver.py").write_text(EXIT_DRIVER)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT)])  # the exit hook; this checkout's course_lib
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(tmp_path / "driver.py"), str(runs), "2", str(out), str(tiny_root)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the runs did not end in 600 s (each rank is killed after 90 s: the driver itself hung)")
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout.splitlines()[-1])["status"]
    record_property("exit_runs", {"runs": runs, "seconds": round(time.monotonic() - start, 1)})
    problems = []
    for run in range(runs):
        for rank in (0, 1):
            log = (out / f"run{run}-rank{rank}.log").read_text(errors="replace")
            if status.get(f"{run}/{rank}") != 0:
                problems.append(f"run {run} rank {rank}: exit status {status.get(f'{run}/{rank}')}\n{log[-2000:]}")
            elif "terminate called" in log or "exit-check: torch.distributed threads running at exit: []" not in log:
                problems.append(f"run {run} rank {rank}:\n{log[-2000:]}")
        if not problems:
            reports = read_reports(out / f"reports{run}")
            assert [r["rank"] for r in reports] == [0, 1] and len({r["weights_sha256"] for r in reports}) == 1
    assert not problems, "\n".join(problems)


def test_torchrun_jobs_leave_no_log_folders_on_the_nodes(stage: Stage) -> None:
    """torchrun keeps a copy of each rank's output in a folder it never removes (without --log-dir, a new
    $TMPDIR/torchelastic_* per run, which piles up on a cluster's nodes). The scripts give it a folder of the job's in
    $SLURM_TMPDIR and remove that when the job ends: after the stage's jobs, neither folder holds any."""
    for job in stage.jobs.values():
        job.result  # every job has ended
    assert not list(stage.job_tmp.glob("torchelastic_*")), sorted(p.name for p in stage.job_tmp.iterdir())
    assert not list(stage.node_local.glob("course-torchrun-*")), sorted(p.name for p in stage.node_local.iterdir())


def test_stage_time(stage: Stage, record_property) -> None:
    """The stage's wall time goes to the test summary (tests/conftest.py prints it). What is checked
    does not depend on how busy the machine is: each job was seen finished within seconds of its
    end (sbatch --wait, which backs off to tens of seconds, took 42 s to notice a 10 s job)."""
    record_property("slurm_stage", {k: round(v, 1) for k, v in stage.timings.items()})
    lags = {}
    for key, job in stage.jobs.items():
        info = job.result.info
        ran = datetime.fromisoformat(info["EndTime"]) - datetime.fromisoformat(info["SubmitTime"])
        lags[key] = round(job.result.waited_s - ran.total_seconds(), 1)  # both to the second: about -1 to 1.2
    assert max(lags.values()) < 5, f"seconds between a job's end and the poll seeing it: {lags}"


# --------------------------------------------------------------------------- a job that survives its time limit

RESUME_LIMIT, RESUME_BATCH, RESUME_EPOCHS = 32, 4, 2  # 2 ranks: 16 samples each per epoch, 4 steps of 4
RESUME_STEPS = RESUME_LIMIT // 2 // RESUME_BATCH * RESUME_EPOCHS
RESUME_ARGS = (
    f"--limit {RESUME_LIMIT} --epochs {RESUME_EPOCHS} --batch-size {RESUME_BATCH} --workers 1 --ckpt-every 2 "
    "--step-seconds 0.5 --timeout 60 --device cpu"
)
RESUME_WAIT_S = 90.0  # for each phase below; each job takes about 50 s (15 s of it the requeue hold)
STALE_STEP = 99  # the checkpoint an earlier job of the same name and id left


def _plant_stale_run(run_dir: Path, report: str) -> None:
    """What an earlier job of the same name and id (a reinstalled cluster) left: its checkpoint would be resumed."""
    (run_dir / "ckpt" / f"step{STALE_STEP:07d}").mkdir(parents=True)
    (run_dir / "ckpt" / "latest").write_text(f"{STALE_STEP}\n")
    (run_dir / "ckpt" / f"step{STALE_STEP:07d}" / "rank0.pt").write_bytes(b"not a checkpoint")
    (run_dir / report).write_text(json.dumps({"run": 0, "epoch": 9, "step": STALE_STEP, "indices": [0]}) + "\n")


def _until(
    slurm: Cluster, job_id: int, what: str, ready: Callable[[dict[str, str]], bool], timeout: float
) -> dict[str, str]:
    """Poll until ``ready(job info)``; past ``timeout`` (or when the job ended) cancel it and fail with its log."""
    deadline = time.monotonic() + timeout
    while True:
        info = slurm.jobs().get(job_id, {})
        if ready(info):
            return info
        if info.get("JobState") in slurm_cluster.DONE_STATES or time.monotonic() > deadline:
            slurm.run("scancel", str(job_id), check=False)
            pytest.fail(
                f"job {job_id}: {what}: not after {timeout:.0f} s (state {info.get('JobState')}, reason "
                f"{info.get('Reason')}; cancelled)\n{slurm_cluster._tail(info.get('StdOut'), 6000)}"
            )
        time.sleep(0.2)


@dataclass
class Requeued:
    """A job noticed, requeued and resumed: its id, folder, result, requeue hold and seconds in all."""

    job_id: int
    run_dir: Path
    result: JobResult
    delay: float
    seconds: float
    left_in_temp: list[str]  # torchrun's log folders the job's two runs left in its SLURM_TMPDIR and TMPDIR


def _submit_notice_requeue(
    slurm: Cluster,
    script: Path,
    env: dict[str, str],
    out: Path,
    run_dir_of: Callable[[int], Path],
    what: str,
    stale_report: str,
) -> Requeued:
    """Submit ``script`` held, plant an earlier job's checkpoint and ``stale_report`` in its folder, and release it.
    Once it saved a checkpoint of its own (``what``), send the notice Slurm sends before the time limit
    (``--signal=B:USR1@120``), now (``scancel --signal=USR1 --batch``); wait until the job is requeued, start it
    again as soon as Slurm allows, and wait for the end."""
    start = time.monotonic()
    out.mkdir(parents=True)
    for key, name in (("SLURM_TMPDIR", "node-local"), ("TMPDIR", "tmp")):
        env = dict(env, **{key: str(out.parent / name)})
        (out.parent / name).mkdir()
    options = [
        "-A",
        "course",
        "-p",
        slurm.partition,
        "--gres=none",
        "-N",
        "1",
        "-c",
        str(slurm.cpus),
        f"--time={JOB_TIME_LIMIT}",
        "-o",
        f"{out}/%x-%j.out",
        "--hold",
    ]
    job_id = slurm.sbatch(script, options, env, cwd=ROOT)
    run_dir = run_dir_of(job_id)
    _plant_stale_run(run_dir, stale_report)
    slurm.run("scontrol", "release", str(job_id))
    latest = run_dir / "ckpt" / "latest"

    def saved(info: dict[str, str]) -> bool:
        try:
            return info.get("JobState") == "RUNNING" and int(latest.read_text()) != STALE_STEP
        except (OSError, ValueError):
            return False

    _until(slurm, job_id, what, saved, RESUME_WAIT_S)
    slurm.run("scancel", "--signal=USR1", "--batch", str(job_id))  # what --signal=B:USR1@120 sends
    # Slurm 22.05 holds a requeued job back: eligible again cred_expire (120 s by default) after the requeue. The
    # job is PENDING at once; the scheduler's next pass gives the reason (the job cannot start before anyway).
    requeued = _until(
        slurm,
        job_id,
        "requeued and held back (Reason=BeginTime)",
        lambda i: (i.get("Restarts"), i.get("JobState"), i.get("Reason")) == ("1", "PENDING", "BeginTime"),
        RESUME_WAIT_S,
    )
    delay = (datetime.fromisoformat(requeued["EligibleTime"]) - datetime.now()).total_seconds()
    assert delay > slurm_cluster.CRED_EXPIRE_S / 2, requeued
    # Slurm starts a requeued job only once the first run's credential has expired (cred_expire, here
    # CRED_EXPIRE_S): started before, it is killed at once ("Killing non-startable batch JobId: Job credential
    # revoked", seen in half of the runs that did). Wait for that, then start it without waiting for the scheduler.
    time.sleep(max(0.0, delay) + 1.0)
    try:
        slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")  # start it again at once
    except slurm_cluster.SlurmError as exc:
        if "no longer pending" not in str(exc):  # unless the scheduler's own pass started it first: as good
            raise
    result = slurm.wait([job_id], timeout=RESUME_WAIT_S)[job_id]
    left = sorted(
        p.name
        for p in [*Path(env["SLURM_TMPDIR"]).glob("course-torchrun-*"), *Path(env["TMPDIR"]).glob("torchelastic_*")]
    )
    return Requeued(job_id, run_dir, result, delay, time.monotonic() - start, left)


CAPSTONE_RESUME_ARGS = "--epochs 3 --batch-size 8 --epoch-batches 3 --step-ms 1000 --timeout 60 --device cpu"


def _resumable_requeued(slurm: Cluster, tiny_root: Path, base: Path) -> Requeued:
    runs = base / "runs"
    env = clean_env()
    env.update(
        SLURM_CONF=str(slurm.conf),
        COURSE_DATA_DIR=str(tiny_root),
        DATA_SIZE="tiny",
        RUNS_DIR=str(runs),
        GPUS_PER_NODE="2",
        TRAIN_ARGS=RESUME_ARGS,
    )
    return _submit_notice_requeue(
        slurm,
        HPC / "train_resumable.sbatch",
        env,
        base / "out",
        lambda job: runs / f"course-train-resumable-{job}",
        "a first checkpoint",
        "rank0.steps.jsonl",
    )


def _capstone_requeued(slurm: Cluster, tiny_root: Path, base: Path) -> Requeued:
    from course_lib.shards import write_image_shards
    from course_lib.slurm_script import write_slurm_script

    runs = base / "runs"
    shard_set = write_image_shards(base / "shards", size="tiny", root=tiny_root, maxcount=SHARD_SIZE)
    script = write_slurm_script(
        base / "capstone" / "train.sbatch",
        shards=str(shard_set.folder),
        num_workers=1,
        gpus_per_node=2,
        nodes=1,
        time_limit="00:05:00",
    )
    env = clean_env()
    env.update(SLURM_CONF=str(slurm.conf), RUNS_DIR=str(runs), TRAIN_ARGS=CAPSTONE_RESUME_ARGS)
    # an earlier job's checkpoint and report are in its folder: the first run must remove them, not resume them
    return _submit_notice_requeue(
        slurm,
        script,
        env,
        base / "out",
        lambda job: runs / f"course-capstone-{job}",
        "a checkpoint after epoch 0",
        "rank0.json",
    )


@pytest.fixture(scope="module")
def requeued(slurm: Cluster, tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """hpc/train_resumable.sbatch and notebook 13's script, each noticed, requeued and resumed, side by side on two
    nodes: each waits out its own requeue hold (CRED_EXPIRE_S) while the other runs. Each test takes its job's
    outcome from its future, so a failure in one shows in that test only."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="requeue") as pool:
        yield {
            "resumable": pool.submit(_resumable_requeued, slurm, tiny_root, tmp_path_factory.mktemp("resumable")),
            "capstone": pool.submit(_capstone_requeued, slurm, tiny_root, tmp_path_factory.mktemp("capstone-resume")),
        }


def test_resumable_job_is_requeued_and_resumes_exactly(
    slurm: Cluster, requeued: dict[str, Future], record_property
) -> None:
    """hpc/train_resumable.sbatch, submitted with options only. Once it has a checkpoint, it gets the notice
    Slurm sends before the time limit (``--signal=B:USR1@120``), now: ``scancel --signal=USR1 --batch``. Its trap
    stops the training at a step boundary, all ranks save, and ``scontrol requeue`` puts the same job id back in
    the queue. Its second run resumes on the next batch: each rank trains every step once, in the order of an
    uninterrupted run (DistributedSampler, same seed), and the ranks end with the same weights."""
    from torch.utils.data import DistributedSampler

    from course_lib.resume import read_steps

    job = requeued["resumable"].result()
    job_id, run_dir, result = job.job_id, job.run_dir, job.result
    record_property("slurm_resumable", {"seconds": round(job.seconds, 1), "requeue_delay_s": round(job.delay)})

    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), result.describe() + "\n" + slurm.log_tails(40)
    assert result.info.get("Restarts") == "1", result.info
    assert job.left_in_temp == [], job.left_in_temp  # torchrun's log folders, removed at the end of each run
    log = result.output()  # one file for both runs (--open-mode=append)
    assert "removed 3 files an earlier job of the same name and id left" in log, log
    assert "(size tiny)" in log, log  # DATA_SIZE reached the training (course_lib.resume --size)
    first, second = log.index("SLURM_RESTART_COUNT=unset"), log.index("SLURM_RESTART_COUNT=1")
    stopped = re.findall(r"\[rank(\d)\]:rank \1: stopped by signal 15 after step (\d+)", log)
    assert sorted(rank for rank, _ in stopped) == ["0", "1"] and len({step for _, step in stopped}) == 1, log
    stop_step = int(stopped[0][1])
    assert 2 <= stop_step < RESUME_STEPS, log
    assert first < log.index("SIGUSR1 reached the batch script") < log.index("stopped by signal") < second, log
    assert first < log.index(f"== scontrol requeue {job_id}") < second, log
    for rank in (0, 1):
        assert second < log.index(f"[rank{rank}]:rank {rank}: finished at step {RESUME_STEPS}"), log
    assert (
        f"check: 2 rank reports, final step {RESUME_STEPS}; the steps come from runs [0, 1]; every step once per "
        f"rank: yes; samples twice in a rank's epoch: 0; samples per epoch: {[RESUME_LIMIT] * RESUME_EPOCHS}; "
        "weights identical on every rank: yes"
    ) in log, log

    steps = read_steps(run_dir)
    for rank in (0, 1):
        # the first run stopped right after its checkpoint: the second did no step again
        lines = (run_dir / f"rank{rank}.steps.jsonl").read_text().splitlines()
        assert len(lines) == RESUME_STEPS, lines
        assert [s["step"] for s in steps[rank]] == list(range(1, RESUME_STEPS + 1))
        assert [s["run"] for s in steps[rank]] == [0] * stop_step + [1] * (RESUME_STEPS - stop_step)
        for epoch in range(RESUME_EPOCHS):
            sampler = DistributedSampler(range(RESUME_LIMIT), num_replicas=2, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            order = list(sampler)
            expected = [order[i : i + RESUME_BATCH] for i in range(0, len(order), RESUME_BATCH)]
            assert [s["indices"] for s in steps[rank] if s["epoch"] == epoch] == expected, (rank, epoch)
    for epoch in range(RESUME_EPOCHS):  # the two ranks' shares: every sample once per epoch
        trained = sorted(i for rank in (0, 1) for s in steps[rank] if s["epoch"] == epoch for i in s["indices"])
        assert trained == list(range(RESUME_LIMIT)), (epoch, trained)
    reports = read_reports(run_dir)
    assert [r["step"] for r in reports] == [RESUME_STEPS] * 2 and len({r["weights_sha256"] for r in reports}) == 1


def test_capstone_script_is_requeued_and_resumes_at_its_last_finished_epoch(
    slurm: Cluster, requeued: dict[str, Future], record_property
) -> None:
    """Notebook 13's generated script has notebook 14's --signal=B:USR1@120, --requeue and trap. The capstone's
    shard stream has no mid-epoch state, so a notice stops the training and the requeued run starts from the
    checkpoint of the last finished epoch (tests/test_capstone.py proves that equals an uninterrupted run)."""
    job = requeued["capstone"].result()
    job_id, run_dir, result = job.job_id, job.run_dir, job.result
    record_property("slurm_capstone_resume", {"seconds": round(job.seconds, 1)})

    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), result.describe() + "\n" + slurm.log_tails(40)
    assert job.left_in_temp == [], job.left_in_temp  # torchrun's log folders, removed at the end of each run
    log = result.output()
    assert "removed 1 rank reports an earlier job of the same name and id left" in log, log
    notice = log.index("SIGUSR1 reached the batch script: the training stops")
    assert notice < log.index(f"== scontrol requeue {job_id}") < log.index("restarted 1 time(s): resuming"), log
    assert "check: 2 rank reports, [3] batches per rank" in log and "weights identical: True" in log, log
    reports = read_reports(run_dir)
    assert [len(r["epochs"]) for r in reports] == [3, 3], reports
    resumed = {tuple(r["resumed_at"]) for r in reports}
    assert len(resumed) == 1 and len(next(iter(resumed))) == 1 and 1 <= next(iter(resumed))[0] < 3, resumed
    assert len({r["weights_sha256"] for r in reports}) == 1


# --------------------------------------------------------------------------- hpc/README.md's blocks, run here

#: The stand-in for ``sbatch`` on this cluster: Slurm checks each request (``--test-only``: nothing is submitted, the
#: stage's own jobs run the scripts) after the options the block and the script give, with this machine's resources
#: in place of a GPU node's (the scripts ask for 4 GPUs and 32 cores), and the cluster's partition for the README's.
SBATCH_STAND_IN = """#!/usr/bin/env bash
set -euo pipefail
args=("$@"); i=0
while [ "$i" -lt "${#args[@]}" ] && [[ "${args[$i]}" != *.sbatch ]]; do i=$((i + 1)); done
fit=(--partition={partition} --cpus-per-task={cpus} --ntasks-per-node=1)
[[ " ${args[*]:0:$i} " == *" --gres="* ]] || fit+=(--gres=gpu:1)
exec {sbatch} --test-only "${args[@]:0:$i}" "${fit[@]}" "${args[@]:$i}"
"""


def test_hpc_readme_blocks_run_on_the_test_cluster(stage: Stage, tiny_root: Path, tmp_path: Path) -> None:
    """Every hpc/README.md block that tests/documented_blocks.py sends here runs, as written, on this cluster, with
    ``sbatch`` replaced by :data:`SBATCH_STAND_IN` (Slurm still reads each script's ``#SBATCH`` lines and the block's
    own options), the class's settings an instructor hands out (with a reservation made for the test), and the check
    by hand reading the reports of the stage's train_1node job instead of job 123456's."""
    here = "tests/test_slurm.py::test_hpc_readme_blocks_run_on_the_test_cluster"
    mine = [b for b in blocks() if here in (entry(ELSEWHERE, b) or "")]
    assert len(mine) >= 5, [b.name for b in mine]
    cluster = stage.cluster
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        SBATCH_STAND_IN.replace("{partition}", cluster.partition)
        .replace("{cpus}", str(cluster.cpus))
        .replace("{sbatch}", str(slurm_cluster.which("sbatch")))
    )
    (bin_dir / "sbatch").chmod(0o755)
    reservation = f"course-readme-{cluster.tag}"
    cluster.run(
        *("scontrol", "create", "reservation", f"ReservationName={reservation}", "StartTime=now", "Duration=30"),
        *(f"Users={pwd.getpwuid(os.geteuid()).pw_name}", f"Nodes={cluster.node_names[0]}", "Flags=IGNORE_JOBS"),
    )
    env = dict(
        clean_env(),
        SLURM_CONF=str(cluster.conf),
        COURSE_DATA_DIR=str(tiny_root),
        DATA_SIZE="tiny",
        CLASS_ACCOUNT="course",
        CLASS_PARTITION=cluster.partition,
        CLASS_RESERVATION=reservation,
        CLASS_CPUS=str(min(4, cluster.cpus)),
    )
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    failures = []
    try:
        for block in mine:
            code = block.code.replace("runs/course-train-1node-123456", str(stage["1node"].run_dir))
            command = ["bash", "-e", "-o", "pipefail", "-c", code] if block.language == "bash" else [sys.executable]
            done = subprocess.run(
                command,
                input=code if block.language == "python" else None,
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode != 0:
                failures.append(f"{block.name}: exit {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    finally:
        cluster.run("scontrol", "delete", "reservation", reservation, check=False)
    assert not failures, "\n\n".join(failures)


# --------------------------------------------------------------------------- exercise 11.4 under a plain srun

SRUN_ENV_JOB = """#!/bin/bash
srun -n 2 {python} -c 'import json, os; print("env:" + json.dumps(dict(os.environ)))'
"""


def test_rank_env_of_notebook_11_reads_a_plain_srun(slurm: Cluster, tmp_path: Path) -> None:
    """Exercise 11.4's solution (notebook 11, the rank MDS should see) in the environments Slurm really gives the two
    tasks of ``sbatch -n 2`` + ``srun -n 2``: no --ntasks-per-node, so no SLURM_NTASKS_PER_NODE, only
    SLURM_TASKS_PER_NODE (sbatch's man page: "Only set if the --ntasks-per-node option is specified")."""
    import nbformat

    notebook = nbformat.read(ROOT / "notebooks" / "solutions" / "11_beyond_webdataset.ipynb", as_version=4)
    source = next(c.source for c in notebook.cells if c.cell_type == "code" and "def rank_env(" in c.source)
    solution = source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    scope: dict = {}
    exec(solution, scope)  # the notebook's own answer, as a learner's notebook defines it
    script = tmp_path / "srun_env.sbatch"
    script.write_text(SRUN_ENV_JOB.format(python=sys.executable))
    job = slurm.sbatch(
        script,
        ["-n", "2", "-N", "1", "-c", "1", f"--time={JOB_TIME_LIMIT}", f"--output={tmp_path / 'out.txt'}"],
        env=clean_env(),
        cwd=tmp_path,
    )
    result = slurm.wait([job], timeout=120)[job]
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), result.describe()
    envs = [json.loads(line[4:]) for line in (tmp_path / "out.txt").read_text().splitlines() if line.startswith("env:")]
    assert len(envs) == 2
    assert all("SLURM_NTASKS_PER_NODE" not in e and e["SLURM_TASKS_PER_NODE"] == "2" for e in envs), envs
    answers = sorted((scope["rank_env"](e) for e in envs), key=lambda a: a["RANK"])
    assert answers == [{"RANK": r, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"} for r in ("0", "1")], answers
