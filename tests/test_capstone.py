"""course_lib.capstone: the shard pipeline, a real 2-rank torchrun training, CPUs per task."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest

from course_lib import capstone, shards
from course_lib.distributed import read_reports
from course_lib.jobs import launch
from course_lib.shards import ShardError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory, tiny_root: Path) -> shards.ShardSet:
    """The tiny set's 80 training images as 8 shards of 10."""
    return shards.write_image_shards(
        tmp_path_factory.mktemp("capstone") / "train", size="tiny", root=tiny_root, maxcount=10
    )


# --------------------------------------------------------------------------- the pipeline, in this process


@pytest.mark.quick
def test_pipeline_yields_decoded_batches_without_end(shard_set) -> None:
    loader = capstone.make_loader(shard_set.urls, num_workers=0, batch_size=8, decode_ms=0)
    record, workers = capstone.run_epoch(loader, 12, lambda batch: None)  # 96 > 80 samples: it cycles
    assert len(record.batches) == 12 and workers == [-1] * 12
    images, labels, keys = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype.is_floating_point and 0 <= images.min() <= images.max() <= 1
    assert labels.dtype.is_floating_point is False and len(keys) == 8 and all(isinstance(k, str) for k in keys)


def simulated_job(urls, epochs: int, seed: int = 3, first_epoch: int = 0, batches: int = 8) -> dict:
    """What a 2-rank job with 2 workers per rank reads, rank by rank in this process (``shards.simulated_reader``):
    ``{epoch: {rank: [(worker, keys of one batch of 5), ...]}}`` for the epochs from ``first_epoch`` on."""
    job: dict = {}
    for rank in range(2):
        with shards.simulated_reader(rank, world_size=2):  # the forked workers inherit the rank
            loader = capstone.make_loader(
                urls, num_workers=2, batch_size=5, decode_ms=0, seed=seed, first_epoch=first_epoch
            )
            for epoch in range(first_epoch, epochs):
                keys: list[list[str]] = []
                _, workers = capstone.run_epoch(loader, batches, lambda batch: keys.append(list(batch[2])))
                job.setdefault(epoch, {})[rank] = list(zip(workers, keys))
            del loader
    return job


def shares(job: dict, shard_of: dict[str, int]) -> dict[int, dict[tuple[int, int], set[int]]]:
    """``{epoch: {(rank, worker): the shards that reader read}}``."""
    read: dict = {}
    for epoch, ranks in job.items():
        for rank, batches in ranks.items():
            for worker, keys in batches:
                read.setdefault(epoch, {}).setdefault((rank, worker), set()).update(shard_of[k] for k in keys)
    return read


@pytest.fixture(scope="module")
def three_epochs(shard_set) -> dict:
    return simulated_job(shard_set.urls, epochs=3)


@pytest.mark.quick
def test_three_epochs_deal_the_shards_anew_and_keep_the_readers_disjoint(shard_set, three_epochs) -> None:
    """8 shards, 2 ranks × 2 workers: each epoch every reader reads 2 shards of its own, other ones every epoch."""
    shard_of = {k: i for i, names in enumerate(shard_set.keys) for k in names}
    read = shares(three_epochs, shard_of)
    for epoch, ranks in three_epochs.items():
        for batches in ranks.values():
            assert [w for w, _ in batches] == [0, 1] * 4  # 8 steps on every rank, the workers in turn
        readers = list(read[epoch].values())
        assert len(readers) == 4 and all(len(s) == 2 for s in readers)
        assert set().union(*readers) == set(range(8))  # disjoint within the epoch: every shard read by one reader
    assert read[0] != read[1] != read[2] != read[0]  # a new deal every epoch...
    for reader in read[0]:
        assert len(set().union(*(read[e][reader] for e in range(3)))) > 2, reader  # ...so no reader keeps its shards
    orders = [[keys for rank in (0, 1) for _, keys in three_epochs[e][rank]] for e in range(3)]
    assert orders[0] != orders[1] != orders[2] != orders[0]


