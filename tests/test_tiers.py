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
