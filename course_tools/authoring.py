"""Maintainers' tool: produce learner notebooks from solution notebooks, and re-execute them.

The source of truth for each notebook is its solution version, ``notebooks/solutions/NN_*.ipynb``.
In its code cells, exercise answers sit between markers::

    ### BEGIN SOLUTION
    train_part, holdout = random_split(train, [0.8, 0.2], generator=torch.Generator().manual_seed(42))
    ### END SOLUTION
    ### BEGIN STUB
    # train_part, holdout = ...
    ### END STUB

The learner version, ``notebooks/NN_*.ipynb``, drops the solution lines and uncomments the stub
lines (the first ``# `` after the indentation). Markers themselves never reach learners.

Commands (run from the repository root)::

    python -m course_lib authoring build            # regenerate learner notebooks, execute all
    python -m course_lib authoring build 02_transforms --no-execute
    python -m course_lib authoring check            # are the learner notebooks up to date?
    python -m course_lib authoring times            # state every notebook's time by the rule (headers, documents)
    python -m course_lib authoring docs             # the generated parts of README.md and INSTRUCTORS.md
    python -m course_lib authoring runs 04          # Run All a solution notebook, record what it takes and starts
    python -m course_lib authoring renumber --insert 10 --dry-run   # make room for a new notebook 10

``renumber`` moves every notebook numbered NN or above up by one, with everything named after it
(both notebook versions, ``course_lib/checks/nbNN.py``, ``tests/test_checks_nbNN.py``) and every
reference to it in the repository's text files; see :data:`RULES` for the references it rewrites.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import fnmatch
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_STUB, END_STUB = "### BEGIN STUB", "### END STUB"
_UNCOMMENT = re.compile(r"^(\s*)# ?")


class MarkerError(ValueError):
    """Solution/stub markers are unbalanced or nested."""


def learner_source(source: str) -> str:
    """The learner's version of one code cell's source (see the module docstring)."""
    out: list[str] = []
    mode: str | None = None
    after_stub = False  # a stub is followed by a blank line, so the learner's answer stands apart from the check
    for n, line in enumerate(source.splitlines(), 1):
        marker = line.strip()
        if after_stub and marker and marker not in (BEGIN_SOLUTION, BEGIN_STUB):
            out.append("")
        after_stub = False
        if marker in (BEGIN_SOLUTION, BEGIN_STUB):
            if mode is not None:
                raise MarkerError(f"line {n}: {marker!r} inside an open {mode} block")
            mode = "solution" if marker == BEGIN_SOLUTION else "stub"
            continue
        if marker in (END_SOLUTION, END_STUB):
            expected = "solution" if marker == END_SOLUTION else "stub"
            if mode != expected:
                raise MarkerError(f"line {n}: {marker!r} without a matching BEGIN")
            mode, after_stub = None, marker == END_STUB
            continue
        if mode == "solution":
            continue
        if mode == "stub" and line.strip():
            if not line.lstrip().startswith("#"):
                raise MarkerError(f"line {n}: stub lines must be commented out in the solution notebook")
            line = _UNCOMMENT.sub(r"\1", line, count=1)
        out.append(line)
    if mode is not None:
        raise MarkerError(f"a {mode} block is never closed")
    return "\n".join(out)


def make_learner(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A learner notebook: solution lines removed, stubs uncommented, outputs cleared."""
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = learner_source(cell.source)
        cell.outputs = []
        cell.execution_count = None
    return nb


