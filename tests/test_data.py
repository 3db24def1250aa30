"""course_lib.data: deterministic, atomic, idempotent generation of the shapes set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from course_lib import data, support

pytestmark = pytest.mark.quick


def test_layout_and_manifest(tiny_set: Path) -> None:
    manifest = json.loads((tiny_set / "manifest.json").read_text())
    spec = data.SIZES["tiny"]
    assert manifest["seed"] == 0 and manifest["size"] == "tiny"
    assert manifest["classes"] == list(data.CLASSES)
    assert manifest["total_images"] == spec.total == len(manifest["files"])
    for split, per_class in (("train", spec.train_per_class), ("val", spec.val_per_class)):
        assert sorted(p.name for p in (tiny_set / split).iterdir()) == sorted(data.CLASSES)
        for cls in data.CLASSES:
            files = sorted((tiny_set / split / cls).glob("*.jpg"))
            assert len(files) == per_class == manifest["counts"][split][cls]
    with Image.open(tiny_set / "train" / "star" / "00000.jpg") as img:
        assert img.format == "JPEG" and img.size == (spec.image_size, spec.image_size) and img.mode == "RGB"


def test_classes_are_sorted_like_imagefolder() -> None:
    assert list(data.CLASSES) == sorted(data.CLASSES)


def test_deterministic_for_a_seed(tmp_path: Path, tiny_set: Path) -> None:
    again = data.prepare_data("tiny", seed=0, root=tmp_path, progress=False)
    other = data.prepare_data("tiny", seed=1, root=tmp_path, progress=False)
    assert data.read_manifest(again)["digest"] == data.read_manifest(tiny_set)["digest"]
    assert data.read_manifest(other)["digest"] != data.read_manifest(tiny_set)["digest"]
    assert other.name == "shapes-tiny-seed1"


def test_draw_shape_varies_and_is_reproducible() -> None:
    a = np.asarray(data.draw_shape(3, np.random.default_rng(7), 32))
    b = np.asarray(data.draw_shape(3, np.random.default_rng(7), 32))
    c = np.asarray(data.draw_shape(3, np.random.default_rng(8), 32))
    assert a.shape == (32, 32, 3) and np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(ValueError, match="label must be in 0..9"):
        data.draw_shape(10, np.random.default_rng(0))


def test_second_call_reuses_the_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = data.prepare_data("tiny", root=tmp_path, progress=False)
    stamp = (first / "manifest.json").stat().st_mtime_ns

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated a set that already existed")

    monkeypatch.setattr(data, "_generate_into", fail)
    assert data.prepare_data("tiny", root=tmp_path, progress=False) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp


def test_failure_mid_write_leaves_nothing_that_looks_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_draw = data.draw_shape
    calls = {"n": 0}

    def draw_then_fail(*args: object, **kwargs: object):
        calls["n"] += 1
        if calls["n"] > 30:
            raise OSError("disk full (simulated)")
        return real_draw(*args, **kwargs)

    monkeypatch.setattr(data, "draw_shape", draw_then_fail)
    with pytest.raises(data.DataError, match=r"cannot write the shapes-tiny-seed0 set.*disk full \(simulated\)"):
        data.prepare_data("tiny", root=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []  # no final folder, no temp folder left behind
    monkeypatch.setattr(data, "draw_shape", real_draw)
    folder = data.prepare_data("tiny", root=tmp_path, progress=False)
    assert data.verify(folder, checksums=True)["total_images"] == data.SIZES["tiny"].total


KILL_SCRIPT = """
import sys
from course_lib import data, support
data.prepare_data("workshop", root=sys.argv[1], progress=False)
"""


def test_killed_run_is_not_reused_and_is_cleaned_up(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until it is writing images
            temps = list(tmp_path.glob(".shapes-workshop-seed0.tmp-*"))
            if temps and any(temps[0].rglob("*.jpg")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the generating process never started writing")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    final = tmp_path / "shapes-workshop-seed0"
    assert not final.exists(), "a killed run must not leave a folder under the final name"
    assert list(tmp_path.glob(".shapes-workshop-seed0.tmp-*")), "the killed run's temp folder should still be there"
    support._remove_dead_temps(tmp_path / "shapes-workshop-seed0")  # what the next prepare_data() does first
    assert not list(tmp_path.glob(".shapes-workshop-seed0.tmp-*"))


def test_stale_temp_of_a_live_process_is_kept(tmp_path: Path) -> None:
    mine = tmp_path / f".shapes-tiny-seed0.tmp-{support._host()}-{os.getpid()}-abcd"
    mine.mkdir()
    support._remove_dead_temps(tmp_path / "shapes-tiny-seed0")
    assert mine.exists()


SCRATCH_SCRIPT = """
import os, sys
from course_lib import data
print(data.scratch_folder("11"), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)  # what nbval does to a kernel: no atexit, no cleanup
"""


def test_scratch_folder_of_a_killed_kernel_goes_at_once_or_at_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(how: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", SCRATCH_SCRIPT, how],
            env={**os.environ, "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    killed = Path(run("kill").stdout.strip())
    assert killed.parent == tmp_path
    deadline = time.monotonic() + 15
    while killed.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not killed.exists(), "the watcher of a killed kernel removes its folder (support.when_this_process_dies)"
    exited = Path(run("exit").stdout.strip())
    assert not exited.exists(), "a kernel that exits removes its own folder"
    # a folder whose watcher could not do it (the machine rebooted): the next call removes it
    left = tmp_path / "course11-left"
    left.mkdir()
    (left / support._SCRATCH_OWNER).write_text(f"{support._host()} {killed_pid_stand_in()}")
    foreign = tmp_path / "course11-notours"  # same name pattern, no owner file: not the course's
    foreign.mkdir()
    other_host = tmp_path / "course09-otherhost"  # a dead pid, but written on another host (a shared /tmp)
    other_host.mkdir()
    (other_host / support._SCRATCH_OWNER).write_text(f"elsewhere {killed_pid_stand_in()}")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    first = data.scratch_folder("07")
    assert first.name.startswith("course07-") and (first / support._SCRATCH_OWNER).exists()
    assert not left.exists(), "the next call removes the folder of a dead kernel"
    assert foreign.exists() and other_host.exists() and first.exists()
    again = data.scratch_folder("07")  # the notebook's first cell, run again in the same kernel
    assert again.is_dir() and not first.exists(), "a second call for the same notebook replaces the first folder"


def killed_pid_stand_in() -> int:
    """A pid that surely runs no more: a child that has exited and been reaped."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=60
    )
    return int(proc.stdout)


