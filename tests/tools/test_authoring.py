"""course_tools.authoring: learner notebooks are generated from solution notebooks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_tools import authoring

pytestmark = pytest.mark.quick

SOLUTION = """\
def f(x):
    ### BEGIN SOLUTION
    return x * 2
    ### END SOLUTION
    ### BEGIN STUB
    # raise NotImplementedError  # your code here
    ### END STUB

### BEGIN SOLUTION
answer = f(21)
### END SOLUTION
### BEGIN STUB
# answer = ...
### END STUB
check(answer)"""

LEARNER = """\
def f(x):
    raise NotImplementedError  # your code here

answer = ...

check(answer)"""  # a blank line after a stub: the learner's answer stands apart from the check


def test_learner_source_drops_solutions_and_uncomments_stubs() -> None:
    assert authoring.learner_source(SOLUTION) == LEARNER
    assert authoring.learner_source("x = 1\n# a comment") == "x = 1\n# a comment"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("### BEGIN SOLUTION\nx = 1", "never closed"),
        ("### END SOLUTION", "without a matching BEGIN"),
        ("### BEGIN SOLUTION\n### BEGIN STUB\n### END STUB\n### END SOLUTION", "inside an open solution block"),
        ("### BEGIN STUB\nx = 1\n### END STUB", "must be commented out"),
    ],
)
def test_unbalanced_markers_are_reported(bad: str, message: str) -> None:
    with pytest.raises(authoring.MarkerError, match=message):
        authoring.learner_source(bad)


def test_make_learner_clears_outputs_and_keeps_markdown() -> None:
    cell = new_code_cell(SOLUTION, execution_count=3, outputs=[new_output("stream", name="stdout", text="✅")])
    cell.metadata["tags"] = ["nbval-ignore-output"]
    nb = new_notebook(cells=[new_markdown_cell("# Title"), cell])
    learner = authoring.make_learner(nb)
    assert learner.cells[0].source == "# Title"
    assert learner.cells[1].source == LEARNER and learner.cells[1].outputs == []
    assert learner.cells[1].execution_count is None and learner.cells[1].metadata["tags"] == ["nbval-ignore-output"]
    assert nb.cells[1].outputs, "the solution notebook itself is left untouched"


def test_out_of_sync_detects_an_edited_solution(tmp_path: Path) -> None:
    (tmp_path / "solutions").mkdir()
    nb = new_notebook(cells=[new_code_cell(SOLUTION)])
    nbformat.write(nb, tmp_path / "solutions" / "01_demo.ipynb")
    assert authoring.out_of_sync(tmp_path) == ["01_demo.ipynb: missing (run `python -m course_lib authoring build`)"]
    authoring.build(tmp_path, run=False)
    assert authoring.out_of_sync(tmp_path) == []
    nb.cells[0].source += "\nprint('new line')"
    nbformat.write(nb, tmp_path / "solutions" / "01_demo.ipynb")
    assert "differs from what 01_demo.ipynb generates" in authoring.out_of_sync(tmp_path)[0]


def test_build_executes_both_versions(tmp_path: Path) -> None:
    (tmp_path / "solutions").mkdir()
    nb = new_notebook(cells=[new_code_cell("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION\nprint(x)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "solutions" / "01_demo.ipynb")
    authoring.build(tmp_path, ["01"])
    solved = nbformat.read(tmp_path / "solutions" / "01_demo.ipynb", as_version=4)
    learner = nbformat.read(tmp_path / "01_demo.ipynb", as_version=4)
    assert solved.cells[0].outputs[0].text == "2\n" and learner.cells[0].outputs[0].text == "1\n"
    assert learner.cells[0].execution_count == 1


def test_cli_check_exits_1_on_a_stale_learner_notebook(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(The repository's own notebooks are checked by tests/test_notebooks.py.)"""
    (tmp_path / "solutions").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(SOLUTION)]), tmp_path / "solutions" / "01_demo.ipynb")
    authoring.build(tmp_path, run=False)
    assert authoring.main(["--notebooks", str(tmp_path), "check"]) == 0 and "up to date" in capsys.readouterr().out
    (tmp_path / "01_demo.ipynb").write_text((tmp_path / "01_demo.ipynb").read_text().replace("answer", "answr"))
    assert authoring.main(["--notebooks", str(tmp_path), "check"]) == 1 and "differs" in capsys.readouterr().out


