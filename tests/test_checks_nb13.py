"""Checks of notebook 13: right answers pass, stubs are "not attempted", wrong answers get their hint."""

from __future__ import annotations

import itertools
import os
import warnings
from pathlib import Path

import pytest

from course_lib import capstone, shards
from course_lib.checks import Status, nb13
from course_lib.instrument import BatchRecord, EpochRecord
from course_lib import slurm_script as slurm
from exercise_status import right_and_stubs, status

pytestmark = pytest.mark.quick

STALLS = {0: 0.6, 1: 0.35, 2: 0.03, 3: 0.02}  # the shape measured on 2 cores


def record(
    workers: int,
    stall: float,
    batches: int = 12,
    decode_ms: float = capstone.DECODE_MS,
    step_ms: float = capstone.STEP_MS,
    batch_size: int = 16,
) -> EpochRecord:
    """An epoch whose loop waits ``stall`` of each batch's time (the first batch excepted)."""
    step = step_ms / 1000
    wait = stall * step / (1 - stall)
    epoch = EpochRecord(
        num_workers=workers,
        t0=0.0,
        settings={"num_workers": workers, "batch_size": batch_size, "decode_ms": decode_ms, "step_ms": step_ms},
    )
    t = 0.0
    for i in range(batches):
        first_wait = 0.3 if i == 0 else wait
        epoch.batches.append(
            BatchRecord(
                number=i,
                worker=-1 if workers == 0 else i % workers,
                start=t,
                end=t + first_wait,
                requested=t,
                received=t + first_wait,
                step_end=t + first_wait + step,
                samples=batch_size,
                nbytes=0,
            )
        )
        t += first_wait + step
    return epoch


def sweep(stalls: dict[int, float] = STALLS, **kw) -> dict[int, EpochRecord]:
    return {w: record(w, s, **kw) for w, s in stalls.items()}


# --------------------------------------------------------------------------- 13.1


def pipeline(
    node=True,
    worker=True,
    cycle="course",
    decode=True,
    fields=("jpg", "cls", "__key__"),
    simulate=True,
    fixed_seed=False,
    stage_seed=None,
    tuple_first=False,
    rotate="course",
    buffer=None,
):
    """Exercise 13.1's answer (the notebook's solution with ``buffer="course"``), and its other forms through the
    keywords: ``rotate`` "course", None (wds.SimpleShardList) or "by rank"; ``cycle`` "course", None, "same order" or
    "with replacement"; ``buffer`` None, "course", "small" (ShuffleBuffer(5, seed)) or "unseeded" (wds.shuffle)."""
    import random

    import webdataset as wds

    from course_lib import capstone

    class RankRotation(capstone.RotatingShardList):  # wrong: the rank in the seed, so the ranks' deals differ
        def __iter__(self):
            rank = int(os.environ.get("RANK", 0))
            self.seed += 1000 * rank
            yield from super().__iter__()
            self.seed -= 1000 * rank

    def with_replacement(src):  # wrong: draws shards at random, a shard twice before another once
        urls = [d["url"] for d in src]
        rng = random.Random(0)
        while True:
            yield {"url": rng.choice(urls)}

    def fn(urls, seed, decode_ms):
        seed = 0 if fixed_seed else seed
        cycle_seed = 0 if stage_seed == "cycle" else seed
        buffer_seed = 0 if stage_seed == "buffer" else seed
        source = {
            "course": capstone.RotatingShardList(urls, seed),
            None: wds.SimpleShardList(urls),
            "by rank": RankRotation(urls, seed),
        }[rotate]
        stages = [source] + ([wds.split_by_node] if node else []) + ([wds.split_by_worker] if worker else [])
        stages += {
            "course": [capstone.EndlessShardCycle(cycle_seed)],
            None: [],
            "same order": [lambda src: itertools.cycle(list(src))],
            "with replacement": [with_replacement],
        }[cycle]
        stages += [wds.tarfile_to_samples()]
        stages += {
            None: [],
            "course": [capstone.ShuffleBuffer(capstone.SHUFFLE_BUFFER, buffer_seed)],
            "small": [capstone.ShuffleBuffer(5, buffer_seed)],
            "unseeded": [wds.shuffle(100)],
        }[buffer]
        decoding = [wds.decode("torchrgb")] if decode else []
        stages += [wds.to_tuple(*fields)] + decoding if tuple_first else decoding + [wds.to_tuple(*fields)]
        stages += [wds.map(capstone.SimulatedDecode(decode_ms))] if simulate else []
        return wds.DataPipeline(*stages)

    return fn