CONCURRENT_SCRIPT = """
import sys
from course_lib import data, support
print(data.prepare_data("tiny", root=sys.argv[1], progress=False).name)
"""


def test_concurrent_preparation_yields_one_complete_set(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outs == ["shapes-tiny-seed0"] * 3
    assert [p.name for p in tmp_path.iterdir()] == ["shapes-tiny-seed0"]
    data.verify(tmp_path / "shapes-tiny-seed0", checksums=True)


def test_verify_reports_missing_and_damaged_files(tmp_path: Path) -> None:
    folder = data.prepare_data("tiny", root=tmp_path, progress=False)
    (folder / "train" / "star" / "00001.jpg").unlink()
    with pytest.raises(data.DataError, match=r"1 missing \(e\.g\. train/star/00001\.jpg\).*force=True"):
        data.prepare_data("tiny", root=tmp_path, progress=False)
    folder = data.prepare_data("tiny", root=tmp_path, progress=False, force=True)
    (folder / "val" / "ring" / "00000.jpg").write_bytes(b"not a jpeg")
    data.verify(folder)  # sizes are not checked without checksums
    with pytest.raises(data.DataError, match=r"1 damaged \(e\.g\. val/ring/00000\.jpg\)"):
        data.prepare_data("tiny", root=tmp_path, progress=False, checksums=True)


def test_force_regenerates_in_place(tmp_path: Path) -> None:
    folder = data.prepare_data("tiny", root=tmp_path, progress=False)
    (folder / "train" / "star" / "00001.jpg").unlink()
    again = data.prepare_data("tiny", root=tmp_path, progress=False, force=True)
    assert again == folder and data.verify(folder, checksums=True)
    assert [p.name for p in tmp_path.iterdir()] == ["shapes-tiny-seed0"]


def test_a_set_from_another_generator_version_is_regenerated(tmp_path: Path) -> None:
    folder = data.prepare_data("tiny", root=tmp_path, progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 0
    (folder / "manifest.json").write_text(json.dumps(manifest))
    data.prepare_data("tiny", root=tmp_path, progress=False)
    assert data.read_manifest(folder)["format_version"] == data._FORMAT_VERSION


def test_folder_without_manifest_is_not_taken_for_a_set(tmp_path: Path) -> None:
    (tmp_path / "shapes-tiny-seed0" / "train").mkdir(parents=True)
    with pytest.raises(data.DataError, match="no manifest.json"):
        data.prepare_data("tiny", root=tmp_path, progress=False)
    assert (tmp_path / "shapes-tiny-seed0" / "train").is_dir()  # nothing of the user's is deleted


def test_data_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert data.data_dir() == tmp_path / "cache" / "pytorch-data-course"
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "env"))
    assert data.data_dir() == tmp_path / "env"
    assert data.data_dir(tmp_path / "arg") == tmp_path / "arg"
    folder = data.prepare_data("tiny", progress=False)
    assert folder.parent == tmp_path / "env"


def test_read_only_shared_folder_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A participant's notebook asks for a size the instructor did not prepare in a read-only folder."""
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        if ".tmp-" in str(self):
            raise PermissionError(13, "Permission denied")
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(data.DataError, match=r"Permission denied.*python -m course_lib prepare --size tiny"):
        data.prepare_data("tiny", root=tmp_path, progress=False)
    assert not list(tmp_path.iterdir())


def test_bad_arguments_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown size 'huge'; choose one of tiny, small"):
        data.prepare_data("huge", root=tmp_path)
    with pytest.raises(ValueError, match="seed must be a whole number >= 0, got -1"):
        data.prepare_data("tiny", seed=-1, root=tmp_path)
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    with pytest.raises(data.DataError, match=f"Set {data.ENV_VAR} to a writable folder"):
        data.prepare_data("tiny", root=not_a_dir / "sub", progress=False)


def test_describe_shows_no_absolute_path(tiny_set: Path) -> None:
    text = data.describe(tiny_set)
    assert text == "shapes-tiny-seed0: 80 train + 20 val images of 32x32 px, 10 classes, seed 0"
    assert str(tiny_set.parent) not in text
