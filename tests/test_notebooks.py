"""Notebook hygiene that nbval cannot see.

nbval re-executes every notebook and compares outputs, but it silently passes a cell whose stored
version was never executed. These tests make sure what is committed was executed top to bottom,
that learner notebooks match their solutions, that learners see "not attempted" where solutions
see "solved", and that nothing machine-specific or downloaded slipped in.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from course_tools import authoring

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = sorted((NOTEBOOKS / "solutions").glob("[0-9][0-9]_*.ipynb"))
LEARNERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
ALL = LEARNERS + SOLUTIONS
EXERCISE_LINE = re.compile(r"^(✅|⬜|❌) Exercise (\d\d\.\d) ", re.M)


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(NOTEBOOKS)) for p in paths]


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def outputs_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_the_readme_counts_and_lists_every_notebook() -> None:
    """The intro's count ("Twelve notebooks") and the course table follow notebooks/, whatever it holds."""
    readme = (ROOT / "README.md").read_text()
    words = (
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".split()
    )
    assert f"{words[len(LEARNERS)].capitalize()} notebooks" in readme, (
        f"the README should say {len(LEARNERS)} notebooks"
    )
    rows = re.findall(r"^\| (\d\d) \| [1-5] \| \[[^\]]+\]\(notebooks/([^)]+\.ipynb)\)", readme, re.M)
    assert [f"{nn}_" for nn, _ in rows] == [p.name[:3] for p in LEARNERS]
    assert [name for _, name in rows] == [p.name for p in LEARNERS]


def test_every_solution_has_a_learner_version_and_vice_versa() -> None:
    assert SOLUTIONS, "no notebooks found"
    assert [p.name for p in SOLUTIONS] == [p.name for p in LEARNERS]


def test_learner_notebooks_are_generated_from_the_solutions() -> None:
    assert authoring.out_of_sync(NOTEBOOKS) == []


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_committed_executed_in_order_without_errors(path: Path) -> None:
    nb = read(path)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in code]
    assert None not in counts, f"cells never executed: {[i for i, n in enumerate(counts) if n is None]}"
    assert counts == list(range(1, len(code) + 1)), "run the notebook top to bottom in a fresh kernel"
    for c in code:
        for out in c.outputs:
            assert out.output_type != "error", f"a stored error: {out.get('ename')}: {out.get('evalue')}"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_no_machine_paths_in_outputs(path: Path) -> None:
    roots = {str(ROOT.parent), os.path.expanduser("~"), tempfile.gettempdir(), sys.prefix}
    pattern = re.compile("|".join(re.escape(r.rstrip("/") + "/") for r in roots if len(r) > 1))
    for i, cell in enumerate(read(path).cells):
        match = pattern.search(outputs_text(cell))
        assert match is None, f"cell {i} shows a path of this machine: {match.group(0)}..."


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_nothing_is_downloaded(path: Path) -> None:
    for cell in read(path).cells:
        if cell.cell_type == "code":
            assert "download=True" not in cell.source and "urlretrieve" not in cell.source


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_lesson_structure(path: Path) -> None:
    nb = read(path)
    intro = nb.cells[0].source
    assert re.search(r"\*\*Level [1-5]\*\*", intro), "the first cell states the level"
    assert "Prerequisites" in intro and "By the end you will be able to" in intro
    assert any(c.cell_type == "markdown" and "## Summary" in c.source for c in nb.cells)
    assert any(c.cell_type == "markdown" and "Pitfall" in c.source for c in nb.cells), "reproduce a pitfall"
    figures = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert figures, "at least one real matplotlib figure"
    assert EXERCISE_LINE.search("".join(outputs_text(c) for c in nb.cells)), "exercises that check themselves"
    exercises = authoring.timing(nb).exercises  # the "### Exercise NN.N · ..." headings
    assert 4 <= len(exercises) <= 6, "the README promises 4–6 exercises per notebook"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=ids(SOLUTIONS))
def test_solutions_solve_and_learners_start_unsolved(solution: Path) -> None:
    solved = EXERCISE_LINE.findall("".join(outputs_text(c) for c in read(solution).cells))
    learner = EXERCISE_LINE.findall("".join(outputs_text(c) for c in read(NOTEBOOKS / solution.name).cells))
    assert solved and all(mark == "✅" for mark, _ in solved), solved
    assert [code for _, code in learner] == [code for _, code in solved]
    assert all(mark == "⬜" for mark, _ in learner), learner


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_notebooks_stay_small(path: Path) -> None:
    assert path.stat().st_size < 1_500_000, "keep figures small (fewer images, smaller figsize)"