def test_cli_needs_a_solutions_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        authoring.main(["--notebooks", str(tmp_path), "check"])


# --------------------------------------------------------------------------- honest times


def _course_notebook(words: int, exercises: list[str], stated: str = "about 5 minutes") -> nbformat.NotebookNode:
    prose = " ".join(["word"] * words)
    cells = [
        new_markdown_cell(f"# 01 · X\n\n**Level 1** · {stated} · *Prerequisites:* none."),
        new_markdown_cell(prose + "\n\n```python\nnot counted at all\n```\n<!-- nor this -->"),
    ]
    cells += [new_markdown_cell(f"### Exercise {title}") for title in exercises]
    return new_notebook(cells=cells)


def test_the_time_rule_counts_prose_and_exercises_and_rounds_up_to_5() -> None:
    nb = _course_notebook(1488, ["01.1 · A dataset (build)", "01.2 · A split"])
    t = authoring.timing(nb)
    # 1488 + the header's 9 words (01 X Level 1 about 5 minutes Prerequisites none; "·" is none) + 5 + 4
    assert t.words == authoring.prose_words(nb) == 1506
    assert (t.exercises, t.stretch) == (("01.1", "01.2"), ())
    assert t.minutes == 35 and t.header() == "about 35 minutes"  # 1506 / 150 + 20 = 30.04 -> 35
    assert authoring.Timing(1500, ("a",), ()).minutes == 20  # exactly 20: not rounded further


def test_link_addresses_and_the_further_reading_are_not_prose() -> None:
    nb = _course_notebook(100, [])
    words = authoring.prose_words(nb)
    nb.cells[1].source += " [the tutorial](https://pytorch.org/tutorials/beginner/basics/data_tutorial.html)"
    assert authoring.prose_words(nb) == words + 2  # "the tutorial", not the address
    nb.cells[1].source += "\n\n**Further reading:**\n\n- [a page](https://example.org/a) — why it helps, in many words"
    assert authoring.prose_words(nb) == words + 2  # read after the class


def test_stretch_exercises_are_marked_in_their_heading_and_timed_apart() -> None:
    nb = _course_notebook(
        1350, ["01.1 · A dataset (build)", "01.2 · A big file (build, stretch)", "01.3 · More (stretch)"]
    )
    t = authoring.timing(nb)
    assert t.stretch == ("01.2", "01.3")
    assert t.words == 1375 and (t.minutes, t.core_minutes) == (40, 20)  # 9.2 + 30 and 9.2 + 10, rounded up
    assert t.header() == "about 40 minutes (20 without the stretch exercises)"
    one = authoring.Timing(1500, ("a", "b"), ("b",))
    assert one.header() == "about 30 minutes (20 without the stretch exercise)"


def test_write_times_sets_headers_and_the_documents_and_keeps_outputs(tmp_path: Path) -> None:
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    nb = _course_notebook(1350, ["01.1 · A (build)", "01.2 · B (stretch)"])
    nb.cells[0].source += "\n\n*In one sentence:* Things, said short."
    nb.cells.append(
        new_code_cell("print(1)", outputs=[new_output("stream", name="stdout", text="1\n")], execution_count=1)
    )
    for path in (tmp_path / "notebooks" / "solutions" / "01_x.ipynb", tmp_path / "notebooks" / "01_x.ipynb"):
        nbformat.write(nb, path)
    (tmp_path / "README.md").write_text(
        "<!-- BEGIN generated: course table -->\n| 01 | 1 | [x](notebooks/01_x.ipynb) | 10 min | things |\n"
        "<!-- END generated: course table -->\n"
    )
    authoring.write_times(tmp_path, show=lambda line: None)
    for path in (tmp_path / "notebooks" / "solutions" / "01_x.ipynb", tmp_path / "notebooks" / "01_x.ipynb"):
        written = nbformat.read(path, as_version=4)
        assert "about 30 minutes (20 without the stretch exercise) ·" in written.cells[0].source  # 1367 words
        assert written.cells[-1].outputs[0]["text"] == "1\n"
    readme = (tmp_path / "README.md").read_text()
    assert "| [X](notebooks/01_x.ipynb) | 30 min (20) | Things, said short. |" in readme
    assert "About 0.5 hours in all" in readme