def test_13_build_dataset_right_answers() -> None:
    def stub(urls, seed, decode_ms):
        raise NotImplementedError

    right_and_stubs(nb13.build_dataset, pipeline(buffer="course"), stub)
    for right in (pipeline(buffer="small"), capstone.build_dataset):  # a small buffer; the course's own
        assert status(nb13.build_dataset, right)[0] is Status.SOLVED, status(nb13.build_dataset, right)[1]


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (dict(node=False), "wds.split_by_node"),
        (dict(worker=False), "wds.split_by_worker"),
        (dict(cycle=None, buffer="course"), "EndlessShardCycle(seed) after the splitters"),
        (dict(), "got its samples shard by shard"),  # no shuffle buffer
        (dict(buffer="course", stage_seed="cycle"), "capstone.EndlessShardCycle has seed 0"),
        (dict(buffer="course", stage_seed="buffer"), "ShuffleBuffer(capstone.SHUFFLE_BUFFER, seed)"),
        (dict(buffer="course", tuple_first=True), "it decodes a sample dict's fields by their extension"),
        (dict(cycle="same order"), "same order every pass"),
        (dict(cycle="with replacement"), "do not draw shards with replacement"),
        (dict(rotate=None, buffer="course"), "in place of wds.SimpleShardList(urls)"),
        (dict(rotate="by rank", buffer="course"), "shuffled alike on every rank and worker"),
        (dict(decode=False), "float tensor"),
        (dict(fields=("cls", "jpg", "__key__")), "float tensor"),
        (dict(fixed_seed=True, buffer="course"), "seeds 0 and 1"),
        (dict(buffer="unseeded"), "capstone.ShuffleBuffer(size, seed)"),
        (dict(simulate=False, buffer="course"), "SimulatedDecode"),
    ],
)
def test_13_build_dataset_wrong_answers(wrong, hint) -> None:
    got, message = status(nb13.build_dataset, pipeline(**wrong))
    assert got is Status.WRONG and hint in message, message


# --------------------------------------------------------------------------- 13.2


def test_synthetic_records_have_the_stall_asked_for() -> None:
    assert record(1, 0.35).steady_stall_fraction == pytest.approx(0.35, abs=0.04)


@pytest.fixture
def four_cores(monkeypatch):
    """A machine with cores for 3 workers and the main process: the core budget is not what these cases test."""
    monkeypatch.setattr(nb13, "cpu_count", lambda: 4)


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(nb13, "cpu_count", lambda: 2)


@pytest.mark.usefixtures("four_cores")
def test_tuned_workers_right_answer() -> None:
    assert status(nb13.tuned_workers, 2, sweep())[0] is Status.SOLVED
    assert status(nb13.tuned_workers, 1, sweep({0: 0.5, 1: 0.05, 2: 0.01}))[0] is Status.SOLVED  # another machine


@pytest.mark.parametrize(
    "answer, results, hint",
    [
        (1, sweep(), "still waits 3"),
        (3, sweep(), "num_workers=2 already stays under 15 %"),
        (4, sweep(), "did not measure num_workers=4"),
        (2, sweep({2: 0.03, 3: 0.02}), "measure every smaller setting too (0, 1)"),
        (2.0, sweep(), "a number of workers (an int)"),
        (2, sweep(decode_ms=0.0), "capstone's workload"),
        (2, sweep(step_ms=40.0), "capstone's workload"),
        (2, sweep(batches=4), "at least 8"),
        (
            2,
            {w: r for w, r in zip([0, 1, 2, 3], sweep().values())} | {1: record(2, 0.35)},
            "the num_workers its record",
        ),
        (2, [record(0, 0.6)], "should be a dict"),
    ],
)
@pytest.mark.usefixtures("four_cores")
def test_tuned_workers_wrong_answers(answer, results, hint) -> None:
    got, message = status(nb13.tuned_workers, answer, results)
    assert got is Status.WRONG and hint in message, message


@pytest.mark.usefixtures("two_cores")
def test_tuned_workers_counts_the_cores() -> None:
    """13.2 does not reward oversubscription: on 2 cores, 1 worker unless only more get under the target."""
    loaded = sweep({0: 0.5, 1: 0.131, 2: 0.113, 3: 0.138})  # all under 15 % on a busy machine: 1 worker is enough
    assert status(nb13.tuned_workers, 1, loaded)[0] is Status.SOLVED
    for wrong in (2, 3):
        got, message = status(nb13.tuned_workers, wrong, loaded)
        assert got is Status.WRONG and "more than your 2 cores leave for workers (1" in message, message
    assert (
        status(nb13.tuned_workers, 2, sweep())[0] is Status.SOLVED
    )  # 1 worker misses the target: 2 may share the cores
    got, message = status(nb13.tuned_workers, 3, sweep())
    assert got is Status.WRONG and "By your sweep the answer is 2." in message, message
    busy = sweep({0: 0.6, 1: 0.4, 2: 0.3, 3: 0.25})  # none under 15 %: the most with a core of their own
    assert status(nb13.tuned_workers, 1, busy)[0] is Status.SOLVED
    got, message = status(nb13.tuned_workers, 3, busy)
    assert got is Status.WRONG and "no setting within 1 got under 15 %" in message, message
    assert "try more" in status(nb13.tuned_workers, 0, busy)[1]


