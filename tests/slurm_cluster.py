"""A real Slurm cluster on this one machine, for tests/test_slurm.py.

Debian's ``slurm-wlm`` (22.05) and ``munge``, started by hand (no systemd needed), with everything
private to one folder: the configuration (``SLURM_CONF`` points at it), state, spool, logs, pid
files, and a munge daemon with its own key and socket (``AuthInfo=socket=...``). Nothing global is
used or changed except one line in ``/etc/hosts``: the node names must resolve (torchrun's
rendezvous and ``course_lib.distributed`` connect to the first node by name), so they get a line
``127.0.0.1 <names>`` of their own, removed again at the end. Ports are free ones, every node's
address is 127.0.0.1, and the daemons bind 127.0.0.1 only (``CommunicationParameters``).

Several nodes on one host are several ``slurmd -N <name>`` daemons, each with its own ``Port=``.
Without cgroups: ``proctrack/linuxproc``, ``task/affinity`` (``--hint=nomultithread`` needs a
task plugin that binds CPUs), no accounting. Each node declares the machine's CPUs (the nodes share
them); a node declaring more than the machine has cannot bind its tasks ("Unable to layout tasks
on given cpus"), so jobs ask for what the machine has and the scripts' other settings come from
the environment. Each node also declares ``gpus`` GPUs that are not GPUs (``gres.conf`` names
``/dev/null`` and the like as their devices): Slurm counts them, checks ``--gres=gpu:N`` against them and
hands them out as on a GPU node (``SLURM_GPUS_ON_NODE``, ``CUDA_VISIBLE_DEVICES``); nothing runs on them.

Everything started here is stopped by its pid; processes the daemons started (slurmstepd, job
steps) are found by the ``SLURM_CONF`` of this cluster in their environment, never by name. The
daemons also carry the pid of the test process: a later start kills those of a test process that
died without stopping them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import psutil

from course_lib.jobs import free_ports

#: The programs the cluster needs (Debian packages slurm-wlm and munge).
PROGRAMS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "scontrol", "squeue", "scancel", "sinfo", "srun")
PACKAGES = ("slurm-wlm", "munge")
#: A job in one of these states is over (scontrol's JobState).
DONE_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# tests/slurm_cluster.py, pid"
#: In the environment of the daemons (and so of slurmstepd): the pid of the process that started them.
OWNER_VAR = "COURSE_SLURM_OWNER"
_SBIN_PATH = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


#: The devices of the nodes' pretend GPUs (gres.conf wants a device file for each).
FAKE_GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")

#: Job credential lifetime (slurm.conf AuthInfo cred_expire; Slurm's default is 120 s). It is also how long a requeued
#: job is held before it may start again: a job started earlier is killed ("Job credential revoked").
CRED_EXPIRE_S = 15  # 30 until 2026-11: each requeue test waited 30 s of it


class SlurmError(RuntimeError):
    """The cluster could not start, or a job could not be submitted or waited for."""


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN_PATH)


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if which(name) is None]


def ensure_installed(timeout: float = 300.0) -> str | None:
    """None when Slurm and munge are here, installing them with apt-get when root; else why not."""
    if not missing_programs():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (
            f"{', '.join(missing_programs())} not found, and they cannot be installed here (needs root and "
            f"apt-get): apt-get install {' '.join(PACKAGES)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", *PACKAGES]  # as .ci/run does
    tries = [install, ["apt-get", "update"], install]  # a fresh container may have no package lists yet
    log = []
    for cmd in tries:
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} took more than {timeout:.0f} s"
        log.append(f"$ {' '.join(cmd)} -> {done.returncode}\n{done.stderr[-2000:]}")
        if cmd is install and done.returncode == 0 and not missing_programs():
            return None
    return f"could not install {' '.join(PACKAGES)} with apt-get:\n" + "\n".join(log)


def unavailable_reason() -> str | None:
    """Why a Slurm cluster cannot run on this machine (None: it can), installing Slurm if needed."""
    if not os.path.exists("/proc/self/environ") or os.name != "posix":
        return "the Slurm stage needs Linux"
    if os.geteuid() != 0:
        return "the Slurm stage needs root (slurmd starts jobs as their user; /etc/hosts names the nodes)"
    if not os.access(HOSTS, os.W_OK):
        return f"{HOSTS} is not writable: the cluster's node names cannot be made to resolve"
    return ensure_installed()


def available_memory_mb() -> int:
    return psutil.virtual_memory().available // 2**20  # Linux: /proc/meminfo's MemAvailable


def _rewrite_hosts(keep_line) -> None:
    """Rewrite /etc/hosts in place (same inode: it is often a bind mount in containers)."""
    with open(HOSTS, "r+") as f:
        lines = f.read().splitlines(keepends=True)
        kept = [line for line in lines if keep_line(line)]
        if kept != lines:
            f.seek(0)
            f.write("".join(kept))
            f.truncate()


def kill_orphans() -> list[int]:
    """Kill (by pid) the daemons and job steps of clusters whose test process died without stopping
    them (killed with SIGKILL, say): they carry OWNER_VAR with a pid that no longer runs."""
    killed = []
    for process in _processes_whose_environment(
        lambda env: OWNER_VAR in env and env[OWNER_VAR].isdigit() and not psutil.pid_exists(int(env[OWNER_VAR]))
    ):
        try:
            process.kill()  # psutil: still the process found (its pid not reused meanwhile)
            killed.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return killed


def _processes_whose_environment(matches: Callable[[dict[str, str]], bool]) -> list[psutil.Process]:
    """The processes (other than this one) whose environment ``matches``; those it may not read are passed over."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if matches(process.environ()):
                found.append(process)
        except psutil.Error:  # gone meanwhile, a zombie, or not ours to read
            continue
    return found


