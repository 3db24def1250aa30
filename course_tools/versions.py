"""Which versions the course runs with: the one place that the doctor, the README and the tests read.

* :data:`TESTED`: every combination that the whole test suite (``pytest``: every notebook, both
  versions, included) passed with. Add a row after a green run on new releases.
* The *accepted* ranges are the dependencies of ``pyproject.toml`` (:func:`accepted` reads them
  from the installed package's metadata); ``requirements.txt`` and ``binder/requirements.txt``
  repeat them, and ``tests/test_packaging.py`` keeps all three and the README in step.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

DISTRIBUTION = "pytorch-data-course"

#: Every combination the whole test suite passed with (Linux x86-64, 2 cores, no GPU).
TESTED: tuple[dict[str, str], ...] = (
    # machines whose pip is capped at torch 2.14.1 / torchvision 0.29.1
    {
        "python": "3.11",
        "torch": "2.14.1",
        "torchvision": "0.29.1",
        "webdataset": "1.0.2",
        "numpy": "2.1.3",
        "torchdata": "0.11.0",
    },
    # what an uncapped `pip install -r requirements.txt` installs
    {"python": "3.11", "torch": "2.15.0", "torchvision": "0.29.2", "webdataset": "1.0.2", "numpy": "2.1.3"},
)
#: The packages the doctor checks, in its report's order.
CHECKED = ("python", "torch", "torchvision", "webdataset", "torchdata")


def tested(name: str) -> list[str]:
    """The versions of ``name`` that some tested combination holds, oldest first."""
    found = {combo[name] for combo in TESTED if name in combo}
    return sorted(found, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))


def _requirements() -> tuple[list[str], str]:
    """The dependency lines and Requires-Python: from the installed package, else from pyproject.toml."""
    try:
        meta = importlib.metadata.metadata(DISTRIBUTION)
        return list(importlib.metadata.requires(DISTRIBUTION) or []), meta["Requires-Python"] or ""
    except importlib.metadata.PackageNotFoundError:  # a source checkout that was never installed
        project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
        return list(project["dependencies"]), project.get("requires-python", "")


def accepted() -> dict[str, tuple[str | None, str | None]]:
    """``{name: (lowest accepted, first refused)}`` for Python and each checked package: the ``>=`` and ``<``
    bounds of its specifier (None where there is none).

    ``packaging`` is imported here, not with the module: the doctor runs where nothing is installed yet.
    """
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    lines, python = _requirements()
    out: dict[str, tuple[str | None, str | None]] = {"python": _bounds("python", SpecifierSet(python))}
    for line in lines:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if requirement.marker is None and name in CHECKED:  # an extra's requirement has one: extra == "formats"
            out[name] = _bounds(name, requirement.specifier)
    return out


def _bounds(name: str, spec: SpecifierSet) -> tuple[str | None, str | None]:
    """The one ``>=`` and the one ``<`` of ``spec``, as written; any other clause cannot be told as such a range."""
    low = [s.version for s in spec if s.operator == ">="]
    below = [s.version for s in spec if s.operator == "<"]
    if len(low) > 1 or len(below) > 1 or len(spec) != len(low) + len(below):
        raise ValueError(f"{name}: the course states its accepted versions as '>=A' or '>=A,<B', not {str(spec)!r}")
    return (low[0] if low else None, below[0] if below else None)
