"""course_lib.storage: files and system calls counted, squashfs images mounted and read without mounting, staging."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from course_lib import storage

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]


def needs(*programs: str) -> None:
    """CI installs these (.ci/run); elsewhere a test without them says which package is missing."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        reason = f"{missing} not installed (Debian: squashfs-tools, squashfuse, strace)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this: {reason}")
        pytest.skip(reason)


@pytest.fixture
def small_set(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    """30 files of a few kB, and the same 30 as 3 tar shards of 10."""
    folder = tmp_path / "files"
    folder.mkdir()
    files = []
    for i in range(30):
        path = folder / f"{i:03d}.bin"
        path.write_bytes(os.urandom(1000 + 37 * i))
        files.append(path)
    shards = []
    for s in range(3):
        shard = tmp_path / f"shard-{s}.tar"
        with tarfile.open(shard, "w") as tar:
            for path in files[10 * s : 10 * s + 10]:
                tar.add(path, arcname=path.name)
        shards.append(shard)
    return files, shards


def test_a_folder_opens_a_file_per_sample_and_shards_one_per_shard(small_set) -> None:
    files, shards = small_set
    by_file = storage.count_reads(files, "files")
    by_shard = storage.count_reads(shards, "shards")
    assert by_file.opened == 30 and by_shard.opened == 3
    assert by_file.bytes == by_shard.bytes == sum(p.stat().st_size for p in files)
    assert by_file.read_calls == 2 * 30  # the file's bytes, then the empty read that says it ended
    assert 0 < by_shard.read_calls


def test_strace_counts_the_loop_alone_and_agrees_with_the_audit_and_proc_counts(small_set) -> None:
    needs("strace")
    files, shards = small_set
    for paths, how in ((files, "files"), (shards, "shards")):
        counted = storage.count_reads(paths, how)
        traced = storage.strace_counts(paths, how)
        assert traced == {"openat": counted.opened, "read": counted.read_calls}, how


def test_count_reads_refuses_an_unknown_way(small_set) -> None:
    with pytest.raises(ValueError, match="how must be 'files'"):
        storage.count_reads(small_set[0], "chunks")


def test_quota_reads_the_file_systems_file_counts(tmp_path: Path) -> None:
    q = storage.quota(tmp_path)
    assert q.files >= q.free >= 0
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("x")
    (tmp_path / "y").write_text("y")
    assert storage.count_files(tmp_path) == 2


def _digest(read, names) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + read(name))
    return h.hexdigest()


def test_an_image_is_the_same_files_mounted_or_read_without_mounting(small_set, tmp_path: Path) -> None:
    needs("mksquashfs", "squashfuse")
    files, _ = small_set
    image = storage.make_image(files[0].parent, tmp_path / "set.sqsh")
    again = storage.make_image(files[0].parent, tmp_path / "again.sqsh")
    assert image.read_bytes() == again.read_bytes(), "the same folder gives the same image"
    names = sorted(p.name for p in files)
    expected = _digest(lambda n: (files[0].parent / n).read_bytes(), names)
    with storage.ImageFiles(image, mount=False) as unmounted:
        assert unmounted.how.startswith("read without mounting (PySquashfsImage)")
        assert unmounted.names() == names
        assert _digest(unmounted.read, names) == expected
    if os.geteuid() != 0:
        pytest.skip("mounting is checked as root (CI); an ordinary user's fallback has its own test")
    with storage.ImageFiles(image) as mounted:
        assert mounted.how == "mounted with squashfuse" and mounted.root == Path(f"{image}.mnt")
        assert os.path.ismount(mounted.root)
        assert mounted.names() == names and _digest(mounted.read, names) == expected
    assert not (tmp_path / "set.sqsh.mnt").exists(), "closing unmounts and removes the mount point"


def test_a_killed_kernels_mount_goes_with_it(small_set, tmp_path: Path) -> None:
    """squashfuse gets SIGTERM when the process that mounted dies (SIGKILL: no clean-up of its own runs), and
    unmounts."""
    needs("mksquashfs", "squashfuse")
    if os.geteuid() != 0:
        pytest.skip("mounting is checked as root (CI)")
    image = storage.make_image(small_set[0][0].parent, tmp_path / "set.sqsh")
    kernel = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from course_lib import storage; import time; im = storage.ImageFiles({str(image)!r}); "
            "print('mounted', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert kernel.stdout.readline().strip() == "mounted"
        assert os.path.ismount(tmp_path / "set.sqsh.mnt")
    finally:
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
    deadline = time.monotonic() + 10
    while os.path.ismount(tmp_path / "set.sqsh.mnt") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.ismount(tmp_path / "set.sqsh.mnt"), "the mount outlived the process that made it"


