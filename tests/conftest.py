"""Shared fixtures: a tiny generated data set, made once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib import data


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding the 'tiny' shapes set (100 images of 32x32 px)."""
    root = tmp_path_factory.mktemp("course-data")
    data.prepare_data("tiny", root=root, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_set(tiny_root: Path) -> Path:
    """The folder of the tiny set itself (holds train/, val/, manifest.json)."""
    return tiny_root / data.dataset_name("tiny", 0)
