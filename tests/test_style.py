"""Style, by stock tools: ``ruff check`` and ``ruff format --check`` pass on the course's code, the notebooks' code
cells included (configured in ``pyproject.toml``, ``[tool.ruff]``). Fix with ``ruff format .`` and ``ruff check --fix
.``; for a notebook, format the solution, then ``python -m course_lib authoring build NN``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_check_passes() -> None:
    result = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_check_passes() -> None:
    result = ruff("format", "--no-cache", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_notebooks_code_is_checked_too(tmp_path: Path) -> None:
    """The checks above can fail, on a notebook as on a module: a sample with an unused import and bad layout."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    notebook = tmp_path / "notebooks" / "solutions" / "99_sample.ipynb"
    notebook.parent.mkdir(parents=True)
    notebook.write_text(
        '{"cells": [{"cell_type": "code", "execution_count": null, "id": "a", "metadata": {}, "outputs": [], '
        '"source": ["import os\\n", "x=[1,2]"]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    checked = ruff("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert checked.returncode == 1 and "99_sample.ipynb:cell 1:1:8: F401" in checked.stdout, checked.stdout
    formatted = ruff("format", "--no-cache", "--check", ".", cwd=tmp_path)
    assert formatted.returncode == 1 and "99_sample.ipynb" in formatted.stdout, formatted.stdout
