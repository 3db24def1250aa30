"""The layers of the course's code, and the lesson library's public names.

Layers, bottom to top (an import may only point down, or within its own layer):

1. ``course_lib`` (the lesson library, ``course_lib/further/`` included): imports neither the checks, nor the tools,
   nor the tests. The one exception is ``course_lib/__main__.py``, the command entry that nothing imports: it hands
   ``python -m course_lib doctor`` and the like to the tools.
2. ``course_lib.checks``: imports the library, never the tools or the tests.
3. ``course_tools``: the instructors' and maintainers' tools, on top; never imports the tests.
4. the notebooks may import all three; nothing imports the tests.

And every name a lesson module exports (``__all__``) is used by the code of some notebook: imported from it, or
reached as an attribute of it (``resume.read_steps``). Markdown does not count. A name nothing teaches is private
(a leading ``_``) or gone.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "course_lib").rglob("*.py"))
TOOLS = sorted((ROOT / "course_tools").rglob("*.py"))
TEST_MODULES = {p.stem for p in (ROOT / "tests").rglob("*.py")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The absolute names of every module a file imports, at any depth of its code (lazy imports too)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..shards import y
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # `from course_lib import checks`
    return found


def layer_violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in paths:
        for name in sorted(imports(path)):
            if name.split(".")[0] in TEST_MODULES or any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_the_lesson_library_imports_neither_checks_nor_tools_nor_tests() -> None:
    lessons = [p for p in LIBRARY if "checks" not in p.parts and p.name != "__main__.py"]
    assert len(lessons) > 20
    assert layer_violations(lessons, ("course_tools", "course_lib.checks")) == []


def test_the_checks_import_the_library_only() -> None:
    checks = [p for p in LIBRARY if "checks" in p.parts]
    assert len(checks) >= 12
    assert layer_violations(checks, ("course_tools",)) == []


def test_the_tools_never_import_the_tests() -> None:
    assert layer_violations(TOOLS, ()) == []


def test_only_the_command_entry_reaches_up_to_the_tools() -> None:
    reaching_up = [p.relative_to(ROOT).as_posix() for p in LIBRARY
                   if any(n.startswith("course_tools") for n in imports(p))]
    assert reaching_up == ["course_lib/__main__.py"]
    entry = {module_name(p) for p in LIBRARY + TOOLS if "course_lib.__main__" in imports(p)}
    assert entry == set(), f"{entry} import course_lib.__main__, which runs the command line"


def test_no_import_cycle_in_the_library() -> None:
    modules = {module_name(p): p for p in LIBRARY if p.name != "__main__.py"}
    graph = {m: {n for n in imports(p) if n in modules and n != m and n != "course_lib"} for m, p in modules.items()}
    # a package's __init__ is imported by everything below it: not an edge of a cycle
    graph = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(n):] + [n]) if n in path else n)
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_layer_reader_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The reader above can fail: relative imports resolve against the package; imports inside functions count."""
    sample = ROOT / "course_lib" / "checks" / "_layering_sample.py"
    sample.write_text("from .. import shards\nfrom ._core import Hint\ndef f():\n    from course_tools.launch import launch\n")
    try:
        assert {"course_lib.shards", "course_lib.checks._core", "course_tools.launch"} <= imports(sample)
        assert "course_lib/checks/_layering_sample.py imports course_tools.launch" in layer_violations(
            [sample], ("course_tools",))
    finally:
        sample.unlink()


# --------------------------------------------------------------------------- public names, taught
def _cell_code(source: str) -> str:
    """A code cell as Python: a ``%%writefile`` cell is the file it writes; other magics and shell lines drop out."""
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):
        return "\n".join(lines[1:]) if lines[0].startswith("%%writefile") else ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


@functools.cache
def names_notebooks_use() -> frozenset[tuple[str, str]]:
    """``(module, name)`` for every lesson name that a notebook's code imports or reaches as a module attribute."""
    used: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "notebooks").rglob("[0-9][0-9]_*.ipynb")):
        aliases: dict[str, str] = {}  # a name in the notebook -> the course_lib module it is bound to
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            tree = ast.parse(_cell_code("".join(cell["source"])))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "course_lib":
                    module = node.module.removeprefix("course_lib").lstrip(".")
                    for alias in node.names:
                        used.add((module, alias.name))
                        aliases[alias.asname or alias.name] = f"{module}.{alias.name}".lstrip(".")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("course_lib.") and alias.asname:
                            aliases[alias.asname] = alias.name.removeprefix("course_lib.")
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    used.add((aliases[node.value.id], node.attr))
    return frozenset(used)


LESSON_MODULES = sorted(p for p in LIBRARY if "checks" not in p.parts and not any(
    part.startswith("_") for part in p.relative_to(ROOT / "course_lib").parts))


def exported(path: Path) -> list[str] | None:
    tree = ast.parse(path.read_text())
    return next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), None)


@pytest.mark.parametrize("path", LESSON_MODULES, ids=[module_name(p) for p in LESSON_MODULES])
def test_every_public_name_is_used_by_a_notebook(path: Path) -> None:
    names = exported(path)
    assert names is not None, "a lesson module lists its public names in __all__"
    module = module_name(path).removeprefix("course_lib.")
    unused = [n for n in names if (module, n) not in names_notebooks_use()]
    assert not unused, f"{unused}: no notebook's code uses them; teach them in a notebook, or make them private"


@pytest.mark.parametrize("path", LESSON_MODULES, ids=[module_name(p) for p in LESSON_MODULES])
def test_public_names_are_listed_and_say_where_they_are_taught(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "a module docstring"
    names = exported(path) or []
    defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for name in names:
        if name in defined:
            doc = ast.get_docstring(defined[name]) or ""
            assert doc.startswith(("Notebook ", "Notebooks ")), f"{name}'s docstring should start 'Notebook NN, ...'"
    for name, node in defined.items():
        is_error = name.endswith(("Error", "Timeout")) or isinstance(node, ast.ClassDef) and any(
            isinstance(b, (ast.Name, ast.Attribute)) and getattr(b, "id", getattr(b, "attr", "")).endswith("Error")
            for b in node.bases)
        assert name in names or name.startswith("_") or is_error or name == "main", (
            f"{name} is public but not in __all__: a lesson's name goes in __all__, anything else starts with _")


def test_the_usage_reader_sees_aliases_attributes_and_writefile() -> None:
    used = names_notebooks_use()
    assert ("resume", "read_steps") in used  # `from course_lib import ... resume` then resume.read_steps(...)
    assert ("further.growing", "GrowingCache") in used  # from course_lib.further.growing import GrowingCache
    assert ("datasets", "image_tensor") in used
    assert not any(module.startswith("checks") and name == "nonexistent" for module, name in used)
