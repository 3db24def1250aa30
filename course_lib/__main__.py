"""``python -m course_lib <command>``: prepare, verify, doctor, bench, slides, authoring.

The commands are instructors' and maintainers' tools; they live in :mod:`course_tools`, imported only when one runs.
"""

import sys

from course_tools.cli import main

sys.exit(main())