def execute(path: Path, timeout: int = 600) -> float:
    """Execute a notebook in place, top to bottom, in its own folder; return the seconds taken."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def pairs(notebooks: Path, names: list[str] | None = None) -> list[tuple[Path, Path]]:
    """(solution, learner) paths for every solution notebook, or for the named ones."""
    solutions = sorted((notebooks / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if names:
        wanted = {n.removesuffix(".ipynb") for n in names}
        solutions = [p for p in solutions if p.stem in wanted or p.stem[:2] in wanted]
        if not solutions:
            raise SystemExit(f"no solution notebook matches {', '.join(names)} in {notebooks / 'solutions'}")
    return [(s, notebooks / s.name) for s in solutions]


def out_of_sync(notebooks: Path) -> list[str]:
    """Learner notebooks whose cells no longer match what their solution notebook generates."""
    problems = []
    for solution, learner in pairs(notebooks):
        if not learner.exists():
            problems.append(f"{learner.name}: missing (run `python -m course_lib authoring build`)")
            continue
        want = make_learner(nbformat.read(solution, as_version=4))
        have = nbformat.read(learner, as_version=4)
        a = [(c.cell_type, c.source) for c in want.cells]
        b = [(c.cell_type, c.source) for c in have.cells]
        if a != b:
            problems.append(f"{learner.name}: differs from what {solution.name} generates (run the build)")
    return problems


def build(notebooks: Path, names: list[str] | None = None, run: bool = True) -> None:
    for solution, learner in pairs(notebooks, names):
        nbformat.write(make_learner(nbformat.read(solution, as_version=4)), learner)
        print(f"wrote {learner.relative_to(notebooks.parent)}")
        if run:
            for path in (solution, learner):
                print(f"executed {path.relative_to(notebooks.parent)} in {execute(path):.1f} s", flush=True)


# --------------------------------------------------------------------------- honest times

WORDS_PER_MINUTE = 150  # reading the prose, with its code, at a learner's pace
MINUTES_PER_EXERCISE = 10  # solving one exercise, a wrong try included
TIME_RULE = f"prose words / {WORDS_PER_MINUTE} + {MINUTES_PER_EXERCISE} minutes per exercise, rounded up to 5 minutes"
_EXERCISE_HEADING = re.compile(r"^### Exercise (\d\d\.\d) · .*?(\((?:[^()]*, )?stretch\))?$", re.M)
_HEADER_TIME = re.compile(r"about \d+ minutes( \(\d+ without the stretch exercises?\))?")


@dataclass(frozen=True)
class Timing:
    """How long a notebook takes by the course's one rule (:data:`TIME_RULE`), from its text."""

    words: int
    exercises: tuple[str, ...]
    stretch: tuple[str, ...]

    @staticmethod
    def _round(minutes: float) -> int:
        return 5 * math.ceil(minutes / 5 - 1e-9)

    @property
    def minutes(self) -> int:
        return self._round(self.words / WORDS_PER_MINUTE + MINUTES_PER_EXERCISE * len(self.exercises))

    @property
    def core_minutes(self) -> int:
        """The time without the stretch exercises, which a workshop may skip."""
        return self._round(
            self.words / WORDS_PER_MINUTE + MINUTES_PER_EXERCISE * (len(self.exercises) - len(self.stretch))
        )

    def header(self) -> str:
        """The phrase the notebook's first cell states: ``about 75 minutes (65 without the stretch exercise)``."""
        if not self.stretch:
            return f"about {self.minutes} minutes"
        plural = "s" if len(self.stretch) > 1 else ""
        return f"about {self.minutes} minutes ({self.core_minutes} without the stretch exercise{plural})"


FURTHER_READING = "**Further reading:**"  # ends a notebook's summary: links to read after the class


def prose_words(nb: nbformat.NotebookNode) -> int:
    """Words in a notebook's markdown cells, fenced code blocks, HTML comments, link addresses, the first cell's
    one-sentence summary (the README's, read in seconds) and the summary's further reading (read after the class)
    left out."""
    text = "\n".join(c.source.split(FURTHER_READING)[0] for c in nb.cells if c.cell_type == "markdown")
    text = re.sub(r"```.*?```|<!--.*?-->|^\*In one sentence:\*[^\n]*$", " ", text, flags=re.S | re.M)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return len(re.findall(r"\w[\w'’.-]*", text))


def timing(nb: nbformat.NotebookNode) -> Timing:
    """Notebook ``nb``'s :class:`Timing`: its prose words, its exercises and which of them are stretch ones
    (a heading ``### Exercise NN.N · title (stretch)`` or ``(build, stretch)``)."""
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    found = _EXERCISE_HEADING.findall(text)
    return Timing(
        prose_words(nb), tuple(dict.fromkeys(n for n, _ in found)), tuple(dict.fromkeys(n for n, s in found if s))
    )