@pytest.mark.quick
def test_the_shuffle_buffer_mixes_shards_in_every_batch(shard_set, three_epochs) -> None:
    shard_of = {k: i for i, names in enumerate(shard_set.keys) for k in names}
    per_batch = [
        len({shard_of[k] for k in keys})
        for ranks in three_epochs.values()
        for batches in ranks.values()
        for _, keys in batches
    ]
    assert len(per_batch) == 48 and sum(n > 1 for n in per_batch) >= 40  # without a buffer: 1 shard (10 samples of 5s)


@pytest.mark.quick
def test_the_pipeline_is_reproducible_and_resumes_at_an_epoch_exactly(shard_set, three_epochs) -> None:
    assert simulated_job(shard_set.urls, epochs=3) == three_epochs  # the same seed: the same three epochs
    assert simulated_job(shard_set.urls, epochs=1, seed=4)[0] != three_epochs[0]
    # a job resumed at epoch e reads what the uninterrupted one read in epoch e, and after it
    assert simulated_job(shard_set.urls, epochs=3, first_epoch=2)[2] == three_epochs[2]
    resumed = simulated_job(shard_set.urls, epochs=3, first_epoch=1)
    assert resumed == {1: three_epochs[1], 2: three_epochs[2]}


@pytest.mark.quick
def test_no_sample_twice_while_a_reader_reads_less_than_its_shards(shard_set) -> None:
    """The buffer holds samples of one round while the next begins: a sample comes twice in an epoch only when a
    reader's epoch (plus the buffer) is longer than its shards. Reader (0, 0) of 2 × 2 has 2 shards, 20 samples."""
    with shards.simulated_reader(0, 2, 0, 2):
        stream = iter(capstone.build_dataset(shard_set.urls, decode_ms=0, buffer=5))
        keys = [key for _, _, key in itertools.islice(stream, 15)]
        assert len(set(keys)) == 15
        more = [key for _, _, key in itertools.islice(stream, 25)]  # 40 samples: every one of the 20 twice
        assert sorted(set(keys + more)) == sorted(set(more)) and len(set(more)) == 20


@pytest.mark.quick
def test_rotating_shard_list_and_shuffle_buffer_on_their_own() -> None:
    urls = [f"s{i}.tar" for i in range(6)]
    shard_list = capstone.RotatingShardList(urls, seed=1)
    epochs = [[d["url"] for d in shard_list] for _ in range(3)]
    assert all(sorted(e) == urls for e in epochs) and epochs[0] != epochs[1] != epochs[2]
    with shards.simulated_reader(1, world_size=2):  # no rank in the order: the same on every rank
        assert [d["url"] for d in capstone.RotatingShardList(urls, seed=1, first_epoch=2)] == epochs[2]
    assert capstone.RotatingShardList("s{0..5}.tar", seed=1).urls == urls
    with pytest.raises(ShardError, match="empty"):
        capstone.RotatingShardList([])

    def samples(keys):
        return iter([{"__key__": f"k{k}"} for k in keys])

    buffer = capstone.ShuffleBuffer(4, seed=1)
    first, second = [[s["__key__"] for s in buffer(samples(range(10)))] for _ in range(2)]
    keys = [f"k{k}" for k in range(10)]
    assert sorted(first) == sorted(second) == sorted(keys) and first != second != keys
    assert [s["__key__"] for s in capstone.ShuffleBuffer(4, seed=1, first_epoch=1)(samples(range(10)))] == second
    # an endless reader's rounds over its shards: every round still yields each of its samples once
    rounds = [s["__key__"] for s in capstone.ShuffleBuffer(4, seed=1)(samples(list(range(10)) * 3))]
    assert all(sorted(rounds[i : i + 10]) == sorted(keys) for i in (0, 10, 20))
    with pytest.raises(ValueError, match="at least 1 sample"):
        capstone.ShuffleBuffer(0)


