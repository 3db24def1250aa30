"""``python -m course_lib prepare|verify``: the instructors' data preparation command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
