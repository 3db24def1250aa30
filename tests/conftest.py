"""Shared fixtures: a tiny generated data set, made once per test session; one OpenMP thread per process."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from course_lib import data

# Two test processes share two cores (pytest -n 2), beside the notebooks' kernels, torchrun's ranks and
# DataLoader workers: with one OpenMP thread each (inherited by all of them), torch's thread pools do not
# oversubscribe the cores, where spinning threads made notebook 06's training cell take four times as long.
# A learner's Jupyter keeps torch's default; the notebooks' measurements are ratios either way.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope`` (one notebook's cells in one process, in order), with both versions of notebook 10 in
    one scope, one after the other. mosaicml-streaming 0.13 names its /dev/shm segments by scanning for a free
    number and then creating it, so two kernels that build a StreamingDataset at the same moment can pick the same
    name, and the slower one fails with FileExistsError."""
    from xdist.scheduler import LoadScopeScheduling

    class NotebookScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return re.sub(r"^notebooks/solutions/(09_)", r"notebooks/\1", super()._split_scope(nodeid))

    return NotebookScopes(config, log)


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
                if name in ("slurm_stage", "exit_runs", "slurm_resumable"):
                    terminalreporter.write_line(f"{name}, seconds: {value}")