def _stale_hosts_line(line: str) -> bool:
    """A line an earlier, now dead, test process added (it was killed before it could remove it)."""
    m = re.search(re.escape(HOSTS_MARK) + r" (\d+)", line)
    return bool(m) and not psutil.pid_exists(int(m.group(1)))


@dataclass
class JobResult:
    """A finished job as ``scontrol show job`` last described it."""

    job_id: int
    info: dict[str, str]
    waited_s: float  # from submission until the poll saw it finished

    @property
    def state(self) -> str:
        return self.info.get("JobState", "?")

    @property
    def exit_code(self) -> str:
        return self.info.get("ExitCode", "?")

    @property
    def nodes(self) -> str:
        return self.info.get("NodeList", "")

    @property
    def name(self) -> str:
        return self.info.get("JobName", "")

    @property
    def stdout_path(self) -> Path:
        return Path(self.info.get("StdOut", "/nonexistent"))

    def output(self) -> str:
        try:
            return self.stdout_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no output file: {exc})"

    def describe(self) -> str:
        return (
            f"job {self.job_id} ({self.name}): {self.state}, exit code {self.exit_code}, nodes {self.nodes}, "
            f"{self.waited_s:.1f} s\n--- {self.stdout_path}\n{self.output()[-6000:]}"
        )


@dataclass
class Cluster:
    """A one-host Slurm cluster of ``nodes`` nodes, private to the folder ``root``.

    By default ``root`` is a new folder in the system's temporary folder, removed by :meth:`stop`:
    munged wants every folder above its socket searchable by all users, which pytest's own
    temporary folders (mode 700) are not.
    """

    root: Path | None = None
    nodes: int = 2
    cpus: int = 4  # per node
    memory_mb: int = 2048  # per node (declared only: no memory is enforced)
    gpus: int = 2  # per node: pretend GPUs (FAKE_GPU_FILES), for jobs that ask for --gres=gpu:N
    partition: str = "course"
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, init=False)
    start_s: float = field(default=0.0, init=False)  # how long start() took
    submitted: dict[int, float] = field(default_factory=dict, init=False)
    _hosts_line: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.own_root = self.root is None
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="course-slurm-"))
            self.root.chmod(0o711)
        self.root = Path(self.root)
        # short names that resolve nowhere else; the tag keeps two test runs on one host apart
        self.node_names = [f"sl{self.tag}n{i}" for i in range(1, self.nodes + 1)]
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"

    # ------------------------------------------------------------------ environment and commands

    @property
    def env(self) -> dict[str, str]:
        """This process's environment for the Slurm commands: no job's variables, this cluster's SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{_SBIN_PATH}"
        return env

    def run(self, *cmd: str, timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess:
        try:
            done = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(cmd)} did not answer in {timeout:.0f} s\n{self.log_tails()}") from None
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}\n{self.log_tails()}")
        return done

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # ------------------------------------------------------------------ start

    def config_text(self, ctld_port: int, node_ports: Sequence[int]) -> str:
        r = self.root
        nodes = "\n".join(
            f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={name} Port={port} CPUs={self.cpus} "
            f"Sockets=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={self.memory_mb}"
            f"{f' Gres=gpu:{self.gpus}' if self.gpus else ''} State=UNKNOWN"
            for name, port in zip(self.node_names, node_ports)
        )
        return f"""# Written by tests/slurm_cluster.py for one test session; private to {r}
