"""The load stage's busy process: it keeps one core's worth of other work competing with a notebook.

The load stage (the top-level conftest.py) re-executes each claim-printing solution notebook while work other than
the notebook's keeps one of the two cores busy. Under ``pytest -n 2`` the other test process often does that by
itself, and a plain busy loop beside it would only slow the suite down. So this process fills in what the rest of
the machine leaves: every tenth of a second it reads how much CPU the machine spent outside the watched process tree
(the test process that drives the notebook, with its kernel and the kernel's workers and ranks), and spins for the
part of the next tenth that brings that up to one core. Alone beside the notebook it spins all the time, as a plain
busy loop would; beside a test that keeps a core busy it sleeps.

On SIGTERM, or when the watched process has ended, it writes what it saw to ``--report`` as JSON and exits: the seconds it ran, the competing CPU in cores on
average (its own included), its own part of that, and the share of whole seconds in which the competing CPU reached
0.9 of the target.

    python tests/busy_core.py --watch PID [--cores 1] [--report FILE] [--ready]

A watched process that has ended before this one starts watching it leaves nothing to compete with: it reports 0
seconds and exits. ``--ready`` prints ``watching PID`` once it watches, for a caller that must know it does.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path
from typing import NamedTuple

import psutil

WINDOW = 0.1  # seconds between two looks at the machine


class Sample(NamedTuple):
    at: float  # time.monotonic()
    busy: float  # CPU seconds the whole machine has spent working since it booted
    tree: float  # CPU seconds of the watched tree (this process left out), its ended children included
    own: float  # this process's CPU seconds


def machine_busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def tree_cpu(root: psutil.Process, me: int) -> float:
    """CPU seconds of ``root`` and every process below it but this one. A process that ended and was waited for
    counts in its parent's children_user/children_system, so the sum does not drop when a worker exits."""
    total = 0.0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for process in processes:
        if process.pid == me:
            continue
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended between the listing and the reading: its parent counts it from now on
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def sample(root: psutil.Process, me: psutil.Process) -> Sample:
    own = me.cpu_times()
    return Sample(time.monotonic(), machine_busy(), tree_cpu(root, me.pid), own.user + own.system)


def spin_for(cores: float, others: float) -> float:
    """The share of the next window to spin: what the other work (in cores) leaves of the target, between 0 and 1."""
    return min(1.0, max(0.0, cores - others))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch", type=int, required=True, help="pid of the process tree whose CPU does not count")
    parser.add_argument("--cores", type=float, default=1.0, help="competing CPU to keep up, in cores (at most 1)")
    parser.add_argument("--report", type=Path, help="where to write what it saw, on SIGTERM")
    parser.add_argument("--ready", action="store_true", help="print 'watching PID' once watching")
    args = parser.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    me = psutil.Process()
    try:
        root = psutil.Process(args.watch)
    except psutil.NoSuchProcess:  # it ended before this process started: nothing to compete with
        if args.report:
            args.report.write_text(
                json.dumps({"seconds": 0.0, "competing_cores": 0.0, "own_cores": 0.0, "seconds_at_target": 1.0})
            )
        return
    first = previous = sample(root, me)
    if args.ready:
        print(f"watching {args.watch}", flush=True)
    share = 1.0
    seconds, second_cpu, second_start = [], 0.0, first.at
    competing_total = 0.0
    while not stop and root.is_running():  # a watched process that ended takes this one along
        start = time.monotonic()
        while time.monotonic() < start + share * WINDOW and not stop:
            pass
        time.sleep(max(0.0, start + WINDOW - time.monotonic()))
        now = sample(root, me)
        elapsed = now.at - previous.at
        mine = now.own - previous.own
        others = max(0.0, (now.busy - previous.busy) - (now.tree - previous.tree) - mine) / elapsed
        share = spin_for(args.cores, others)
        competing = others * elapsed + mine
        competing_total += competing
        second_cpu += competing
        if now.at - second_start >= 1.0:
            seconds.append(second_cpu / (now.at - second_start))
            second_cpu, second_start = 0.0, now.at
        previous = now
    if args.report:
        ran = previous.at - first.at
        args.report.write_text(
            json.dumps(
                {
                    "seconds": round(ran, 1),
                    "competing_cores": round(competing_total / ran, 2) if ran else 0.0,
                    "own_cores": round((previous.own - first.own) / ran, 2) if ran else 0.0,
                    "seconds_at_target": round(sum(c >= 0.9 * args.cores for c in seconds) / len(seconds), 2)
                    if seconds
                    else 1.0,
                }
            )
        )


if __name__ == "__main__":
    main()
