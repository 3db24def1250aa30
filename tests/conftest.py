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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the timings tests/test_slurm.py records (its Slurm stage, its exit runs) at the end of the run."""
    for status in ("passed", "failed"):
        for report in terminalreporter.stats.get(status, []):
            for name, value in getattr(report, "user_properties", []):
                if name in ("slurm_stage", "exit_runs"):
                    terminalreporter.write_line(f"{name}, seconds: {value}")
