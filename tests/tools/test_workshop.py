"""course_tools.workshop: the README's course table, INSTRUCTORS.md's schedules and notebook facts stay true."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_tools import authoring, workshop

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.quick
def test_the_documents_are_in_step_with_the_notebooks() -> None:
    assert workshop.out_of_step(ROOT) == [], "run `python -m course_lib authoring docs`"


@pytest.mark.quick
def test_every_notebook_has_a_recorded_run_of_its_current_code() -> None:
    assert workshop.stale_runs(ROOT) == []


@pytest.mark.quick
def test_every_notebook_says_itself_in_one_short_sentence_in_both_versions() -> None:
    for solution, learner in authoring.pairs(ROOT / "notebooks"):
        sentences = [
            workshop._SENTENCE.search(nbformat.read(p, as_version=4).cells[0].source) for p in (solution, learner)
        ]
        assert sentences[0] and sentences[1], f"{solution.name}: no '*In one sentence:* ...' in its first cell"
        assert sentences[0]["text"] == sentences[1]["text"]
        assert len(sentences[0]["text"].split()) <= workshop.MAX_SENTENCE_WORDS


@pytest.mark.quick
def test_the_readme_is_the_learners_page() -> None:
    """About 150 lines (the table holds one line per notebook); the instructors' and admins' text is elsewhere."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 190
    for moved in ("jupyterhub_config.py", "sudo ", "bench loader", "salloc"):
        assert moved not in readme, f"{moved!r} belongs in INSTRUCTORS.md"
    assert "INSTRUCTORS.md" in readme and "CONTRIBUTING.md" in readme


@pytest.mark.quick
def test_the_instructors_guide_has_its_parts() -> None:
    guide = (ROOT / "INSTRUCTORS.md").read_text()
    for heading in (
        "## Checklist",
        "## Schedules",
        "### Half a day",
        "### One day",
        "### Three days",
        "### Four days",
        "### Tracks",
        "## The notebooks, one by one",
        "## Known issues per platform",
        "## Setting up a JupyterHub",
        "## Setting up a cluster",
    ):
        assert f"\n{heading}\n" in guide, heading
    for solution, _ in authoring.pairs(ROOT / "notebooks"):
        assert re.search(rf"^### {solution.name[:2]} · ", guide, re.M), f"no notes on notebook {solution.name[:2]}"
    for platform in ("JupyterHub", "Slurm cluster", "Binder", "Linux", "macOS", "Windows"):
        assert re.search(rf"^### .*{platform}", guide.split("## Known issues per platform")[1], re.M), platform


# --------------------------------------------------------------------------- schedules


def _nbs() -> dict[str, workshop.Notebook]:
    return {nb.number: nb for nb in workshop.notebooks(ROOT)}


@pytest.mark.quick
def test_every_plan_fits_its_days_without_overlaps() -> None:
    nbs = _nbs()
    for plan in workshop.PLANS:
        slots, left = workshop.lay_out(plan, nbs)
        assert left >= 0
        for day in {s.day for s in slots}:
            today = [s for s in slots if s.day == day]
            for a, b in zip(today, today[1:]):
                assert a.start + a.minutes == b.start, f"{plan.name}, day {day}: {a} then {b}"
            assert today[0].start == workshop.DAY_START
            assert today[-1].start + today[-1].minutes == (
                workshop.DAY_END if plan.days >= 1 else workshop.BREAKS[1][0]
            )
        placed = {re.match(r"notebook (\d\d)", s.what)[1] for s in slots if s.what.startswith("notebook")}
        assert placed == set(plan.numbers)


@pytest.mark.quick
def test_a_plan_that_does_not_fit_says_what_to_do() -> None:
    plan = workshop.Plan("Too much", 1, tuple(f"{n:02d}" for n in range(1, 15)), True, "nobody")
    with pytest.raises(workshop.DocsError, match="do not fit in 1 days: take notebooks out"):
        workshop.lay_out(plan, _nbs())


@pytest.mark.quick
def test_a_notebook_runs_on_after_a_break_but_never_into_the_next_day() -> None:
    nbs = _nbs()
    slots, _ = workshop.lay_out(workshop.PLANS[-1], nbs)
    continued = [s for s in slots if s.what.endswith("(continued)")]
    assert continued, "some notebook runs across a break"
    for s in continued:
        before = [
            t for t in slots if t.day == s.day and t.start < s.start and not t.what.startswith(("break", "lunch"))
        ]
        assert before[-1].what.startswith(s.what.removesuffix(" (continued)")), s


# --------------------------------------------------------------------------- generating, in a tiny course


