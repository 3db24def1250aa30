"""Notebooks 09 and 13: storage as a cluster has it, measured on real parts.

* :func:`count_reads`: the files a loading loop opens and the ``read`` system calls it makes, counted in a fresh
  interpreter around the loop alone (Python's ``open`` audit events; ``/proc/self/io``'s ``syscr``, which needs no
  privileges); :func:`strace_counts`: the same loop's system calls by kind, from ``strace -c -f``, less those of an
  identical run that skips the loop (the interpreter's start-up, which dominates a naive count).
* :func:`quota`: what a file-count quota allows, from ``statvfs`` (what ``df -i`` prints).
* :func:`make_image` packs a folder into one squashfs file (``mksquashfs``); :func:`open_image` reads it as a folder
  of files: mounted with ``squashfuse`` where this user may mount (root, or a ``fusermount3`` that works), else read
  without mounting (PySquashfsImage), and says which.
* :func:`staged` copies files to node-local storage (``/dev/shm``, ``$TMPDIR``) and times the copy, refusing a copy
  that does not fit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = [
    "ImageFiles",
    "StorageError",
    "count_files",
    "count_reads",
    "make_image",
    "quota",
    "stage_or_stream",
    "staged",
    "strace_counts",
]

_StrPath = str | os.PathLike[str]


class StorageError(RuntimeError):
    """Notebook 09: a storage step that cannot be done here; the message says why and what to do."""


# ------------------------------------------------------------------------------ counting files and system calls

_LOOP = r"""
import json, os, sys, tarfile
how, paths, run = json.loads(sys.stdin.read())
opened = 0
counting = False
def hook(event, args):
    global opened
    if counting and event == "open":
        opened += 1
sys.addaudithook(hook)

def io():
    with open("/proc/self/io") as f:  # read before counting starts and after it stops
        return {k: int(v) for k, v in (line.split(": ") for line in f)}

def read_files(paths):
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
    return total

