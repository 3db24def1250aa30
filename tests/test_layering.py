"""The layers of the course's code, and the lesson library's public names.

Layers, bottom to top (an import may only point down, or within its own layer):

1. ``course_lib`` (the lesson library, ``course_lib/`` included): imports neither the checks, nor the tools,
   nor the tests. The one exception is ``course_lib/__main__.py``, the command entry that nothing imports: it hands
   ``python -m course_lib doctor`` and the like to the tools.
2. ``course_lib.checks``: imports the library, never the tools or the tests.
3. ``course_tools``: the instructors' and maintainers' tools, on top; never imports the tests.
4. the notebooks import ``course_lib`` and its checks, never the tools; nothing imports the tests.

No module reaches into another's privates: ``from X import _name`` names a module's own helper only inside that
module, and a private module (``_core``, ``_programs``) is imported only from its own package. A helper that modules
share is public where it is defined (``course_lib.support``, ``shards.find_shards``).

And every name a lesson module exports (``__all__``) is used by the code of some notebook: imported from it, or
reached as an attribute of it (``resume.read_steps``). Markdown does not count. A name nothing teaches is private
(a leading ``_``) or gone.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

from course_tools.changed import cell_code  # a notebook cell as Python, as the CI's notebook picker reads it

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "course_lib").rglob("*.py"))
TOOLS = sorted((ROOT / "course_tools").rglob("*.py"))
TEST_MODULES = {p.stem for p in (ROOT / "tests").rglob("*.py")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str | None = None) -> set[str]:
    """The absolute names of every module a file imports, at any depth of its code (lazy imports too). ``module``:
    the file's module name, where it does not lie in the repository (a sample in a temporary folder)."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
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


def layer_violations(paths: list[Path], forbidden: tuple[str, ...], module: str | None = None) -> list[str]:
    bad = []
    for path in paths:
        for name in sorted(imports(path, module)):
            if name.split(".")[0] in TEST_MODULES or any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{module or path.relative_to(ROOT)} imports {name}")
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
    reaching_up = [
        p.relative_to(ROOT).as_posix() for p in LIBRARY if any(n.startswith("course_tools") for n in imports(p))
    ]
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
                pytest.fail("import cycle: " + " -> ".join(path[path.index(n) :] + [n]) if n in path else n)
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_layer_reader_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The reader above can fail: relative imports resolve against the package; imports inside functions count."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from .. import shards\nfrom ._core import Hint\ndef f():\n    from course_tools.bench import main\n"
    )
    module = "course_lib.checks.sample"
    assert {"course_lib.shards", "course_lib.checks._core", "course_tools.bench"} <= imports(sample, module)
    assert "course_lib.checks.sample imports course_tools.bench" in layer_violations(
        [sample], ("course_tools",), module
    )


# --------------------------------------------------------------------------- no private reaches
def private_reaches(path: Path, module: str | None = None) -> list[str]:
    """Where a file imports another module's private name (``from .shards import _find``), or a private module of
    another package (``course_lib.checks`` importing ``course_lib._programs``)."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for name in sorted(imports(path, module)):
        parts = name.split(".")
        if parts[0] not in ("course_lib", "course_tools"):
            continue
        for i, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__"):
                owner = ".".join(parts[:i])  # the package or module the private part belongs to
                if owner != package and owner != module:
                    found.append(f"{module} imports {name}")
                break
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    assert [r for p in LIBRARY + TOOLS for r in private_reaches(p)] == []


def test_the_private_reach_reader_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from .shards import _find\nfrom ._programs import one_line\nfrom . import _programs\n"
        "from .checks._core import Hint\ndef f():\n    from course_lib._programs import run\n"
    )
    assert private_reaches(sample, "course_lib.sample") == [
        "course_lib.sample imports course_lib.checks._core",
        "course_lib.sample imports course_lib.checks._core.Hint",
        "course_lib.sample imports course_lib.shards._find",
    ]
    sample.write_text("from course_lib import _programs, shards\nfrom course_lib.support import check_int\n")
    assert private_reaches(sample, "course_tools.sample") == ["course_tools.sample imports course_lib._programs"]


# --------------------------------------------------------------------------- public names, taught
@functools.cache
def names_notebooks_use() -> frozenset[tuple[str, str]]:
    """``(module, name)`` for every lesson name that a notebook's code imports or reaches as a module attribute."""
    used: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "notebooks").rglob("[0-9][0-9]_*.ipynb")):
        aliases: dict[str, str] = {}  # a name in the notebook -> the course_lib module it is bound to
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            tree = ast.parse(cell_code("".join(cell["source"])))
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


#: helpers that the lesson modules, the checks and the tools share; no lesson of their own, and no ``__all__``
SHARED_MODULES = [ROOT / "course_lib" / "support.py"]
LESSON_MODULES = sorted(
    p
    for p in LIBRARY
    if "checks" not in p.parts
    and p not in SHARED_MODULES
    and not any(part.startswith("_") for part in p.relative_to(ROOT / "course_lib").parts)
)