def test_tuned_workers_not_attempted() -> None:
    assert status(nb13.tuned_workers, ..., sweep())[0] is Status.NOT_ATTEMPTED
    assert status(nb13.tuned_workers, 2, ...)[0] is Status.NOT_ATTEMPTED


def test_tuned_workers_on_a_real_measurement(tmp_path, tiny_root) -> None:
    """A real sweep of the capstone's workload on this machine: the check agrees with its own reading."""
    train = shards.write_image_shards(tmp_path / "train", size="tiny", root=tiny_root, maxcount=10)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        results = capstone.sweep(train.urls, "num_workers", [0, 1, 2], batches=8)
    best = nb13.smallest_under_target(results)
    assert results[0].steady_stall_fraction > capstone.STALL_TARGET  # 0 workers: the loop decodes itself
    if best is not None:  # on a very busy machine even 2 workers may miss it; the check says so then
        assert status(nb13.tuned_workers, best, results)[0] is Status.SOLVED


# --------------------------------------------------------------------------- 13.3


def audit(
    reports,
    shard_of,
    stall_target,
    across_epochs=False,
    weights=True,
    every_epoch_stall=False,
    stall=True,
    idle=True,
    stall_of=lambda stalls: stalls[-1],
):
    """Exercise 13.3's answer (the notebook's solution with the defaults), and its wrong forms through the keywords."""
    problems = []
    seen_ever, shards_ever = [], []
    for epoch in range(len(reports[0]["epochs"])):
        steps = [r["epochs"][epoch]["batches"] for r in reports]
        if len(set(steps)) > 1:
            problems.append(f"epoch {epoch}: batches per rank {steps}")
        readers = [keys for r in reports for keys in r["epochs"][epoch]["keys_by_worker"].values()]
        if idle and any(not keys for keys in readers):
            problems.append(f"epoch {epoch}: a reader read nothing")
        shard_sets = [{shard_of[k] for k in keys} for keys in readers]
        shards_ever += shard_sets if across_epochs else []
        sets = shards_ever if across_epochs else shard_sets
        if len(set().union(*sets)) < sum(map(len, sets)):
            problems.append(f"epoch {epoch}: a shard read by two readers")
        seen = [k for keys in readers for k in keys]
        seen_ever += seen if across_epochs else []
        keys = seen_ever if across_epochs else seen
        if len(keys) != len(set(keys)):
            problems.append(f"epoch {epoch}: a sample read twice")
        for r in reports if every_epoch_stall else []:
            if r["epochs"][epoch]["steady_stall"] >= stall_target:
                problems.append(f"rank {r['rank']} waits")
    if weights and len({r["weights_sha256"] for r in reports}) > 1:
        problems.append("the ranks' weights differ")
    for r in reports if stall and not every_epoch_stall else []:
        waits = stall_of([e["steady_stall"] for e in r["epochs"]])
        if waits >= stall_target:
            problems.append(f"rank {r['rank']} waits {waits:.0%} of the time")
    return problems


def test_audit_job() -> None:
    def stub(reports, shard_of, stall_target):
        raise NotImplementedError

    right_and_stubs(nb13.audit_job, audit, stub)
    wrong = {
        "within one epoch": lambda *a: audit(*a, across_epochs=True),
        "weights differ passed": lambda *a: audit(*a, weights=False),
        "Report each fault once": lambda *a: audit(*a) * 2,
        "stall on the last epoch only": lambda *a: audit(*a, every_epoch_stall=True),
        "waits 25 % of the time in the last epoch (2 % in epoch 0, 13.5 % on average) passed your audit with no "
        "problem: judge the stall on the last epoch": lambda *a: audit(*a, stall=False),
        "waited 40 % of the time in epoch 0 but 5 %": lambda *a: audit(*a, stall_of=lambda s: sum(s) / len(s)),
        "in epoch 0 but 5 % in the last epoch": lambda *a: audit(*a, stall_of=lambda s: s[0]),
        "Judge each rank's stall on the last epoch only": lambda *a: audit(*a, stall_of=max),
        "read nothing in epoch 0 passed": lambda *a: audit(*a, idle=False),
        "return a list": lambda *a: "; ".join(audit(*a)) or None,
    }
    for words, fn in wrong.items():
        outcome, message = status(nb13.audit_job, fn)
        assert outcome is Status.WRONG and words in message, (words, message)