def stated_time(nb: nbformat.NotebookNode) -> str | None:
    """The time phrase the notebook's first cell states, or None."""
    m = _HEADER_TIME.search(nb.cells[0].source) if nb.cells else None
    return m.group(0) if m else None


def write_times(root: Path, show: Callable[[str], None] = print) -> None:
    """Set every notebook's stated time (first cell, both versions) by the rule, then the documents that show it
    (README.md's course table, INSTRUCTORS.md's schedules: :mod:`course_tools.workshop`).

    Only markdown is touched: the stored outputs of both versions stay as they are."""
    from course_tools import workshop

    total = 0
    for solution, learner in pairs(root / "notebooks"):
        t = timing(nbformat.read(solution, as_version=4))
        total += t.minutes
        for path in (solution, learner):
            nb = nbformat.read(path, as_version=4)
            if stated_time(nb) is None:
                raise SystemExit(f"{path}: its first cell states no time ('about N minutes'): add one")
            nb.cells[0].source = _HEADER_TIME.sub(t.header(), nb.cells[0].source, count=1)
            nbformat.write(nb, path)
        show(
            f"{solution.name}: {t.words} words, {len(t.exercises)} exercises ({len(t.stretch)} stretch) -> {t.header()}"
        )
    show(f"all notebooks: {total} minutes")
    workshop.write(root, show)


# --------------------------------------------------------------------------- renumbering


class RenumberError(ValueError):
    """A renumbering cannot be done as asked; the message says what to do instead."""


NN = r"\d\d(?!\d)"  # a notebook number: two digits (each rule says what may stand before them)
_ID = r"\d\d\.[1-9](?!\d|\.\d)"  # an exercise id: 07.3
_RANGE = rf"{NN}(?:[ \t]*[–-][ \t]*{NN})?"  # 07, or 07–09 (both ends are mapped)
_ITEM = rf"{_RANGE}(?:'s)?(?:\s+\([^()]*\))?"  # in a list after "notebooks": 07, 07's, 07 (samplers)
_AND = r"(?:,\s+and\s+|,\s*|\s+and\s+)"
_CHECKS = ("course_lib/checks/nb*.py", "tests/test_checks*.py")
#: Files that name notebooks by a quoted number ("04", "01-09"), where quoted numbers are nothing else.
_QUOTED = ("tests/test_jupyterlab.py", "tests/tools/test_slides.py", "course_tools/preparation.py")
#: Never rewritten: this module and its tests (their examples are not the course's), vendored code.
_EXCLUDED = ("course_tools/authoring.py", "tests/tools/test_authoring.py", "slides/vendor/*")


@dataclass(frozen=True)
class Rule:
    """One kind of reference: ``pattern`` finds it, and its group ``ref`` holds the numbers to map."""

    name: str
    pattern: re.Pattern[str]
    files: tuple[str, ...] = ("*",)  # where it applies: globs on the path from the repository root
    markdown_only: bool = False  # only in .md files and in notebooks' markdown cells


def _rule(
    name: str, pattern: str, files: tuple[str, ...] = ("*",), markdown_only: bool = False, flags: int = 0
) -> Rule:
    return Rule(name, re.compile(pattern, flags), files, markdown_only)


