"""The two test tiers: a test without exactly one tier marker fails the collection (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

CONFTEST = (Path(__file__).resolve().parent / "conftest.py").read_text()


def collect(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample="import pytest\n\n" + body)
    return pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")


def test_a_test_without_a_tier_fails_the_collection(pytester: pytest.Pytester) -> None:
    result = collect(pytester, "def test_untiered():\n    pass\n")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*every test needs exactly one tier marker*", "*test_untiered: no tier*"])


def test_two_tiers_fail_and_one_passes(pytester: pytest.Pytester) -> None:
    result = collect(pytester, "pytestmark = pytest.mark.quick\n\n@pytest.mark.full\ndef test_both():\n    pass\n")
    assert result.ret != 0
    assert "test_sample.py::test_both: ['full', 'quick']" in result.stderr.str()
    assert collect(pytester, "@pytest.mark.full\ndef test_one():\n    pass\n").ret == 0


class FakeItem:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


@pytest.mark.parametrize(
    ("nodeid", "quick", "group"),
    [
        ("notebooks/01_map_style_datasets.ipynb::Cell 3", False, "notebooks/01_map_style_datasets.ipynb"),
        (
            "notebooks/solutions/01_map_style_datasets.ipynb::Cell 3",
            True,
            "notebooks/solutions/01_map_style_datasets.ipynb",
        ),
        ("notebooks/11_beyond_webdataset.ipynb::Cell 0", False, "mds"),
        ("notebooks/solutions/14_surviving_preemption.ipynb::Cell 9", False, "mds"),
        ("tests/test_slurm.py::test_requeue", False, "tests/test_slurm.py"),
        ("tests/test_slurm.py::test_requeue", True, None),
        ("tests/test_alternatives.py::test_release_mds", True, "mds"),  # MDS tests, in either tier
        ("tests/test_checks_nb11.py::test_mds_loader", False, "mds"),
    ],
)
def test_each_notebook_keeps_its_cells_in_one_group_and_mds_notebooks_share_one(
    nodeid: str, quick: bool, group: str | None
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("top_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert conftest.xdist_group(FakeItem(nodeid), quick) == group


def test_the_groups_reach_xdist(pytester: pytest.Pytester) -> None:
    """Under ``--dist loadgroup`` a test's node id ends with its group: the marks are set before xdist reads them, and
    this pytest and pytest-xdist still group by them (pytest 9.2 with xdist 3.8 does not: pytest-xdist#1386). The
    top-level conftest sets them, for a file in any folder, named alone on the command line (a notebook's cells were
    once spread over both processes, when a hook of tests/conftest.py set them: it never reaches notebooks/)."""
    pytester.makeconftest((Path(__file__).resolve().parents[1] / "conftest.py").read_text())  # the top-level one
    pytester.mkdir("elsewhere")
    sample = pytester.path / "elsewhere" / "test_sample.py"
    sample.write_text("import pytest\n\n@pytest.mark.full\ndef test_one():\n    pass\n")
    result = pytester.runpytest("-p", "xdist", "-n", "1", "--dist", "loadgroup", "-v", str(sample))
    result.stdout.fnmatch_lines(["*PASSED elsewhere/test_sample.py::test_one@elsewhere/test_sample.py*"])
