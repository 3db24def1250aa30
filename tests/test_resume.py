"""course_lib.resume: checkpoints that are complete or absent, step logs, the stop flag, streams resumed twice in
one epoch, and 2-rank torchrun jobs stopped at several points (SIGKILL before the first checkpoint, SIGKILL while
the workers prefetch, SIGTERM in the same epoch after a resume, SIGTERM in the second epoch) that resume exactly:
the same samples in the same order on every rank, the same final weights."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib import resume
from course_lib.distributed import read_reports
from course_lib.jobs import launch


@pytest.mark.quick
def test_a_checkpoint_is_complete_or_absent(tmp_path):
    assert resume.load_checkpoint(tmp_path, 0) is None
    resume.save_checkpoint(tmp_path, 0, 4, {"mine": 4}, shared={"step": 4, "w": torch.ones(2)})
    resume.save_checkpoint(tmp_path, 0, 8, {"mine": 8}, shared={"step": 8, "w": torch.zeros(2)})
    assert (tmp_path / "latest").read_text().strip() == "8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step0000008"]  # the older step is gone
    assert sorted(p.name for p in (tmp_path / "step0000008").iterdir()) == ["rank0.pt", "shared.pt"]
    got = resume.load_checkpoint(tmp_path, 0)
    assert got["step"] == 8 and got["mine"] == 8 and got["rank_part"] and torch.equal(got["w"], torch.zeros(2))
    # a rank that saved no part of its own (a job started with more ranks) gets the shared part, and is told so
    other = resume.load_checkpoint(tmp_path, 1)
    assert other["step"] == 8 and "mine" not in other and not other["rank_part"]


@pytest.mark.quick
def test_a_step_with_neither_part_is_named_damaged(tmp_path):
    (tmp_path / "step0000003").mkdir()
    (tmp_path / "latest").write_text("3\n")
    with pytest.raises(resume.ResumeError, match="damaged; remove .*latest"):
        resume.load_checkpoint(tmp_path, 0)


@pytest.mark.quick
def test_every_file_reaches_the_disk_before_latest_names_it(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", str(b))), real_replace(a, b)))
    resume.save_checkpoint(tmp_path, 0, 2, {"mine": 2}, shared={"step": 2})
    names = [(kind, Path(path).name) for kind, path in events]
    latest = names.index(("rename", "latest"))
    for name in ("rank0.pt", "shared.pt"):
        rename = names.index(("rename", name))
        assert any(kind == "fsync" and n.startswith(f".{name}.tmp") for kind, n in names[:rename])  # bytes first
        assert rename < latest
    assert ("fsync", "step0000002") in names[:latest]  # the renames in the step folder, before latest moves
    assert names[-1] == ("fsync", tmp_path.name)  # and latest's own rename


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
    assert [(s["step"], s["run"], s["indices"]) for s in steps] == [
        (1, 0, [1]),
        (2, 0, [2]),
        (3, 1, [13]),
        (4, 1, [14]),
    ]
    with pytest.raises(FileNotFoundError, match="--report"):
        resume.read_steps(tmp_path / "nothing")


@pytest.mark.quick
@pytest.mark.parametrize(
    "saved, world_size, per_epoch, expected",
    [
        # the cases, with the defaults (64 samples, batches of 4): 3 ranks have 6 steps per epoch, 4 have 4, 2 have 8
        ({"step": 8, "world_size": 3, "steps_per_epoch": 6}, 2, 8, "saved by 3 ranks at step 8, 2 steps into epoch 1"),
        ({"step": 4, "world_size": 4, "steps_per_epoch": 4}, 2, 8, (1, 8)),  # an epoch boundary: epoch 1 starts
        ({"step": 11, "world_size": 2, "steps_per_epoch": 8}, 3, 6, "resume it with 2 ranks"),  # more ranks, mid-epoch
        ({"step": 8, "world_size": 2, "steps_per_epoch": 8}, 3, 6, (1, 6)),  # more ranks, at the boundary
        ({"step": 11, "world_size": 2, "steps_per_epoch": 8}, 2, 8, (1, 11)),  # as many ranks: anywhere
        ({"step": 11, "world_size": 2, "steps_per_epoch": 8}, 2, 4, "the same data, batch size and --limit"),
    ],
)
def test_a_resized_job_resumes_at_an_epoch_boundary_or_is_told_what_to_do(saved, world_size, per_epoch, expected):
    if isinstance(expected, tuple):
        assert resume.resume_point(saved, world_size, per_epoch) == expected
    else:
        with pytest.raises(resume.ResumeError, match=expected):
            resume.resume_point(saved, world_size, per_epoch)


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
def test_the_stop_flag_all_reduces_on_the_rank_device_where_cpu_tensors_are_refused():
    """A group whose only backend serves CUDA devices rejects CPU tensors, as NCCL does: "cuda:gloo" shows it on a
    machine without a GPU. The flag built for the CPU fails there; a gloo group takes it."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        dist.init_process_group("cuda:gloo", store=dist.HashStore(), rank=0, world_size=1)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            resume.StopFlag(torch.device("cpu")).agreed()
        dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        flag = resume.StopFlag(torch.device("cpu"))
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.agreed() and flag.device == torch.device("cpu")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.quick
def test_bad_options_are_refused_with_a_message(capsys):
    with pytest.raises(SystemExit):
        resume._parse_args(["--ckpt", "c", "--report", "r", "--ckpt-every", "-1"])
    assert "not negative" in capsys.readouterr().err


