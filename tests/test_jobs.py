"""course_lib.jobs: torchrun jobs started from a notebook, their output by rank, failures and hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from course_lib.jobs import LaunchError, _ephemeral_ports, free_ports, launch


SCRIPT_OK = """
import torch, torch.distributed as dist
from course_lib import distributed
env, _ = distributed.start("cpu", timeout_s=20)
t = torch.tensor([env.rank + 1.0]); dist.all_reduce(t)
print(f"rank {env.rank} of {env.world_size}: sum {t.item():.0f}", flush=True)
distributed.finish()
"""

SCRIPT_FAILS = """
import os, sys, time
if os.environ.get("RANK", os.environ.get("SLURM_PROCID")) == "1":  # torchrun's variable, or srun's
    raise KeyError("rank 1 lost its key")
time.sleep(30)
"""

SCRIPT_HANGS = """
import os, subprocess, sys, time
# a process below the rank in a session of its own: the rank's group does not hold it, and srun-style tasks
# have no torchrun above them
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.environ["HELPER_PIDS"], "a") as f:
    f.write(f"{helper.pid}\\n")
print("started", flush=True)
time.sleep(600)
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.full
@pytest.mark.timeout(120)
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_launch_collects_each_ranks_output_in_rank_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], style: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"  # the job's temporary folder: torchrun kept a torchelastic_* folder of logs there
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    result = launch(write(tmp_path, "ok.py", SCRIPT_OK), nproc=2, timeout=90, style=style)
    assert result.ok and result.summary() == "2 ranks finished"
    assert result.ranks == {0: ["rank 0 of 2: sum 3"], 1: ["rank 1 of 2: sum 3"]}
    out = capsys.readouterr().out
    assert out.index("── rank 0 ──") < out.index("rank 0 of 2") < out.index("── rank 1 ──") < out.index("rank 1 of 2")
    assert not list(temp.iterdir()), "the job left files in the temporary folder"


@pytest.mark.full
@pytest.mark.timeout(120)
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_a_failed_rank_raises_with_its_own_error(tmp_path: Path, style: str) -> None:
    with pytest.raises(LaunchError, match="rank 1 failed first: KeyError: 'rank 1 lost its key'") as info:
        launch(write(tmp_path, "fails.py", SCRIPT_FAILS), nproc=2, timeout=90, show=False, style=style)
    assert info.value.result.returncode != 0 and not info.value.result.timed_out


@pytest.mark.full
@pytest.mark.timeout(120)
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_a_hung_job_is_killed_at_the_timeout(tmp_path: Path, style: str) -> None:
    pids = tmp_path / "helper-pids"
    with pytest.raises(LaunchError, match="timed out") as info:
        launch(
            write(tmp_path, "hangs.py", SCRIPT_HANGS),
            nproc=2,
            timeout=10,
            show=False,
            style=style,
            env={"HELPER_PIDS": str(pids)},
        )
    result = info.value.result
    assert result.timed_out and not result.ok and result.seconds < 25
    assert result.ranks[0] == ["started"] and result.ranks[1] == ["started"]  # unbuffered: output survives the kill
    helpers = [int(pid) for pid in pids.read_text().split()]
    assert len(helpers) == 2
    for pid in helpers:  # every process below the job ended with it (a zombie has: only its reaping is left)
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        except psutil.NoSuchProcess:
            pass


DRIVER = """
import sys, time
from course_lib.jobs import launch
try:
    launch(sys.argv[1], nproc=2, timeout=300, show=False, style=sys.argv[2], env={"HELPER_PIDS": sys.argv[3]})
except KeyboardInterrupt as stop:
    print("caught:", *getattr(stop, "__notes__", []), flush=True)
    time.sleep(120)  # alive, as a kernel is after Kernel > Interrupt: its own exit may not be what ends the job
"""


@pytest.mark.full
@pytest.mark.timeout(120)
@pytest.mark.parametrize("style", ["torchrun", "srun"])
def test_an_interrupted_cell_ends_the_job_before_the_next_cell(
    tmp_path: Path, style: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    pids = tmp_path / "helper-pids"
    driver = subprocess.Popen(
        [
            sys.executable,
            write(tmp_path, "driver.py", DRIVER),
            write(tmp_path, "hangs.py", SCRIPT_HANGS),
            style,
            str(pids),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(pids.read_text().split() if pids.exists() else []) < 2:
            assert time.monotonic() < deadline and driver.poll() is None, "the job's ranks did not start"
            time.sleep(0.1)
        below = psutil.Process(driver.pid).children(recursive=True) + [
            psutil.Process(int(pid)) for pid in pids.read_text().split()
        ]
        driver.send_signal(signal.SIGINT)  # what Kernel > Interrupt sends
        assert "the job was stopped with the cell" in driver.stdout.readline()
        assert driver.poll() is None, "the driver is alive: its exit is not what ended the job"
        left = [p for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [p.cmdline() for p in left]
        assert not list(temp.iterdir()), "the job left files in the temporary folder"
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.quick
def test_launch_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nproc"):
        launch("course_lib.train", nproc=0)
    with pytest.raises(FileNotFoundError, match="no script"):
        launch(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="style"):
        launch("course_lib.train", style="mpirun")


@pytest.mark.quick
def test_the_rank_that_crashed_is_named_not_the_one_that_lost_it() -> None:
    """torchrun's root cause is ordered to the second: a peer's consequence error can come first in it."""
    from course_lib.jobs import LaunchResult

    result = LaunchResult(2, 1, False, 3.0)
    result.ranks = {
        0: [
            "epoch 0",
            "RuntimeError: Connection closed by peer [127.0.0.1]:59556. This is typically caused "
            "by a remote worker crashing.",
        ],
        1: ["RuntimeError: rank 1 crashed on purpose at batch 2 (--crash-rank)"],
    }
    result.launcher = ["Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)"]
    assert result.failed_rank() == 1 and result.first_error().startswith("RuntimeError: rank 1 crashed")
    result.launcher = ["Root Cause (first observed failure):", "  rank      : 1 (local_rank: 1)"]
    assert result.failed_rank() == 1
    both = LaunchResult(2, 1, False, 3.0)  # both ranks time out: torchrun's choice stands
    both.ranks = {0: ["RuntimeError: Timed out waiting 3000ms"], 1: ["RuntimeError: Timed out waiting 3000ms"]}
    both.launcher = ["Root Cause", "  rank      : 1 (local_rank: 1)"]
    assert both.failed_rank() == 1


@pytest.mark.quick
def test_free_ports_are_distinct_and_bindable() -> None:
    import socket

    ports = free_ports(3)
    assert len(set(ports)) == 3
    low, _ = _ephemeral_ports()
    assert all(1024 <= port < low for port in ports), f"{ports}: a client's connect() could take one ({low} and up)"
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: nothing holds it after the call
