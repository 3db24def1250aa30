"""binder/ (what repo2docker builds on Binder), checked where repo2docker itself cannot run.

binder/requirements.txt must install the same packages, with the same ranges, as the top-level
requirements.txt (only torch/torchvision's index differs: the CPU wheels); runtime.txt names the
tested Python; postBuild is executable, valid bash, prepares the data, and works.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib import data
from course_tools import binder, preparation, versions

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def normalise(name: str) -> str:
    """PEP 503 name normalisation: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirements(path: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """({normalised name: specifier without spaces}, editable/local lines, option lines) of a requirements file."""
    packages: dict[str, str] = {}
    local: list[str] = []
    options: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-e", "--editable", ".", "/")):
            local.append(" ".join(line.split()))
        elif line.startswith("-"):
            options.append(" ".join(line.split()))
        else:
            match = _NAME.match(line)
            assert match, f"{path.name}: cannot read the line {raw!r}"
            name = normalise(match.group(1))
            assert name not in packages, f"{path.name} lists {name} twice"
            packages[name] = re.sub(r"\s+", "", (match.group(2) or "") + match.group(3))
    return packages, local, options


def test_parse_requirements_normalises(tmp_path: Path) -> None:
    f = tmp_path / "r.txt"
    f.write_text("# c\nFoo_Bar.baz >= 1.0 , <2  # why\n--extra-index-url https://x\n-e .\nmosaicml-streaming\n")
    assert parse_requirements(f) == (
        {"foo-bar-baz": ">=1.0,<2", "mosaicml-streaming": ""},
        ["-e ."],
        ["--extra-index-url https://x"],
    )


def test_binder_installs_requirements_txt_less_the_tests_packages() -> None:
    """binder/requirements.txt is generated (python -m course_lib binder requirements): the top-level packages and
    ranges, less what only the tests use, so that a package added to requirements.txt reaches Binder."""
    assert binder.main(["requirements", "--check"]) == 0, "run python -m course_lib binder requirements"
    top, top_local, _ = parse_requirements(REPO / "requirements.txt")
    image, image_local, _ = parse_requirements(BINDER / "requirements.txt")
    assert image == {name: spec for name, spec in top.items() if name not in binder.TEST_ONLY}
    assert binder.TEST_ONLY <= set(top), "every package left out is one requirements.txt installs"
    assert image_local == top_local == ["-e ."], "both install course_lib itself with `-e .`"


def test_no_notebook_imports_what_binder_leaves_out() -> None:
    import json

    imported = set()
    for path in (REPO / "notebooks").rglob("[0-9][0-9]_*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                imported |= set(re.findall(r"^\s*(?:import|from)\s+([\w.]+)", source, re.M))
    top = {normalise(name.split(".")[0]) for name in imported}
    assert not top & binder.TEST_ONLY, f"a notebook imports {sorted(top & binder.TEST_ONLY)}: keep it for Binder"


def test_a_new_package_flows_through_and_a_test_only_one_does_not() -> None:
    text = (REPO / "requirements.txt").read_text().replace("\nspdl-core", "\nnewpkg>=1.0\nspdl-core")
    text += "\n# more tests\npytest-cov>=5\npytest>=8\n"
    made = binder.binder_requirements(text)
    assert "\nnewpkg>=1.0\n" in made and "pytest-cov>=5" in made and "\npytest>=8" not in made


def test_the_badge_comes_from_a_github_remote(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "README.md").write_text(
        "# Course\n\n[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/OWNER/REPO/HEAD)\n"
    )
    assert binder.main(["badge"], root=tmp_path) == 2  # no remote: said, nothing written
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", "https://gitlab.com/ws/course"], check=True)
    assert binder.main(["badge", "--write"], root=tmp_path) == 2  # not GitHub: Binder's gh/ route cannot build it
    assert "OWNER/REPO" in (tmp_path / "README.md").read_text()
    subprocess.run(
        ["git", "-C", str(tmp_path), "remote", "set-url", "origin", "git@github.com:ws/pytorch-data-course.git"],
        check=True,
    )
    assert binder.main(["badge", "--write"], root=tmp_path) == 0
    assert (tmp_path / "README.md").read_text().splitlines()[2] == (
        "[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/ws/pytorch-data-course/HEAD"
        "?labpath=notebooks%2F01_map_style_datasets.ipynb)"
    )
    with pytest.raises(binder.BinderError, match="not a GitHub repository"):
        binder.badge("https://example.org/ws/course.git")


def test_torch_comes_from_the_cpu_index() -> None:
    packages, _, options = parse_requirements(BINDER / "requirements.txt")
    assert f"--extra-index-url {CPU_INDEX}" in options
    # no other index: a CUDA index (or --index-url replacing PyPI) would defeat the CPU build
    assert [o for o in options if "index-url" in o or o.startswith(("-i ", "-f ", "--find-links"))] == [
        f"--extra-index-url {CPU_INDEX}"
    ]
    assert "torch" in packages and "torchvision" in packages
    assert "+cu" not in packages["torch"] and "+cu" not in packages["torchvision"]


def test_runtime_is_the_tested_python() -> None:
    assert (BINDER / "runtime.txt").read_text().strip() == f"python-{versions.TESTED[-1]['python']}"


def test_post_build_is_executable_valid_bash_and_prepares() -> None:
    post = BINDER / "postBuild"
    assert post.stat().st_mode & stat.S_IXUSR, "binder/postBuild must be executable: chmod +x binder/postBuild"
    assert post.read_text().startswith("#!/bin/bash\n")
    checked = subprocess.run(["bash", "-n", str(post)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    commands = [
        line.strip() for line in post.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "set -euo pipefail" in commands  # a failed preparation fails the build, not the first notebook
    assert any(c.startswith("python -m course_lib prepare") for c in commands)


def test_post_build_git_mode_is_executable() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-s", "binder/postBuild"], capture_output=True, text=True, cwd=REPO, timeout=30
    )
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip("not a git checkout, or postBuild not committed yet")
    assert listed.stdout.split()[0] == "100755", (
        "commit postBuild as executable: git update-index --chmod=+x binder/postBuild"
    )


@pytest.mark.timeout(300)
def test_post_build_runs_and_leaves_the_notebooks_data_ready(tmp_path: Path) -> None:
    # As repo2docker does: from the repository root, with the environment's python on PATH.
    env = {
        **os.environ,
        "COURSE_DATA_DIR": str(tmp_path),
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run([str(BINDER / "postBuild")], capture_output=True, text=True, cwd=REPO, env=env, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert preparation.status(tmp_path) == {name: True for name in preparation.STEPS}
    assert (tmp_path / data.dataset_name()).is_dir()


def test_apt_txt_brings_the_debian_packages_notebook_09_uses() -> None:
    """repo2docker installs binder/apt.txt's packages, one name a line: the same Debian packages `.ci/run` installs
    for the notebooks (notebook 09, section 11), so that Binder counts and packs as CI does."""
    packages = (BINDER / "apt.txt").read_text().split()
    assert packages == ["strace", "squashfs-tools", "squashfuse"]
    ci = (REPO / ".ci" / "run").read_text()
    assert all(f"missing+=({name})" in ci for name in packages)
