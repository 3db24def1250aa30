"""For instructors on a JupyterHub: ``python -m course_lib hub link`` prints the nbgitpuller link that hands out the course,
and ``python -m course_lib hub class`` starts a class's worth of notebook 10's S3 servers on this host, to size it.

    python -m course_lib hub link --hub https://hub.example.edu --repo https://github.com/you/pytorch-data-course
    python -m course_lib hub link --hub https://hub.example.edu --repo https://gitlab.example.edu/ws/course.git \\
        --branch workshop-2026 --notebook notebooks/04_dataloader_performance.ipynb --interface notebook
    python -m course_lib hub class --learners 30     # 30 notebook-10 servers at once: ports, memory, start time

A learner who opens the link logs in to the hub, and nbgitpuller (installed in the hub's user environment)
clones the repository into their home, in a folder named after it, or, when it is there already, pulls the
new commits and merges them: a notebook the learner changed keeps their changes, a file they deleted comes
back, and where both changed the same lines the learner's version wins (nbgitpuller's merge rules). Then
it opens the notebook. Only the files come this way: the hub's environment (``pip install -r
requirements.txt``, by the admin) provides ``course_lib`` and its packages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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


def simulate_class(learners: int, show=print) -> list[dict]:
    """Start ``learners`` S3 servers at once, as a class's notebook 10 does on one hub host, each in a folder of its
    own; report each one's listening ports, memory (PSS of the server's processes) and seconds to start, and the
    whole; then stop them all. A server that did not start is reported with its error."""
    import psutil

    from course_lib import s3server

    with tempfile.TemporaryDirectory(prefix="hub-class-") as top:
        servers = [s3server.S3Server(Path(top) / f"learner{i:02d}") for i in range(learners)]

        def start(server: s3server.S3Server) -> str | None:
            try:
                server.start()
            except Exception as exc:  # noqa: BLE001 - a finding of the simulation, reported
                return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            return None

        began = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=learners) as pool:
                errors = list(pool.map(start, servers))
            all_up = time.monotonic() - began
            rows = []
            for i, (server, error) in enumerate(zip(servers, errors)):
                if error is not None:
                    rows.append({"learner": i, "error": error})
                    continue
                process = psutil.Process(server.pid)
                pss = 0
                for p in [process, *process.children(recursive=True)]:
                    try:
                        pss += p.memory_full_info().pss
                    except (psutil.Error, AttributeError):
                        pss += p.memory_info().rss
                ports = [port for _, port in server.listeners()]
                rows.append({"learner": i, "ports": ports, "pss_mb": pss / 2**20, "seconds": server.seconds_to_start})
        finally:
            for server in servers:
                server.stop(graceful=False)
    up = [r for r in rows if "error" not in r]
    for r in rows:
        if "error" in r:
            show(f"learner {r['learner']:02d}: did not start: {r['error']}")
        else:
            show(
                f"learner {r['learner']:02d}: {len(r['ports'])} ports, {r['pss_mb']:.0f} MB, "
                f"started in {r['seconds']:.1f} s"
            )
    every_port = [port for r in up for port in r["ports"]]
    show(
        f"{len(up)} of {learners} servers started at once in {all_up:.1f} s on {psutil.cpu_count()} CPUs "
        f"({psutil.virtual_memory().total / 2**30:.0f} GB)"
        + (
            f": each {statistics.median(r['seconds'] for r in up):.1f} s to start (median, slowest "
            f"{max(r['seconds'] for r in up):.1f} s), {statistics.median(len(r['ports']) for r in up):g} ports "
            f"({len(every_port)} in all, {len(set(every_port))} distinct), "
            f"{statistics.median(r['pss_mb'] for r in up):.0f} MB (median; {sum(r['pss_mb'] for r in up):,.0f} MB "
            "in all)"
            if up
            else ""
        )
    )
    return rows


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
    simulation = sub.add_parser(
        "class", help="start a class's notebook-10 S3 servers on this host at once: ports, memory, start time"
    )
    simulation.add_argument("--learners", type=int, default=30, help="how many servers (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "class":
        if args.learners < 1:
            parser.error("--learners must be at least 1")
        rows = simulate_class(args.learners)
        return 0 if all("error" not in r for r in rows) else 1
    try:
        print(pull_link(args.hub, args.repo, args.branch, args.notebook, args.interface))
    except LinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