ClusterName=course{self.tag}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
GresTypes=gpu
SchedulerType=sched/builtin
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=3600
InactiveLimit=0
{nodes}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=30 State=UP
"""

    def start(self, timeout: float = 60.0) -> None:
        """Start munged, slurmctld and one slurmd per node; on any failure stop them again and raise."""
        start = time.monotonic()
        try:
            self._start(start + timeout)
            self.start_s = time.monotonic() - start
        except BaseException:
            self.stop()
            raise

    def _start(self, deadline: float) -> None:
        kill_orphans()
        for sub in ("etc", "state", "spool", "run", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for name in self.node_names:
            (self.root / "spool" / name).mkdir(exist_ok=True)
        self._add_hosts_line()
        for name in self.node_names:
            try:
                addr = socket.gethostbyname(name)
            except OSError as exc:
                raise SlurmError(f"node name {name} does not resolve after adding it to {HOSTS}: {exc}") from None
            if addr != "127.0.0.1":
                raise SlurmError(f"node name {name} resolves to {addr}, not 127.0.0.1: check {HOSTS} and nsswitch.conf")
        self._start_munge(deadline)
        ctld_port, *node_ports = free_ports(1 + self.nodes)
        if not 0 <= self.gpus <= len(FAKE_GPU_FILES):
            raise SlurmError(f"gpus={self.gpus}: at most {len(FAKE_GPU_FILES)} pretend GPUs per node")
        self.conf.write_text(self.config_text(ctld_port, node_ports))
        # slurmd reads gres.conf next to slurm.conf: the same pretend devices on every node (no cgroups to tell)
        (self.conf.parent / "gres.conf").write_text(
            "".join(f"Name=gpu File={device}\n" for device in FAKE_GPU_FILES[: self.gpus])
        )
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-i"])
        self._until(
            deadline,
            lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0,
            "slurmctld does not answer scontrol ping",
        )
        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [which("slurmd"), "-D", "-N", name])
        self._until(deadline, self._all_nodes_idle, f"the nodes {', '.join(self.node_names)} are not idle")

    def _add_hosts_line(self) -> None:
        self._hosts_line = f"127.0.0.1 {' '.join(self.node_names)}  {HOSTS_MARK} {os.getpid()}\n"
        _rewrite_hosts(lambda line: not _stale_hosts_line(line))
        with open(HOSTS, "a+") as f:
            f.seek(0)
            text = f.read()
            f.write(("" if not text or text.endswith("\n") else "\n") + self._hosts_line)

    def _start_munge(self, deadline: float) -> None:
        folder = self.munge_socket.parent
        folder.chmod(0o711)  # munged: the socket's folder must be searchable by every user
        key = folder / "munge.key"
        key.write_bytes(secrets.token_bytes(128))  # what mungekey writes: random bytes, private
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                which("munged"),
                "-F",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--seed-file={folder / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                "--num-threads=2",
            ],
        )
        self._until(deadline, self.munge_socket.exists, f"munged made no socket {self.munge_socket}")

    def _spawn(self, name: str, cmd: list) -> None:
        out = open(self.root / "log" / f"{name}.stdout.log", "w")
        # a session of its own: a Ctrl-C in the terminal does not reach it before the fixture stops it
        env = dict(self.env, **{OWNER_VAR: str(os.getpid())})
        self.procs[name] = subprocess.Popen(
            [str(c) for c in cmd],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.root,
        )
        out.close()

    def _until(self, deadline: float, ready, what: str) -> None:
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(f"{name} exited with {proc.returncode} while starting\n{self.log_tails()}")
            try:
                if ready():
                    return
            except SlurmError:
                pass
            if time.monotonic() > deadline:
                raise SlurmError(f"{what} (timed out)\n{self.log_tails()}")
            time.sleep(0.1)

    def _all_nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(name) == "idle" for name in self.node_names)

    # ------------------------------------------------------------------ jobs

    def sbatch(
        self,
        script: Path | str,
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> int:
        """Submit ``script`` with command-line ``options`` (they win over its #SBATCH lines); its job id."""
        return self.submit([which("sbatch"), "--parsable", *options, str(script)], env, cwd)[0]

    def submit(
        self, cmd: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | str | None = None
    ) -> tuple[int, str]:
        """Run ``cmd``, a command that runs ``sbatch --parsable`` (a wrapper, say); the job id and what it printed
        on stderr."""
        job_env = dict(env if env is not None else self.env, SLURM_CONF=str(self.conf))
        try:
            done = subprocess.run(
                [str(c) for c in cmd], env=job_env, cwd=cwd, capture_output=True, text=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(map(str, cmd))} did not answer in 30 s\n{self.log_tails()}") from None
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(map(str, cmd))} failed: {done.stderr.strip()}")
        job_id = int(done.stdout.strip().splitlines()[-1].split(";")[0])
        self.submitted[job_id] = time.monotonic()
        return job_id, done.stderr

    def jobs(self) -> dict[int, dict[str, str]]:
        """Every job slurmctld knows, as scontrol describes it (one line each with -o)."""
        out = self.run("scontrol", "-o", "show", "job", check=False).stdout
        jobs = {}
        for line in out.splitlines():
            info = dict(re.findall(r"(\w[\w/:]*)=(\S*)", line))
            if "JobId" in info:
                jobs[int(info["JobId"])] = info
        return jobs

    def wait(self, job_ids: Sequence[int], timeout: float, poll: float = 0.2) -> dict[int, JobResult]:
        """Wait until every job is over, polling every ``poll`` s (sbatch --wait backs off to tens of
        seconds); past ``timeout`` the rest are cancelled and SlurmError names them with their output."""
        deadline = time.monotonic() + timeout
        done: dict[int, JobResult] = {}
        while True:
            jobs = self.jobs()
            for job_id in job_ids:
                info = jobs.get(job_id)
                if job_id not in done and info and info.get("JobState") in DONE_STATES:
                    done[job_id] = JobResult(job_id, info, time.monotonic() - self.submitted.get(job_id, deadline))
            if len(done) == len(job_ids):
                return done
            if time.monotonic() > deadline:
                late = [j for j in job_ids if j not in done]
                self.run("scancel", *map(str, late), check=False)
                details = "\n".join(
                    f"job {j}: {jobs.get(j, {}).get('JobState', 'unknown')} "
                    f"(reason {jobs.get(j, {}).get('Reason', '?')})\n"
                    f"{_tail(jobs.get(j, {}).get('StdOut'))}"
                    for j in late
                )
                raise SlurmError(
                    f"jobs {late} not finished after {timeout:.0f} s (cancelled now):\n{details}\n{self.log_tails()}"
                )
            time.sleep(poll)

    # ------------------------------------------------------------------ stop

    def stop(self) -> list[str]:
        """Stop jobs and daemons, by pid, within about 20 s; returns notes on anything killed the hard way."""
        notes = []
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", f"--partition={self.partition}", check=False, timeout=10)
                end = time.monotonic() + 10
                while time.monotonic() < end and any(
                    info.get("JobState") not in DONE_STATES for info in self.jobs().values()
                ):
                    time.sleep(0.2)
            except SlurmError as exc:  # slurmctld not answering: its jobs' processes are killed below
                notes.append(f"could not cancel the jobs: {exc}".splitlines()[0])
        for name in sorted(self.procs, key=lambda n: (n == "munged", n == "slurmctld")):  # slurmds first
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                    notes.append(f"{name} (pid {proc.pid}) ignored SIGTERM for 10 s: killed")
        for process in self.leftover_processes():
            try:
                process.kill()
                notes.append(f"pid {process.pid} of this cluster still running after its daemons stopped: killed")
            except psutil.NoSuchProcess:
                pass
        if self._hosts_line:
            line, self._hosts_line = self._hosts_line, None
            _rewrite_hosts(lambda other: other != line)
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)  # the folder __post_init__ made, nothing else
        return notes

    def leftover_processes(self) -> list[psutil.Process]:
        """Processes started by this cluster (slurmstepd, job steps): their environment holds its SLURM_CONF."""
        return _processes_whose_environment(lambda env: env.get("SLURM_CONF") == str(self.conf))

    def __enter__(self) -> "Cluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _tail(path: str | None, chars: int = 3000) -> str:
    if not path:
        return ""
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no output file {path})"