#: The references ``renumber`` rewrites (with those of :func:`_course_rules`). A number changes only where
#: one of them finds it, and only if it is the number of a notebook that moves: "batch 10", "seed 11",
#: "10 %", "12.5×" or a host "gpu[07-08]" never match. Numbers inside parentheses of a list are skipped.
RULES = [
    _rule("notebook NN", rf"\b[Nn]otebook\s+(?P<ref>{NN})"),  # notebook 07, Notebook 07's, (notebook 07)
    _rule(
        "notebooks NN, NN and NN–NN", rf"\b[Nn]otebooks\s+(?P<ref>{_ITEM}(?:{_AND}{_ITEM})*)"
    ),  # notebooks 03 (basics), 05 and 07–09
    _rule("notebook:NN# figure", rf"\bnotebook:(?P<ref>{NN})#"),  # slides: ![...](notebook:07#c010)
    # Exercise 07.3, exercises 07.2 and 07.3, exercises 07.2–07.4
    _rule("exercise NN.K", rf"\b[Ee]xercises?\s+(?P<ref>{_ID}(?:(?:{_AND}|[ \t]*[–-][ \t]*){_ID})*)"),
    _rule("exercise NN.K", rf"(?P<q>[\"'])(?P<ref>{_ID})(?P=q)"),  # exercise("07.3", ...), id="07.3"
    _rule(
        "exercise NN.K", rf"(?:\bas in|^[ \t]*#)[ \t]+(?P<ref>{_ID})", flags=re.M
    ),  # as in 07.3; a comment "# 07.3: ..."
    _rule("nbNN module", rf"(?<![A-Za-z0-9])nb(?P<ref>{NN})"),  # checks.nb07, import nb07, test_checks_nb07
    _rule("test_NN_ name", rf"\btest_(?P<ref>{NN})_"),  # def test_07_epoch_sampler
    _rule("name ending in NN", rf"(?<=[A-Za-z_])(?P<ref>{NN})\b", files=("tests/test_checks*.py",)),  # _loader07, val07
    _rule("scratch folder", rf"\bscratch_folder\((?P<q>[\"'])(?P<ref>{NN})(?P=q)"),  # scratch_folder("07")
    _rule("scratch folder", rf"(?<![\w])course(?P<ref>{NN})-"),  # course07-*, prefix="course07-"
    _rule("command argument", rf"\b(?:authoring build|figures)[ \t]+(?P<ref>{NN})(?![\w.])"),  # slides figures 07
    _rule(
        "module (NN)", rf"`[ \t]+\(?(?P<ref>{_RANGE}(?:,[ \t]*{_RANGE})*)(?=[,;)])"
    ),  # `samplers` (06), ``workers`` 04-05,
    # a table cell that ends in notebook numbers: | 07 | 3 | ..., | 07, 08 |, | here (briefly), 04, 05 |
    _rule("table cell", rf"\|(?:[^|\n]*?,)??[ \t]*(?P<ref>{NN}(?:,[ \t]*{NN})*)[ \t]*(?=\|)", markdown_only=True),
    _rule("quoted NN", rf"(?P<q>[\"'])(?P<ref>{_RANGE})(?P=q)", files=_QUOTED),  # LearnerPath("07", ...)
    # a path or pattern without the name: r"^notebooks/solutions/(07_)", notebooks/07_*.ipynb
    _rule("notebook path", rf"\bnotebooks/(?:solutions/)?\(?(?P<ref>{NN})_(?![A-Za-z])"),
]


def _course_rules(root: Path, names: dict[int, str]) -> list[Rule]:
    """The rules that depend on the course: each notebook's file name (``07_distributed_sampling``) and title after
    its number (``07 · Distributed sampling``); in the checks and their tests, any exercise id the checks declare."""
    ids = sorted(
        set(
            re.findall(
                r"@exercise\(\s*[\"'](\d\d\.\d)[\"']",
                "".join(
                    p.read_text(encoding="utf-8") for p in (root / "course_lib" / "checks").glob("nb[0-9][0-9].py")
                ),
            )
        )
    )
    rules = (
        [_rule("exercise NN.K", rf"(?<![\w.])(?P<ref>{'|'.join(map(re.escape, ids))})(?!\d|\.\d)", files=_CHECKS)]
        if ids
        else []
    )
    for number, name in names.items():
        words = r"[\s_-]+".join(re.escape(w) for w in name.split("_"))
        rules.append(_rule("NN_name file", rf"(?<!\d)(?P<ref>{number:02d})_{re.escape(name)}(?!\w)"))
        rules.append(_rule("NN title", rf"(?<![\w.])(?P<ref>{number:02d})(?:[ \t]+·)?[ \t]+{words}(?!\w)", flags=re.I))
    return rules


