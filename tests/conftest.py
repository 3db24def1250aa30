"""Shared fixtures: a tiny generated data set, made once per test session; one OpenMP thread per process.

And the two test tiers. Every test carries exactly one tier marker, or collection fails:

* ``quick``: ``pytest -m quick``, the inner loop (about 2 minutes on 2 cores): every module's unit tests, every
  check's right and wrong answers, notebook hygiene and the layering rule; no notebook execution, no torchrun
  job, no Slurm, no browser;
* ``full``: everything else; plain ``pytest`` (the README's test command, CI) runs both tiers. nbval's notebook
  cells are ``full`` without saying so.

The load stage is in the repository's top-level conftest.py: its hooks must reach the notebooks' cells too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from course_lib import data

# Two test processes share two cores (pytest -n 2), beside the notebooks' kernels, torchrun's ranks and
# DataLoader workers: with one OpenMP thread each (inherited by all of them), torch's thread pools do not
# oversubscribe the cores, where spinning threads made notebook 06's training cell take four times as long.
# A learner's Jupyter keeps torch's default; the notebooks' measurements are ratios either way.
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs the tier rule on sample tests


TIERS = ("quick", "full")


@pytest.hookimpl(tryfirst=True)  # before `-m quick` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give nbval's cells the ``full`` marker; fail the collection where a test has no tier, or two."""
    untiered = []
    for item in items:
        if item.nodeid.split("::")[0].endswith(".ipynb"):  # a notebook cell, re-executed by nbval
            item.add_marker(pytest.mark.full)
            continue
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if len(tiers) != 1:
            untiered.append(f"{item.nodeid}: {sorted(tiers) or 'no tier'}")
    if untiered:
        raise pytest.UsageError(
            "every test needs exactly one tier marker, pytest.mark.quick or pytest.mark.full "
            "(tests/conftest.py says which is which):\n  " + "\n  ".join(untiered[:30])
        )


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
