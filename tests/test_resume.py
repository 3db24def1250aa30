"""course_lib.resume: checkpoints that are complete or absent, step logs, the stop flag, and 2-rank torchrun jobs
stopped at several points (SIGKILL before the first checkpoint, SIGKILL while the workers prefetch, SIGTERM in the
second epoch) that resume exactly: the same samples in the same order on every rank, the same final weights."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import torch.distributed as dist

from course_lib import resume
from course_lib.distributed import read_reports
from course_tools.launch import launch


@pytest.mark.quick
def test_a_checkpoint_is_complete_or_absent(tmp_path):
    assert resume.load_checkpoint(tmp_path, 0) is None
    resume.save_checkpoint(tmp_path, 0, 4, {"step": 4, "w": torch.ones(2)})
    resume.save_checkpoint(tmp_path, 0, 8, {"step": 8, "w": torch.zeros(2)})
    assert (tmp_path / "latest").read_text().strip() == "8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step0000008"]  # the older step is gone
    assert resume.load_checkpoint(tmp_path, 0)["step"] == 8
    # a rank that did not write its part of the latest step is told so, not given another step's part
    with pytest.raises(FileNotFoundError, match="rank1.pt is missing"):
        resume.load_checkpoint(tmp_path, 1)


@pytest.mark.quick
def test_only_its_own_step_folders_are_removed(tmp_path):
    mine = tmp_path / "step0000001"
    mine.mkdir()
    (mine / "notes.txt").write_text("a file the course did not write")
    resume.save_checkpoint(tmp_path, 0, 2, {"step": 2})
    assert (mine / "notes.txt").exists()


@pytest.mark.quick
def test_the_checkpoint_loads_without_running_code(tmp_path):
    resume.save_checkpoint(tmp_path, 0, 1, {"step": 1, "rng": torch.get_rng_state(), "nested": {"a": [1, 2]}})
    assert resume.load_checkpoint(tmp_path, 0)["nested"] == {"a": [1, 2]}


@pytest.mark.quick
def test_step_logs_keep_the_last_run_of_each_step(tmp_path):
    lines = [{"run": 0, "epoch": 0, "step": s, "indices": [s]} for s in (1, 2, 3)]
    lines += [{"run": 1, "epoch": 0, "step": s, "indices": [10 + s]} for s in (3, 4)]
    (tmp_path / "rank0.steps.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    steps = resume.read_steps(tmp_path)[0]
    assert [(s["step"], s["run"], s["indices"]) for s in steps] == [(1, 0, [1]), (2, 0, [2]), (3, 1, [13]), (4, 1, [14])]
    with pytest.raises(FileNotFoundError, match="--report"):
        resume.read_steps(tmp_path / "nothing")


@pytest.mark.quick
def test_the_stop_flag_notes_the_signal_and_agrees_alone():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        flag = resume.StopFlag()
        assert not flag.agreed()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.received == signal.SIGUSR1 and flag.agreed()
        assert not dist.is_initialized()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.quick
def test_bad_options_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit):
        resume._parse_args(["--ckpt", "c", "--report", "r", "--ckpt-every", "-1"])
    assert "not negative" in capsys.readouterr().err


def _job(tmp_path, name, *options, nproc=2):
    return launch("course_lib.resume", "--ckpt", str(tmp_path / name / "ckpt"), "--report", str(tmp_path / name / "steps"),
                  *options, nproc=nproc, timeout=90, check=False, show=False)


def _orders(folder):
    return {rank: [s["indices"] for s in steps] for rank, steps in resume.read_steps(folder).items()}


@pytest.mark.full
@pytest.mark.timeout(300)
def test_a_job_stopped_three_times_resumes_exactly(tmp_path):
    """16 steps (2 epochs of 8), a checkpoint every 4. The same job is stopped three times and resumed each time."""
    reference = _job(tmp_path, "reference")
    assert reference.ok, reference.ranks
    # 1. SIGKILL after step 3, before any checkpoint: the next run starts from scratch
    first = _job(tmp_path, "stopped", "--stop-at", "3")
    assert not first.ok and not (tmp_path / "stopped" / "ckpt" / "latest").exists()
    # 2. SIGKILL after step 6: 2 workers x prefetch 2 hold batches 7-10 when rank 0 and its workers die
    second = _job(tmp_path, "stopped", "--stop-at", "6")
    assert not second.ok and (tmp_path / "stopped" / "ckpt" / "latest").read_text().strip() == "4"
    # 3. SIGTERM to torchrun after step 11, in the second epoch: every rank saves step 11 and stops
    third = _job(tmp_path, "stopped", "--stop-at", "11", "--how", "term")
    assert all("stopped by signal 15 after step 11" in third.ranks[r][-1] for r in (0, 1)), third.ranks
    assert (tmp_path / "stopped" / "ckpt" / "latest").read_text().strip() == "11"
    # a mid-epoch checkpoint of 2 ranks cannot resume with 3: refused with a message, the checkpoint untouched
    three = _job(tmp_path, "stopped", nproc=3)
    assert not three.ok and any("resume it with 2 ranks" in line for r in three.ranks.values() for line in r)
    last = _job(tmp_path, "stopped")
    assert last.ok, last.ranks

    steps = resume.read_steps(tmp_path / "stopped" / "steps")
    assert [s["run"] for s in steps[0]] == [1] * 4 + [2] * 7 + [3] * 5  # the runs that made the final model
    assert _orders(tmp_path / "stopped" / "steps") == _orders(tmp_path / "reference" / "steps")
    digests = {r["weights_sha256"] for name in ("stopped", "reference") for r in read_reports(tmp_path / name / "steps")}
    assert len(digests) == 1


@pytest.mark.full
@pytest.mark.timeout(120)
def test_a_plain_loader_replays_the_epoch(tmp_path):
    """The pitfall the notebook shows: the same stop with --loader plain trains half of epoch 0 twice."""
    assert not _job(tmp_path, "plain", "--loader", "plain", "--stop-at", "6").ok
    assert _job(tmp_path, "plain", "--loader", "plain").ok
    epoch0 = [i for steps in resume.read_steps(tmp_path / "plain" / "steps").values()
              for s in steps if s["epoch"] == 0 for i in s["indices"]]
    assert len(epoch0) == 64 and len(set(epoch0)) == 32
