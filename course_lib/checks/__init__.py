"""Self-checking exercises, one module per notebook: ``from course_lib.checks import nb01``.

Each check prints one line (solved, not attempted yet, or a specific hint) and never raises.
See :mod:`course_lib.checks._core` for the machinery.
"""

from ._core import CheckResult, Hint, NotAttempted, Status, attempted, exercise, require

__all__ = ["CheckResult", "Hint", "NotAttempted", "Status", "attempted", "exercise", "require"]
