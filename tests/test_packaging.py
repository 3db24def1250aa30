"""The install story: requirements.txt, pyproject.toml, README and .ci/run stay in step."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirement_lines() -> dict[str, str]:
    reqs = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name = re.match(r"[A-Za-z0-9_.\-]+", line).group(0).lower()
            reqs[name] = line
    return reqs


def test_requirements_include_the_library_dependencies_with_the_same_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = requirement_lines()
    for dep in project["dependencies"] + project["optional-dependencies"]["test"]:
        name = re.match(r"[A-Za-z0-9_.\-]+", dep).group(0).lower()
        assert reqs.get(name) == dep, f"{dep} in pyproject.toml vs {reqs.get(name)} in requirements.txt"


def test_requirements_cover_the_course_tools() -> None:
    reqs = requirement_lines()
    for tool in ("torch", "torchvision", "jupyterlab", "ipywidgets", "matplotlib", "nbval", "webdataset", "tqdm", "pytest"):
        assert tool in reqs, tool
    assert "-e ." in (ROOT / "requirements.txt").read_text().splitlines()


def test_ci_runs_the_readme_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt"
    assert install + " && jupyter lab notebooks/01_map_style_datasets.ipynb" in readme
    for step in install.split(" && "):
        assert step in ci, step
    assert re.search(r"^pytest$", ci, re.M) and re.search(r"^pytest$", readme, re.M)
    assert (ROOT / "notebooks" / "01_map_style_datasets.ipynb").exists()


def test_layout() -> None:
    for path in ("README.md", "requirements.txt", "pyproject.toml", "notebooks", "course_lib", "tests", "binder", "slides", "hpc", ".ci/run"):
        assert (ROOT / path).exists(), path
