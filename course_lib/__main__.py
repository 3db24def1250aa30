"""Command line: ``python -m course_lib prepare`` (run once on a login node before a workshop).

    python -m course_lib prepare                      # the default 'small' set
    python -m course_lib prepare --size workshop --root /scratch/$USER/course-data
    python -m course_lib verify --size small --checksums
"""

from __future__ import annotations

import argparse
import sys

from . import data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib", description="Helpers of the course 'Feeding PyTorch with data'.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("prepare", "generate the course data set (or reuse it) and print where it is"),
        ("verify", "check that a generated data set is complete (and intact, with --checksums)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--size", default=data.DEFAULT_SIZE, choices=sorted(data.SIZES), help="how large (default: %(default)s)")
        p.add_argument("--seed", type=int, default=0, help="random seed of the generated set (default: %(default)s)")
        p.add_argument("--root", help=f"data folder (default: ${data.ENV_VAR}, else ~/.cache/pytorch-data-course)")
        p.add_argument("--checksums", action="store_true", help="re-hash every file of an existing set")
        if name == "prepare":
            p.add_argument("--force", action="store_true", help="regenerate even if the set exists")
            p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            folder = data.prepare_data(
                args.size, args.seed, args.root, progress=not args.quiet, force=args.force, checksums=args.checksums
            )
        else:
            folder = data.data_dir(args.root) / data.dataset_name(args.size, args.seed)
            if not folder.is_dir():
                raise data.DataError(f"{folder} does not exist; create it with `python -m course_lib prepare --size {args.size}`")
            data.verify(folder, checksums=args.checksums)
    except (data.DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(data.describe(folder))
    print(f"location: {folder}")
    if args.root is not None:
        print(f"notebooks find it once you set: export {data.ENV_VAR}={data.data_dir(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
