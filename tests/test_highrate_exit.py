"""course_lib.highrate: a RingLoader left alive until the interpreter exits stops its workers quietly.

A ring held in a module global (a notebook's cell, a script) outlives the code that used it: it is stopped at
interpreter exit, when a ``__del__`` can find module globals such as ``contextlib`` or ``queue`` already set to
None and prints "Exception ignored in ... 'NoneType' object has no attribute ...". Full tier: each case starts a
fresh interpreter that imports torch (a few seconds)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.full

PROGRAM = """
import sys
from course_lib import highrate

raw = highrate.write_raw_tensors(sys.argv[1], 8, sample_bytes=4096)
ring = highrate.RingLoader(raw, batch_size=2, num_workers=2)
print(*(p.pid for p in ring._procs))
if sys.argv[2] == "mid-epoch":  # a suspended epoch: its generator is closed during the interpreter's teardown
    batches = iter(ring)
    first = next(batches)
elif sys.argv[2] == "two rings":  # another one, never iterated
    other = highrate.RingLoader(raw, batch_size=4, num_workers=1)
    print(*(p.pid for p in other._procs))
else:  # a whole epoch, the ring left open
    assert sum(1 for _ in ring) == 4
"""


@pytest.mark.parametrize("case", ["epoch done", "mid-epoch", "two rings"])
def test_a_global_ring_exits_without_a_word_on_stderr(tmp_path: Path, case: str) -> None:
    script = tmp_path / "global_ring.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "raw.f32"), case],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no "Exception ignored in ...": the workers were stopped while modules were whole
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == (3 if case == "two rings" else 2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)  # and none was left running


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
