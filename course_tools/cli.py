"""The course's commands, one entry point: ``python -m course_lib <command>`` (or ``python -m course_tools``).

    python -m course_lib prepare                      # the default 'small' set
    python -m course_lib prepare --all --root /scratch/course-data   # everything, once, on a login node
    python -m course_lib verify --size small --checksums
    python -m course_lib doctor                       # is this environment ready for the course?
    python -m course_lib bench loader                 # benchmarks (instructors)
    python -m course_lib slides build                 # offline slide decks (instructors)
    python -m course_lib authoring build 02           # learner notebooks from solutions (maintainers)
    python -m course_lib authoring renumber --insert 10 --dry-run   # what inserting a notebook at 10 changes
    python -m course_lib gpu                          # every GPU path, run and measured, where a GPU is

Each command's module is imported only when it runs, so the doctor works where torch is missing.
On a Python older than the course's, every command stops first, saying so.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys

#: The oldest Python the course runs on: pyproject.toml's requires-python (tests/test_packaging.py keeps the
#: two in step). Checked before any command's module is imported: they use what older ones lack (tomllib).
REQUIRES_PYTHON = (3, 11)

#: command -> (module of course_tools, one line of help). The module's ``main(argv)`` runs it.
COMMANDS = {
    "prepare": ("cli", "generate the course data (or reuse it) and print where it is"),
    "verify": ("cli", "check that a generated data set is complete (and intact, with --checksums)"),
    "doctor": ("doctor", "check this environment for the course and say what to fix"),
    "bench": ("bench", "benchmarks: loader, highrate, formats (run on the participants' kind of machine)"),
    "slides": ("slides", "build the offline slide decks"),
    "authoring": ("authoring", "learner notebooks from solutions; re-execute notebooks; renumber them to insert one"),
    "gpu": ("gpu", "the GPU checklist: run and measure every GPU path (reports 'not run' without a GPU)"),
    "hub": ("hub", "for instructors on a JupyterHub: the nbgitpuller link that hands out the course"),
    "binder": ("binder", "for maintainers: binder/requirements.txt from requirements.txt, and the README's badge"),
    "changed": ("changed", "for CI: the notebooks a change touches (the notebook, its checks, the modules it uses)"),
}


def _add_data_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from course_lib import data

    from . import preparation

    sizes, default = sorted(data.SIZES), data.DEFAULT_SIZE
    p.add_argument("--size", default=default, choices=sizes, help="how large (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the generated set (default: %(default)s)")
    p.add_argument("--root", help="data folder (default: $COURSE_DATA_DIR, else ~/.cache/pytorch-data-course)")
    p.add_argument("--checksums", action="store_true", help="re-hash every file of an existing set")
    if name == "prepare":
        p.add_argument("--force", action="store_true", help="regenerate even if the data exists")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        steps = ", ".join(preparation.STEPS)
        p.add_argument(
            "--all",
            action="store_true",
            help="everything the notebooks read (every step, for the notebooks' own 'small' set and for --size): "
            "run once on a login node so that compute nodes without internet find it all",
        )
        p.add_argument(
            "--step", action="append", default=[], metavar="NAME", help=f"run this step (repeatable; steps: {steps})"
        )


def _prepare(args: argparse.Namespace) -> int:
    from course_lib import data

    from . import preparation

    triples = preparation.plan(args.step, args.size, args.seed, args.all)
    base = preparation.Options(root=args.root, force=args.force, progress=not args.quiet, checksums=args.checksums)
    folder = data.data_dir(args.root).absolute()

    def show(o: preparation.Outcome) -> None:
        print(f"  {o.step:<8} {o.summary}")

    print(f"preparing in {folder}:")
    preparation.run_steps(triples, base, report=show)
    # Verify summary: each image set's steps, read back as a notebook will find them.
    for size, seed in dict.fromkeys((s, sd) for _, s, sd in triples):
        state = preparation.status(args.root, size, seed)
        done = [n for n, ok in state.items() if ok]
        print(
            f"verified {data.dataset_name(size, seed)}: {', '.join(done) or 'nothing'} ready"
            + (
                ""
                if len(done) == len(state)
                else f"; not prepared: {', '.join(n for n, ok in state.items() if not ok)}"
            )
        )
    # One line per image set in the old format (scripts read it), then where it all is.
    first = data.data_dir(args.root) / data.dataset_name(args.size, args.seed)
    if first.is_dir():
        print(data.describe(first))
        print(f"location: {first}")
    shared = args.root is not None or bool(os.environ.get(data.ENV_VAR, "").strip())  # not one's own cache
    private = preparation.unreadable_by_others(folder) if shared else []
    if private:
        print(f"note: other users cannot read {private[0]}; for a shared folder run: chmod -R a+rX {folder}")
    print(f"notebooks find it once you set: export {data.ENV_VAR}={folder}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from course_lib import data

    folder = data.data_dir(args.root) / data.dataset_name(args.size, args.seed)
    if not folder.is_dir():
        raise data.DataError(
            f"{folder} does not exist; create it with `python -m course_lib prepare --size {args.size}`"
        )
    data.verify(folder, checksums=args.checksums)
    print(data.describe(folder))
    print(f"location: {folder}")
    return 0


def _data_command(name: str, argv: list[str]) -> int:
    """``prepare`` and ``verify``."""
    try:
        from course_lib import data
        from course_lib.shards import ShardError

        from . import preparation
    except ImportError as exc:
        print(f"error: {exc}; install the course's packages: pip install -r requirements.txt", file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(prog=f"python -m course_lib {name}", description=COMMANDS[name][1])
    _add_data_arguments(parser, name)
    args = parser.parse_args(argv)
    try:
        return _prepare(args) if name == "prepare" else _verify(args)
    except (data.DataError, ShardError, preparation.PrepareError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < REQUIRES_PYTHON:
        need = ".".join(map(str, REQUIRES_PYTHON))
        print(
            f"[FAIL] python {platform.python_version()} ({sys.executable}): the course needs Python {need} or newer.\n"
            f"  fix: python{need} -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt "
            "(from the course folder)",
            file=sys.stderr,
        )
        return 1
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        parser = argparse.ArgumentParser(
            prog="python -m course_lib", description="The commands of the course 'Feeding PyTorch with data'."
        )
        sub = parser.add_subparsers(dest="command", required=True, metavar="command")
        for name, (_, text) in COMMANDS.items():
            sub.add_parser(name, help=text, add_help=False)
        parser.parse_args(argv)  # prints the usage (or --help) and exits
        return 2
    name, rest = argv[0], argv[1:]
    if COMMANDS[name][0] == "cli":
        return _data_command(name, rest)
    return importlib.import_module(f"course_tools.{COMMANDS[name][0]}").main(rest)


if __name__ == "__main__":
    sys.exit(main())
