"""Maintainers' tool: produce learner notebooks from solution notebooks, and re-execute them.

The source of truth for each notebook is its solution version, ``notebooks/solutions/NN_*.ipynb``.
In its code cells, exercise answers sit between markers::

    ### BEGIN SOLUTION
    train_part, holdout = random_split(train, [0.8, 0.2], generator=torch.Generator().manual_seed(42))
    ### END SOLUTION
    ### BEGIN STUB
    # train_part, holdout = ...
    ### END STUB

The learner version, ``notebooks/NN_*.ipynb``, drops the solution lines and uncomments the stub
lines (the first ``# `` after the indentation). Markers themselves never reach learners.

Commands (run from the repository root)::

    python -m course_lib authoring build            # regenerate learner notebooks, execute all
    python -m course_lib authoring build 02_transforms --no-execute
    python -m course_lib authoring check            # are the learner notebooks up to date?
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from pathlib import Path

import nbformat

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_STUB, END_STUB = "### BEGIN STUB", "### END STUB"
_UNCOMMENT = re.compile(r"^(\s*)# ?")


class MarkerError(ValueError):
    """Solution/stub markers are unbalanced or nested."""


def learner_source(source: str) -> str:
    """The learner's version of one code cell's source (see the module docstring)."""
    out: list[str] = []
    mode: str | None = None
    after_stub = False  # a stub is followed by a blank line, so the learner's answer stands apart from the check
    for n, line in enumerate(source.splitlines(), 1):
        marker = line.strip()
        if after_stub and marker and marker not in (BEGIN_SOLUTION, BEGIN_STUB):
            out.append("")
        after_stub = False
        if marker in (BEGIN_SOLUTION, BEGIN_STUB):
            if mode is not None:
                raise MarkerError(f"line {n}: {marker!r} inside an open {mode} block")
            mode = "solution" if marker == BEGIN_SOLUTION else "stub"
            continue
        if marker in (END_SOLUTION, END_STUB):
            expected = "solution" if marker == END_SOLUTION else "stub"
            if mode != expected:
                raise MarkerError(f"line {n}: {marker!r} without a matching BEGIN")
            mode, after_stub = None, marker == END_STUB
            continue
        if mode == "solution":
            continue
        if mode == "stub" and line.strip():
            if not line.lstrip().startswith("#"):
                raise MarkerError(f"line {n}: stub lines must be commented out in the solution notebook")
            line = _UNCOMMENT.sub(r"\1", line, count=1)
        out.append(line)
    if mode is not None:
        raise MarkerError(f"a {mode} block is never closed")
    return "\n".join(out)


def has_markers(source: str) -> bool:
    return any(m in source for m in (BEGIN_SOLUTION, BEGIN_STUB))


def make_learner(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A learner notebook: solution lines removed, stubs uncommented, outputs cleared."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = learner_source(cell.source)
        cell.outputs = []
        cell.execution_count = None
    return nb


def execute(path: Path, timeout: int = 600) -> float:
    """Execute a notebook in place, top to bottom, in its own folder; return the seconds taken."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def pairs(notebooks: Path, names: list[str] | None = None) -> list[tuple[Path, Path]]:
    """(solution, learner) paths for every solution notebook, or for the named ones."""
    solutions = sorted((notebooks / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if names:
        wanted = {n.removesuffix(".ipynb") for n in names}
        solutions = [p for p in solutions if p.stem in wanted or p.stem[:2] in wanted]
        if not solutions:
            raise SystemExit(f"no solution notebook matches {', '.join(names)} in {notebooks / 'solutions'}")
    return [(s, notebooks / s.name) for s in solutions]


def out_of_sync(notebooks: Path) -> list[str]:
    """Learner notebooks whose cells no longer match what their solution notebook generates."""
    problems = []
    for solution, learner in pairs(notebooks):
        if not learner.exists():
            problems.append(f"{learner.name}: missing (run `python -m course_lib authoring build`)")
            continue
        want = make_learner(nbformat.read(solution, as_version=4))
        have = nbformat.read(learner, as_version=4)
        a = [(c.cell_type, c.source) for c in want.cells]
        b = [(c.cell_type, c.source) for c in have.cells]
        if a != b:
            problems.append(f"{learner.name}: differs from what {solution.name} generates (run the build)")
    return problems


def build(notebooks: Path, names: list[str] | None = None, run: bool = True) -> None:
    for solution, learner in pairs(notebooks, names):
        nbformat.write(make_learner(nbformat.read(solution, as_version=4)), learner)
        print(f"wrote {learner.relative_to(notebooks.parent)}")
        if run:
            for path in (solution, learner):
                print(f"executed {path.relative_to(notebooks.parent)} in {execute(path):.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib authoring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="the notebooks folder")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate learner notebooks and execute both versions in place")
    b.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    b.add_argument("--no-execute", action="store_true", help="only regenerate the learner notebooks")
    sub.add_parser("check", help="exit 1 if a learner notebook is out of date")
    args = parser.parse_args(argv)
    if not (args.notebooks / "solutions").is_dir():
        parser.error(f"no {args.notebooks / 'solutions'} folder: run from the repository root or pass --notebooks")
    if args.command == "build":
        build(args.notebooks, args.names, run=not args.no_execute)
        return 0
    problems = out_of_sync(args.notebooks)
    print("\n".join(problems) or "learner notebooks are up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
