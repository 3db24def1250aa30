"""Every shell and Python block of the course's documents runs, as written, in a scratch copy of the course.

Which blocks there are, and which run elsewhere, with a stand-in, or not at all (and why): tests/documented_blocks.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from documented_blocks import AROUND, ELSEWHERE, NOT_RUN, ROOT, STAND_INS, TIMEOUTS, Block, blocks, entry, key


@pytest.mark.quick
def test_every_block_is_run_or_says_why_not() -> None:
    found = blocks()
    assert len(found) >= 15, f"only {len(found)} blocks: did the documents' fences change?"
    names = {key(b.name) for b in found}
    for table in (ELSEWHERE, NOT_RUN, STAND_INS, AROUND):
        stale = [k for k in table if key(k) not in names]
        assert not stale, f"entries that name no block (the document changed: update the entry): {stale}"
    assert len({key(b.name) for b in found}) == len(found), "two blocks start with the same line: tell them apart"
    skipped = [b.name for b in found if entry(NOT_RUN, b)]
    assert len(skipped) <= len(found) / 4, f"{len(skipped)} of {len(found)} blocks are not run: {skipped}"


@pytest.mark.quick
def test_blocks_run_elsewhere_are_read_there() -> None:
    for name, where in ELSEWHERE.items():
        for test in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", where):
            path, function = ROOT / test[0], test[1]
            assert path.exists(), f"{name}: {test[0]} does not exist"
            text = path.read_text()
            assert not function or f"def {function}(" in text, f"{name}: no {function} in {test[0]}"
            document = name.split(":")[0]
            assert document in text or "README" in text, f"{name}: {test[0]} does not read {document}"


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A scratch copy of the course, as a learner's clone is, with this environment as its .venv."""
    top = tmp_path_factory.mktemp("documents")
    copy = top / "pytorch-data-course"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = copy / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (copy / ".venv").symlink_to(Path(sys.prefix))
    for command in (
        ["git", "init", "-q"],
        ["git", "remote", "add", "origin", "https://github.com/you/pytorch-data-course.git"],
    ):
        subprocess.run(command, cwd=copy, check=True)
    home, tmp, data, out = top / "home", top / "tmp", top / "tmp" / "course-data", top / "out"
    for folder in (home, tmp, out):
        folder.mkdir()
    return {"copy": copy, "home": home, "tmp": tmp, "data": data, "out": out}


def _run(block: Block, course: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    code = block.code
    for old, new in entry(STAND_INS, block) or []:
        assert old in code, f"{block.name}: the stand-in's {old!r} is no longer in the block: update STAND_INS"
        code = code.replace(old, new.format(data=course["data"], out=course["out"]))
    before, after = entry(AROUND, block) or ("", "")
    code = before + code + after
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PYTEST_", "JUPYTER", "VIRTUAL_ENV"))}
    env.update(
        HOME=str(course["home"]),
        TMPDIR=str(course["tmp"]),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        XDG_CACHE_HOME=str(course["home"] / ".cache"),
    )
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if block.language == "bash" else [sys.executable, "-c", code]
    return subprocess.run(
        command,
        cwd=course["copy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUTS.get(key(block.name), 120),
    )


RUN_HERE = [b for b in blocks() if not entry(NOT_RUN, b) and not entry(ELSEWHERE, b)]


@pytest.mark.full
@pytest.mark.parametrize("block", RUN_HERE, ids=[key(b.name)[:60] for b in RUN_HERE])
def test_the_block_runs(block: Block, course: dict[str, Path]) -> None:
    done = _run(block, course)
    assert done.returncode == 0, (
        f"{block.name}\nexit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