@pytest.mark.quick
def test_measure_and_sweep_record_the_settings(shard_set) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        results = capstone.sweep(shard_set.urls, "num_workers", [0, 1], batches=4, step_ms=5, decode_ms=1, batch_size=4)
    assert list(results) == [0, 1]
    for workers, record in results.items():
        assert record.num_workers == workers and len(record.batches) == 4
        assert record.settings["decode_ms"] == 1 and record.settings["step_ms"] == 5
        assert record.mean_step >= 0.004
    with pytest.raises(ValueError, match="num_workers"):
        capstone.sweep(shard_set.urls, "batch_size", [1])


@pytest.mark.quick
def test_simulated_decode_pays_its_cost_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    asked: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        asked.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(capstone.time, "sleep", sleep)
    stage = capstone.SimulatedDecode(2.0, chunk_ms=10.0)
    start = time.perf_counter()
    for i in range(20):
        assert stage(("x", i)) == ("x", i)
    elapsed = time.perf_counter() - start
    # 40 ms asked for, paid in sleeps of at least one 10 ms chunk; at most one chunk is still owed at the end.
    # A late wake-up (a busy machine) pays ahead: fewer sleeps, never more, and never less time in all.
    assert asked and all(s >= 0.010 for s in asked) and len(asked) <= 4
    assert elapsed >= 0.030
    with pytest.raises(ValueError, match="decode_ms"):
        capstone.SimulatedDecode(-1)


# --------------------------------------------------------------------------- bad input


@pytest.mark.quick
def test_too_few_shards_for_ranks_times_workers(shard_set) -> None:
    with pytest.raises(ShardError, match=r"8 shards for 2 ranks × 5 workers = 10 readers.*fewer workers"):
        capstone.check_job(shard_set.folder, world_size=2, num_workers=5)
    assert len(capstone.check_job(shard_set.folder, world_size=2, num_workers=4)) == 8


@pytest.mark.quick
def test_missing_shard_folder(tmp_path) -> None:
    with pytest.raises(ShardError, match="no shard folder or file 'nowhere'.*Write shards first"):
        capstone.check_job(tmp_path / "nowhere", world_size=1, num_workers=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShardError, match="holds no .tar shards"):
        capstone.check_job(tmp_path / "empty", world_size=1, num_workers=0)


@pytest.mark.quick
def test_a_reader_without_shards_says_so(shard_set) -> None:
    three = shards.brace_urls(shard_set.paths[:3])
    with shards.simulated_reader(rank=1, world_size=2):  # rank 1 gets 1 shard; its second worker none
        loader = capstone.make_loader(three, num_workers=2, batch_size=4, decode_ms=0)
        with pytest.raises(Exception, match="got no shard"):
            capstone.run_epoch(loader, 4, lambda batch: None)
        del loader


@pytest.mark.quick
def test_one_pass_needs_a_manifest(shard_set, tmp_path) -> None:
    assert capstone._one_pass_batches(shard_set.paths, world_size=2, batch_size=8) == 80 // 16
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "a-000000.tar").write_bytes(shard_set.paths[0].read_bytes())
    with pytest.raises(ShardError, match="--epoch-batches"):
        capstone._one_pass_batches([bare / "a-000000.tar"], world_size=1, batch_size=8)


@pytest.mark.quick
def test_cli_check(shard_set, capsys) -> None:
    check = ["check", "--shards", str(shard_set.folder)]
    assert capstone.main([*check, "--ranks", "2", "--workers", "2"]) == 0
    assert "8 shards for 2 ranks × 2 readers each: 2.0 shards per reader" in capsys.readouterr().out
    assert capstone.main([*check, "--ranks", "4", "--workers", "3"]) == 2
    assert "ShardError: 8 shards for 4 ranks × 3 workers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        capstone.main(["train", "--shards", "x", "--workers", "-1"])


# ---------------------------------------------------------- under torchrun (the 2-rank training itself runs in notebook
# 11, where nbval compares every line, and in the Slurm stage)


