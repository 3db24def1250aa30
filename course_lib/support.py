"""The helpers the lesson modules share, one per idea: files and folders written under a temporary
name and renamed (a reader never sees half of one; a folder the course did not write is never replaced),
the ``fork`` context where the platform has it, argument checks that say what was wrong, and the CPU and
memory limits of this process's cgroup. Public because the checks and the tools share them too; no notebook
needs them."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import operator
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, Iterator


_SCRATCH_OWNER, _SCRATCH = ".course-scratch-owner", {}  # notebook -> this process's scratch folder


def _host() -> str:
    return "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:40]


@contextlib.contextmanager
def new_file(path: str | os.PathLike[str], mode: str = "wb", durable: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; rename it to ``path`` when the block ends without error.

    ``durable``: the file's bytes reach the disk (fsync) before the rename, and the rename itself after it (an
    fsync of the folder), so that a crash of the machine, not only of the process, leaves the old file or the new."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on one file system: readers see all of it or nothing
        if durable:
            fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (new names, renames) to the disk; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], payload: bytes | str, durable: bool = False) -> Path:
    """Write ``payload`` to ``path`` through a temporary file (see :func:`new_file`)."""
    with new_file(path, "wb" if isinstance(payload, bytes) else "w", durable=durable) as f:
        f.write(payload)
    return Path(path)


def _process_gone(host: str, pid: int) -> bool:
    """True if ``pid`` ran on this host and runs no more (another user's live process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return host == _host()
    except PermissionError:
        pass
    return False


def _remove_dead_temps(final: Path) -> None:
    """Remove temporary folders of ``final`` left by runs of this host that died (a killed kernel)."""
    prefix = f".{final.name}.tmp-{_host()}-"
    for tmp in final.parent.glob(f"{prefix}*"):
        with contextlib.suppress(ValueError):  # a name that is not one of ours
            if _process_gone(_host(), int(tmp.name[len(prefix) :].split("-", 1)[0])):
                shutil.rmtree(tmp, ignore_errors=True)


def scratch_folder(notebook: str) -> Path:
    """Notebooks 07-13: this kernel's scratch folder in the temporary directory, removed when the kernel exits or
    calls again for the same notebook. A killed kernel cannot remove its own: :func:`when_this_process_dies` does,
    and each call first removes the folders of this host's dead kernels, found by the owner file that only this
    function writes."""
    if notebook in _SCRATCH:  # the notebook's first cell, run again: start afresh
        _remove_scratch(_SCRATCH.pop(notebook))
    for old in Path(tempfile.gettempdir()).glob("course*-*"):
        with contextlib.suppress(OSError, ValueError):  # another user's folder, or not one of ours
            host, pid = (old / _SCRATCH_OWNER).read_text().split()
            if _process_gone(host, int(pid)):
                _remove_scratch(old)
    folder = Path(tempfile.mkdtemp(prefix=f"course{notebook}-"))
    (folder / _SCRATCH_OWNER).write_text(f"{_host()} {os.getpid()}")
    atexit.register(_remove_scratch, folder)
    when_this_process_dies(remove=folder)
    _SCRATCH[notebook] = folder
    return folder


def _remove_scratch(folder: Path) -> None:
    """Remove a scratch folder, its owner file last: a removal cut short (a kernel ended mid-way) leaves a folder
    that the next notebook still recognises as a dead kernel's, keys and all."""
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        if entry.name != _SCRATCH_OWNER:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- what a killed process leaves

#: The watcher :func:`when_this_process_dies` starts: a process of its own (not a child of the kernel, so that neither
#: ipykernel's SIGTERM to its children at a shutdown nor an interrupt reaches it) that reads what to clean up from a
#: pipe and, once the process that started it is gone (killed or not), kills the processes and removes the folders
#: still there. It needs only the standard library and psutil.
_WATCHER = r"""
import os, select, shutil, sys, time
import psutil
if os.fork():  # the parent returns at once: the watcher is no child of the kernel
    os._exit(0)
os.setsid()
watched, born = int(sys.argv[1]), float(sys.argv[2])
kill, remove, pipe = [], [], sys.stdin.fileno()

def alive():
    try:
        p = psutil.Process(watched)
        return p.create_time() == born and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

buffer, ended = b"", False


def read(timeout):
    global buffer, ended
    ready, _, _ = select.select([pipe], [], [], timeout)
    chunk = os.read(pipe, 65536) if ready else b""
    ended = ended or bool(ready and not chunk)  # the other end closed: the process has ended, or is ending
    buffer += chunk
    *lines, buffer = buffer.split(b"\n")
    for line in lines:
        verb, _, arg = line.decode().partition(" ")
        (kill if verb == "kill" else remove).append(arg)
    return bool(chunk)


while alive():
    if ended:
        time.sleep(0.25)
    else:
        read(0.25)
while not ended and read(0):  # what it wrote just before it died
    pass
for entry in kill:  # the processes first: they may hold files in the folders
    pid, created = entry.split()
    try:
        p = psutil.Process(int(pid))
        if p.create_time() == float(created):
            for q in [p, *p.children(recursive=True)]:
                q.kill()
    except psutil.Error:
        pass
for path in remove:
    shutil.rmtree(path, ignore_errors=True)
"""
_WATCHERS: dict[int, int] = {}  # pid of the process watched -> write end of its watcher's pipe


def when_this_process_dies(*, remove: str | os.PathLike[str] | None = None, kill: int | None = None) -> None:
    """Make sure that the folder ``remove`` is removed, and the process ``kill`` with its children killed, once this
    process has ended, however it ends: killed by SIGKILL, by SIGTERM (no ``atexit`` handler runs), or normally, if
    its own clean-up left them. Kernels ended by Jupyter, nbval or a hub leave nothing behind this way. A watcher
    process (one per process that calls this) does it; where it cannot start, nothing changes."""
    import psutil

    me = os.getpid()
    if me not in _WATCHERS:
        read, write = os.pipe()
        try:
            starter = subprocess.Popen(
                [sys.executable, "-I", "-c", _WATCHER, str(me), repr(psutil.Process(me).create_time())],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            starter.wait(timeout=30)  # the watcher itself forked and goes on
        except (OSError, subprocess.SubprocessError):
            os.close(write)
            return
        finally:
            os.close(read)
        _WATCHERS[me] = write
    lines = []
    if remove is not None:
        lines.append(f"remove {os.fspath(remove)}\n")
    if kill is not None:
        with contextlib.suppress(psutil.Error):
            lines.append(f"kill {kill} {psutil.Process(kill).create_time()!r}\n")
    with contextlib.suppress(OSError):  # the watcher ended: nothing more can be done
        os.write(_WATCHERS[me], "".join(lines).encode())


@contextlib.contextmanager
def new_folder(final: str | os.PathLike[str], marker: str, error: type[Exception]) -> Iterator[Path]:
    """Build a folder under a temporary name beside ``final``; rename it into place when the block ends.

    The caller writes ``marker`` (a manifest, an index) last: a folder holding it is finished. An existing
    ``final`` is replaced only if it holds ``marker`` (the course wrote it) or is empty; any other is refused
    with ``error``, nothing deleted. On an error the temporary folder goes; a finished copy another process
    (a second notebook, another rank) put in place meanwhile is kept.
    """
    final = Path(final).expanduser()
    if final.exists() and not final.is_dir():
        raise error(f"{final.name} exists and is a file; give a folder name")
    if final.is_dir() and not (final / marker).exists() and any(final.iterdir()):
        raise error(
            f"{final.name}/ already holds files that the course did not write; "
            "choose a new or empty folder (nothing was deleted)"
        )
    replacing = (final / marker).exists()
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temps(final)
    tmp = final.parent / f".{final.name}.tmp-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        if not (tmp / marker).exists():
            raise RuntimeError(f"new_folder: {marker} was not written; the folder is not finished")
        if replacing:  # ours from an earlier run: swap, then delete the old one
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.replace(tmp, final)
            except OSError:
                if not (final / marker).exists():  # not another process's finished copy
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fork_context() -> Any:
    """``multiprocessing``'s ``fork`` context where the platform has it (Linux, macOS), else ``spawn``'s."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def check_int(value: Any, name: str, minimum: int = 0) -> int:
    """``value`` as an ``int`` >= ``minimum`` (NumPy and 0-d tensor integers too), or a ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {n}")
    return n


_UNLIMITED_BYTES = 2**60  # cgroup v1's "no memory limit" is a number near 2**63


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(base: Path, inner: str) -> list[Path]:
    """This process's cgroup folder under ``base`` and its ancestors up to ``base`` (a limit on any of them applies).
    In a container the folder named in /proc/self/cgroup may not exist: the namespace's root is ``base`` itself."""
    here = base / inner.lstrip("/")
    if not here.is_dir():
        return [base]
    dirs = [here]
    while here != base and base in here.parents:
        here = here.parent
        dirs.append(here)
    return dirs


def cgroup_limits(
    root: str | os.PathLike[str] = "/sys/fs/cgroup", proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup"
) -> tuple[str, float | None, float | None]:
    """``(version, CPU quota in cores, memory limit in MB)`` of this process's cgroup, None where there is none:
    what a container's ``--cpus`` and ``--memory`` or a hub's ``cpu_limit`` and ``mem_limit`` set.

    cgroup v2 (one hierarchy, ``cpu.max`` "QUOTA PERIOD" or "max PERIOD", ``memory.max``), else v1 (``cpu`` and
    ``memory`` hierarchies: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``memory.limit_in_bytes``); the
    tightest limit on the way up to the root counts. ("none", None, None) where neither can be read."""
    root = Path(root)
    text = _read_text(Path(proc_cgroup)) or ""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    quotas: list[float] = []
    memory: list[float] = []
    unified = next((path for number, names, path in lines if number == "0" and names == ""), None)
    v1 = {name: (names, path) for number, names, path in lines if names for name in names.split(",")}
    if unified is not None and (root / "cgroup.controllers").is_file() and "cpu" not in v1 and "memory" not in v1:
        for folder in _cgroup_dirs(root, unified):
            cpu = (_read_text(folder / "cpu.max") or "max").split()
            if cpu and cpu[0] != "max" and len(cpu) == 2:
                quotas.append(int(cpu[0]) / int(cpu[1]))
            mem = _read_text(folder / "memory.max")
            if mem and mem != "max":
                memory.append(int(mem) / 2**20)
        return "v2", min(quotas, default=None), min(memory, default=None)
    if not v1:
        return "none", None, None
    for controller in ("cpu", "memory"):
        if controller not in v1:
            continue
        names, path = v1[controller]
        base = next((b for b in (root / names, root / controller) if b.is_dir()), None)
        if base is None:
            continue
        for folder in _cgroup_dirs(base, path):
            if controller == "cpu":
                quota, period = _read_text(folder / "cpu.cfs_quota_us"), _read_text(folder / "cpu.cfs_period_us")
                if quota and period and int(quota) > 0 and int(period) > 0:
                    quotas.append(int(quota) / int(period))
            else:
                limit = _read_text(folder / "memory.limit_in_bytes")
                if limit and int(limit) < _UNLIMITED_BYTES:
                    memory.append(int(limit) / 2**20)
    return "v1", min(quotas, default=None), min(memory, default=None)