# --------------------------------------------------------------------------- 13.4


def test_cpus_per_task_right_answer() -> None:
    assert status(nb13.cpus_per_task, lambda ranks, workers: ranks * (workers + 1))[0] is Status.SOLVED
    assert status(nb13.cpus_per_task, capstone.cpus_per_task)[0] is Status.SOLVED


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda r, w: r * w, "counts the workers only"),
        (lambda r, w: w + 1, "one rank's share"),
        (lambda r, w: r + w + 0 * (r == 1), "counts multiply"),
        (lambda r, w: 32, "cpus_per_task(1, 0) = 32, expected 1: 1 rank, "),
        (lambda r, w: r * (w + 1) / 3, "a number of CPUs is a whole number"),
        (lambda r, w: "32", "whole number"),
        (lambda r, w: float(r * (w + 1)), "cpus_per_task(4, 7) returned 32.0, a float"),
        (lambda r, w: r * (w + 1.0), "sbatch refuses --cpus-per-task=32.0"),
    ],
)
def test_cpus_per_task_wrong_answers(fn, hint) -> None:
    got, message = status(nb13.cpus_per_task, fn)
    assert got is Status.WRONG and hint in message, message


def test_cpus_per_task_stub() -> None:
    def stub(ranks, workers):
        raise NotImplementedError

    assert status(nb13.cpus_per_task, stub)[0] is Status.NOT_ATTEMPTED


# --------------------------------------------------------------------------- 13.5


def write(tmp_path: Path, **settings) -> Path:
    base = dict(shards=nb13.CLUSTER_SHARDS, num_workers=2, nodes=2, gpus_per_node=4, cpus_per_node=32, stage=True)
    return slurm.write_slurm_script(tmp_path / "runs" / "capstone" / "train_capstone.sbatch", **{**base, **settings})


def test_slurm_script_right_answer(tmp_path) -> None:
    assert status(nb13.slurm_script, write(tmp_path), sweep())[0] is Status.SOLVED
    assert status(nb13.slurm_script, str(write(tmp_path)), sweep())[0] is Status.SOLVED


@pytest.mark.parametrize(
    "settings, hint",
    [
        (dict(nodes=1), "2 nodes"),
        (dict(gpus_per_node=2), "4 GPUs"),
        (dict(num_workers=3), "your measurement calls for 2"),
        (dict(num_workers=7), "your measurement calls for 2"),
        (dict(shards="/tmp/course13-abc/train"), "/scratch/$USER/course-shards"),
        (dict(stage=False), "is repaid by 20 faster epochs (1600 s saved)"),
    ],
)
def test_slurm_script_wrong_settings(tmp_path, settings, hint) -> None:
    got, message = status(nb13.slurm_script, write(tmp_path, **settings), sweep())
    assert got is Status.WRONG and hint in message, message


def test_slurm_script_edited_by_hand(tmp_path) -> None:
    path = write(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("--cpus-per-task=12", "--cpus-per-task=8"))
    assert "expected 12" in status(nb13.slurm_script, path, sweep())[1]
    path.write_text(
        text.replace("--account=CHANGE_ME", "--account=myproj").replace("--partition=CHANGE_ME", "--partition=gpu")
    )
    assert "CHANGE_ME" in status(nb13.slurm_script, path, sweep())[1]
    path.write_text(text.replace("fi\n", "", 1))
    assert "bash cannot parse" in status(nb13.slurm_script, path, sweep())[1]


def test_slurm_script_elsewhere_or_missing(tmp_path, monkeypatch) -> None:
    other = slurm.write_slurm_script(
        tmp_path / "train_capstone.sbatch", shards=nb13.CLUSTER_SHARDS, num_workers=2, nodes=2
    )
    assert "runs/capstone/" in status(nb13.slurm_script, other, sweep())[1]
    assert "no file" in status(nb13.slurm_script, tmp_path / "runs" / "capstone" / "nope.sbatch", sweep())[1]
    # no setting under the target (a busy machine): 13.2's answer is the core budget, 1 on 2 cores, and the script follows it
    monkeypatch.setattr(nb13, "cpu_count", lambda: 2)
    assert "calls for 1 (the answer of 13.2)" in status(nb13.slurm_script, write(tmp_path), sweep({0: 0.6, 1: 0.4}))[1]
    assert status(nb13.slurm_script, ..., sweep())[0] is Status.NOT_ATTEMPTED
    assert "pass the path" in status(nb13.slurm_script, None, sweep())[1]