def test_an_interrupt_while_it_mounts_leaves_no_mount(small_set, tmp_path: Path, monkeypatch) -> None:
    """Kernel > Interrupt in the moment squashfuse has mounted but ``ImageFiles`` has not yet seen it (the worst
    case): the KeyboardInterrupt goes on, and neither the mount, nor squashfuse, nor the mount point is left."""
    needs("mksquashfs", "squashfuse")
    if os.geteuid() != 0:
        pytest.skip("mounting is checked as root (CI)")
    image = storage.make_image(small_set[0][0].parent, tmp_path / "set.sqsh")
    point = tmp_path / "set.sqsh.mnt"
    real_ismount, real_sleep, before = os.path.ismount, time.sleep, set(psutil.Process().children())
    interrupted = []

    def interrupt_once_mounted(seconds: float) -> None:
        if interrupted:  # Popen.wait sleeps too
            return real_sleep(seconds)
        deadline = time.monotonic() + 10
        while not real_ismount(point) and time.monotonic() < deadline:
            real_sleep(0.02)
        interrupted.append(True)
        raise KeyboardInterrupt

    monkeypatch.setattr(storage.os.path, "ismount", lambda path: False)
    monkeypatch.setattr(storage.time, "sleep", interrupt_once_mounted)
    with pytest.raises(KeyboardInterrupt):
        storage.ImageFiles(image)
    monkeypatch.undo()
    assert not os.path.ismount(point) and not point.exists(), "the interrupted mount was left behind"
    assert not [p for p in set(psutil.Process().children()) - before if p.status() != psutil.STATUS_ZOMBIE]


def test_an_ordinary_user_reads_the_image_without_mounting(small_set, tmp_path: Path) -> None:
    """As on many hubs: squashfuse cannot mount for an ordinary user here (no working fusermount3), so the image
    is read without mounting, saying so, and gives the same bytes."""
    needs("mksquashfs", "squashfuse")
    sys.path.insert(0, str(Path(__file__).parent))
    from ordinary_user import CannotRunAsUser, throwaway_user

    files, _ = small_set
    if os.geteuid() != 0:
        pytest.skip("run as root (CI) to test as a throwaway ordinary user")
    work = Path(__import__("tempfile").mkdtemp(prefix="course-sqsh-"))
    try:
        work.chmod(0o755)
        image = storage.make_image(files[0].parent, work / "set.sqsh")
        try:
            with throwaway_user(needs=[ROOT, work]) as user:
                user.give(work)
                script = textwrap.dedent(
                    f"""
                    from course_lib import storage
                    with storage.ImageFiles({str(image)!r}) as im:
                        print(im.how)
                        print(sum(len(im.read(n)) for n in im.names()))
                    """
                )
                done = subprocess.run(
                    [*user.prefix, sys.executable, "-c", script],
                    env=user.env(PYTHONPATH=str(ROOT)),
                    capture_output=True,
                    text=True,
                    cwd=work,
                    timeout=60,
                )
        except CannotRunAsUser as exc:
            pytest.fail(f"the ordinary user's route must be tested here: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    how, size = done.stdout.splitlines()
    assert how.startswith("read without mounting (PySquashfsImage): squashfuse could not mount it ("), how
    assert int(size) == sum(p.stat().st_size for p in files)


def test_staging_copies_whole_and_refuses_what_does_not_fit(small_set, tmp_path: Path, monkeypatch) -> None:
    files, _ = small_set
    with storage.staged(files, tmp_path / "copy") as copy:
        assert sorted(p.name for p in copy.folder.iterdir()) == sorted(p.name for p in files)
        assert copy.bytes == sum(p.stat().st_size for p in files) and copy.seconds > 0
    assert not (tmp_path / "copy").exists(), "the staged copy goes when the block ends"
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(storage.StorageError, match=r"does not fit in .* \(0 MB free\): stage to the node's local disk"):
        storage._stage(files, tmp_path / "shm-copy")
    assert list(tmp_path.glob("*shm-copy*")) == [], "nothing is written when it does not fit"


@pytest.mark.parametrize("version", ["09_streaming_shards.ipynb", "solutions/09_streaming_shards.ipynb"])
def test_notebook_09s_image_cell_goes_on_without_mksquashfs(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hub without squashfs-tools: the cell that packs the image says so and prints what a machine with it
    printed, and no later cell needs what it would have made (Run All goes on to exercise 09.6)."""
    cells = [
        "".join(c["source"])
        for c in json.loads((ROOT / "notebooks" / version).read_text())["cells"]
        if c["cell_type"] == "code"
    ]
    at = next(i for i, source in enumerate(cells) if "storage.make_image(" in source)
    monkeypatch.setenv("PATH", str(tmp_path))  # no mksquashfs (nor anything else) on the PATH
    namespace = {"storage": storage, "claims": None, "shards": None, "root": tmp_path, "work": tmp_path, "files": []}
    exec(compile(cells[at], "cell", "exec"), namespace)
    out = capsys.readouterr().out
    assert "mksquashfs is not installed (Debian: apt-get install squashfs-tools)" in out
    assert "samples/s" in out, "the stored figures"
    made = {"image", "rounds", "read_three_ways"}
    later = [
        n for source in cells[at + 1 :] for n in made if re.search(rf"\b{n}\b(?!\s*=[^=])", source)
    ]  # not a keyword
    assert not later, f"later cells use {later}, which a machine without mksquashfs does not have"
