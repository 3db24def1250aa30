"""Command line of the course's helpers.

    python -m course_lib prepare                      # the default 'small' set
    python -m course_lib prepare --all --root /scratch/course-data   # everything, once, on a login node
    python -m course_lib prepare --size workshop --root /scratch/$USER/course-data
    python -m course_lib verify --size small --checksums
    python -m course_lib doctor                       # is this environment ready for the course?
"""

from __future__ import annotations

import argparse
import os
import sys

from . import doctor

try:  # numpy/PIL missing must not stop the doctor, whose job is to say so
    from . import data, preparation
except ImportError as _exc:  # pragma: no cover - exercised by the doctor's subprocess test
    data = preparation = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = _exc
else:
    _IMPORT_ERROR = None


def _add_data_arguments(p: argparse.ArgumentParser, name: str) -> None:
    sizes = sorted(data.SIZES) if data is not None else None
    default = data.DEFAULT_SIZE if data is not None else "small"
    p.add_argument("--size", default=default, choices=sizes, help="how large (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the generated set (default: %(default)s)")
    p.add_argument("--root", help="data folder (default: $COURSE_DATA_DIR, else ~/.cache/pytorch-data-course)")
    p.add_argument("--checksums", action="store_true", help="re-hash every file of an existing set")
    if name == "prepare":
        p.add_argument("--force", action="store_true", help="regenerate even if the data exists")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        steps = ", ".join(preparation.STEPS) if preparation is not None else "images, ..."
        p.add_argument(
            "--all", action="store_true",
            help="everything the notebooks read (every step, for the notebooks' own 'small' set and for --size): "
            "run once on a login node so that compute nodes without internet find it all",
        )
        p.add_argument("--step", action="append", default=[], metavar="NAME", help=f"run this step (repeatable; steps: {steps})")


def _prepare(args: argparse.Namespace) -> int:
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
        print(f"verified {data.dataset_name(size, seed)}: {', '.join(done) or 'nothing'} ready"
              + ("" if len(done) == len(state) else f"; not prepared: {', '.join(n for n, ok in state.items() if not ok)}"))
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
    folder = data.data_dir(args.root) / data.dataset_name(args.size, args.seed)
    if not folder.is_dir():
        raise data.DataError(f"{folder} does not exist; create it with `python -m course_lib prepare --size {args.size}`")
    data.verify(folder, checksums=args.checksums)
    print(data.describe(folder))
    print(f"location: {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib", description="Helpers of the course 'Feeding PyTorch with data'.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("prepare", "generate the course data (or reuse it) and print where it is"),
        ("verify", "check that a generated data set is complete (and intact, with --checksums)"),
    ):
        _add_data_arguments(sub.add_parser(name, help=help_text), name)
    doctor.add_arguments(sub.add_parser("doctor", help="check this environment for the course and say what to fix"))
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor.run(args)
    if _IMPORT_ERROR is not None:
        print(f"error: {_IMPORT_ERROR}; install the course's packages: pip install -r requirements.txt", file=sys.stderr)
        return 1
    from .shards import ShardError

    try:
        return _prepare(args) if args.command == "prepare" else _verify(args)
    except (data.DataError, ShardError, preparation.PrepareError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
