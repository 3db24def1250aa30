"""``python -m course_lib changed``: the notebooks that a change touches, for CI to re-execute on a pull request.

A notebook is touched when one of these changed:

* the notebook itself, either version;
* its checks (``course_lib/checks/nbNN.py``) or their shared machinery (``course_lib/checks/_core.py``, ``__init__``);
* a module of ``course_lib`` that its code imports or starts as a program (``launch("course_lib.train", ...)``,
  ``python -m course_lib.resume``), directly or through the modules that one imports;
* what every notebook depends on: the requirements, ``pyproject.toml``, nbval's sanitize file, the top-level
  ``conftest.py`` (the load stage).

Anything else (tests, tools, documents, ``hpc/``) touches no notebook. Both versions of each touched notebook are
printed, one path a line, in teaching order::

    python -m course_lib changed --base origin/main     # what this branch changed since it left main
    python -m course_lib changed FILE ...               # or for the files named
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
EVERYTHING = {"requirements.txt", "pyproject.toml", "tests/nbval_sanitize.cfg", "conftest.py"}
_CHECKS = re.compile(r"^course_lib/checks/nb(\d\d)\.py$")
_NOTEBOOK = re.compile(r"^notebooks/(?:solutions/)?(\d\d)_[^/]+\.ipynb$")
_PROGRAM = re.compile(r"course_lib\.(\w+)")  # a module started as a program: launch("course_lib.train"), -m ...


def module_of(path: str) -> str | None:
    """``course_lib/shards.py`` -> ``shards``, ``course_lib/checks/nb09.py`` -> ``checks.nb09``,
    ``course_lib/__init__.py`` -> ``""``; None outside the library."""
    parts = Path(path).with_suffix("").parts
    if path.endswith(".py") and parts[0] == "course_lib":
        return ".".join(parts[1:]).removesuffix("__init__").rstrip(".")
    return None


def imported(tree: ast.AST, package: str) -> set[str]:
    """The library modules (``shards``, ``checks.nb09``) that code in ``package`` (``course_lib.checks``) imports;
    for ``from course_lib.X import Y``, both ``X`` and ``X.Y`` (Y may be a module)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module == "course_lib" or module.startswith("course_lib."):
                rest = module.removeprefix("course_lib").lstrip(".")
                found |= {rest} | {f"{rest}.{a.name}".lstrip(".") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("course_lib.") for a in node.names if a.name.startswith("course_lib.")}
    return found


@functools.cache
def library_imports(root: Path = ROOT) -> dict[str, frozenset[str]]:
    """For each module of ``course_lib``, checks included, the library modules it imports, at any depth of its code."""
    graph: dict[str, frozenset[str]] = {}
    for path in sorted((root / "course_lib").rglob("*.py")):
        name = module_of(path.relative_to(root).as_posix())
        if name is None or name == "__main__":
            continue
        package = "course_lib." + name if path.name == "__init__.py" else ("course_lib." + name).rpartition(".")[0]
        graph[name] = frozenset(imported(ast.parse(path.read_text()), package.rstrip(".")) - {name})
    return graph


def cell_code(source: str) -> str:
    """A code cell as Python: a ``%%writefile`` cell is the file it writes; other magics and shell lines drop out."""
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):
        return "\n".join(lines[1:]) if lines[0].startswith("%%writefile") else ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


@functools.cache
def notebook_modules(number: str, root: Path = ROOT) -> frozenset[str]:
    """The library modules notebook ``number``'s solution uses, directly or through the modules they import."""
    (path,) = (root / "notebooks" / "solutions").glob(f"{number}_*.ipynb")
    direct: set[str] = {""}  # every notebook's first cell: course_lib itself
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        code = cell_code("".join(cell["source"]))
        direct |= set(_PROGRAM.findall(code)) | imported(ast.parse(code), "")
    graph, seen, todo = library_imports(root), set(), list(direct)
    while todo:
        module = todo.pop()
        if module in graph and module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return frozenset(seen)


def numbers(root: Path = ROOT) -> list[str]:
    return sorted(p.name[:2] for p in (root / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))


def touched(changed: Iterable[str], root: Path = ROOT) -> list[str]:
    """The numbers of the notebooks that the changed files (paths relative to the repository) touch."""
    every, found = numbers(root), set()
    for path in changed:
        if path in EVERYTHING:
            return every
        if m := _NOTEBOOK.match(path) or _CHECKS.match(path):
            found.add(m.group(1))
        elif (module := module_of(path)) is not None:
            found |= {n for n in every if module in notebook_modules(n, root)}
    return sorted(found & set(every))


def notebook_paths(touched_numbers: Iterable[str], root: Path = ROOT) -> list[str]:
    """Both versions of each notebook, learner first, as paths relative to the repository."""
    paths = []
    for number in touched_numbers:
        for folder in ("notebooks", "notebooks/solutions"):
            paths += [p.relative_to(root).as_posix() for p in (root / folder).glob(f"{number}_*.ipynb")]
    return paths


def changed_since(base: str, root: Path = ROOT) -> list[str]:
    """The files this branch changed since it left ``base`` (``git diff --name-only base...HEAD``)."""
    result = subprocess.run(["git", "diff", "--name-only", f"{base}...HEAD"], cwd=root, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(
            f"git diff against {base!r} failed: {result.stderr.strip()} (fetch it first: "
            f"git fetch origin, or give the changed files as arguments)"
        )
    return result.stdout.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib changed", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="changed files, relative to the repository (default: --base)")
    parser.add_argument("--base", help="a git ref: the files changed since this branch left it")
    args = parser.parse_args(argv)
    if bool(args.files) == bool(args.base):
        parser.error("give either --base REF or the changed files")
    files = args.files or changed_since(args.base)
    for path in notebook_paths(touched(files)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