_NUMBER = re.compile(r"\([^()]*\)|(?<![\w.])(\d\d)(?!\d)")  # the numbers of a reference; parentheses are skipped
_TOKEN = re.compile(r"(?<![\w.])(\d\d)(?!\d)")
_CONTEXT = re.compile(r"notebook|exercise", re.I)


def notebook_names(root: Path) -> dict[int, str]:
    """``{number: name}`` of the course's notebooks (``7: "distributed_sampling"``), learner and solution versions."""
    folder = root / "notebooks"
    if not (folder / "solutions").is_dir():
        raise RenumberError(f"no {folder / 'solutions'} folder: run from the repository root or pass --root")
    paths = [*folder.glob("[0-9][0-9]_*.ipynb"), *(folder / "solutions").glob("[0-9][0-9]_*.ipynb")]
    if not paths:
        raise RenumberError(
            f"no numbered notebooks (NN_name.ipynb) in {folder} or {folder / 'solutions'}: nothing to renumber"
        )
    return {int(p.name[:2]): p.stem[3:] for p in sorted(paths)}


def insert_mapping(numbers: list[int], insert: str) -> dict[int, int]:
    """``{old: new}`` that makes room for a new notebook ``insert``: each notebook from there on moves up by one."""
    last = max(numbers, default=0)
    if not re.fullmatch(r"\d{1,2}", insert):
        raise RenumberError(
            f"--insert {insert!r}: give the number the new notebook will have, e.g. --insert {last:02d}"
        )
    at = int(insert)
    if at < 1:
        raise RenumberError(
            f"--insert {insert}: notebooks are numbered from 01; --insert 01 makes room for a new first notebook"
        )
    if at > last + 1:
        raise RenumberError(
            f"--insert {insert}: the last notebook is {last:02d}, so a new one goes at {last + 1:02d} at the most "
            f"(which moves nothing); to move notebooks, give a number from 01 to {last:02d}"
        )
    if last >= 99 and at <= last:
        raise RenumberError(
            f"--insert {insert}: notebook {last:02d} would become {last + 1}, and numbers have two digits"
        )
    return {n: n + 1 for n in sorted(numbers) if n >= at}


def _applies(rule: Rule, path: str, markdown: bool) -> bool:
    return (markdown or not rule.markdown_only) and any(fnmatch.fnmatch(path, g) for g in rule.files)


def _rewrite(
    text: str, path: str, markdown: bool, rules: list[Rule], mapping: dict[int, int]
) -> tuple[str, Counter[str], list[str]]:
    """``text`` with every reference the rules find mapped, all in one pass; the replacements per rule; and the
    lines that keep a moved number next to the word notebook or exercise, or quoted (to check by hand)."""
    spans: dict[int, tuple[str, str]] = {}  # start of a number -> (its new text, the rule that found it)
    for rule in rules:
        if not _applies(rule, path, markdown):
            continue
        for m in rule.pattern.finditer(text):
            for n in _NUMBER.finditer(m.group("ref")):
                if n.group(1) and int(n.group(1)) in mapping:
                    spans.setdefault(m.start("ref") + n.start(1), (f"{mapping[int(n.group(1))]:02d}", rule.name))
    parts, last = [], 0
    for start in sorted(spans):
        parts += [text[last:start], spans[start][0]]
        last = start + 2
    parts.append(text[last:])
    left, offset = [], 0
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        for m in _TOKEN.finditer(line):
            quoted = (
                line[m.start() - 1 : m.start()] in ("'", '"') and line[m.end() : m.end() + 1] == line[m.start() - 1]
            )
            if int(m.group(1)) in mapping and offset + m.start() not in spans and (quoted or _CONTEXT.search(line)):
                left.append(f"{lineno}: {line.strip()}")
                break
        offset += len(line)
    return "".join(parts), Counter(name for _, name in spans.values()), left


