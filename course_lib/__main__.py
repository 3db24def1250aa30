"""``python -m course_lib <command>`` and the ``course-lib`` command: prepare, verify, doctor, bench, slides, authoring.

The commands are instructors' and maintainers' tools; they live in :mod:`course_tools`, imported only when one
runs. This file is the one place where the lesson library reaches up to the tools, and nothing imports it.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run one command of :mod:`course_tools.cli` and return its exit status."""
    from course_tools.cli import main as run_command

    return run_command(argv)


if __name__ == "__main__":
    sys.exit(main())