def _passes(loader, count=2):
    """``count`` passes of ``loader``, each as one list of ints; its workers are stopped at the end."""
    passes, it = [], None
    try:
        for _ in range(count):
            it = iter(loader)
            passes.append([int(i) for batch in it for i in batch])
        return passes
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


@pytest.mark.quick
@pytest.mark.parametrize(
    "workers",
    [{"num_workers": 0}, {"num_workers": 2, "persistent_workers": True}, {"num_workers": 2}],
    ids=["no-workers", "persistent-workers", "fresh-workers"],
)
def test_the_resumable_stream_reads_every_epoch_whole_and_resumes_twice(workers):
    """The same stream object (no workers, persistent ones) runs __iter__ once per epoch: a restored position serves
    the first pass only, and every epoch, resumed twice or not at all, covers 0..n-1."""
    whole = _passes(resume.stateful_loader(resume.ResumableStream(12), batch_size=3, **workers))
    assert [sorted(p) for p in whole] == [list(range(12))] * 2
    before, state = _stopped(lambda: resume.stateful_loader(resume.ResumableStream(12), batch_size=3, **workers), 2)
    more, state = _stopped(
        lambda: resume.stateful_loader(resume.ResumableStream(12), batch_size=3, **workers), 1, state
    )
    resumed = resume.stateful_loader(resume.ResumableStream(12), batch_size=3, **workers)
    resumed.load_state_dict(state)
    after, following = _passes(resumed)
    assert before + more + after == whole[0] and following == whole[1]


def _stopped(make_loader, batches, state=None):
    """The samples of ``batches`` batches of a new loader (resumed from ``state``), and its state after them."""
    loader = make_loader()
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    got = [int(i) for _ in range(batches) for i in next(it)]
    state = loader.state_dict()
    getattr(it, "_shutdown_workers", lambda: None)()
    return got, state


@pytest.mark.quick
@pytest.mark.parametrize("workers", [0, 2], ids=["no-workers", "2-workers"])
def test_a_state_that_stops_advancing_passes_one_resume_and_fails_the_second(workers):
    """StaleStateStream, the stand-in for huggingface/datasets#8308: resumed once it goes on exactly; the state it
    saves after that resume is position 0, so the second resume starts its share over."""

    def make():
        return resume.stateful_loader(resume.StaleStateStream(12), batch_size=3, num_workers=workers)

    whole = [int(i) for b in make() for i in b]
    first, state = _stopped(make, 2)
    once = make()
    once.load_state_dict(state)
    assert first + [int(i) for b in once for i in b] == whole  # one resume: exact
    second, state = _stopped(make, 1, state)
    again = make()
    again.load_state_dict(state)
    rest = [int(i) for b in again for i in b]
    assert first + second + rest != whole and len(rest) > len(whole) - len(first) - len(second)  # replayed
    # the course's stream, stopped and resumed at the same points, is exact both times
    good = lambda: resume.stateful_loader(resume.ResumableStream(12), batch_size=3, num_workers=workers)  # noqa: E731
    a, state = _stopped(good, 2)
    b, state = _stopped(good, 1, state)
    last = good()
    last.load_state_dict(state)
    assert a + b + [int(i) for x in last for i in x] == [int(i) for x in good() for i in x]


