"""course_lib: the lesson library of the course "Feeding PyTorch with data".

What the notebooks and their DataLoader workers import, one module per lesson (``data``/``datasets`` 01,
``transforms`` 02, ``loaders`` 03, ``instrument``/``explorer`` 04, ``workers`` 04-05, ``samplers`` 06,
``distributed``/``train`` 07, ``iterable``/``growing`` 08, ``shards``/``shard_reader`` 09,
``object_store`` 10, ``alternatives`` 11, ``highrate``/``threads``/``gpu_feed`` 12, ``capstone`` 13,
``resume`` 14), ``jobs`` (torchrun jobs from a notebook, 07-14), ``s3server`` (10), ``kernel`` (every
notebook's first cell) and ``checks``; the tools are in :mod:`course_tools`.
"""

__version__ = "0.2.0"  # pyproject.toml's version; every notebook's first cell requires the one it was written for


class CourseLibTooOldError(RuntimeError):
    """The course library installed is older than the notebook: the notebooks were updated, the environment not."""


def require(version: str) -> None:
    """Notebooks 01-15, first cell: stop at once, saying why, where the installed course library is older than
    ``version``, the one the notebook was written for. On a hub, nbgitpuller updates the notebooks in a learner's
    home, and the shared environment stays as the admin installed it until the admin updates it."""
    from packaging.version import Version

    if Version(__version__) < Version(version):
        raise CourseLibTooOldError(
            f"this notebook needs course_lib {version} or newer, and the environment has {__version__} "
            f"({__file__}): the notebooks were updated, the environment was not. On a JupyterHub, ask its admin to "
            "update the course's environment (git pull in its clone of the course, then pip install -r "
            "requirements.txt); on your own machine, run git pull and pip install -r requirements.txt yourself, "
            "then restart the kernel"
        )
