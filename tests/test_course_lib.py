"""course_lib itself: its version, which every notebook's first cell requires."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

import course_lib

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


def test_the_version_is_pyprojects() -> None:
    assert course_lib.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_require_passes_this_version_and_older_ones() -> None:
    course_lib.require(course_lib.__version__)
    course_lib.require("0.1")


def test_require_of_a_newer_version_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(course_lib, "__version__", "0.1.0")  # a hub's environment, installed before an update
    with pytest.raises(course_lib.CourseLibTooOldError) as caught:
        course_lib.require("0.2.0")
    message = str(caught.value)
    assert message.startswith("this notebook needs course_lib 0.2.0 or newer, and the environment has 0.1.0")
    assert (
        "ask its admin" in message and "pip install -r requirements.txt" in message and "restart the kernel" in message
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_every_notebook_first_requires_this_version(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    assert first.startswith(
        f'import course_lib\nfrom course_lib import kernel\n\ncourse_lib.require("{course_lib.__version__}")'
    ), "the first code cell starts by requiring the course library it was written for: bump it with the version"
    assert "\nkernel.let_the_kernel_exit()  # " in first.split("\n\n")[1], (
        "then lets the kernel exit when asked to (course_lib.kernel), with a comment saying why"
    )
