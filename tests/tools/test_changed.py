"""``python -m course_lib changed``: the notebooks a change touches, on sample diffs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_tools import changed

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[2]
ALL = changed.numbers()


@pytest.mark.parametrize(
    ("files", "want"),
    [
        (["notebooks/03_dataloader_basics.ipynb"], ["03"]),  # a notebook, either version
        (["notebooks/solutions/12_high_rate_question.ipynb", "notebooks/01_map_style_datasets.ipynb"], ["01", "12"]),
        (["course_lib/checks/nb09.py"], ["09"]),  # its checks
        (["course_lib/checks/_core.py"], ALL),  # every check's machinery
        (["course_lib/s3server.py"], ["10"]),  # a module one notebook imports
        (["course_lib/resume.py"], ["13", "14", "15"]),  # ... one that modules import (capstone, tokens)
        (["course_lib/train.py"], ["07", "13", "14", "15"]),  # a program (launch("course_lib.train")), and imported
        (["course_lib/support.py"], ALL),  # what every lesson module imports
        (["requirements.txt"], ALL),
        (["tests/nbval_sanitize.cfg"], ALL),
        (["README.md", "tests/test_shards.py", "course_tools/doctor.py", "hpc/common.sh"], []),  # no notebook's
    ],
)
def test_the_touched_notebooks(files: list[str], want: list[str]) -> None:
    assert changed.touched(files) == want


def test_every_notebook_is_touched_by_its_first_cells_modules() -> None:
    for number in ALL:
        assert {"", "kernel", "data"} <= changed.notebook_modules(number), number


def test_the_command_prints_both_versions_in_teaching_order() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "course_lib", "changed", "course_lib/checks/nb09.py", "course_lib/checks/nb02.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == [
        "notebooks/02_transforms.ipynb",
        "notebooks/solutions/02_transforms.ipynb",
        "notebooks/09_streaming_shards.ipynb",
        "notebooks/solutions/09_streaming_shards.ipynb",
    ]


def test_a_base_that_git_does_not_know_says_what_to_do() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "course_lib", "changed", "--base", "no-such-branch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "fetch it first" in result.stderr