def test_write_times_needs_a_stated_time(tmp_path: Path) -> None:
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    nb = _course_notebook(10, [], stated="soon")
    for path in (tmp_path / "notebooks" / "solutions" / "01_x.ipynb", tmp_path / "notebooks" / "01_x.ipynb"):
        nbformat.write(nb, path)
    (tmp_path / "README.md").write_text("About 1 hours in all")
    with pytest.raises(SystemExit, match="states no time"):
        authoring.write_times(tmp_path, show=lambda line: None)


# --------------------------------------------------------------------------- renumber: a tiny course in tmp_path

CHECKS = '''"""Checks for notebook 02 (loaders).

02.1 counts batches; 02.2 is checked in workers (notebook 03 explains why). 1000 / 64 = 15.6 batches.
"""
from ._core import exercise


@exercise("02.1", "batch 10 of seed 11 holds 10 % of the samples.")
def count(fn):
    with tempfile.TemporaryDirectory(prefix="course02-") as folder:
        return fn(folder)


@exercise("02.2", "see exercise 02.1 and exercises 02.1–02.2.")
def workers(fn):
    return fn(10)
'''
CHECK_TESTS = '''"""The checks of notebook 02."""
from course_lib.checks import nb02


def _loader02(n):
    return list(range(n))  # 10 items, batch 10


# ----------------------------------------------------------------- 02.1: count
def test_02_count():
    assert nb02.count.evaluate(_loader02).passed  # the 02.1 check
'''
README = """# A tiny course

| # | level | notebook |
| --- | --- | --- |
| 01 | 1 | [intro](notebooks/01_intro.ipynb) |
| 02 | 2 | [loaders](notebooks/02_loaders.ipynb) |
| 03 | 2 | [shards](notebooks/03_shards.ipynb) |

Notebooks 02–03 use 10 % more memory; notebooks 01 and 03 (shards) run with batch 10 and seed 11.
`loaders` (02), `shards` (03): see `python -m course_lib authoring build 02`.
Hosts n[02-03] and gpu02 are not notebooks, nor are 12.5× or version 02.1.
"""
HELPERS = '''"""Notebooks 02–03: helpers shared by the loaders and the shards (notebook 03)."""


def batches(n=10, seed=11):
    """Notebook 02, section 1: ``n`` batches of 02 items (not a notebook number)."""
    return scratch_folder("02"), n, seed


SCOPE = r"^notebooks/solutions/(02_)"  # a regular expression naming both versions of notebook 02
'''
DECK = """# Level 1

Feeding PyTorch with data: notebooks 01, 02 and 03

![A figure](notebook:02#abc123)

| question | notebooks |
| --- | --- |
| does it load? | 01, 02 |
"""


def _notebook(number: str, title: str, body: str, output: str = "") -> nbformat.NotebookNode:
    code = new_code_cell(
        body, execution_count=1, outputs=[new_output("stream", name="stdout", text=output)] if output else []
    )
    return new_notebook(
        cells=[new_markdown_cell(f"# {number} · {title}\n\n*Prerequisites:* notebook 01 (intro)."), code]
    )