@pytest.mark.full
def test_two_ranks_refuse_too_few_shards_before_the_rendezvous(shard_set) -> None:
    run = launch(
        "course_lib.capstone",
        "train",
        "--shards",
        str(shard_set.folder),
        "--workers",
        "5",
        nproc=2,
        timeout=120,
        check=False,
        show=False,
    )
    assert not run.ok and not run.timed_out
    assert run.first_error().startswith("ShardError: 8 shards for 2 ranks × 5 workers = 10 readers")


# --------------------------------------------------------------------------- the Slurm script


@pytest.mark.quick
def test_cpus_per_task() -> None:
    assert (
        capstone.cpus_per_task(4, 7) == 32 and capstone.cpus_per_task(1, 0) == 1 and capstone.cpus_per_task(2, 2) == 6
    )
    with pytest.raises(ValueError):
        capstone.cpus_per_task(0, 2)


@pytest.mark.quick
def test_plot_stall_draws_one_bar_per_setting_and_the_target() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from test_checks_nb13 import sweep  # synthetic records of a known stall

    fig = capstone.plot_stall(sweep())
    ax = fig.axes[0]
    assert len(ax.patches) == 4 and [round(p.get_height()) for p in ax.patches][2:] == [3, 2]
    assert ax.lines[0].get_ydata()[0] == 100 * capstone.STALL_TARGET
    with pytest.raises(ValueError, match="nothing to draw"):
        capstone.plot_stall({})


@pytest.mark.quick
def test_cli_writes_shards(tmp_path, tiny_root, capsys) -> None:
    out = tmp_path / "cluster-shards"
    argv = ["shards", "--out", str(out), "--size", "tiny", "--data", str(tiny_root), "--maxcount", "20"]
    assert capstone.main(argv) == 0
    assert "4 shards shapes-train-{000000..000003}.tar: 80 samples" in capsys.readouterr().out
    assert len(capstone.check_job(out, world_size=2, num_workers=2)) == 4


# --------------------------------------------------------------------------- resuming at an epoch's end (--ckpt)


@pytest.mark.full
def test_two_ranks_resume_from_the_last_finished_epoch_as_if_never_stopped(shard_set, tmp_path) -> None:
    common = (
        "train",
        "--shards",
        str(shard_set.folder),
        "--workers",
        "1",
        "--epoch-batches",
        "3",
        "--batch-size",
        "4",
        "--decode-ms",
        "0",
    )

    def train(name: str, epochs: int, *more: str, nproc: int = 2):
        return launch(
            "course_lib.capstone",
            *common,
            "--epochs",
            str(epochs),
            "--report",
            str(tmp_path / name),
            *more,
            nproc=nproc,
            timeout=120,
            check=False,
            show=False,
        )

    straight = train("straight", 2)
    ckpt = str(tmp_path / "ckpt")
    first = train("first", 1, "--ckpt", ckpt)  # a job that ended after epoch 0 (the next one would redo epoch 1)
    again = train("again", 2, "--ckpt", ckpt)
    for run in (straight, first, again):
        assert run.ok, run.ranks
    want, got = (read_reports(tmp_path / name) for name in ("straight", "again"))
    assert [r["resumed_at"] for r in got] == [[1], [1]] and [r["resumed_at"] for r in want] == [[], []]
    for a, b in zip(want, got):
        assert [e["keys_by_worker"] for e in a["epochs"]] == [e["keys_by_worker"] for e in b["epochs"]]
        assert a["weights_sha256"] == b["weights_sha256"]
    shard_of = {k: i for i, names in enumerate(shard_set.keys) for k in names}
    read = [
        [{shard_of[k] for keys in r["epochs"][e]["keys_by_worker"].values() for k in keys} for r in want]
        for e in range(2)
    ]
    assert all(ranks[0].isdisjoint(ranks[1]) for ranks in read)  # one deal of the shards on both ranks in each epoch
    assert read[0] != read[1]  # and another deal in the next epoch
    other = train("other", 2, "--ckpt", ckpt, nproc=1)
    assert not other.ok and "written by 2 ranks, this job has 1" in other.first_error()
