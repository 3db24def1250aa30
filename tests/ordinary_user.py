"""An ordinary (not root) user to run a command as, for tests/test_jupyterlab.py.

As root, :func:`throwaway_user` adds a system user with its own group and a home in a temporary
folder (``useradd``), and removes both afterwards (``userdel``); its commands start through
``setpriv``, which drops every privilege: a real ordinary user, with no capability left.

That user runs this environment's Python, read-only. When a folder on the way to it cannot be
searched by others (a pyenv Python under ``/root``, mode 700, is the usual case), nothing is
chmod-ed: the command starts in a mount namespace of its own (``unshare --mount``, private
propagation) in which that folder is a tmpfs holding only the needed entries, bound from the real
one. Only that command and its children see it; the namespace ends with them, whatever happens to
the test. Where no such namespace can be made (no ``CAP_SYS_ADMIN``), :class:`CannotRunAsUser`
says so, and why.

Not root, there is no one else to become: :func:`current_user` runs commands as this process's user.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pwd
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


class CannotRunAsUser(RuntimeError):
    """This machine cannot run a command as an ordinary user (the message says what is missing)."""


@dataclass
class User:
    """Who runs a command: ``prefix`` goes before it (empty: this process's own user)."""

    name: str
    uid: int
    gid: int
    home: Path
    prefix: list[str] = field(default_factory=list)
    how: str = "this process's user"  # for messages: how the command became this user's

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for the user: this process's, with the user's ``HOME`` and names; for another
        user, without this one's folders for Jupyter, IPython and XDG (theirs are under their home)."""
        own = self.uid == os.geteuid()
        kept = {
            k: v
            for k, v in os.environ.items()
            if own or not k.startswith(("XDG_", "JUPYTER", "IPYTHONDIR", "MPLCONFIGDIR", "TMPDIR"))
        }
        return {**kept, "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, **extra}

    def give(self, path: Path) -> None:
        """Make ``path`` (and all below it) the user's: as a clone of their own would be."""
        if self.uid == os.geteuid():
            return
        for folder, dirs, files in os.walk(path):
            for name in [folder, *(os.path.join(folder, f) for f in dirs + files)]:
                os.chown(name, self.uid, self.gid, follow_symlinks=False)


def current_user() -> User:
    """This process's own user, as it is."""
    return User(getpass.getuser(), os.geteuid(), os.getegid(), Path.home())


def _searchable(path: Path, uid: int, gid: int) -> bool:
    """Whether a user with uid ``uid`` and only the group ``gid`` may pass through folder ``path``."""
    st = path.stat()
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def blocked_folders(paths: list[Path], uid: int, gid: int) -> dict[Path, set[str]]:
    """For each of ``paths``, the first folder on its way that the user cannot pass through, with the
    names below it that lead to the paths: ``{Path("/root"): {".pyenv"}}``."""
    blocked: dict[Path, set[str]] = {}
    for path in paths:
        path = path.absolute()
        for folder, below in zip([*reversed(path.parents)], [*reversed(path.parents)][1:] + [path]):
            if not _searchable(folder, uid, gid):
                blocked.setdefault(folder, set()).add(below.relative_to(folder).parts[0])
                break
    return blocked


def _namespace_prefix(blocked: dict[Path, set[str]], work: Path) -> list[str]:
    """A command prefix: a private mount namespace where each blocked folder is a searchable tmpfs
    holding its needed entries, bound from the real folder (kept reachable at ``work/keep-N``)."""
    unshare, mount = shutil.which("unshare", path=SBIN), shutil.which("mount", path=SBIN)
    if not unshare or not mount:
        raise CannotRunAsUser(
            "unshare and mount (util-linux) are needed to show the user "
            f"{', '.join(map(str, blocked))} without changing its permissions"
        )
    lines = ["set -e"]
    for n, (folder, names) in enumerate(sorted(blocked.items())):
        if folder == Path("/"):
            raise CannotRunAsUser("others cannot pass through / itself")
        keep = work / f"keep-{n}"
        keep.mkdir(mode=0o700)
        lines.append(f"{mount} --rbind {shlex.quote(str(folder))} {shlex.quote(str(keep))}")
        lines.append(f"{mount} -t tmpfs -o mode=0755,size=1m course-test {shlex.quote(str(folder))}")
        for name in sorted(names):
            inside, real = folder / name, keep / name
            lines.append(f"{'mkdir' if inside.is_dir() else 'touch'} {shlex.quote(str(inside))}")  # root sees it
            lines.append(f"{mount} --rbind {shlex.quote(str(real))} {shlex.quote(str(inside))}")
    lines.append('exec "$@"')
    return [unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines), "sh"]


@contextlib.contextmanager
def throwaway_user(needs: list[Path]) -> Iterator[User]:
    """As root: a new system user (own group, home in a temporary folder) who can run this Python and
    reach ``needs``; removed, home included, afterwards. :class:`CannotRunAsUser` if this machine can't."""
    if os.geteuid() != 0:
        raise CannotRunAsUser("only root can add a user")
    tools = {name: shutil.which(name, path=SBIN) for name in ("useradd", "userdel", "setpriv")}
    if not all(tools.values()):
        raise CannotRunAsUser(f"missing {[n for n, t in tools.items() if not t]} (Debian: passwd, util-linux)")
    # Not under pytest's tmp_path: /tmp/pytest-of-root is root's alone (mode 700).
    work = Path(tempfile.mkdtemp(prefix="course-user-"))
    work.chmod(0o755)
    name = f"course-{secrets.token_hex(4)}"
    home = work / "home"
    made = subprocess.run(
        [
            tools["useradd"],
            "--system",
            "--user-group",
            "--create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/sh",
            "--comment",
            "throwaway user of tests/test_jupyterlab.py",
            name,
        ],
        capture_output=True,
        text=True,
    )
    try:
        if made.returncode != 0:
            raise CannotRunAsUser(f"useradd {name} failed ({made.returncode}): {made.stderr.strip()}")
        entry = pwd.getpwnam(name)
        drop = [tools["setpriv"], f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--"]
        blocked = blocked_folders(
            needs + [Path(sys.executable).resolve(), Path(sys.base_prefix)], entry.pw_uid, entry.pw_gid
        )
        prefix = [*_namespace_prefix(blocked, work), *drop] if blocked else drop
        how = f"useradd {name} (uid {entry.pw_uid}), then setpriv" + (
            f", in a mount namespace that shows it {sorted(str(f / n) for f, ns in blocked.items() for n in ns)}"
            f" (others may not pass through {sorted(map(str, blocked))})"
            if blocked
            else ""
        )
        user = User(name, entry.pw_uid, entry.pw_gid, home, prefix, how)
        # Can the user start this Python at all? (Else every later failure would read as the test's.)
        tried = subprocess.run(
            [*prefix, sys.executable, "-c", "import os; print(os.geteuid())"],
            env=user.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if tried.returncode != 0 or tried.stdout.strip() != str(entry.pw_uid):
            raise CannotRunAsUser(
                f"{how}: cannot run {sys.executable} ({tried.returncode}): "
                f"{(tried.stderr or tried.stdout).strip()[-1000:]}"
            )
        yield user
    finally:
        if made.returncode == 0:
            gone = subprocess.run([tools["userdel"], name], capture_output=True, text=True)
            if gone.returncode != 0:
                print(f"userdel {name} failed ({gone.returncode}): {gone.stderr.strip()}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