def tiny_course(root: Path) -> Path:
    """Three notebooks (both versions), the checks of 02 and their tests, a README, a deck, a library module."""
    (root / "notebooks" / "solutions").mkdir(parents=True)
    notebooks = {
        "01_intro": _notebook("01", "Intro", "x = 10  # batch 10, seed 11"),
        "02_loaders": _notebook(
            "02",
            "Loaders",
            'from course_lib.checks import nb02 as check\nwork = data.scratch_folder("02")\n'
            "check.count(count)  # batch 10, seed 11, 10 %",
            "✅ Exercise 02.1 solved: batch 10 of seed 11 holds 10 % of the samples.\n",
        ),
        "03_shards": _notebook(
            "03", "Shards", "print('see notebook 02, and notebooks 01-02')", "see notebook 02, and notebooks 01-02\n"
        ),
    }
    for name, nb in notebooks.items():
        nbformat.write(nb, root / "notebooks" / "solutions" / f"{name}.ipynb")
        nbformat.write(authoring.make_learner(nb), root / "notebooks" / f"{name}.ipynb")
    files = {
        "course_lib/checks/nb02.py": CHECKS,
        "tests/test_checks_nb02.py": CHECK_TESTS,
        "README.md": README,
        "course_lib/helpers.py": HELPERS,
        "slides/decks/level1.md": DECK,
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_renumber_insert_moves_and_rewrites_everything_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tiny_course(tmp_path)
    before = snapshot(root)
    assert authoring.main(["renumber", "--insert", "02", "--root", str(root)]) == 0
    files = snapshot(root)
    assert sorted(files) == [
        "README.md",
        "course_lib/checks/nb03.py",
        "course_lib/helpers.py",
        "notebooks/01_intro.ipynb",
        "notebooks/03_loaders.ipynb",
        "notebooks/04_shards.ipynb",
        "notebooks/solutions/01_intro.ipynb",
        "notebooks/solutions/03_loaders.ipynb",
        "notebooks/solutions/04_shards.ipynb",
        "slides/decks/level1.md",
        "tests/test_checks_nb03.py",
    ]
    text = {path: data.decode() for path, data in files.items()}
    assert text["course_lib/checks/nb03.py"] == CHECKS.replace("notebook 02", "notebook 03").replace(
        "notebook 03 explains", "notebook 04 explains"
    ).replace('"02.', '"03.').replace("02.1 counts", "03.1 counts").replace("02.2 is", "03.2 is").replace(
        "course02-", "course03-"
    ).replace("exercise 02.1 and exercises 02.1–02.2", "exercise 03.1 and exercises 03.1–03.2")
    assert text["tests/test_checks_nb03.py"] == CHECK_TESTS.replace("02", "03")
    assert text["README.md"] == README.replace(
        "| 03 | 2 | [shards](notebooks/03_shards", "| 04 | 2 | [shards](notebooks/04_shards"
    ).replace("| 02 | 2 | [loaders](notebooks/02_loaders", "| 03 | 2 | [loaders](notebooks/03_loaders").replace(
        "Notebooks 02–03", "Notebooks 03–04"
    ).replace("notebooks 01 and 03", "notebooks 01 and 04").replace(
        "`loaders` (02), `shards` (03)", "`loaders` (03), `shards` (04)"
    ).replace("build 02", "build 03")
    assert "n[02-03] and gpu02 are not notebooks, nor are 12.5× or version 02.1" in text["README.md"]
    assert text["course_lib/helpers.py"] == HELPERS.replace("Notebooks 02–03", "Notebooks 03–04").replace(
        "(notebook 03)", "(notebook 04)"
    ).replace("Notebook 02,", "Notebook 03,").replace('scratch_folder("02")', 'scratch_folder("03")').replace(
        "solutions/(02_)", "solutions/(03_)"
    ).replace("versions of notebook 02", "versions of notebook 03")
    assert text["slides/decks/level1.md"] == DECK.replace("01, 02 and 03", "01, 03 and 04").replace(
        "notebook:02#", "notebook:03#"
    ).replace("| 01, 02 |", "| 01, 03 |")

    loaders = nbformat.read(root / "notebooks" / "solutions" / "03_loaders.ipynb", as_version=4)
    assert loaders.cells[0].source == "# 03 · Loaders\n\n*Prerequisites:* notebook 01 (intro)."
    assert loaders.cells[1].source == (
        'from course_lib.checks import nb03 as check\nwork = data.scratch_folder("03")\n'
        "check.count(count)  # batch 10, seed 11, 10 %"
    )
    assert (
        loaders.cells[1].outputs[0].text == "✅ Exercise 03.1 solved: batch 10 of seed 11 holds 10 % of the samples.\n"
    )
    shards = nbformat.read(root / "notebooks" / "04_shards.ipynb", as_version=4)
    assert shards.cells[0].source.startswith("# 04 · Shards")
    assert shards.cells[1].source == "print('see notebook 03, and notebooks 01-03')"
    solution = nbformat.read(root / "notebooks" / "solutions" / "04_shards.ipynb", as_version=4)
    assert solution.cells[1].outputs[0].text == "see notebook 03, and notebooks 01-03\n"
    for path in [p for p in files if p.endswith(".ipynb")]:  # the JSON layout nbformat writes, kept
        assert text[path] == nbformat.writes(nbformat.reads(text[path], as_version=4)) + "\n"
    assert authoring.out_of_sync(root / "notebooks") == []
    assert all(files[path] == before[path] for path in before if "/01_intro" in path)

    out = capsys.readouterr().out
    assert "renumbering 02 -> 03, 03 -> 04" in out and "files moved: 6" in out and "files edited: 9" in out
    assert "  notebooks/solutions/02_loaders.ipynb -> notebooks/solutions/03_loaders.ipynb" in out
    assert "  exercise NN.K: " in out and "  table cell: " in out and "  notebooks NN, NN and NN–NN: " in out


def test_renumber_dry_run_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tiny_course(tmp_path)
    before = snapshot(root)
    assert authoring.main(["renumber", "--insert", "03", "--dry-run", "--root", str(root)]) == 0
    assert snapshot(root) == before
    out = capsys.readouterr().out
    assert "(dry run: nothing was changed)" in out and "files moved: 2" in out
    assert (
        "-| 03 | 2 | [shards](notebooks/03_shards.ipynb) |" in out
        and "+| 04 | 2 | [shards](notebooks/04_shards.ipynb) |" in out
    )
    assert "notebooks/solutions/03_shards.ipynb -> notebooks/solutions/04_shards.ipynb" in out


@pytest.mark.parametrize(
    "insert, message",
    [
        ("00", "numbered from 01; --insert 01 makes room for a new first notebook"),
        ("05", "the last notebook is 03, so a new one goes at 04 at the most"),
        ("x", "give the number the new notebook will have, e.g. --insert 03"),
        ("123", "give the number the new notebook will have"),
    ],
)
def test_renumber_refuses_a_bad_insert_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], insert: str, message: str
) -> None:
    root = tiny_course(tmp_path)
    before = snapshot(root)
    assert authoring.main(["renumber", "--insert", insert, "--root", str(root)]) == 2
    assert message in capsys.readouterr().err
    assert snapshot(root) == before


