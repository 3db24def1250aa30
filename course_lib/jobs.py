"""Notebooks 07, 09, 10, 13, 14 and 15: start a ``torchrun`` job from a notebook, with a timeout, and collect each
rank's output.

The notebooks call :func:`launch` to run the course's programs as real ``torchrun`` jobs; the tests and the tools
call it too. The rendezvous listens on 127.0.0.1 only; each rank's
output is shown in rank order when the job ends; a failed rank raises :class:`LaunchError` with
that rank's own error line; a job still running at the timeout is killed, every rank and every
DataLoader worker below it included, instead of hanging the notebook.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from .distributed import SLURM_NODELIST_VARS, SLURM_VARS, TORCHRUN_VARS
from .support import when_this_process_dies

__all__ = ["LaunchError", "launch"]


class LaunchError(RuntimeError):
    """Notebooks 07, 09, 10, 13, 14 and 15: a launched job failed or timed out; ``result`` holds every rank's output."""

    def __init__(self, message: str, result: "LaunchResult") -> None:
        super().__init__(message)
        self.result = result


@dataclass
class LaunchResult:
    """What a :func:`launch` produced: each rank's lines, the launcher's own lines, how it ended."""

    nproc: int
    returncode: int | None
    timed_out: bool
    seconds: float
    ranks: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def error_line(self, rank: int) -> str | None:
        """The last ``SomeError: message`` line a rank printed, if any."""
        # a Python exception line, or what a C++ exception printed before the process aborted
        pattern = re.compile(r"^([\w.]*(Error|Exception|Interrupt)\b.*?:|\s*what\(\):)")
        for line in reversed(self.ranks.get(rank, [])):
            if pattern.match(line):
                return line
        return None

    def first_error(self) -> str | None:
        """The failed rank's error line, without the C++ source location gloo/NCCL put in front."""
        rank = self.failed_rank()
        line = self.error_line(rank) if rank is not None else None
        return re.sub(r"\[[^\]\s]+\.(?:cc|cpp|h|hpp):\d+\]\s*", "", line) if line else None

    def failed_rank(self) -> int | None:
        """The rank whose error came first: torchrun's root cause, unless that rank only saw a peer vanish.

        torchrun orders the ranks' errors by their time stamps, to the second: when rank 1 crashes and
        rank 0 loses its connection to it in the same second, either can be named. An error that says a
        peer went away is a consequence, so a rank with any other error is named instead.
        """
        m = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", "\n".join(self.launcher), re.S)
        named = int(m.group(1)) if m else None
        failed = [r for r in sorted(self.ranks) if self.error_line(r)]
        causes = [r for r in failed if not _PEER_GONE.search(self.error_line(r) or "")]
        if named is not None and (named in causes or not causes):
            return named
        return (causes or failed or [named])[0]

    def show(self, last: int | None = None, errors_only: bool = False) -> None:
        """Print each rank's output in rank order (only the ``last`` lines of each, if given)."""
        for rank in range(self.nproc):
            lines = self.ranks.get(rank, [])
            if errors_only:
                err = self.error_line(rank)
                lines = [err] if err else []
            elif last is not None:
                lines = lines[-last:]
            print(f"── rank {rank} ──")
            for line in lines:
                print(f"  {line}")

    def summary(self) -> str:
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s: the job was stopped; the ranks were still running"
        if self.ok:
            return f"{self.nproc} ranks finished"
        return f"rank {self.failed_rank()} failed first: {self.first_error() or 'no error line (see its output above)'}"


#: What a rank says when another rank died first (gloo, NCCL, the TCP store): a consequence, not a cause.
_PEER_GONE = re.compile(
    r"(closed|reset) by peer|remote worker crash|Broken pipe|Connection refused|peer.*(died|exited)", re.I
)
_PREFIX = re.compile(r"^\[rank(\d+)\]:(.*)$")


def _split_by_rank(text: str, nproc: int) -> tuple[dict[int, list[str]], list[str]]:
    ranks: dict[int, list[str]] = {r: [] for r in range(nproc)}
    launcher: list[str] = []
    for line in text.splitlines():
        m = _PREFIX.match(line)
        if m:
            rank, rest = int(m.group(1)), m.group(2)
            # torch prefixes its own traceback lines with "[rankN]:" too; drop the second copy
            rest = re.sub(rf"^\[rank{rank}\]:\s?", "", rest)
            ranks.setdefault(rank, []).append(rest)
        elif line.strip() and not re.match(r"^[WI]\d{4} .*(\*{5}|OMP_NUM_THREADS)", line):
            launcher.append(line)
    return ranks, launcher


