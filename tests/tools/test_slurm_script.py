"""course_tools.slurm: notebook 10's Slurm script, rendered from the tuned settings, valid, and run under a fake srun."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import shards
from course_lib.distributed import read_reports
from course_tools import slurm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory, tiny_root: Path) -> shards.ShardSet:
    """The tiny set's 80 training images as 8 shards of 10."""
    return shards.write_image_shards(tmp_path_factory.mktemp("slurm") / "train", size="tiny", root=tiny_root, maxcount=10)


@pytest.mark.parametrize("nodes", [1, 3])
def test_rendered_script_is_valid_bash_with_the_tuned_settings(nodes, tmp_path) -> None:
    path = slurm.write_slurm_script(tmp_path / "runs" / "capstone" / "train.sbatch", shards="/scratch/$USER/shards",
                                       num_workers=3, prefetch_factor=4, nodes=nodes, gpus_per_node=4)
    text = path.read_text()
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    options = slurm.sbatch_options(text)
    assert options["nodes"] == str(nodes) and options["ntasks-per-node"] == "1" and options["gres"] == "gpu:4"
    assert options["cpus-per-task"] == "16"  # 4 ranks × (3 workers + 1)
    assert options["account"] == options["partition"] == "CHANGE_ME"
    settings = slurm.script_settings(text)
    assert settings["WORKERS"] == "3" and settings["PREFETCH_FACTOR"] == "4" and settings["CPUS_PER_TASK"] == "16"
    assert 'SHARDS="${SHARDS:-/scratch/$USER/shards}"' in text and "/dev/shm" in text
    assert ("--standalone" in text) == (nodes == 1) and ("--rdzv-endpoint" in text) == (nodes > 1)
    assert "-m course_lib.capstone train" in text and "course_lib.capstone check" in text


def test_script_refuses_plain_bash(tmp_path) -> None:
    path = slurm.write_slurm_script(tmp_path / "x.sbatch", shards="/data/shards", num_workers=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr


@pytest.mark.parametrize("settings, message", [
    (dict(num_workers=7, cpus_per_node=24), r"32 CPUs, but a node has 24: use at most 5 workers"),
    (dict(num_workers=-1), "num_workers must be a whole number >= 0"),
    (dict(num_workers=2.5), "num_workers must be a whole number"),
    (dict(num_workers=2, nodes=0), "nodes must be"),
    (dict(num_workers=2, shards="/my data/shards"), "without spaces or quotes"),
    (dict(num_workers=2, shards='x"; rm -rf ~'), "without spaces or quotes"),
    (dict(num_workers=2, time_limit="20 minutes"), "HH:MM:SS"),
])
def test_bad_script_settings(settings, message) -> None:
    settings = {"shards": "/scratch/shards", **settings}
    with pytest.raises(ValueError, match=message):
        slurm.render_slurm_script(**settings)


def test_script_name_must_end_in_sbatch(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\*\.sbatch"):
        slurm.write_slurm_script(tmp_path / "train.sh", shards="/s", num_workers=1)
    assert not (tmp_path / "train.sh").exists()


FAKE_SRUN = """#!/bin/sh
# fake srun for one node: drop srun's own options, run the command once
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""


def test_one_node_script_runs_end_to_end_with_a_fake_srun(shard_set, tmp_path) -> None:
    """The rendered 1-node script under a fake srun: 2 CPU ranks, 1 worker each, its own final check passes."""
    path = slurm.write_slurm_script(tmp_path / "job.sbatch", shards=str(shard_set.folder), num_workers=1,
                                       gpus_per_node=2)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": FAKE_SRUN, "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
                       "torchrun": f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n'}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    drop = re.compile(r"^(SLURM_|TORCHELASTIC_|RANK$|LOCAL_RANK$|WORLD_SIZE$|MASTER_|VIRTUAL_ENV$)")
    env = {k: v for k, v in os.environ.items() if not drop.match(k)}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NAME="capstone-test",
               SLURM_NNODES="1", SLURM_CPUS_PER_TASK="4", COURSE_VENV="", RUNS_DIR=str(tmp_path / "runs"),
               TRAIN_ARGS="--epochs 1 --batch-size 4 --epoch-batches 3", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(["bash", str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script still ran after 150 s\n{out}\n{err}")
    assert proc.returncode == 0, out + err
    assert "check: 2 rank reports, [3] batches per rank" in out and "weights identical: True" in out
    assert len(read_reports(tmp_path / "runs" / "capstone-test-4242")) == 2
