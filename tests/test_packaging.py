"""The install story and the shape of the two packages.

* requirements.txt, binder/requirements.txt, pyproject.toml, README and .ci/run stay in step, and
  the versions named anywhere come from ``course_tools.versions``;
* every import of ``course_lib`` and ``course_tools`` is declared in pyproject.toml (read from the
  code itself, not from a list kept by hand);
* no tool lives in ``course_lib`` (the layers and the lesson library's public names: tests/test_layering.py).
"""

from __future__ import annotations

import pytest

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path


from course_tools import versions

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
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
    # the `jupyter lab ...` part is run, as written, by tests/test_jupyterlab.py
    assert re.search(rf"^{re.escape(install)} && jupyter lab .*notebooks/01_map_style_datasets\.ipynb$", readme, re.M)
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
    # the commands' own check, made before anything else is imported, says the same
    from course_tools import cli

    assert PYPROJECT["requires-python"] == ">=" + ".".join(map(str, cli.REQUIRES_PYTHON))


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


def test_the_import_reader_sees_what_it_should(tmp_path: Path) -> None:
    """The reader above can fail: it finds function-level imports and skips guarded optional ones."""
    sample = tmp_path / "imports_sample.py"
    code = "import os\ndef f():\n    import yaml\n    from PIL import Image\ntry:\n    import nvidia.dali\nexcept ImportError:\n    pass\n"
    sample.write_text(code)
    assert _imports(sample) == {"yaml", "PIL"}


def test_every_module_of_both_packages_imports() -> None:
    import importlib

    for path in PACKAGE_FILES:
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.name == "__main__":
            continue
        importlib.import_module(".".join(rel.parts).removesuffix(".__init__"))


# --------------------------------------------------------------------------- tools stay tools


def test_no_tool_lives_in_course_lib() -> None:
    tools = {p.stem for p in (ROOT / "course_tools").glob("*.py")} - {"__init__", "__main__"}
    assert not tools & {p.stem for p in (ROOT / "course_lib").glob("*.py")}
    for path in (ROOT / "course_lib").rglob("*.py"):
        text = path.read_text()
        assert 'argparse.ArgumentParser(prog="python -m course_lib ' not in text, path  # a tool's command line