def test_sanitize_patterns_only_mask_what_is_measured() -> None:
    """The sanitize file must not be so broad that a wrong deterministic output could pass."""
    from nbval.plugin import get_sanitize_patterns  # read the file exactly as nbval does

    patterns = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())
    regexes = [re.compile(regex) for regex, _ in patterns]
    deterministic = (
        "✅ Exercise 01.1 solved",
        "shapes-small-seed0: 800 train + 200 val images",
        "[44, 633, 667]",
        "True",
        "under 10 %",
        "25 batches, 800 samples",
        "epochs the workers saw: [[0], [0], [0]]",
        "accuracy on 200 held-out points: 99%",
        "buckets of 64 sequences: 31% padding, 5% of batch-mates together",
        "padding: random batches 47%, bucketed 11%",
        "simulated latency 1 ms per open",
        "(9 ms decode per sample,",
        "bucketing: 1.7 times fewer padded tokens",
        "WebDataset on disk 3.79 MB",
        "under the 15 % target: True",
    )
    for text in deterministic:
        assert not any(r.search(text) for r in regexes), text
    measured = (
        "12.5×",
        "420 µs per sample",
        "0x7f3a2b1c0d",
        "in 1.10 s: 726",
        "first batch after 26.6 ms",
        "after 73 ms, 84 ms, 84 ms",
        "185 ms per GB",
        "1297 samples/s",
        "35.9 MB/s",
        "waiting for data: 54% of",
        "busy: main 53%",
        "w1 50%",
        "the loop waits 31% of",
        "waiting 59% of the time",
        "worker (pid(s) 1234, 5678) exited",
        "pid=42",
        "PSS 863 MB",
        "2 workers beat 0 → holds: 1.9× (median of 5 rounds, spread ±0.1×)",
        "2 workers beat 0 → inconclusive on this machine: 1.1× (median of 5 rounds) is within twice the rounds' spread",
    )
    for text in measured:
        assert any(r.search(text) for r in regexes), text

    # a claim's verdict: holds and inconclusive compare equal, and "does not hold" stays different
    def sanitized(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    held = sanitized("2 workers beat 0 → holds: 1.9× (median of 5 rounds, spread ±0.1×)\nnext line")
    assert (
        held
        == sanitized(
            "2 workers beat 0 → inconclusive on this machine: 1.0× (median of 5 rounds) is "
            "within twice the rounds' spread (±0.3×) of 1.0×\nnext line"
        )
        == "2 workers beat 0 → holds\nnext line"
    )
    assert held != sanitized("2 workers beat 0 → does not hold: 0.6× (median of 5 rounds, spread ±0.1×)\nnext line")


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_ratios_are_printed_without_padding(path: Path) -> None:
    """`{r:5.1f}×` pads '9.8×' and '12.8×' differently; the sanitizer masks digits, not spaces."""
    for cell in read(path).cells:
        if cell.cell_type == "code":
            assert not re.search(r":\d+(\.\d+)?f\}\s*×", cell.source), cell.source


CLAIM_LINE = re.compile(r"^(?P<statement>.+?) → (?P<verdict>holds|does not hold|inconclusive on this machine):", re.M)
CLAIM_SENTENCE = re.compile(r"\*\*Claim:\*\* (?P<statement>[^\n]+?)\.?$", re.M)


def claims_in(nb: nbformat.NotebookNode) -> list[tuple[int, str, str]]:
    """``(cell index, statement, verdict)`` of every measured claim (course_lib.claims) a notebook's outputs print."""
    return [
        (i, m["statement"].strip(), m["verdict"])
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for m in CLAIM_LINE.finditer(outputs_text(c))
    ]


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_stored_claims_hold(path: Path) -> None:
    """The stored outputs were made on an idle machine: every measured claim holds there. A claim that says
    "inconclusive" in a stored output could hide behind the sanitize file forever; one that fails contradicts
    the prose that states it."""
    nb = read(path)
    for i, statement, verdict in claims_in(nb):
        assert verdict == "holds", (
            f"cell {i}: {statement!r} → {verdict}: re-execute on an idle machine, or fix the claim"
        )
    for i, cell in enumerate(nb.cells):
        assert "inconclusive on this machine" not in outputs_text(cell), f"cell {i} stores an inconclusive result"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_each_marked_claim_is_printed_by_the_next_code_cell(path: Path) -> None:
    """The convention: a markdown line ``**Claim:** STATEMENT.`` states what the next code cell measures, and that
    cell's stored output prints ``STATEMENT → holds: ...``. So the prose and the measurement cannot disagree."""
    nb = read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for m in CLAIM_SENTENCE.finditer(cell.source):
            following = next((c for c in nb.cells[i + 1 :] if c.cell_type == "code"), None)
            assert following is not None, f"cell {i}: the claim {m['statement']!r} has no code cell after it"
            printed = {s: v for _, s, v in claims_in(nbformat.v4.new_notebook(cells=[following]))}
            assert printed.get(m["statement"]) == "holds", (
                f"cell {i} claims {m['statement']!r}; the next code cell prints {printed or 'no claim'}"
            )


def test_the_claims_in_the_notebooks() -> None:
    """The notebooks print measured claims through course_lib.claims, and announce them in their prose."""
    printed = [s for p in SOLUTIONS for _, s, _ in claims_in(read(p))]
    marked = [
        m["statement"]
        for p in SOLUTIONS
        for c in read(p).cells
        if c.cell_type == "markdown"
        for m in CLAIM_SENTENCE.finditer(c.source)
    ]
    assert printed, "no notebook prints a measured claim"
    assert set(marked) <= set(printed)


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_the_stated_time_follows_the_rule(path: Path) -> None:
    """One rule sets every time (course_tools.authoring.TIME_RULE); `python -m course_lib authoring times` applies it."""
    want = authoring.timing(read(NOTEBOOKS / "solutions" / path.name)).header()
    assert authoring.stated_time(read(path)) == want, "run `python -m course_lib authoring times`"


def test_the_readme_states_the_time_rule_and_follows_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert authoring.TIME_RULE in readme
    total = 0
    for path in SOLUTIONS:
        t = authoring.timing(read(path))
        total += t.minutes
        core = f" ({t.core_minutes})" if t.stretch else ""
        assert f"](notebooks/{path.name}) | {t.minutes} min{core} |" in readme, (
            "run `python -m course_lib authoring times`"
        )
    assert f"About {round(total / 30) / 2:g} hours in all" in readme