@functools.cache
def names_modules_import() -> frozenset[tuple[str, str]]:
    """``(module, name)`` for every name of ``course_lib`` that another module of the library, the checks or the
    tools imports: a shared helper, public where it is defined."""
    used = set()
    for path in LIBRARY + TOOLS:
        own = module_name(path)
        package = own if path.name == "__init__.py" else own.rpartition(".")[0]
        aliases: dict[str, str] = {}  # a name in the file -> the course_lib module or name it is bound to
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
            elif isinstance(node, ast.Import):
                aliases |= {a.asname: a.name for a in node.names if a.asname}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                aliases.setdefault(f"{node.value.id}.{node.attr}", f"{aliases[node.value.id]}.{node.attr}")
        for target in aliases.values():
            module, _, attr = target.rpartition(".")
            if module.split(".")[0] == "course_lib" and module != own:
                used.add((module.removeprefix("course_lib").lstrip("."), attr))
    return frozenset(used)


def returned_by(tree: ast.Module, names: list[str]) -> set[str]:
    """The names that the return annotations of the functions ``names`` mention: a class a taught function returns."""
    found: set[str] = set()
    taught = [node for node in tree.body if getattr(node, "name", None) in names]
    for node in [n for t in taught for n in ast.walk(t)]:  # the functions, and the methods of the classes
        if isinstance(node, ast.FunctionDef) and node.returns is not None:
            found |= {n.id for n in ast.walk(node.returns) if isinstance(n, ast.Name)}
            found |= {
                word
                for n in ast.walk(node.returns)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
                for word in re.findall(r"\w+", n.value)
            }  # a quoted annotation, "NoCuda.Stream"
    return found


def exported(path: Path) -> list[str] | None:
    tree = ast.parse(path.read_text())
    return next(
        (
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        ),
        None,
    )


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
    module = module_name(path).removeprefix("course_lib.")
    allowed = set(names) | returned_by(tree, names) | {n for m, n in names_modules_import() if m == module}
    for name, node in defined.items():
        is_error = (
            name.endswith(("Error", "Timeout"))
            or isinstance(node, ast.ClassDef)
            and any(
                isinstance(b, (ast.Name, ast.Attribute)) and getattr(b, "id", getattr(b, "attr", "")).endswith("Error")
                for b in node.bases
            )
        )
        assert name in allowed or name.startswith("_") or is_error or name == "main", (
            f"{name} is public but not in __all__, returned by a name in it, or shared with another module: a "
            "lesson's name goes in __all__, anything else starts with _"
        )


@pytest.mark.parametrize("path", SHARED_MODULES, ids=[module_name(p) for p in SHARED_MODULES])
def test_every_shared_helper_is_shared(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "a module docstring"
    module = module_name(path).removeprefix("course_lib.")
    public = [
        n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")
    ]
    unshared = [n for n in public if (module, n) not in names_modules_import()]
    assert not unshared, f"{unshared}: no other module uses them; make them private (a leading _) or remove them"


def notebook_imports(path: Path) -> set[str]:
    """The modules a notebook's code imports, its ``%%writefile`` scripts included."""
    found: set[str] = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            for node in ast.walk(ast.parse(cell_code("".join(cell["source"])))):
                if isinstance(node, ast.Import):
                    found |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


NOTEBOOKS = sorted((ROOT / "notebooks").rglob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(ROOT / "notebooks").as_posix() for p in NOTEBOOKS])
def test_notebooks_import_the_library_and_its_checks_never_the_tools(path: Path) -> None:
    assert sorted(n for n in notebook_imports(path) if n.split(".")[0] == "course_tools") == []


def test_the_notebook_import_reader_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "99_sample.ipynb"
    cells = [
        "import course_lib",
        "%%writefile job.py\nfrom course_tools.bench import main",
        "x = 1\nimport course_tools",
    ]
    sample.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}))
    assert {"course_lib", "course_tools.bench", "course_tools"} <= notebook_imports(sample)


def test_every_library_name_a_notebook_uses_exists() -> None:
    """A name a notebook imports or reaches (``check.solved``) is there: a re-export an unused-import fix took away
    would otherwise surface only when the notebook runs."""
    import importlib

    missing = []
    for module, name in sorted(names_notebooks_use()):
        try:
            target = importlib.import_module(f"course_lib.{module}".rstrip("."))
        except ImportError:  # an attribute reached through a name that is not a module (a class, say)
            continue
        if not hasattr(target, name):
            try:
                importlib.import_module(f"{target.__name__}.{name}")  # a submodule: from course_lib import data
            except ImportError:
                missing.append(f"course_lib.{module}.{name}".replace("..", "."))
    assert missing == []


def test_the_usage_reader_sees_aliases_attributes_and_writefile() -> None:
    used = names_notebooks_use()
    assert ("resume", "read_steps") in used  # `from course_lib import ... resume` then resume.read_steps(...)
    assert ("growing", "GrowingCache") in used  # from course_lib.growing import GrowingCache
    assert ("datasets", "image_tensor") in used
    assert not any(module.startswith("checks") and name == "nonexistent" for module, name in used)
