"""The load stage, for every notebook cell nbval re-executes (here, not in tests/conftest.py: pytest applies a
conftest's per-test hooks only to the tests below its folder, and the notebooks live in notebooks/).

The solution version of every notebook that prints a measured claim (course_lib.claims) is re-executed while a
competing process keeps one core busy, instead of on an idle machine. Its claims must hold or say "inconclusive on
this machine"; a claim that prints the opposite of its prose fails the cell. The learner versions run idle. The
summary at the end of the run gives each loaded notebook's time and every claim a notebook left inconclusive.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
LOADED = ROOT / "notebooks" / "solutions"
_hogs: dict[str, subprocess.Popen] = {}  # notebook path -> the process keeping a core busy while its cells run
_started: dict[str, float] = {}


def _notebook(item: pytest.Item | None) -> str | None:
    """The notebook (a path relative to the repository) whose cell ``item`` is, or None."""
    path = item.nodeid.split("::")[0] if item is not None else ""
    return path if path.endswith(".ipynb") else None


@functools.cache
def under_load(nodeid_path: str) -> bool:
    """A solution notebook whose stored outputs print a measured claim ("STATEMENT → holds: ...")."""
    path = ROOT / nodeid_path
    return path.parent == LOADED and path.suffix == ".ipynb" and " → holds: " in path.read_text()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The load stage: before a loaded notebook's first cell, start a process that keeps one core busy."""
    notebook = _notebook(item)
    if notebook and notebook not in _hogs and under_load(notebook):
        _hogs[notebook] = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        _started[notebook] = time.monotonic()


INCONCLUSIVE = re.compile(r"^.+ → inconclusive on this machine: .*$", re.M)


def _claims_left_open(item: pytest.Item) -> list[str]:
    """The claims a notebook cell just printed as "inconclusive on this machine" (nbval keeps the fresh outputs)."""
    text = "".join(str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
                   for out in getattr(item, "test_outputs", None) or [])
    return INCONCLUSIVE.findall(text)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a loaded notebook's last cell (or a failure that ends the run), stop its busy process, by pid.
    Note every claim a cell left inconclusive, loaded or not: the summary at the end lists them."""
    notebook = _notebook(item)
    for line in _claims_left_open(item) if notebook else []:
        load = "under load" if notebook in _hogs else "idle"
        item.user_properties.append(("inconclusive", f"{item.nodeid} ({load}): {line}"))
    if notebook in _hogs and _notebook(nextitem) != notebook:
        hog = _hogs.pop(notebook)
        hog.kill()
        hog.wait(timeout=10)
        item.user_properties.append(("load_stage", f"{notebook} {time.monotonic() - _started.pop(notebook):.0f}"))


def pytest_sessionfinish() -> None:
    for hog in _hogs.values():
        hog.kill()
        hog.wait(timeout=10)
    _hogs.clear()



def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each loaded notebook's time, and every claim left inconclusive (from the teardown reports, category "")."""
    for report in terminalreporter.stats.get("", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "load_stage":
                terminalreporter.write_line(f"load_stage, seconds: {value}")
            elif name == "inconclusive":
                terminalreporter.write_line(f"claim left inconclusive: {value}")
