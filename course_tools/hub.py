"""For instructors on a JupyterHub: ``python -m course_lib hub link`` prints the nbgitpuller link that hands out the course.

    python -m course_lib hub link --hub https://hub.example.edu --repo https://github.com/you/pytorch-data-course
    python -m course_lib hub link --hub https://hub.example.edu --repo https://gitlab.example.edu/ws/course.git \\
        --branch workshop-2026 --notebook notebooks/04_dataloader_performance.ipynb --interface notebook

A learner who opens the link logs in to the hub, and nbgitpuller (installed in the hub's user environment)
clones the repository into their home, in a folder named after it, or, when it is there already, pulls the
new commits and merges them: a notebook the learner changed keeps their changes, a file they deleted comes
back, and where both changed the same lines the learner's version wins (nbgitpuller's merge rules). Then
it opens the notebook. Only the files come this way: the hub's environment (``pip install -r
requirements.txt``, by the admin) provides ``course_lib`` and its packages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import quote, urlencode, urlparse

INTERFACES = {"lab": "lab/tree", "notebook": "tree"}  # where the hub opens the pulled notebook


class LinkError(ValueError):
    """An argument that cannot make a working link; the message says which and what to give."""


def clone_folder(repo: str) -> str:
    """The folder the link has nbgitpuller clone ``repo`` into, in the learner's home: the repository's name without
    ``.git`` (given as ``targetpath``: nbgitpuller's own default keeps the ``.git``)."""
    name = urlparse(repo).path.rstrip("/").rsplit("/", 1)[-1]
    return name[:-4] if name.endswith(".git") else name


def pull_link(
    hub: str,
    repo: str,
    branch: str = "main",
    notebook: str = "notebooks/01_map_style_datasets.ipynb",
    interface: str = "lab",
    course: Path | None = None,
) -> str:
    """The nbgitpuller link: ``HUB/hub/user-redirect/git-pull?repo=...&branch=...&targetpath=...&urlpath=...``.

    ``notebook`` must be one of the course's notebooks, as this copy of the course (``course``, default: the one
    this command runs from) has them: a link to a notebook that does not exist opens an error page for every
    learner."""
    for name, url, schemes in (
        ("--hub", hub, ("http", "https")),
        ("--repo", repo, ("http", "https", "git", "ssh", "file")),
    ):
        parts = urlparse(url)
        if parts.scheme not in schemes or not (parts.netloc or parts.scheme == "file"):
            raise LinkError(
                f"{name} {url!r} is not a URL: give it with its scheme ({', '.join(schemes)}), "
                f"e.g. {'https://hub.example.edu' if name == '--hub' else 'https://github.com/you/course'}"
            )
    if interface not in INTERFACES:
        raise LinkError(f"--interface {interface!r}: choose one of {', '.join(INTERFACES)}")
    if not branch or any(c in branch for c in " ~^:?*["):
        raise LinkError(f"--branch {branch!r} is not a git branch name")
    course = Path(__file__).resolve().parents[1] if course is None else course
    if not notebook.endswith(".ipynb") or not (course / notebook.lstrip("/")).is_file():
        known = sorted(p.relative_to(course).as_posix() for p in course.glob("notebooks/**/[0-9][0-9]_*.ipynb"))
        raise LinkError(
            f"--notebook {notebook!r} is not a notebook of this course: give its path relative to the course folder, "
            f"e.g. {known[0] if known else 'notebooks/01_map_style_datasets.ipynb'} ({len(known)} notebooks there)"
        )
    folder = clone_folder(repo)
    if not folder:
        raise LinkError(f"--repo {repo!r} names no repository (its path is empty)")
    target = f"{INTERFACES[interface]}/{folder}/{notebook.lstrip('/')}"
    query = urlencode(
        {"repo": repo, "branch": branch, "targetpath": folder, "urlpath": target}, quote_via=quote, safe=""
    )
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib hub", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    link = sub.add_parser("link", help="print the nbgitpuller link that hands out the course on a hub")
    link.add_argument("--hub", required=True, help="the hub's address, e.g. https://hub.example.edu")
    link.add_argument("--repo", required=True, help="the course repository's clone URL (your fork or mirror)")
    link.add_argument("--branch", default="main", help="the branch to hand out (default: %(default)s)")
    link.add_argument(
        "--notebook",
        default="notebooks/01_map_style_datasets.ipynb",
        help="the notebook to open, relative to the repository (default: %(default)s)",
    )
    link.add_argument(
        "--interface",
        default="lab",
        choices=sorted(INTERFACES),
        help="JupyterLab or the classic notebook interface (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        print(pull_link(args.hub, args.repo, args.branch, args.notebook, args.interface))
    except LinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