def _rewrite_notebook(
    text: str, path: str, rules: list[Rule], mapping: dict[int, int]
) -> tuple[str, Counter[str], list[str]]:
    """:func:`_rewrite` on a notebook's cell sources and stored text outputs; nbformat writes it back as it was."""
    nb = nbformat.reads(text, as_version=4)
    counts: Counter[str] = Counter()
    left: list[str] = []

    def fix(value: str, markdown: bool, where: str) -> str:
        new, found, kept = _rewrite(value, path, markdown, rules, mapping)
        counts.update(found)
        left.extend(f"{where}, line {line}" for line in kept)
        return new

    for i, cell in enumerate(nb.cells, 1):
        cell.source = fix(cell.source, cell.cell_type == "markdown", f"cell {i}")
        for out in cell.get("outputs", []):
            if "text" in out:
                out.text = fix(out.text, False, f"cell {i} output")
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    out.data[mime] = fix(value, mime == "text/markdown", f"cell {i} output")
            if out.get("output_type") == "error":
                out.evalue = fix(out.evalue, False, f"cell {i} error")
                out.traceback = [fix(line, False, f"cell {i} error") for line in out.traceback]
    return (nbformat.writes(nb) + "\n" if counts else text), counts, left


def _files(root: Path) -> tuple[list[str], set[str]]:
    """The repository's files (paths from ``root``), and those git tracks (empty outside a git repository)."""

    def git(*args: str) -> list[str]:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", *args], capture_output=True, text=True, check=True
        ).stdout
        return [p for p in out.split("\0") if p]

    try:
        tracked = git("--cached")
        every = sorted(set(tracked) | set(git("--others", "--exclude-standard")))
    except (OSError, subprocess.CalledProcessError):
        tracked = []
        every = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file()
            and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts)
        )
    return [p for p in every if (root / p).is_file()], set(tracked)


@dataclass
class Plan:
    """What a renumbering changes: files to move, new texts of edited files, replacements per rule."""

    mapping: dict[int, int]
    moves: list[tuple[str, str]] = field(default_factory=list)  # (old path, new path), from the root
    edits: dict[str, tuple[str, str]] = field(default_factory=dict)  # old path -> (old text, new text)
    counts: Counter[str] = field(default_factory=Counter)
    per_file: dict[str, int] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)  # lines to check by hand
    tracked: set[str] = field(default_factory=set)


