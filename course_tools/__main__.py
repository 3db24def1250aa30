"""``python -m course_tools <command>``: the same commands as ``python -m course_lib <command>``."""

import sys

from .cli import main

sys.exit(main())
