"""The load stage, for every notebook cell nbval re-executes (here, not in tests/conftest.py: pytest applies a
conftest's per-test hooks only to the tests below its folder, and the notebooks live in notebooks/).

The solution version of every notebook that prints a measured claim (course_lib.claims) is re-executed while other
work keeps one core busy, instead of on an idle machine. Its claims must hold or say "inconclusive on this machine";
a claim that prints the opposite of its prose fails the cell. The learner versions run idle. The busy process
(tests/busy_core.py) tops up whatever the other test process leaves to one core, rather than adding a core of its own
beside it. The summary at the end of the run gives each loaded notebook's time, the competing load it ran under, and
every claim a notebook left inconclusive.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent
LOADED = ROOT / "notebooks" / "solutions"
BUSY_CORE = ROOT / "tests" / "busy_core.py"
_hogs: dict[str, subprocess.Popen] = {}  # notebook path -> the process keeping a core busy while its cells run
_started: dict[str, float] = {}
_reports: dict[str, Path] = {}  # notebook path -> where its busy process writes what it saw


def _notebook(item: pytest.Item | None) -> str | None:
    """The notebook (a path relative to the repository) whose cell ``item`` is, or None."""
    path = item.nodeid.split("::")[0] if item is not None else ""
    return path if path.endswith(".ipynb") else None


@functools.cache
def under_load(nodeid_path: str) -> bool:
    """A solution notebook whose stored outputs print a measured claim ("STATEMENT → holds: ...")."""
    path = ROOT / nodeid_path
    return path.parent == LOADED and path.suffix == ".ipynb" and " → holds: " in path.read_text()


#: What must not run at the same time as anything else that builds an MDS StreamingDataset, in one xdist group:
#: mosaicml-streaming 0.13 names its /dev/shm segments by scanning for a free number and then creating it, so two
#: processes that build one at the same moment can pick the same name (the slower fails with FileExistsError), and a
#: test that counts the segments it leaves sees the other's. Notebooks 11 and 14, both versions, and these files:
MDS = "mds"
MDS_NOTEBOOKS = {"11", "14"}
MDS_TESTS = {"tests/test_alternatives.py", "tests/test_checks_nb11.py"}  # and tools/test_bench.py's formats test


def xdist_group(item: pytest.Item, quick: bool) -> str | None:
    """The xdist group (``--dist loadgroup``, pyproject.toml) that runs ``item`` in one test process with the rest
    of its group, in order: a notebook's cells; everything that uses MDS; in a full run, a test module's tests, so
    that its module-scoped servers and clusters start once. None: spread test by test, as the quick tier's other
    tests are (about 5 % faster)."""
    path = item.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        return MDS if Path(path).name[:2] in MDS_NOTEBOOKS else path
    if path in MDS_TESTS:
        return MDS
    return None if quick else path


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups, and before `-m quick` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its xdist group (:func:`xdist_group`). Here, at the top, so that it is loaded whatever the
    command line names: ``pytest notebooks/...`` alone never reads tests/conftest.py."""
    quick = config.option.markexpr.strip() == "quick"
    for item in items:
        group = xdist_group(item, quick)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The load stage: before a loaded notebook's first cell, start a process that keeps one core busy."""
    notebook = _notebook(item)
    if notebook and notebook not in _hogs and under_load(notebook):
        report = Path(tempfile.mkdtemp(prefix="load-stage-")) / "busy-core.json"
        _hogs[notebook] = subprocess.Popen(
            [sys.executable, str(BUSY_CORE), "--watch", str(os.getpid()), "--report", str(report)]
        )
        _started[notebook], _reports[notebook] = time.monotonic(), report


INCONCLUSIVE = re.compile(r"^.+ → inconclusive on this machine: .*$", re.M)


def _claims_left_open(item: pytest.Item) -> list[str]:
    """The claims a notebook cell just printed as "inconclusive on this machine" (nbval keeps the fresh outputs)."""
    text = "".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
        for out in getattr(item, "test_outputs", None) or []
    )
    return INCONCLUSIVE.findall(text)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a loaded notebook's last cell (or a failure that ends the run), stop its busy process, by pid.
    Note every claim a cell left inconclusive, loaded or not: the summary at the end lists them."""
    notebook = _notebook(item)
    for line in _claims_left_open(item) if notebook else []:
        load = "under load" if notebook in _hogs else "idle"
        item.user_properties.append(("inconclusive", f"{item.nodeid} ({load}): {line}"))
    if notebook in _hogs and _notebook(nextitem) != notebook:
        hog, report = _hogs.pop(notebook), _reports.pop(notebook)
        ended_early = hog.poll()
        hog.terminate()  # it writes its report on SIGTERM
        try:
            hog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hog.kill()
            hog.wait(timeout=10)
        seconds = time.monotonic() - _started.pop(notebook)
        if ended_early is not None:
            raise RuntimeError(
                f"the load stage's busy process (tests/busy_core.py) ended early, with exit status "
                f"{ended_early}: {notebook} did not run under load"
            )
        seen = json.loads(report.read_text()) if report.is_file() else {}
        shutil.rmtree(report.parent, ignore_errors=True)
        load = (
            f", other work {seen['competing_cores']:.2f} cores on average (the busy process "
            f"{seen['own_cores']:.2f}), at least 0.9 core in {seen['seconds_at_target']:.0%} of its seconds"
            if seen
            else ""
        )
        item.user_properties.append(("load_stage", f"{notebook} {seconds:.0f}{load}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed notebook cell's report shows what the cell wrote to stderr: nbval says only "Unexpected output
    fields from running code: {'stderr'}", and a warning a library logs under load is gone after the run."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        stderr = "".join(
            str(out.get("text", ""))
            for out in getattr(item, "test_outputs", None) or []
            if out.get("output_type") == "stream" and out.get("name") == "stderr"
        )
        if stderr:
            report.sections.append(("the cell's stderr", stderr))


def pytest_sessionfinish() -> None:
    """A run that ended inside a loaded notebook (interrupted, timed out): its busy process goes, and its report folder."""
    for hog in _hogs.values():
        hog.kill()
        hog.wait(timeout=10)
    for report in _reports.values():
        shutil.rmtree(report.parent, ignore_errors=True)
    _hogs.clear()
    _reports.clear()
    _started.clear()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each loaded notebook's time, and every claim left inconclusive (from the teardown reports, category "")."""
    for report in terminalreporter.stats.get("", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "load_stage":
                terminalreporter.write_line(f"load_stage, seconds: {value}")
            elif name == "inconclusive":
                terminalreporter.write_line(f"claim left inconclusive: {value}")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many test processes ``-n auto`` (pyproject.toml) starts: 2 for a full run, whose notebooks, jobs and
    browser keep both cores busy (a third made it no faster), and 3 for the quick tier (``-m quick``), whose tests
    wait about a third of their time on the processes and servers they start (151 s with 2, 131 s with 3, warm, on
    2 cores). Here, at the top, because xdist asks before it reads tests/conftest.py."""
    return 3 if config.option.markexpr.strip() == "quick" else 2
