"""course_tools.authoring: learner notebooks are generated from solution notebooks."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_tools import authoring

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
