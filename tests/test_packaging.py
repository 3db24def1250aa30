"""The install story and the shape of the two packages.

* requirements.txt, binder/requirements.txt, pyproject.toml, README and .ci/run stay in step, and
  the versions named anywhere come from ``course_tools.versions``;
* every import of ``course_lib`` and ``course_tools`` is declared in pyproject.toml (read from the
  code itself, not from a list kept by hand);
* ``course_lib`` stays a short lesson library: every public name says which notebook teaches it and
  is used or named by a notebook; tools live in ``course_tools``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

from course_tools import versions

ROOT = Path(__file__).resolve().parents[1]
LESSON_MODULES = sorted(p for p in (ROOT / "course_lib").glob("*.py") if not p.name.startswith("_"))
PACKAGE_FILES = sorted((ROOT / "course_lib").rglob("*.py")) + sorted((ROOT / "course_tools").rglob("*.py"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")


def requirement_lines(path: Path = ROOT / "requirements.txt") -> dict[str, str]:
    reqs = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs[_name(line)] = line
    return reqs


# --------------------------------------------------------------------------- requirements and versions


def test_requirements_hold_pyprojects_ranges() -> None:
    reqs = requirement_lines()
    declared = PYPROJECT["dependencies"] + [d for extra in PYPROJECT["optional-dependencies"].values() for d in extra]
    for dep in declared:
        assert reqs.get(_name(dep)) == dep, f"{dep} in pyproject.toml vs {reqs.get(_name(dep))} in requirements.txt"
    assert "-e ." in (ROOT / "requirements.txt").read_text().splitlines()
    assert "jupyterlab" in reqs  # the course environment itself


def test_ci_runs_the_readme_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt"
    assert install + " && jupyter lab --allow-root notebooks/01_map_style_datasets.ipynb" in readme
    for step in install.split(" && "):
        assert step in ci, step
    assert re.search(r"^pytest$", ci, re.M) and re.search(r"^pytest$", readme, re.M)


def test_the_readme_names_every_tested_combination_and_nothing_else() -> None:
    """README's "Tested versions" table is course_tools.versions.TESTED, row for row."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tested versions", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|- ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    table = [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in rows[1:]]
    assert table == [{k: combo[k] for k in header} for combo in versions.TESTED]
    other = re.findall(r"torch(?:vision)? \d+\.\d+\.\d+", readme.replace(section, ""))
    assert not other, f"versions named outside the table: {other}"


def test_accepted_ranges_come_from_pyproject() -> None:
    ranges = versions.accepted()
    deps = {_name(d): d for d in PYPROJECT["dependencies"]}
    for name in ("torch", "torchvision", "webdataset"):
        low, below = ranges[name]
        assert deps[name] == f"{name}>={low}" + (f",<{below}" if below else "")
    assert PYPROJECT["requires-python"] == f">={ranges['python'][0]}"


# --------------------------------------------------------------------------- every import declared


def _imports(path: Path) -> set[str]:
    """Top-level names of the third-party modules a file imports, except inside ``try: ... except ImportError``."""
    tree = ast.parse(path.read_text())
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("course_lib", "course_tools")}


def test_every_import_of_both_packages_is_declared() -> None:
    declared = {_name(d) for d in PYPROJECT["dependencies"]}
    for extra in PYPROJECT["optional-dependencies"].values():
        declared |= {_name(d) for d in extra}
    providers = importlib.metadata.packages_distributions()
    missing = []
    for path in PACKAGE_FILES:
        for module in _imports(path):
            dists = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
            if not dists & declared:
                missing.append(f"{path.relative_to(ROOT)} imports {module} ({', '.join(sorted(dists))})")
    assert not missing, "not declared in pyproject.toml:\n" + "\n".join(missing)
    assert {"ipywidgets", "nbformat", "nbclient", "mistune", "pygments"} <= declared


def test_the_import_reader_sees_what_it_should() -> None:
    """The reader above can fail: it finds function-level imports and skips guarded optional ones."""
    sample = ROOT / "tests" / "_imports_sample.py"
    code = "import os\ndef f():\n    import yaml\n    from PIL import Image\ntry:\n    import nvidia.dali\nexcept ImportError:\n    pass\n"
    sample.write_text(code)
    try:
        assert _imports(sample) == {"yaml", "PIL"}
    finally:
        sample.unlink()


def test_every_module_of_both_packages_imports() -> None:
    import importlib

    for path in PACKAGE_FILES:
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.name == "__main__":
            continue
        importlib.import_module(".".join(rel.parts).removesuffix(".__init__"))


# --------------------------------------------------------------------------- a short lesson library


def _notebook_text() -> tuple[str, str]:
    """All code cells, and the `code spans` of all markdown cells, of every notebook (both versions)."""
    code, spans = [], []
    for path in sorted((ROOT / "notebooks").rglob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                code.append(source)
            else:
                spans += re.findall(r"`([^`]+)`", source)
    return "\n".join(code), "\n".join(spans)


def test_course_lib_is_short() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "course_lib").glob("*.py"))
    assert lines <= 5000, f"course_lib outside checks/ has {lines} lines: the lesson library must stay short"


@pytest.mark.parametrize("path", LESSON_MODULES, ids=[p.stem for p in LESSON_MODULES])
def test_public_names_say_where_they_are_taught_and_a_notebook_uses_them(path: Path) -> None:
    if path.stem == "__main__":
        return
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "a module docstring"
    exported = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), None)
    assert exported is not None, "a lesson module lists its public names in __all__"
    code, spans = _notebook_text()
    defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for name in exported:
        if name in defined:
            doc = ast.get_docstring(defined[name]) or ""
            assert re.match(r"Notebooks? \d\d", doc), f"{name}'s docstring should start with 'Notebook NN, section N: ...'"
        word = re.compile(rf"\b{re.escape(name)}\b")
        named = bool(word.search(code) or word.search(spans))
        assert named, f"{name} is used or named by no notebook: make it private or remove it"
    for name, node in defined.items():
        is_error = isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception", "Timeout")) or
            isinstance(b, ast.Attribute) and b.attr.endswith("Error") for b in node.bases) or name.endswith(("Error", "Timeout"))
        assert name in exported or name.startswith("_") or is_error or name == "main", (
            f"{name} is public but not in __all__: a lesson's name goes in __all__, anything else starts with _"
        )


def test_no_tool_lives_in_course_lib() -> None:
    tools = {p.stem for p in (ROOT / "course_tools").glob("*.py")} - {"__init__", "__main__"}
    assert not tools & {p.stem for p in (ROOT / "course_lib").glob("*.py")}
    for path in (ROOT / "course_lib").rglob("*.py"):
        text = path.read_text()
        assert "argparse.ArgumentParser(prog=\"python -m course_lib " not in text, path  # a tool's command line