def plan(root: Path, mapping: dict[int, int]) -> Plan:
    """Work out a renumbering (``{old: new}``) of the course in ``root`` without changing anything."""
    rules = RULES + _course_rules(root, notebook_names(root))
    file_rules = [r for r in rules if r.name in ("NN_name file", "nbNN module")]
    files, tracked = _files(root)
    result = Plan(mapping, tracked=tracked)
    for path in files:
        if any(fnmatch.fnmatch(path, g) for g in _EXCLUDED):
            continue
        folder, _, name = path.rpartition("/")
        new_name = _rewrite(name, path, False, file_rules, mapping)[0]
        if new_name != name:
            result.moves.append((path, f"{folder}/{new_name}" if folder else new_name))
        data = (root / path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "\0" in text:
            continue
        if path.endswith(".ipynb"):
            new, counts, left = _rewrite_notebook(text, path, rules, mapping)
        else:
            new, counts, left = _rewrite(text, path, path.endswith(".md"), rules, mapping)
        if new != text:
            result.edits[path] = (text, new)
            result.per_file[path] = sum(counts.values())
            result.counts.update(counts)
        result.left += [f"{path}:{line[:150]}" for line in left]
    sources = {old for old, _ in result.moves}
    for old, new in result.moves:
        if (root / new).exists() and new not in sources:
            raise RenumberError(f"{old} would move to {new}, which exists already: move or delete {new} first")
    return result


def apply(root: Path, p: Plan) -> None:
    """Write the edited files, then move files in two steps (to a temporary name, then to the new one), so that
    10 -> 11 never meets 11 -> 12; tracked files move with ``git mv``."""
    for path, (_, new) in p.edits.items():
        (root / path).write_bytes(new.encode("utf-8"))

    def move(old: str, new: str, tracked: bool) -> None:
        if tracked:
            subprocess.run(["git", "-C", str(root), "mv", old, new], check=True, capture_output=True)
        else:
            os.replace(root / old, root / new)

    for old, _ in p.moves:
        move(old, old + ".renumbering", old in p.tracked)
    for old, new in p.moves:
        move(old + ".renumbering", new, old in p.tracked)


def renumber(root: Path, insert: str, dry_run: bool = False, show: Callable[[str], None] = print) -> Plan | None:
    """Make room for a new notebook ``insert`` (e.g. ``"10"``) in the course in ``root``; print what changes."""
    mapping = insert_mapping(list(notebook_names(root)), insert)
    if not mapping:
        show(
            f"nothing to renumber: {int(insert):02d} follows the last notebook; add notebooks/solutions/{int(insert):02d}_<name>.ipynb"
        )
        return None
    p = plan(root, mapping)
    if dry_run:
        for path, (old, new) in p.edits.items():
            show("\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), path, path, n=0, lineterm="")))
    else:
        apply(root, p)
    show(
        f"renumbering {', '.join(f'{a:02d} -> {b:02d}' for a, b in mapping.items())} in {root}"
        + (" (dry run: nothing was changed)" if dry_run else "")
    )
    sections = [
        (f"files moved: {len(p.moves)}", [f"{old} -> {new}" for old, new in p.moves]),
        (f"files edited: {len(p.edits)}", [f"{path}: {n}" for path, n in p.per_file.items()]),
        (f"replacements per pattern: {sum(p.counts.values())}", [f"{name}: {n}" for name, n in p.counts.most_common()]),
        (
            f"left alone, check by hand ({len(p.left)}: a moved number near 'notebook' or 'exercise', or quoted):",
            p.left,
        ),
    ]
    for title, lines in sections:
        if lines or not title.startswith("left alone"):
            show("\n".join([title, *(f"  {line}" for line in lines)]))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib authoring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="the notebooks folder")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="regenerate learner notebooks and execute both versions in place")
    b.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    b.add_argument("--no-execute", action="store_true", help="only regenerate the learner notebooks")
    sub.add_parser("check", help="exit 1 if a learner notebook is out of date")
    sub.add_parser("times", help=f"set each notebook's stated time, and the documents', by the rule: {TIME_RULE}")
    d = sub.add_parser("docs", help="rewrite the generated parts of README.md and INSTRUCTORS.md")
    d.add_argument("--check", action="store_true", help="change nothing; exit 1 if they are out of step")
    runs = sub.add_parser("runs", help="Run All solution notebooks, recording what each takes and starts")
    runs.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    r = sub.add_parser(
        "renumber",
        help="make room for a new notebook: move notebooks NN and above up by one, "
        "with their checks, tests and every reference to them",
    )
    r.add_argument("--insert", required=True, metavar="NN", help="the number the new notebook will have")
    r.add_argument(
        "--dry-run", action="store_true", help="print what would change (a diff and a summary); change nothing"
    )
    r.add_argument("--root", type=Path, default=Path("."), help="the repository (default: the current folder)")
    args = parser.parse_args(argv)
    if args.command == "renumber":
        try:
            renumber(args.root, args.insert, dry_run=args.dry_run)
        except RenumberError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not (args.notebooks / "solutions").is_dir():
        parser.error(f"no {args.notebooks / 'solutions'} folder: run from the repository root or pass --notebooks")
    if args.command == "build":
        build(args.notebooks, args.names, run=not args.no_execute)
        return 0
    root = args.notebooks.resolve().parent
    if args.command == "times":
        write_times(root)
        return 0
    if args.command in ("docs", "runs"):
        from course_tools import workshop

        try:
            if args.command == "runs":
                workshop.record(root, args.names)
                workshop.write(root)
            elif args.check:
                stale = workshop.out_of_step(root)
                print(
                    "\n".join(f"{name}: out of step: run `python -m course_lib authoring docs`" for name in stale)
                    or "README.md and INSTRUCTORS.md are up to date"
                )
                return 1 if stale else 0
            else:
                workshop.write(root)
        except workshop.DocsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    problems = out_of_sync(args.notebooks)
    print("\n".join(problems) or "learner notebooks are up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
