"""The load stage (the top-level conftest.py): a loaded notebook's cells run while another process keeps a core busy."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
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
    return next(
        p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(ROOT / "conftest.py")
    )


def test_the_solutions_that_print_claims_run_under_load_and_nothing_else(conftest: Any) -> None:
    loaded = {
        p.name
        for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb")
        if conftest.under_load(str(p.relative_to(ROOT)))
    }
    printing = {p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb") if " → holds: " in p.read_text()}
    assert loaded == printing and loaded, loaded
    assert not any(conftest.under_load(str(p.relative_to(ROOT))) for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_a_busy_process_runs_from_the_first_cell_to_the_last(conftest: Any) -> None:
    loaded = next(
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
        if conftest.under_load(str(p.relative_to(ROOT)))
    )
    cells = [SimpleNamespace(nodeid=f"{loaded}::Cell {i}", user_properties=[]) for i in range(3)]
    other = SimpleNamespace(nodeid="tests/test_data.py::test_x", user_properties=[])
    conftest.pytest_runtest_setup(cells[0])
    hog = conftest._hogs[loaded]
    try:
        busy = psutil.Process(hog.pid)
        assert busy.ppid() == os.getpid() and busy.status() in ("running", "sleeping")
        deadline = time.monotonic() + 10  # right after the fork, before exec, /proc may still show no command line
        while not busy.cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert busy.cmdline()[1:4] == [str(ROOT / "tests" / "busy_core.py"), "--watch", str(os.getpid())]
        time.sleep(0.5)  # what it does is tested below
        conftest.pytest_runtest_teardown(cells[0], cells[1])
        conftest.pytest_runtest_setup(cells[1])
        assert conftest._hogs[loaded] is hog  # one busy process for the whole notebook
        conftest.pytest_runtest_teardown(cells[2], other)
        assert loaded not in conftest._hogs and hog.poll() is not None  # stopped, by pid, after the last cell
        name, value = cells[2].user_properties[0]
        assert name == "load_stage" and re.fullmatch(
            rf"{loaded} \d+, other work \d\.\d\d cores on average \(the busy "
            r"process \d\.\d\d\), at least 0\.9 core in \d+% of its seconds",
            value,
        ), value
    finally:
        hog.kill()
    conftest.pytest_runtest_setup(other)
    assert not conftest._hogs


def test_claims_left_inconclusive_are_noted_for_the_summary(conftest: Any) -> None:
    outputs = [
        {
            "output_type": "stream",
            "name": "stdout",
            "text": "x → holds: 2.0× (median of 5 rounds, spread ±0.1×)\n"
            "y → inconclusive on this machine: 1.1× (median of 5 rounds) is within twice ...\n",
        }
    ]
    item = SimpleNamespace(nodeid="notebooks/04_x.ipynb::Cell 3", user_properties=[], test_outputs=outputs)
    conftest.pytest_runtest_teardown(item, None)
    assert item.user_properties == [
        (
            "inconclusive",
            "notebooks/04_x.ipynb::Cell 3 (idle): y → inconclusive on this machine: 1.1× (median of 5 "
            "rounds) is within twice ...",
        )
    ]


BUSY_CORE = ROOT / "tests" / "busy_core.py"


def test_the_busy_process_spins_what_the_rest_of_the_machine_leaves_of_one_core() -> None:
    from tests.busy_core import spin_for

    assert spin_for(1.0, 0.0) == 1.0  # nothing else runs: spin all the time
    assert spin_for(1.0, 0.25) == 0.75
    assert spin_for(1.0, 1.6) == 0.0  # another test keeps a core busy: sleep


def _busy(watch: int, report: Path) -> subprocess.Popen:
    """A busy process that watches ``watch`` already when this returns (it says so on its stdout)."""
    busy = subprocess.Popen(
        [sys.executable, str(BUSY_CORE), "--watch", str(watch), "--report", str(report), "--ready"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert busy.stdout is not None and busy.stdout.readline() == f"watching {watch}\n"
    return busy


def _stop(busy: subprocess.Popen, report: Path) -> dict:
    busy.terminate()
    assert busy.wait(10) == 0
    return json.loads(report.read_text())


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


def test_the_watched_tree_does_not_count_as_other_work(tmp_path: Path) -> None:
    """A notebook's own workers, spinning, leave the busy process spinning: other work stays at a core or more,
    measured here without its help (the machine's CPU less this test's tree: the notebook's side)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a child: in the watched tree
    busy = _busy(os.getpid(), tmp_path / "seen.json")
    try:
        me, spin = psutil.Process(), psutil.Process(spinner.pid)
        time.sleep(1.0)  # its first windows
        before = (sum(psutil.cpu_times()[:3]), _cpu(me), _cpu(spin), time.monotonic())
        time.sleep(2.0)
        after = (sum(psutil.cpu_times()[:3]), _cpu(me), _cpu(spin), time.monotonic())
        machine, mine, spun, seconds = (a - b for a, b in zip(after, before))
        other_work = (machine - mine - spun) / seconds
        assert other_work > 0.8, f"{other_work:.2f} cores of other work beside a spinning notebook"
    finally:
        seen = _stop(busy, tmp_path / "seen.json")
        spinner.kill()
        spinner.wait(10)
    assert seen["seconds"] > 2.5 and 0 <= seen["own_cores"] <= seen["competing_cores"]


def test_other_work_leaves_the_busy_process_idle(tmp_path: Path) -> None:
    """A process outside the watched tree (as the other test process is) keeps a core busy: the busy process yields."""
    spin = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    outside = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; print(subprocess.Popen([sys.executable, "
            f"'-c', {spin!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # its parent has ended: the spinner is not in this test's tree
    spinner = psutil.Process(int(outside.stdout))
    busy = _busy(os.getpid(), tmp_path / "seen.json")
    try:
        time.sleep(1.0)
        before = _cpu(psutil.Process(busy.pid))
        time.sleep(2.0)
        own = (_cpu(psutil.Process(busy.pid)) - before) / 2.0
    finally:
        seen = _stop(busy, tmp_path / "seen.json")
        with contextlib.suppress(psutil.NoSuchProcess):
            spinner.kill()
    assert own < 0.5, f"the busy process took {own:.2f} of a core beside a process that kept one busy"
    assert seen["competing_cores"] > 0.5


def test_the_busy_process_ends_with_the_process_it_watches(tmp_path: Path) -> None:
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = _busy(watched.pid, tmp_path / "seen.json")
    try:
        time.sleep(0.5)  # a few of its windows
        watched.kill()
        watched.wait(10)
        assert busy.wait(10) == 0 and json.loads((tmp_path / "seen.json").read_text())["seconds"] > 0
    finally:
        busy.kill()


def test_a_process_that_ended_before_the_busy_process_watched_it_is_reported_not_a_crash(tmp_path: Path) -> None:
    """Under heavy load the watched process can end before the busy process has started (a full run once saw
    NoSuchProcess): it reports that it ran 0 seconds and exits normally."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    busy = subprocess.run(
        [sys.executable, str(BUSY_CORE), "--watch", str(gone.pid), "--report", str(tmp_path / "seen.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert busy.returncode == 0, busy.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["seconds"] == 0.0
