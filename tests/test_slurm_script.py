"""course_lib.slurm_script: notebook 13's Slurm script, rendered from the tuned settings and valid (tests/test_slurm.py runs it on a real cluster)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from course_lib import slurm_script as slurm
from course_lib.checks.nb13 import sbatch_options, script_settings

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nodes", [1, 3])
def test_rendered_script_is_valid_bash_with_the_tuned_settings(nodes, tmp_path) -> None:
    path = slurm.write_slurm_script(
        tmp_path / "runs" / "capstone" / "train.sbatch",
        shards="/scratch/$USER/shards",
        num_workers=3,
        prefetch_factor=4,
        nodes=nodes,
        gpus_per_node=4,
    )
    text = path.read_text()
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    options = sbatch_options(text)
    assert options["nodes"] == str(nodes) and options["ntasks-per-node"] == "1" and options["gres"] == "gpu:4"
    assert options["cpus-per-task"] == "16"  # 4 ranks × (3 workers + 1)
    assert options["account"] == options["partition"] == "CHANGE_ME"
    settings = script_settings(text)
    assert settings["WORKERS"] == "3" and settings["PREFETCH_FACTOR"] == "4" and settings["CPUS_PER_TASK"] == "16"
    assert 'SHARDS="${SHARDS:-/scratch/$USER/shards}"' in text and "/dev/shm" in text
    assert ("--standalone" in text) == (nodes == 1) and ("--rdzv-endpoint" in text) == (nodes > 1)
    assert "-m course_lib.capstone train" in text and "course_lib.capstone check" in text
    # notebook 14: the time-limit notice, a requeue, one log for every run, a checkpoint at every epoch's end
    assert options["signal"] == "B:USR1@120" and options["open-mode"] == "append" and "requeue" in options
    assert (
        '--ckpt "$CKPT_DIR"' in text and "trap 'on_notice USR1' USR1" in text and "scontrol requeue Incomplete" in text
    )
    # torchrun's copy of each rank's output: a folder of the job's on each node, removed on every node at the end
    assert '--tee=3 --log-dir="$TORCHRUN_LOGS"' in text
    on_each_node = 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 ' if nodes > 1 else ""
    assert "trap '" + on_each_node + 'rm -rf -- "$TORCHRUN_LOGS" ' in text


def test_script_refuses_plain_bash(tmp_path) -> None:
    path = slurm.write_slurm_script(tmp_path / "x.sbatch", shards="/data/shards", num_workers=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_workers=7, cpus_per_node=24), r"32 CPUs, but a node has 24: use at most 5 workers"),
        (dict(num_workers=-1), "num_workers must be a whole number >= 0"),
        (dict(num_workers=2.5), "num_workers must be a whole number"),
        (dict(num_workers=2, nodes=0), "nodes must be"),
        (dict(num_workers=2, shards="/my data/shards"), "without spaces or quotes"),
        (dict(num_workers=2, shards='x"; rm -rf ~'), "without spaces or quotes"),
        (dict(num_workers=2, time_limit="20 minutes"), "HH:MM:SS"),
    ],
)
def test_bad_script_settings(settings, message) -> None:
    settings = {"shards": "/scratch/shards", **settings}
    with pytest.raises(ValueError, match=message):
        slurm.render_slurm_script(**settings)


def test_script_name_must_end_in_sbatch(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\*\.sbatch"):
        slurm.write_slurm_script(tmp_path / "train.sh", shards="/s", num_workers=1)
    assert not (tmp_path / "train.sh").exists()


def test_a_staged_script_copies_the_shards_reads_them_there_and_removes_them(tmp_path) -> None:
    """stage=True: each node copies the shards to its local disk (timed, with the reason printed), the training
    reads the copy, and the EXIT trap removes it, on an error too. Run here with bash, srun-less (one node)."""
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        (shards / f"s-{i:06d}.tar").write_bytes(b"x" * 1000)
    text = slurm.render_slurm_script(
        shards=str(shards), num_workers=1, nodes=1, gpus_per_node=2, stage=True, stage_why="it pays"
    )
    start, end = text.index("TORCHRUN_LOGS="), text.index("RUN_DIR=")
    block = text[start:end]
    node = tmp_path / "node"
    node.mkdir()
    script = f'set -euo pipefail\nSHARDS="{shards}"\n{block}\nls "$SHARDS"\necho "reading $SHARDS"\nfalse\n'
    done = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_TMPDIR": str(node)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1, done.stderr
    assert "staging (it pays): 1 MB copied to the node's local disk in " in done.stdout, done.stdout
    assert f"reading {node}/course-shards-77" in done.stdout
    assert sorted(line for line in done.stdout.splitlines() if line.endswith(".tar")) == [
        f"s-{i:06d}.tar" for i in range(3)
    ]
    assert list(node.iterdir()) == [], "the copy goes when the script ends"
    plain = slurm.render_slurm_script(shards="/s", num_workers=1, stage_why="the shards are few and large")
    assert "# ---- no staging (the shards are few and large)" in plain and "LOCAL_SHARDS" not in plain


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(stage="yes"), "stage must be True or False"),
        (dict(stage=True, stage_why="it's"), "plain text"),
        (dict(stage_why='"$(rm -rf ~)"'), "plain text"),
    ],
)
def test_bad_staging_settings(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        slurm.render_slurm_script(shards="/s", num_workers=1, **settings)