@pytest.fixture
def job(tmp_path, tiny_root):
    """``job(name, *options, nproc=2)``: a torchrun job of course_lib.resume on the tiny set (prepared by this session,
    not left in the data cache by a notebook that ran before), its checkpoints and step logs in tmp_path / name."""

    def run(name, *options, nproc=2):
        return launch(
            "course_lib.resume",
            "--ckpt",
            str(tmp_path / name / "ckpt"),
            "--report",
            str(tmp_path / name / "steps"),
            "--data",
            str(tiny_root),
            "--size",
            "tiny",
            *options,
            nproc=nproc,
            timeout=90,
            check=False,
            show=False,
        )

    return run


def _orders(folder):
    """Per rank, every step's samples and a digest of their augmented images."""
    return {rank: [(s["indices"], s["images"]) for s in steps] for rank, steps in resume.read_steps(folder).items()}


@pytest.mark.full
@pytest.mark.timeout(300)
def test_a_job_stopped_four_times_resumes_exactly(job, tmp_path):
    """16 steps (2 epochs of 8), a checkpoint every 4. The same job is stopped four times and resumed each time;
    epoch 0 is resumed twice (from step 4, then from step 7, a state saved after the first resume)."""
    reference = job("reference")
    assert reference.ok, reference.ranks
    # 1. SIGKILL after step 3, before any checkpoint: the next run starts from scratch
    first = job("stopped", "--stop-at", "3")
    assert not first.ok and not (tmp_path / "stopped" / "ckpt" / "latest").exists()
    # 2. SIGKILL after step 6: 2 workers x prefetch 2 hold batches 7-10 when rank 0 and its workers die
    second = job("stopped", "--stop-at", "6")
    assert not second.ok and (tmp_path / "stopped" / "ckpt" / "latest").read_text().strip() == "4"
    # 3. SIGTERM to torchrun after step 7: resumed from step 4, it saves step 7 in the same epoch and stops
    third = job("stopped", "--stop-at", "7", "--how", "term")
    assert all("stopped by signal 15 after step 7" in third.ranks[r][-1] for r in (0, 1)), third.ranks
    # 4. SIGTERM after step 11, in the second epoch, by a run that resumed a state saved after a resume (step 7)
    fourth = job("stopped", "--stop-at", "11", "--how", "term")
    assert all("stopped by signal 15 after step 11" in fourth.ranks[r][-1] for r in (0, 1)), fourth.ranks
    assert (tmp_path / "stopped" / "ckpt" / "latest").read_text().strip() == "11"
    # a mid-epoch checkpoint of 2 ranks cannot resume with 3: refused with a message, the checkpoint untouched
    three = job("stopped", nproc=3)
    assert not three.ok and any("resume it with 2 ranks" in line for r in three.ranks.values() for line in r)
    last = job("stopped")
    assert last.ok, last.ranks

    steps = resume.read_steps(tmp_path / "stopped" / "steps")
    assert [s["run"] for s in steps[0]] == [1] * 4 + [2] * 3 + [3] * 4 + [4] * 5  # the runs that made the model
    assert _orders(tmp_path / "stopped" / "steps") == _orders(tmp_path / "reference" / "steps")
    digests = {
        r["weights_sha256"] for name in ("stopped", "reference") for r in read_reports(tmp_path / name / "steps")
    }
    assert len(digests) == 1


@pytest.mark.full
@pytest.mark.timeout(240)
def test_a_resized_job_goes_on_at_the_next_epoch(job, tmp_path):
    """3 ranks train epoch 0 (6 steps each) and end; 2 ranks take over at epoch 1 (8 steps each) from that checkpoint."""
    first = job("resized", "--epochs", "1", nproc=3)
    assert first.ok, first.ranks
    assert (tmp_path / "resized" / "ckpt" / "latest").read_text().strip() == "6"
    second = job("resized", "--epochs", "2")
    assert second.ok, second.ranks
    assert all(
        any("resumed at step 8 (epoch 1) from a checkpoint of 3 ranks" in line for line in second.ranks[r])
        for r in (0, 1)
    ), second.ranks
    steps = resume.read_steps(tmp_path / "resized" / "steps")
    epoch1 = [i for rank in (0, 1) for s in steps[rank] if s["epoch"] == 1 for i in s["indices"]]
    assert sorted(epoch1) == list(range(64))  # the new job's epoch 1: every sample once over its 2 ranks
