"""What every test of the exercise checks needs: a check's outcome, and the three answers every check treats alike."""

from __future__ import annotations

from typing import Any

from course_lib.checks import Status


def status(check: Any, *args: Any) -> tuple[Status, str]:
    """``(✅/⬜/❌, the line's message)`` of ``check`` on ``args``."""
    result = check.evaluate(*args)
    return result.status, result.message


def right_and_stubs(check: Any, right: Any, stub: Any) -> None:
    """``right`` passes; the ``...`` placeholder and ``stub`` (which raises NotImplementedError) are "not attempted"."""
    assert status(check, right)[0] is Status.SOLVED, status(check, right)[1]
    assert status(check, ...)[0] is Status.NOT_ATTEMPTED
    assert status(check, stub)[0] is Status.NOT_ATTEMPTED
