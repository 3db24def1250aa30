"""course_lib.timing: ratios from robust per-call timings."""

from __future__ import annotations

import pytest

import time

from course_lib.timing import format_seconds, seconds_per_call

pytestmark = pytest.mark.quick


def test_seconds_per_call_is_close_to_a_known_duration() -> None:
    t = seconds_per_call(lambda: time.sleep(0.002), repeat=2)
    assert 0.0015 < t < 0.05


def test_fast_calls_are_batched_into_measurable_rounds() -> None:
    calls = []
    seconds_per_call(lambda: calls.append(1), repeat=2)
    assert len(calls) > 100


def test_a_slow_call_is_timed_once_per_round_and_once_to_size_them() -> None:
    calls = []
    seconds_per_call(lambda: (calls.append(1), time.sleep(0.06)), repeat=3)
    assert len(calls) == 4


def test_format_seconds() -> None:
    assert format_seconds(0.00042) == "420 µs"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(2.5) == "2.50 s"
