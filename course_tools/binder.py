"""``python -m course_lib binder``: the Binder image's requirements and the README's launch badge, made, not typed.

* ``binder requirements``: writes ``binder/requirements.txt`` from the top-level ``requirements.txt``, less what only
  the tests need (:data:`TEST_ONLY`: no notebook imports them), with PyTorch's CPU wheel index added, so that a
  package added to ``requirements.txt`` reaches Binder and the image stays lean. ``--check`` exits 1 where the file
  is out of date (the quick tier runs it: ``tests/tools/test_binder.py``).
* ``binder badge``: the Binder badge and link for this repository, read from ``git remote get-url origin`` (a GitHub
  URL), opening notebook 01; ``--write`` puts it on the README's first badge line. Without a GitHub remote it says so
  and what to do, and writes nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
FIRST_NOTEBOOK = "notebooks/01_map_style_datasets.ipynb"
#: What only the tests use: the test runner and its plugins, the browser driver, the hub of the hub stage, the style
#: and workflow checkers. No notebook imports them (tests/tools/test_binder.py checks), so Binder's image leaves them out.
TEST_ONLY = frozenset(
    {
        "pytest",
        "pytest-timeout",
        "pytest-xdist",
        "hypothesis",
        "nbval",
        "playwright",
        "jupyterhub",
        "ruff",
        "check-jsonschema",
    }
)
HEADER = f"""# Binder (repo2docker) installs this file instead of the top-level requirements.txt, because a binder/ folder
# exists. Generated from requirements.txt by `python -m course_lib binder requirements` (do not edit it by hand):
# the same packages and ranges, less what only the tests use:
#   {", ".join(sorted(TEST_ONLY))}
# and PyTorch's CPU wheel index, whose torch/torchvision builds (versions like 2.15.0+cpu) are about 200 MB instead of
# the multi-GB CUDA builds on PyPI: Binder has no GPU. pip takes the highest version across both indexes, and a "+cpu"
# build ranks above the same release without a local label, so torch and torchvision come from this index. The last
# line, `-e .`, installs course_lib: a local reference makes repo2docker install this file after copying the whole
# repository, from its root, so "." is the repository, not binder/.
--extra-index-url {CPU_INDEX}
"""
_PACKAGE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
_GITHUB = re.compile(
    r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$"
)
_BADGE_LINE = re.compile(r"^\[!\[Binder\]\(https://mybinder\.org/badge_logo\.svg\)\]\([^)]*\)$", re.M)


class BinderError(RuntimeError):
    """What the command cannot do here, and what to do instead."""


def package_name(line: str) -> str | None:
    """The normalised package a requirements line installs, or None (a comment, an option, a blank or local line)."""
    match = _PACKAGE.match(line.strip())
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def binder_requirements(top: str) -> str:
    """``binder/requirements.txt`` from the text of the top-level ``requirements.txt``: its paragraphs (blank-line
    separated), less the packages in :data:`TEST_ONLY` and the comments of a paragraph left with no package."""
    kept = []
    for paragraph in top.strip().split("\n\n"):
        lines = [line for line in paragraph.splitlines() if package_name(line) not in TEST_ONLY]
        if any(package_name(line) or line.startswith("-e") for line in lines):
            kept.append("\n".join(lines))
    body = "\n\n".join(p for p in kept if not p.startswith("# Everything the course needs"))  # the file's own intro
    return HEADER + "\n" + body + "\n"


def badge(remote: str, notebook: str = FIRST_NOTEBOOK) -> str:
    """The README's Binder badge for the GitHub repository at ``remote``, opening ``notebook`` in JupyterLab."""
    match = _GITHUB.match(remote.strip())
    if not match:
        raise BinderError(
            f"the remote {remote.strip()!r} is not a GitHub repository: Binder builds from GitHub. Push the course to "
            "GitHub and set it as origin (git remote set-url origin https://github.com/OWNER/REPO), then run this again"
        )
    owner, repo = match.groups()
    link = f"https://mybinder.org/v2/gh/{owner}/{repo}/HEAD?labpath={quote(notebook, safe='')}"
    return f"[![Binder](https://mybinder.org/badge_logo.svg)]({link})"


def origin(root: Path = ROOT) -> str:
    result = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True)
    if result.returncode:
        raise BinderError(
            "this repository has no remote named origin (git remote get-url origin failed): add the GitHub "
            "repository the course is published in (git remote add origin https://github.com/OWNER/REPO), then run "
            "this again"
        )
    return result.stdout.strip()


def write_badge(readme: Path, line: str) -> None:
    text = readme.read_text()
    if not _BADGE_LINE.search(text):
        raise BinderError(f"{readme.name} has no Binder badge line to replace (a line starting [![Binder](...)")
    readme.write_text(_BADGE_LINE.sub(line.replace("\\", "\\\\"), text, count=1))


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib binder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="write binder/requirements.txt from requirements.txt")
    req.add_argument("--check", action="store_true", help="only check: exit 1 where it is out of date")
    mark = sub.add_parser("badge", help="print the README's Binder badge for this repository's GitHub remote")
    mark.add_argument("--write", action="store_true", help="put it on README.md's badge line")
    args = parser.parse_args(argv)
    try:
        if args.command == "requirements":
            want, path = (
                binder_requirements((root / "requirements.txt").read_text()),
                root / "binder" / "requirements.txt",
            )
            if args.check:
                if path.read_text() != want:
                    print(
                        "binder/requirements.txt is out of date: python -m course_lib binder requirements",
                        file=sys.stderr,
                    )
                    return 1
                return 0
            path.write_text(want)
            print(f"wrote {path.relative_to(root)}")
        else:
            line = badge(origin(root))
            if args.write:
                write_badge(root / "README.md", line)
            print(line)
    except BinderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
