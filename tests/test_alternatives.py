"""course_lib.alternatives: the same images as WebDataset, MDS and litdata, read back and measured."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from course_lib import alternatives as alt
from course_lib import data, shards
from course_lib.datasets import image_tensor
from course_tools.bench import write_litdata, write_mds

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
N = 48


@pytest.fixture(scope="module")
def items() -> list[tuple[str, int]]:
    return alt.image_items(data.prepare_data(progress=False), "train", limit=N)


@pytest.fixture(scope="module")
def written(items, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("formats")
    return {
        "mds": write_mds(items, out / "mds", size_limit=20_000),
        "lit": write_litdata(items, out / "lit", chunk_bytes=20_000, num_workers=2),
    }


def expected(items: list[tuple[str, int]]) -> list[tuple[torch.Tensor, int]]:
    return [(image_tensor(Path(p).read_bytes()), y) for p, y in items]


def test_image_items_are_picklable_paths_and_labels(items) -> None:
    assert len(items) == N and all(Path(p).is_file() and isinstance(y, int) for p, y in items)
    sample = alt.encoded_sample(items[0])
    assert sample["jpg"][:2] == b"\xff\xd8" and sample["cls"] == items[0][1]  # the JPEG bytes as they are


@pytest.mark.timeout(120)
def test_mds_and_litdata_hold_the_same_samples(items, written) -> None:
    assert len(list(written["mds"].glob("shard.*.mds"))) > 1 and (written["mds"] / "index.json").is_file()
    assert len(list(written["lit"].glob("*.bin"))) > 1
    truth = sorted((y, img.sum().item()) for img, y in expected(items))
    for ds in (alt.mds_images(written["mds"], batch_size=8), alt.litdata_images(written["lit"])):
        got = sorted((y, img.sum().item()) for img, y in ds)
        assert got == truth, type(ds.inner).__module__
    assert not list(written["mds"].parent.glob(".*tmp"))
    import litdata

    lit = litdata.StreamingDataset(str(written["lit"]))
    mds = alt.mds_dataset(local=str(written["mds"]), remote=None, shuffle=False, batch_size=8)
    try:
        for i in (0, 17, N - 1):  # in the order written, whatever the speed of optimize's workers
            assert bytes(lit[i]["jpg"]) == Path(items[i][0]).read_bytes() == mds[i]["jpg"]
    finally:
        alt.release_mds(mds)  # its shared memory and lock files


@pytest.mark.timeout(120)
def test_readers_split_among_dataloader_workers(items, written) -> None:
    for ds in (alt.mds_images(written["mds"], batch_size=8), alt.litdata_images(written["lit"])):
        labels = [y for _, ys in DataLoader(ds, batch_size=8, num_workers=2) for y in ys.tolist()]
        assert sorted(labels) == sorted(y for _, y in items), type(ds.inner).__module__  # each sample once


@pytest.mark.timeout(120)
def test_an_mds_dataset_iterated_here_never_delivers_in_forked_workers_and_one_made_for_the_loader_does(
    written,
) -> None:
    """Notebook 11's pitfall, as its prose states it (mosaicml-streaming 0.13). A look with ``next(iter(...))`` starts
    the dataset's preparing threads in this process; a fork worker's copy waits for them forever (here: until the
    loader's timeout) or, when they had stopped before the fork, fails at the barrier lock (filelock 3.30 or later).
    Which of the two depends on timing; a batch never comes. A dataset made for the loader works. When a release
    fixes this, the test fails, and the notebook's paragraph goes."""
    import filelock
    from packaging.version import Version

    def first_batch(dataset, timeout=0):
        return next(
            iter(DataLoader(dataset, batch_size=8, num_workers=1, multiprocessing_context="fork", timeout=timeout))
        )

    peeked = alt.mds_images(written["mds"], batch_size=8)
    next(iter(peeked))  # a look at the first sample, in this process
    lock_raises = Version(filelock.__version__) >= Version("3.30")  # on a lock inherited across fork
    outcomes = "timed out|inherited across fork" if lock_raises else "timed out"
    try:
        first_batch(peeked, timeout=10)  # a healthy worker sends 8 small images in well under a second
    except RuntimeError as exc:
        assert re.search(outcomes, str(exc)), f"the forked worker failed otherwise than the notebook says: {exc}"
        traceback.clear_frames(exc.__traceback__)  # the failed loader's worker stops now, not at a later collection
    else:
        if lock_raises:
            pytest.fail("a fork worker delivered a batch from a dataset iterated here: notebook 11's trap is gone")
    images, labels = first_batch(alt.mds_images(written["mds"], batch_size=8))
    assert images.shape[0] == len(labels) == 8
    alt.release_mds()


@pytest.mark.timeout(120)
def test_write_litdata_restores_the_start_method(items, tmp_path: Path) -> None:
    before = multiprocessing.get_start_method(allow_none=True)
    write_litdata(items[:8], tmp_path / "lit", num_workers=1, start_method="fork")
    assert multiprocessing.get_start_method(allow_none=True) == before


@pytest.mark.timeout(180)
def test_compare_formats_counts_every_sample(items, written, tmp_path: Path) -> None:
    ws = shards.write_image_shards(tmp_path / "wds", split="train", maxcount=N // 4)
    first = ws.paths[:4]  # the first 4 shards hold the first N images of the shuffled set; compare only needs counts
    urls = shards.brace_urls(first)
    results = alt.compare_formats(
        {
            "WebDataset": lambda: alt.webdataset_images(urls),
            "MDS": lambda: alt.mds_images(written["mds"], batch_size=8),
            "litdata": lambda: alt.litdata_images(written["lit"]),
        },
        samples=N,
        batch_size=8,
        rounds=1,
    )
    assert list(results) == ["WebDataset", "MDS", "litdata"] and all(v[0] > 0 for v in results.values())
    fig = alt.plot_formats(results)
    assert len(fig.axes[0].patches) == 3
    with pytest.raises(RuntimeError, match="instead of"):
        alt.compare_formats(
            {"MDS": lambda: alt.mds_images(written["mds"], batch_size=8)}, samples=N + 1, batch_size=8, rounds=1
        )


def test_missing_folders_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(alt.FormatError, match="MDSWriter"):
        alt.mds_images(tmp_path, batch_size=8)
    with pytest.raises(alt.FormatError, match="litdata.optimize"):
        alt.litdata_images(tmp_path)
    with pytest.raises(alt.FormatError, match="pip install nothing-such"):
        alt.require_package("nothing_such_module", "nothing-such")


def test_dali_is_reported_unavailable_without_a_gpu() -> None:
    if not torch.cuda.is_available():
        assert alt.dali_available() is False


def test_the_formats_extra_is_in_requirements() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["formats"]
    reqs = (ROOT / "requirements.txt").read_text().splitlines()
    for dep in extra:
        assert dep in reqs, dep  # CI installs requirements.txt only: notebook 11 needs these
        assert re.match(r"[a-z-]+>=", dep)


def mds_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if re.match(r"\d{6}_", n)} if os.path.isdir("/dev/shm") else set()


@pytest.mark.timeout(60)
def test_release_mds_unlinks_the_shared_memory_and_the_lock_files(written, tmp_path: Path, monkeypatch) -> None:
    import tempfile

    import streaming

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mosaicml-streaming puts its lock files there
    before = mds_segments()
    direct = streaming.StreamingDataset(local=str(written["mds"]), remote=None, shuffle=False, batch_size=8)
    wrapped = alt.mds_images(written["mds"], batch_size=8)
    assert sum(1 for _ in wrapped) == N
    made = mds_segments() - before
    assert made or not os.path.isdir("/dev/shm")
    assert alt.release_mds(direct) >= 2 * 4  # at least the barrier, locals, epoch and cache scalars of each
    assert not (mds_segments() - before)
    assert alt.release_mds() == 0  # nothing left to release
    assert not list(tmp_path.iterdir()), "release_mds left files in the temporary folder"


@pytest.mark.timeout(60)
def test_a_process_that_exits_without_release_mds_leaves_no_lock_files(written, tmp_path: Path) -> None:
    """A script (or a test process) that never calls release_mds: its datasets are released at a normal exit."""
    program = (
        "import sys\nfrom course_lib import alternatives as alt\n"
        "dataset = alt.mds_dataset(local=sys.argv[1], remote=None, shuffle=False, batch_size=8, predownload=8)\n"
        "next(iter(dataset))  # a loop left early: its threads still prepare shards at exit\n"
    )
    folder = tmp_path / "tmp"
    folder.mkdir()
    job = subprocess.run(
        [sys.executable, "-c", program, str(written["mds"])],
        capture_output=True,
        text=True,
        timeout=50,
        env=dict(os.environ, TMPDIR=str(folder)),
        cwd=ROOT,
    )
    assert job.returncode == 0 and not job.stderr.strip(), job.stderr[-2000:]
    left = sorted(p.name for p in folder.iterdir() if "filelock" in p.name)
    assert not left, f"the process left MDS lock files in its temporary folder: {left}"


@pytest.mark.timeout(60)
def test_release_mds_first_stops_the_threads_of_a_loop_left_early(written) -> None:
    """A loop over an MDS dataset left early (a framework's few steps, notebook 11) leaves its shard-preparing threads
    running; unlinked under them, the shared memory gave "RuntimeError: Invalid shard state" on the notebook's
    stderr. With predownload=8 the preparing thread waits for the loop, so it is still running at release."""
    dataset = alt.mds_dataset(local=str(written["mds"]), remote=None, shuffle=False, batch_size=8, predownload=8)
    samples = iter(dataset)
    next(samples)
    threads = dataset._iterator  # mosaicml-streaming 0.13.0's record of its threads
    assert threads._num_exited < threads._num_threads_to_exit  # still preparing
    alt.release_mds()
    assert threads._num_exited == threads._num_threads_to_exit, "release_mds left the dataset's threads running"


def test_mds_prefix_race_is_retried(written, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes picking the same /dev/shm prefix: the loser looks again instead of failing."""
    import streaming

    real, calls = streaming.StreamingDataset, []

    def racy(**kwargs):
        calls.append(kwargs)
        if len(calls) < 3:
            raise FileExistsError("[Errno 17] File exists: '/000376_locals'")
        return real(**kwargs)

    monkeypatch.setattr(streaming, "StreamingDataset", racy)
    assert sum(1 for _ in alt.mds_images(written["mds"], batch_size=8)) == N and len(calls) == 3
    alt.release_mds()


def test_writers_never_replace_a_folder_the_course_did_not_write(items, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    for write in (lambda: write_mds(items[:4], mine), lambda: write_litdata(items[:4], mine, num_workers=1)):
        with pytest.raises(alt.FormatError, match="did not write"):
            write()
        assert (mine / "thesis.tex").read_text() == "years of work" and len(list(tmp_path.iterdir())) == 1


def test_a_failing_writer_leaves_no_temporary_folder(items, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_mds([("/no/such/image.jpg", 0)], tmp_path / "mds")
    assert list(tmp_path.iterdir()) == []
    again = write_mds(items[:4], tmp_path / "mds", size_limit=20_000)  # a second write replaces the course's own
    assert write_mds(items[:6], again, size_limit=20_000) == again and (again / "index.json").is_file()


_AS_THE_NOTEBOOKS_DO = """
import os, sys
from multiprocessing import resource_tracker
from streaming import StreamingDataLoader, StreamingDataset
from torch.utils.data import DataLoader
from course_lib import alternatives as alt

shards, cache, release = sys.argv[1], sys.argv[2], sys.argv[3] == "release"
# notebook 11: a loader with 2 workers, a loop of a few steps in this process, the reused local folder
assert sum(len(y) for _, y in DataLoader(alt.mds_images(shards, 8), batch_size=8, num_workers=2)) == 48
next(iter(DataLoader(alt.mds_images(shards, 8), batch_size=8)))
first = alt.mds_dataset(remote=shards, local=cache, shuffle=False, batch_size=8)
try:
    StreamingDataset(remote=shards, local=cache, shuffle=False, batch_size=8)
    raise SystemExit("MDS accepted a second dataset on the same local folder")
except ValueError as exc:
    assert "Reused local directory" in str(exc), exc
direct = StreamingDataset(local=shards, remote=None, shuffle=False, batch_size=8)
# notebook 14: a StreamingDataLoader stopped and resumed (its resumption state is one more segment)
loader = StreamingDataLoader(alt.mds_dataset(local=shards, remote=None, batch_size=8), batch_size=8)
batches = iter(loader)
next(batches)
state = loader.state_dict()
del batches
resumed = StreamingDataLoader(alt.mds_dataset(local=shards, remote=None, batch_size=8), batch_size=8)
resumed.load_state_dict(state)
assert sum(len(b["cls"]) for b in resumed) == 40
if release:  # the notebooks' release cells
    assert alt.release_mds(direct) > 0
# what course_lib.kernel does when a kernel is asked to shut down: close this process's end of the resource
# tracker's pipe, before the atexit handlers run; the tracker then unlinks, and names, what is still registered
tracker = resource_tracker._resource_tracker
os.close(tracker._fd)
tracker._fd = tracker._pid = None
"""


@pytest.mark.timeout(120)
def test_released_mds_segments_are_no_leaked_shared_memory_when_a_kernel_shuts_down(written, tmp_path: Path) -> None:
    """Notebooks 11 and 14's MDS code, then the exit of a course kernel (course_lib.kernel closes the resource
    tracker's pipe before atexit runs). What release_mds unlinked in a cell it also unregistered: the tracker has
    nothing to call leaked. Left to the exit-time release instead, every segment still registered when the pipe
    closes is reported leaked (6 per dataset), although atexit releases it a moment later: the cause of the
    warnings that a notebook run left on the kernel's stderr, so notebooks 11 and 14 release in a cell."""

    def run(how: str) -> str:
        folder = tmp_path / how
        folder.mkdir()
        # a copy of the shards of its own: MDS names its shared memory after the local folder, and a dataset on
        # the module's folder that an earlier test of this process still holds would make the script wait for it
        shards = shutil.copytree(written["mds"], folder / "mds")
        # a short temporary folder of its own: the workers pass tensors through a Unix socket made there, whose
        # path must stay under 108 bytes (a pytest-xdist worker's tmp_path is too long for it: the loader hangs)
        short = tempfile.mkdtemp(prefix="course-mds-")
        try:
            job = subprocess.run(
                [sys.executable, "-c", _AS_THE_NOTEBOOKS_DO, str(shards), str(folder / "cache"), how],
                capture_output=True,
                text=True,
                timeout=100,
                env=dict(os.environ, TMPDIR=short),
                cwd=ROOT,
            )
        finally:
            shutil.rmtree(short, ignore_errors=True)
        assert job.returncode == 0, job.stderr[-3000:]
        return job.stderr

    released = run("release")
    assert "leaked shared_memory" not in released and "resource_tracker" not in released, released[-3000:]
    left = run("exit")  # the control: the same code without the release cell
    assert "leaked shared_memory" in left, left[-3000:]
