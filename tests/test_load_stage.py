"""The load stage (the top-level conftest.py): a loaded notebook's cells run while another process keeps a core busy."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def conftest(pytestconfig: pytest.Config) -> Any:
    """The top-level conftest.py, as pytest loaded it (sys.modules keeps only the last module named conftest)."""
    return next(p for p in pytestconfig.pluginmanager.get_plugins()
                if getattr(p, "__file__", None) == str(ROOT / "conftest.py"))


def test_the_solutions_that_print_claims_run_under_load_and_nothing_else(conftest: Any) -> None:
    loaded = {p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb")
              if conftest.under_load(str(p.relative_to(ROOT)))}
    printing = {p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb") if " → holds: " in p.read_text()}
    assert loaded == printing and loaded, loaded
    assert not any(conftest.under_load(str(p.relative_to(ROOT))) for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_a_busy_process_runs_from_the_first_cell_to_the_last(conftest: Any) -> None:
    loaded = next(str(p.relative_to(ROOT)) for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
                  if conftest.under_load(str(p.relative_to(ROOT))))
    cells = [SimpleNamespace(nodeid=f"{loaded}::Cell {i}", user_properties=[]) for i in range(3)]
    other = SimpleNamespace(nodeid="tests/test_data.py::test_x", user_properties=[])
    conftest.pytest_runtest_setup(cells[0])
    hog = conftest._hogs[loaded]
    try:
        busy = psutil.Process(hog.pid)
        assert busy.ppid() == os.getpid() and busy.status() in ("running", "sleeping")
        before = sum(busy.cpu_times()[:2])
        time.sleep(0.5)
        assert sum(busy.cpu_times()[:2]) - before > 0.05  # it burns CPU (a full core on an idle machine)
        conftest.pytest_runtest_teardown(cells[0], cells[1])
        conftest.pytest_runtest_setup(cells[1])
        assert conftest._hogs[loaded] is hog  # one busy process for the whole notebook
        conftest.pytest_runtest_teardown(cells[2], other)
        assert loaded not in conftest._hogs and hog.poll() is not None  # stopped, by pid, after the last cell
        assert cells[2].user_properties[0][0] == "load_stage"
    finally:
        hog.kill()
    conftest.pytest_runtest_setup(other)
    assert not conftest._hogs


def test_claims_left_inconclusive_are_noted_for_the_summary(conftest: Any) -> None:
    outputs = [{"output_type": "stream", "name": "stdout",
                "text": "x → holds: 2.0× (median of 5 rounds, spread ±0.1×)\n"
                        "y → inconclusive on this machine: 1.1× (median of 5 rounds) is within twice ...\n"}]
    item = SimpleNamespace(nodeid="notebooks/04_x.ipynb::Cell 3", user_properties=[], test_outputs=outputs)
    conftest.pytest_runtest_teardown(item, None)
    assert item.user_properties == [
        ("inconclusive", "notebooks/04_x.ipynb::Cell 3 (idle): y → inconclusive on this machine: 1.1× (median of 5 "
                         "rounds) is within twice ...")]
