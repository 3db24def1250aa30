"""What every program of the course does around its per-rank loop: join the job, run, leave; short errors.

``python -m course_lib.train``, ``.shard_reader``, ``.capstone``, ``.resume`` and ``.tokens`` each hold their own command line
and loop; this is the plumbing they share, kept out of their listings.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any, Callable

from . import distributed


def run_on_one_rank(run: Callable[[distributed.DistEnv, Any], dict], device: str, timeout: float) -> dict:
    """Join the job, ``run(env, device)``, leave it.

    Everything that holds the process group (the DDP model, the loader and its workers) lives in ``run``'s frames:
    gone when it returns, cleared when it fails, so that :func:`course_lib.distributed.finish` ends the group's
    threads before Python shuts down.
    """
    env, dev = distributed.start(device, timeout)
    try:
        return run(env, dev)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)  # a failed run's frames hold its DDP model and loader
        raise
    finally:
        distributed.finish()


def one_line(exc: BaseException) -> int:
    """Print one readable line (torchrun prefixes it with the rank) instead of a traceback; return exit status 2."""
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 2


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data`` and ``--size``: which prepared set of shapes images a program reads."""
    parser.add_argument("--data", help="folder holding the prepared data sets (default: $COURSE_DATA_DIR or the cache)")
    parser.add_argument("--size", default="small", help="which prepared set (default: small)")