def _torchrun_command(target: Sequence[str], nproc: int, module: bool = True, log_dir: str | None = None) -> list[str]:
    """The torchrun command line :func:`launch` runs: ``--standalone``, pinned to 127.0.0.1.

    ``--standalone`` means a one-node rendezvous on a free port of ``localhost``; the explicit
    form below is the same, with the address written as 127.0.0.1 so that nothing listens on
    other interfaces. ``log_dir``: where torchrun keeps each rank's copy of its output (without it,
    a new ``torchelastic_*`` folder in the temporary folder, which torchrun never removes).
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        "--local-addr=127.0.0.1",
        "--max-restarts=0",
        "--tee=3",  # each rank's lines get the prefix set in launch() (env var: older torchrun has no flag)
        *([f"--log-dir={log_dir}"] if log_dir else []),
    ]
    return cmd + (["-m"] if module else []) + list(target)


def launch(
    target: str,
    *args: str,
    nproc: int = 2,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    show: bool = True,
    style: str = "torchrun",
) -> LaunchResult:
    """Notebooks 07, 09, 10, 13, 14 and 15: run ``torchrun --standalone --nproc-per-node=nproc -m target *args`` and
    collect the output.

    ``style="srun"`` starts the ``nproc`` processes as ``srun`` starts the tasks of one node instead: with
    ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, ``SLURM_STEP_NODELIST`` and
    ``SLURM_STEP_TASKS_PER_NODE`` set (and ``MASTER_PORT``, as the hpc/ scripts export it), and no ``RANK`` or
    ``WORLD_SIZE``. ``target`` is a module name (``"course_lib.train"``) or a path to a ``.py`` script. Each
    rank's lines are shown in rank order when the job ends (``show``). The whole job is killed
    after ``timeout`` seconds, so a rank stuck in a collective cannot hang the notebook. With
    ``check``, a failed or timed-out job raises :class:`LaunchError` naming the failed rank and
    its error; ``check=False`` returns the result for inspection instead.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if style not in ("torchrun", "srun"):
        raise ValueError(f"style must be 'torchrun' or 'srun', got {style!r}")
    module = not target.endswith(".py")
    if not module and not Path(target).is_file():
        raise FileNotFoundError(f"no script {target!r}; give a path to a .py file or a module name")
    child_env = dict(os.environ)
    for name in TORCHRUN_VARS + SLURM_VARS + SLURM_NODELIST_VARS:
        child_env.pop(name, None)  # this notebook's own job must not leak into the child job
    child_env.update(
        PYTHONUNBUFFERED="1",  # a killed rank still shows what it printed
        GLOO_SOCKET_IFNAME=child_env.get("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else ""),
        OMP_NUM_THREADS=child_env.get("OMP_NUM_THREADS", "1"),
        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:",  # what _split_by_rank parses
        **(env or {}),
    )
    if not child_env["GLOO_SOCKET_IFNAME"]:
        del child_env["GLOO_SOCKET_IFNAME"]
    start = time.perf_counter()
    if style == "srun":
        result = _run_tasks([sys.executable, *(["-m"] if module else []), target, *args], nproc, child_env, timeout)
    else:
        # the ranks' output comes through the pipe; torchrun's own copy of it goes to a folder removed afterwards
        with tempfile.TemporaryDirectory(prefix="course-torchrun-", ignore_cleanup_errors=True) as logs:
            proc = subprocess.Popen(
                _torchrun_command([target, *args], nproc, module=module, log_dir=logs),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=child_env,
                start_new_session=True,
            )
            timed_out = False
            try:
                when_this_process_dies(kill=proc.pid, remove=logs)  # a killed kernel leaves no job, no logs
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                out, _ = proc.communicate()
            except BaseException as stop:  # Kernel > Interrupt: the job ends with the cell, not after it
                _stopped_with_the_cell(stop, [proc])
                raise
        result = LaunchResult(nproc, proc.returncode, timed_out, time.perf_counter() - start)
        result.ranks, result.launcher = _split_by_rank(out, nproc)
    if show:
        result.show()
    if check and not result.ok:
        raise LaunchError(result.summary(), result)
    return result


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, for servers that are told their port (a rendezvous, ``weed
    mini``'s ten listeners).

    Chosen below the range Linux hands out to outgoing connections (``ip_local_port_range``, 32768 and up by
    default): a port from that range, free when chosen, can be taken by any client's ``connect()`` before the
    server binds it (a full CI run saw ``weed mini``'s filer fail so: "bind: address already in use"). Each is bound
    while choosing, so all differ and each was free then; another process may still choose one before the server
    binds it (rare, from some 16 000 ports): a server that can, tries again on new ports (:class:`S3Server`)."""
    import random
    import socket

    low = _ephemeral_ports()[0]
    below = range(max(1024, low - 16384), low)
    if len(below) < 64 * n:  # an unusual machine: the connection range starts low; take what the kernel gives
        below = range(0)
    sockets: list[socket.socket] = []
    try:
        for port in [*random.sample(below, min(len(below), 64 * n)), *[0] * n]:
            if len(sockets) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use: another
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ephemeral_ports() -> tuple[int, int]:
    """The range Linux picks a connection's local port from (elsewhere, Linux's default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _run_tasks(cmd: list[str], nproc: int, env: dict[str, str], timeout: float) -> LaunchResult:
    """One process per task, as srun starts them on one node. When a task fails the others are stopped (as
    ``srun --kill-on-bad-exit=1`` and torchrun do); at the timeout all are."""
    import tempfile

    slurm = dict(
        SLURM_NTASKS=str(nproc),
        SLURM_NODEID="0",
        SLURM_STEP_NODELIST="127.0.0.1",
        SLURM_STEP_TASKS_PER_NODE=str(nproc),
        MASTER_PORT=env.get("MASTER_PORT", str(free_ports()[0])),
    )
    start, deadline = time.perf_counter(), time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="course-tasks-") as folder:
        logs = [open(Path(folder) / f"task{r}.log", "w+") for r in range(nproc)]
        procs = [
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env={**env, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            )
            for r, log in enumerate(logs)
        ]
        timed_out = False
        try:
            for p in procs:
                when_this_process_dies(kill=p.pid, remove=folder)
            while None in (codes := [p.poll() for p in procs]):  # every task polled, each time
                failed = any(code not in (None, 0) for code in codes)
                timed_out = time.monotonic() > deadline
                if failed or timed_out:
                    for p in procs:
                        _kill_group(p)
                    break
                time.sleep(0.05)
        except BaseException as stop:  # Kernel > Interrupt
            _stopped_with_the_cell(stop, procs)
            for log in logs:
                log.close()
            raise
        codes = [p.wait() for p in procs]
        outs = []
        for log in logs:
            log.seek(0)
            outs.append(log.read())
            log.close()
    result = LaunchResult(nproc, next((c for c in codes if c), 0), timed_out, time.perf_counter() - start)
    # torch prefixes a rank's traceback lines with "[rankN]:" once the process group exists
    result.ranks = {
        r: [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in out.splitlines() if line.strip()]
        for r, out in enumerate(outs)
    }
    return result


def _stopped_with_the_cell(stop: BaseException, procs: list[subprocess.Popen]) -> None:
    """An interrupted cell (``KeyboardInterrupt``) or any error while waiting: stop the job's processes, all of them,
    before the error goes on, and say so beside the traceback."""
    for proc in procs:
        _kill_group(proc)
        proc.wait()
    stop.add_note("the job was stopped with the cell: its processes and workers have ended; run the cell again")


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop torchrun, every rank and every DataLoader worker below it: SIGTERM, then SIGKILL to what is left.

    torchrun starts each rank in a session of its own, so signalling torchrun's process group
    does not reach them: the processes below it are collected first (psutil), and each rank's group
    is signalled too, reaching workers forked after the collection.
    """
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:  # it has ended and been waited for already
        below = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # started with start_new_session=True: its pid is its group's id
        except (ProcessLookupError, PermissionError):
            pass
        for child in below:
            _signal(child, sig)
        deadline = time.monotonic() + grace
        try:
            proc.wait(timeout=grace)  # proc itself through Popen, which keeps its exit status
        except subprocess.TimeoutExpired:
            continue
        below = _still_running(below, deadline)
        if not below:
            return


def _signal(process: psutil.Process, sig: signal.Signals) -> None:
    """``sig`` to ``process``, to its whole group where it leads one (a rank and its DataLoader workers).

    psutil checks that the pid still names the process collected (not a new one that reused it)."""
    try:
        if process.is_running() and os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
        pass


def _still_running(processes: list[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Those of ``processes`` still running at ``deadline`` (``time.monotonic()``), or as soon as none is.

    A zombie has ended, only its parent's wait is missing (where the container's init does not reap
    orphans, it stays one): it counts as ended, where ``psutil.wait_procs`` alone would wait for it.
    """
    while True:
        _, alive = psutil.wait_procs(processes, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        processes = [p for p in alive if not _ended(p)]
        if not processes or time.monotonic() >= deadline:
            return processes


def _ended(process: psutil.Process) -> bool:
    """Gone, or a zombie."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
