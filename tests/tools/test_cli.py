"""``python -m course_lib prepare|verify``: the instructors' data preparation command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import shards
from course_tools import preparation

pytestmark = pytest.mark.quick


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course_lib", *args], capture_output=True, text=True, timeout=120)


def test_prepare_then_verify(tmp_path: Path) -> None:
    done = run("prepare", "--size", "tiny", "--root", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "shapes-tiny-seed0: 80 train + 20 val images" in done.stdout
    assert f"export COURSE_DATA_DIR={tmp_path}" in done.stdout
    checked = run("verify", "--size", "tiny", "--root", str(tmp_path), "--checksums")
    assert checked.returncode == 0, checked.stderr


def test_verify_missing_set_fails_with_advice(tmp_path: Path) -> None:
    done = run("verify", "--size", "small", "--root", str(tmp_path))
    assert done.returncode == 1
    assert "python -m course_lib prepare --size small" in done.stderr


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    done = run("prepare", "--size", "huge", "--root", str(tmp_path))
    assert done.returncode == 2 and "invalid choice" in done.stderr


# --------------------------------------------------------------------------- prepare for a workshop


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``folder`` (hidden ones included) with inode, size and mtime."""
    out = {}
    for p in [folder, *folder.rglob("*")]:
        st = p.stat()
        out[str(p.relative_to(folder))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def test_plan_names_steps_in_order() -> None:
    assert preparation.plan([], "tiny", 3, False) == [("images", "tiny", 3)]
    assert preparation.plan(["shards", "images"], "tiny", 0, False) == [("images", "tiny", 0), ("shards", "tiny", 0)]
    # --all: every step for the notebooks' own set, and for the requested one if it differs
    assert preparation.plan([], "small", 0, True) == [
        ("images", "small", 0),
        ("shards", "small", 0),
        ("text", "small", 0),
    ]
    assert preparation.plan([], "workshop", 0, True)[3:] == [
        ("images", "workshop", 0),
        ("shards", "workshop", 0),
        ("text", "workshop", 0),
    ]
    with pytest.raises(ValueError, match="unknown step 'movies'; the steps are: images, shards"):
        preparation.plan(["movies"], "small", 0, False)


def test_prepare_all_then_notebooks_reuse_it_without_writing(tmp_path: Path) -> None:
    done = run("prepare", "--all", "--root", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "verified shapes-small-seed0: images, shards, text ready" in done.stdout
    assert f"export COURSE_DATA_DIR={tmp_path}" in done.stdout
    for split in preparation.NB09_SHARDS:
        assert (shards.shard_folder(split, root=tmp_path) / "manifest.json").is_file()
    before = snapshot(tmp_path)

    # What the notebooks call, with COURSE_DATA_DIR set as the instructor says: it reuses, writes nothing.
    notebook_calls = (
        "from course_lib import data, shards\nfrom course_tools import preparation\n"
        "root = data.prepare_data()\n"  # notebooks 01-09
        "for split, maxcount in preparation.NB09_SHARDS.items():\n"  # notebook 09's shards, its parameters
        "    shards.write_image_shards(shards.shard_folder(split), split=split, maxcount=maxcount)\n"
        "print(data.describe(root))\n"
    )
    env = {**os.environ, "COURSE_DATA_DIR": str(tmp_path)}
    used = subprocess.run([sys.executable, "-c", notebook_calls], capture_output=True, text=True, timeout=120, env=env)
    assert used.returncode == 0, used.stderr
    assert "shapes-small-seed0: 800 train + 200 val images" in used.stdout
    again = run("prepare", "--all", "--root", str(tmp_path), "--quiet")
    assert again.returncode == 0, again.stderr
    assert snapshot(tmp_path) == before  # nothing rewritten, touched, or left behind


def test_prepare_one_step(tmp_path: Path) -> None:
    done = run("prepare", "--step", "shards", "--size", "tiny", "--root", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "shards   train: shapes-train-000000.tar, 80 samples; val: shapes-val-000000.tar, 20 samples" in done.stdout
    assert not (tmp_path / "shapes-small-seed0").exists()  # without --all: only what was asked


def test_prepare_unknown_step_is_refused(tmp_path: Path) -> None:
    done = run("prepare", "--step", "movies", "--root", str(tmp_path))
    assert done.returncode == 1 and "the steps are: images, shards" in done.stderr


def test_prepare_into_a_file_fails_and_keeps_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("keep me")
    done = run("prepare", "--all", "--root", str(blocker), "--quiet")
    assert done.returncode == 1
    assert (
        "error: step 'images' (shapes-small-seed0) failed: cannot create the data folder: not-a-folder is a file"
        in done.stderr
    )
    assert "COURSE_DATA_DIR" in done.stderr and "Traceback" not in done.stderr
    assert blocker.read_text() == "keep me"


def test_help_lists_doctor() -> None:
    done = run("--help")
    assert done.returncode == 0 and "doctor" in done.stdout and "prepare" in done.stdout


def test_prepare_notes_a_shared_folder_others_cannot_read(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)  # whatever the umask
    open_to_all = run("prepare", "--size", "tiny", "--root", str(shared), "--quiet")
    assert open_to_all.returncode == 0 and "chmod" not in open_to_all.stdout
    shared.chmod(0o700)
    private = run("prepare", "--size", "tiny", "--root", str(shared), "--quiet")
    assert private.returncode == 0
    assert f"note: other users cannot read {shared}; for a shared folder run: chmod -R a+rX {shared}" in private.stdout


def test_the_course_lib_command_is_a_real_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    """`course-lib` (pyproject's console script) is course_lib.__main__:main, a function: importing the module
    runs nothing, and calling it runs a command."""
    import importlib
    import tomllib
    from pathlib import Path

    target = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = target["course-lib"].partition(":")
    entry = getattr(importlib.import_module(module), name)  # a command would have run (and exited) here before
    assert callable(entry)
    with pytest.raises(SystemExit) as exit_info:
        entry(["--help"])
    assert exit_info.value.code == 0 and "prepare" in capsys.readouterr().out
    assert entry(["verify", "--size", "tiny", "--root", "/nonexistent-course-data"]) == 1