def test_renumber_after_the_last_notebook_moves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tiny_course(tmp_path)
    before = snapshot(root)
    assert authoring.main(["renumber", "--insert", "04", "--root", str(root)]) == 0
    assert "nothing to renumber" in capsys.readouterr().out and snapshot(root) == before


def test_renumber_never_overwrites_a_file_in_the_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tiny_course(tmp_path)
    (root / "course_lib" / "checks" / "nb03.py").write_text("# checks of notebook 03\n")
    (root / "course_lib" / "checks" / "nb04.py").write_text("# a leftover, of no notebook\n")
    before = snapshot(root)
    assert authoring.main(["renumber", "--insert", "02", "--root", str(root)]) == 2
    assert (
        "course_lib/checks/nb03.py would move to course_lib/checks/nb04.py, which exists already"
        in capsys.readouterr().err
    )
    assert snapshot(root) == before


def test_renumber_needs_a_course(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert authoring.main(["renumber", "--insert", "02", "--root", str(tmp_path)]) == 2
    assert "run from the repository root or pass --root" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_renumber_moves_tracked_files_with_git(tmp_path: Path) -> None:
    root = tiny_course(tmp_path)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a tiny course"]):
        subprocess.run(git + args, check=True)
    assert authoring.main(["renumber", "--insert", "03", "--root", str(root)]) == 0
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert "R  notebooks/03_shards.ipynb -> notebooks/04_shards.ipynb" in status.replace("RM ", "R  ")
    assert not any(line.startswith("??") for line in status.splitlines()), status