def read_shards(paths):  # as webdataset streams a shard: one open, the members in order
    total = 0
    for p in paths:
        with open(p, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    total += len(tar.extractfile(member).read())
    return total

read = {"files": read_files, "shards": read_shards}[how]
base = io()
before = io()  # reading /proc/self/io costs read calls too: as many as the empty interval from base shows
counting = True
total = read(paths) if run else 0
counting = False
after = io()
print(json.dumps({"opened": opened, "read_calls": after["syscr"] - before["syscr"] - (before["syscr"] - base["syscr"]), "bytes": total}))
"""


@dataclass(frozen=True)
class Reads:
    """Notebook 09: what one pass over the data cost: ``opened`` files (Python's ``open`` audit events), ``read_calls`` (the
    ``read`` system calls, ``/proc/self/io``'s ``syscr``), ``bytes`` read."""

    opened: int
    read_calls: int
    bytes: int


def _loop_command(how: str) -> list[str]:
    if how not in ("files", "shards"):
        raise ValueError(f"how must be 'files' (a file per sample) or 'shards' (tar shards), got {how!r}")
    return [sys.executable, "-I", "-c", _LOOP]


def count_reads(paths: Sequence[_StrPath], how: str) -> Reads:
    """Notebook 09: read every file of ``paths`` whole (``how="files"``) or every member of every tar shard
    (``how="shards"``) in a fresh interpreter, and count the files opened and the read system calls of that loop
    alone. Needs Linux's ``/proc/self/io``."""
    if not Path("/proc/self/io").exists():
        raise StorageError(
            "counting read system calls needs Linux's /proc/self/io: on this system, see the stored figures"
        )
    done = subprocess.run(
        _loop_command(how),
        input=json.dumps([how, [os.fspath(p) for p in paths], True]),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise StorageError(f"the counting loop failed: {done.stderr.strip()[-500:]}")
    return Reads(**json.loads(done.stdout))


def _strace_table(path: Path) -> dict[str, int]:
    """``strace -c``'s summary table: calls by system call."""
    calls: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            try:
                calls[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return calls


def strace_counts(paths: Sequence[_StrPath], how: str, kinds: Sequence[str] = ("openat", "read")) -> dict[str, int]:
    """Notebook 09: the loop of :func:`count_reads` under ``strace -c -f``, by kind of system call (``kinds``), less
    the same run with the loop skipped: what the interpreter's start-up and imports make is subtracted. Needs
    ``strace`` (Debian package ``strace``)."""
    strace = shutil.which("strace")
    if strace is None:
        raise StorageError("strace is not installed (Debian: apt-get install strace): see the stored figures")
    counts = []
    with tempfile.TemporaryDirectory(prefix="course-strace-") as where:
        for run in (True, False):
            table = Path(where) / f"run-{run}.txt"
            done = subprocess.run(
                [strace, "-f", "-c", "-o", str(table), *_loop_command(how)],
                input=json.dumps([how, [os.fspath(p) for p in paths], run]),
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise StorageError(
                    f"strace could not trace the loop ({done.stderr.strip()[-300:]}); in a container it may need "
                    "the SYS_PTRACE capability: see the stored figures"
                )
            counts.append(_strace_table(table))
    loop, start_up = counts
    return {kind: loop.get(kind, 0) - start_up.get(kind, 0) for kind in kinds}


# --------------------------------------------------------------------------------------------------- file quotas


@dataclass(frozen=True)
class Quota:
    """Notebook 09: what ``df -i`` shows for the file system holding a folder: ``files`` (inodes in all), ``free``."""

    folder: str
    files: int
    free: int


def quota(folder: _StrPath) -> Quota:
    """Notebook 09: the file count (inodes) of the file system holding ``folder``, in all and free, from
    ``os.statvfs``. A cluster's quota is per user or project (``lfs quota``, ``myquota``): this is the file
    system's, and on an overlay or tmpfs it may mean little."""
    st = os.statvfs(folder)
    return Quota(os.fspath(folder), st.f_files, st.f_favail)


def count_files(folder: _StrPath) -> int:
    """Notebook 09: files under ``folder``, as a file-count quota counts them (folders count too on most, not here)."""
    return sum(len(files) for _, _, files in os.walk(folder))


# ------------------------------------------------------------------------------------------------ squashfs images


def make_image(folder: _StrPath, image: _StrPath) -> Path:
    """Notebook 09: pack ``folder`` into one read-only squashfs file ``image`` with ``mksquashfs`` (Debian package
    ``squashfs-tools``): gzip, every time stamp 0 and every file root's, so that the same folder gives the same
    image. Written under a temporary name, then renamed."""
    mksquashfs = shutil.which("mksquashfs")
    if mksquashfs is None:
        raise StorageError(
            "mksquashfs is not installed (Debian: apt-get install squashfs-tools): see the stored figures"
        )
    image = Path(image)
    tmp = image.with_name(f".{image.name}.tmp-{os.getpid()}")
    done = subprocess.run(
        [mksquashfs, os.fspath(folder), str(tmp), "-noappend", "-quiet", "-no-progress", "-comp", "gzip"]
        + ["-mkfs-time", "0", "-all-time", "0", "-all-root", "-processors", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"mksquashfs failed: {done.stderr.strip()[-500:]}")
    os.replace(tmp, image)
    return image


def _term_with_parent() -> None:
    """In squashfuse's process: SIGTERM when the kernel that started it dies (it then unmounts and exits)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ImageFiles:
    """Notebook 09: the files of a squashfs image, read as a folder: ``read(relative_path)`` returns a file's bytes, ``names``
    lists them. ``how`` says whether the image is mounted or read without mounting. Close it (or use ``with``) to
    unmount."""

    def __init__(self, image: _StrPath, mountpoint: _StrPath | None = None, mount: bool = True) -> None:
        self.image = Path(image)
        if not self.image.is_file():
            raise FileNotFoundError(f"no squashfs image at {self.image}: make one with make_image(folder, image)")
        self.root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: Any = None
        failure = self._mount(Path(mountpoint) if mountpoint else None) if mount else "not asked to mount"
        if self.root is not None:
            self.how = "mounted with squashfuse"
        else:
            from PySquashfsImage import SquashFsImage

            self._reader = SquashFsImage.from_file(str(self.image))
            self.how = f"read without mounting (PySquashfsImage): {failure}"

    def _mount(self, mountpoint: Path | None) -> str:
        squashfuse = shutil.which("squashfuse")
        if squashfuse is None:
            return "squashfuse is not installed (Debian: apt-get install squashfuse)"
        if mountpoint is None:
            mountpoint = self.image.with_name(self.image.name + ".mnt")
        mountpoint.mkdir(exist_ok=True)
        if os.path.ismount(mountpoint):
            return f"{mountpoint} is already a mount point"
        process = subprocess.Popen(
            [squashfuse, "-f", str(self.image), str(mountpoint)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_term_with_parent,
        )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if os.path.ismount(mountpoint):
                    self.root, self._process = mountpoint, process
                    return ""
                if process.poll() is not None:
                    error = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
                    with contextlib.suppress(OSError):
                        mountpoint.rmdir()
                    return f"squashfuse could not mount it ({error or f'exit status {process.returncode}'})"
                time.sleep(0.02)
        except BaseException:  # Kernel > Interrupt while it mounts: no mount may outlive the cell
            _unmount(process, mountpoint)
            raise
        _unmount(process, mountpoint)
        return "squashfuse did not mount it within 10 s"

    def names(self) -> list[str]:
        """Every file's path inside the image, sorted."""
        if self.root is not None:
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        return sorted(str(f.path).lstrip("/") for f in self._reader if f.is_file)

    def read(self, name: str) -> bytes:
        if self.root is not None:
            return (self.root / name).read_bytes()
        entry = self._reader.select("/" + name.lstrip("/"))
        if entry is None:
            raise FileNotFoundError(f"{name} is not in {self.image}")
        return entry.read_bytes()

    def close(self) -> None:
        """Unmount (squashfuse unmounts when it is asked to stop) and remove the mount point, or close the reader."""
        process, self._process = self._process, None
        if process is not None and self.root is not None:
            _unmount(process, self.root)
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> ImageFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _unmount(process: subprocess.Popen, mountpoint: Path) -> None:
    """Stop ``squashfuse -f``: SIGTERM, on which it unmounts (SIGKILL would leave a dead mount), then remove the
    mount point."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stderr:
        process.stderr.close()
    with contextlib.suppress(OSError):
        mountpoint.rmdir()


# ------------------------------------------------------------------------------------------------------- staging


@dataclass(frozen=True)
class Staged:
    """Notebook 09: files copied to node-local storage: where, how many bytes, in how many seconds."""

    folder: Path
    bytes: int
    seconds: float


def _stage(paths: Sequence[_StrPath], dest: _StrPath) -> Staged:
    """Notebook 09: copy ``paths`` into a new folder ``dest`` (e.g. on ``/dev/shm`` or ``$TMPDIR``), timed. The copy
    goes to a temporary name first and is renamed when whole; it is refused before anything is written when the
    file system holding ``dest`` has not room for it."""
    paths = [Path(p) for p in paths]
    need = sum(p.stat().st_size for p in paths)
    dest = Path(dest)
    parent = dest.parent
    free = shutil.disk_usage(parent).free
    if need > free:
        raise StorageError(
            f"staging {need / 1e6:.0f} MB does not fit in {parent} ({free / 1e6:.0f} MB free): stage to the node's "
            "local disk ($TMPDIR) instead, or read from where the data is"
        )
    tmp = parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    start = time.perf_counter()
    for p in paths:
        shutil.copyfile(p, tmp / p.name)
    seconds = time.perf_counter() - start
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return Staged(dest, need, seconds)


def stage_or_stream(
    copy_s: float, shared_epoch_s: float, local_epoch_s: float, epochs: int, need_mb: float, free_mb: float
) -> str:
    """Notebooks 09 (exercise 09.6) and 13: ``"stage"`` when a copy to node-local storage fits there and pays for
    itself over the job (the copy, once, plus every epoch from the copy, take less than every epoch from the shared
    file system), else ``"stream"``."""
    if need_mb > free_mb:
        return "stream"
    return "stage" if copy_s + epochs * local_epoch_s < epochs * shared_epoch_s else "stream"


@contextlib.contextmanager
def staged(paths: Sequence[_StrPath], dest: _StrPath) -> Iterator[Staged]:
    """Notebook 09: :func:`_stage`, removed again when the block ends (as a job's end removes its node-local copy)."""
    copy = _stage(paths, dest)
    try:
        yield copy
    finally:
        shutil.rmtree(copy.folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.storage image FOLDER [IMAGE]``: pack a prepared set into one squashfs file (default:
    FOLDER.sqsh beside it), on a login node, for ``STAGE_DATA=image`` (hpc/common.sh) or Apptainer's
    ``--bind IMAGE:/data:image-src=/``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_lib.storage", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    image = sub.add_parser("image", help="pack a folder into one squashfs file")
    image.add_argument("folder", type=Path)
    image.add_argument("image", type=Path, nargs="?", help="(default: FOLDER.sqsh)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder} is not a folder: give the prepared set's folder", file=sys.stderr)
        return 2
    target = args.image or args.folder.with_name(args.folder.name + ".sqsh")
    try:
        made = make_image(args.folder, target)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{made}: {count_files(args.folder)} files in one file of {made.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