def _tiny_course(root: Path, sentence: str = "Learn one thing well.") -> None:
    (root / "notebooks" / "solutions").mkdir(parents=True)
    nb = new_notebook(
        cells=[
            new_markdown_cell(f"# 01 · X: more\n\n**Level 1** · about 5 minutes\n\n*In one sentence:* {sentence}"),
            new_markdown_cell(" ".join(["word"] * 1400) + "\n\n**Claim:** it holds.\n\n### Exercise 01.1 · A"),
            new_code_cell("print(1)"),
        ]
    )
    for path in (root / "notebooks" / "solutions" / "01_x.ipynb", root / "notebooks" / "01_x.ipynb"):
        nbformat.write(nb, path)
    (root / "README.md").write_text(
        "# c\n\n<!-- BEGIN generated: course table (python -m course_lib authoring docs) -->\nold\n"
        "<!-- END generated: course table -->\nafter\n"
    )
    (root / "INSTRUCTORS.md").write_text(
        "# i\n<!-- BEGIN generated: schedules -->\n<!-- END generated: schedules -->\n"
        "<!-- BEGIN generated: notebook facts -->\n<!-- END generated: notebook facts -->\n"
    )


@pytest.mark.quick
def test_write_makes_the_table_from_the_first_cell(tmp_path: Path) -> None:
    _tiny_course(tmp_path)
    table = workshop.course_table(workshop.notebooks(tmp_path))
    assert "| 01 | 1 | [X](notebooks/01_x.ipynb) | 20 min | Learn one thing well. |" in table
    (tmp_path / "course_tools").mkdir()
    (tmp_path / workshop.RUNS_FILE).write_text(
        json.dumps(
            {
                "machine": {"cores": 2},
                "notebooks": {
                    "01": {
                        "seconds": 61,
                        "code": "x",
                        "processes": 3,
                        "torchrun_jobs": 1,
                        "ranks": 2,
                        "s3_server": True,
                        "scratch_mb": 0.2,
                        "shm_mb": 0,
                    }
                },
            }
        )
    )
    facts = workshop.facts_table(tmp_path, workshop.notebooks(tmp_path))
    assert "| 01 | 1.5 min | 3 | 1 job × 2 ranks | yes | <1 MB | – | 1 |" in facts
    assert workshop.stale_runs(tmp_path) == [
        "01_x.ipynb: its code changed since its recorded run: run `python -m course_lib authoring runs 01` on an "
        "idle machine"
    ]


@pytest.mark.quick
def test_a_long_sentence_or_a_missing_marker_is_refused(tmp_path: Path) -> None:
    _tiny_course(tmp_path, sentence=" ".join(["many"] * 21))
    with pytest.raises(workshop.DocsError, match="21 words; say it in 20 or fewer"):
        workshop.notebooks(tmp_path)
    (tmp_path / "x").mkdir()
    _tiny_course(tmp_path / "x")
    (tmp_path / "x" / "README.md").write_text("no markers")
    with pytest.raises(workshop.DocsError, match="README.md: needs one"):
        workshop.generated(tmp_path / "x")
    (tmp_path / "x" / "README.md").write_text(
        "<!-- BEGIN generated: course table -->\n<!-- END generated: course table -->\n"
    )
    with pytest.raises(workshop.DocsError, match="names notebooks 04, 05, which do not exist"):
        workshop.generated(tmp_path / "x")


@pytest.mark.full
def test_record_watches_what_a_notebook_starts(tmp_path: Path) -> None:
    """A real kernel runs a notebook that starts two processes and writes into a scratch folder: both are seen."""
    _tiny_course(tmp_path)
    nb = nbformat.read(tmp_path / "notebooks" / "solutions" / "01_x.ipynb", as_version=4)
    nb.cells[-1] = new_code_cell(
        "import subprocess, sys, tempfile, os, time\n"
        "folder = tempfile.mkdtemp(prefix='course01-')\n"
        "open(os.path.join(folder, 'x'), 'wb').write(b'x' * 3_000_000)\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)']) for _ in range(2)]\n"
        "[p.wait() for p in procs]\n"
        "import shutil; shutil.rmtree(folder)"
    )
    nbformat.write(nb, tmp_path / "notebooks" / "solutions" / "01_x.ipynb")
    (tmp_path / "course_tools").mkdir()
    runs = workshop.record(tmp_path, ["01"], show=lambda line: None)
    got = runs["notebooks"]["01"]
    assert got["processes"] >= 2 and got["scratch_mb"] >= 2 and got["torchrun_jobs"] == 0 and not got["s3_server"]
    assert workshop.stale_runs(tmp_path) == []
