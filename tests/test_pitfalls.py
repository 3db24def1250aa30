"""course_lib.pitfalls.expect_error: shows an expected error, and fails when it stops happening."""

from __future__ import annotations

import pytest

from course_lib.pitfalls import PitfallDidNotHappen, expect_error

pytestmark = pytest.mark.quick


def test_prints_the_error_as_a_learner_sees_it(capsys: pytest.CaptureFixture[str]) -> None:
    with expect_error(KeyError):
        {}["missing"]
    with expect_error(ValueError, lines=2):
        raise ValueError("first line\nsecond line\nthird line")
    assert capsys.readouterr().out == "KeyError: 'missing'\nValueError: first line\nsecond line\n"


def test_fails_when_the_pitfall_no_longer_happens() -> None:
    with pytest.raises(PitfallDidNotHappen, match="expected IndexError or KeyError"):
        with expect_error(IndexError, KeyError):
            pass


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(ZeroDivisionError):
        with expect_error(KeyError):
            1 / 0
