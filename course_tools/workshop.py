"""The workshop documents' generated parts, made from the notebooks so that they stay true.

* README.md's course table: one line per notebook (number, level, title, time, its one sentence), read from each
  solution notebook's first cell (``*In one sentence:* ...``) and its time by the course's rule.
* INSTRUCTORS.md's schedules (half a day, one day, three days, four days, and tracks), laid out on a day of fixed
  breaks from the notebooks' times, each saying what it cuts; and its table of what each notebook starts.
* ``course_tools/notebook_runs.json``: what a Run All of each solution notebook took and started, recorded by
  :func:`record` (a watcher samples the kernel's processes, its scratch folders and ``/dev/shm`` while it runs).

Commands (from the repository root)::

    python -m course_lib authoring docs             # rewrite the generated parts of README.md and INSTRUCTORS.md
    python -m course_lib authoring docs --check     # exit 1 when they are out of step (the quick tier runs it)
    python -m course_lib authoring runs 04 09       # Run All those solution notebooks, record what they start

A generated part sits between ``<!-- BEGIN generated: NAME ... -->`` and ``<!-- END generated: NAME -->``; the
text around it is written by hand.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import platform
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_tools import authoring

RUNS_FILE = Path("course_tools", "notebook_runs.json")  # from the repository root
_SENTENCE = re.compile(r"^\*In one sentence:\* (?P<text>.+)$", re.M)
_TITLE = re.compile(r"^# (?P<nn>\d\d) · (?P<title>.+)$", re.M)
_LEVEL = re.compile(r"\*\*Level (?P<level>[1-5])\*\*")
MAX_SENTENCE_WORDS = 20


class DocsError(ValueError):
    """A generated part cannot be made; the message says what to fix."""


# --------------------------------------------------------------------------- what the notebooks say


@dataclass(frozen=True)
class Notebook:
    number: str  # "04"
    level: int
    title: str  # the first cell's heading after "NN · "
    sentence: str  # the first cell's "*In one sentence:* ..."
    path: Path  # the learner version, from the repository root
    timing: authoring.Timing
    claims: int  # its "**Claim:** ..." lines: measured claims that may print "inconclusive" on a busy machine

    @property
    def short_title(self) -> str:
        """The title up to its colon: "Capstone" for "Capstone: a tuned data pipeline under DDP, ..."."""
        return self.title.split(":")[0]


def notebooks(root: Path) -> list[Notebook]:
    """Every notebook, from its solution version's first cell and text."""
    found = []
    for solution, learner in authoring.pairs(root / "notebooks"):
        nb = nbformat.read(solution, as_version=4)
        first = nb.cells[0].source if nb.cells else ""
        title, level, sentence = _TITLE.search(first), _LEVEL.search(first), _SENTENCE.search(first)
        where = solution.relative_to(root)
        if title is None or level is None:
            raise DocsError(f"{where}: the first cell needs '# NN · Title' and '**Level N**'")
        if sentence is None:
            raise DocsError(f"{where}: the first cell needs a line '*In one sentence:* ...' (at most 20 words)")
        words = len(sentence["text"].split())
        if words > MAX_SENTENCE_WORDS:
            raise DocsError(f"{where}: its one sentence has {words} words; say it in {MAX_SENTENCE_WORDS} or fewer")
        found.append(
            Notebook(
                title["nn"],
                int(level["level"]),
                title["title"].strip(),
                sentence["text"].strip(),
                learner.relative_to(root),
                authoring.timing(nb),
                len(
                    re.findall(
                        r"^\*\*Claim:\*\*", "\n".join(c.source for c in nb.cells if c.cell_type == "markdown"), re.M
                    )
                ),
            )
        )
    return found


def _time(t: authoring.Timing) -> str:
    return f"{t.minutes} min ({t.core_minutes})" if t.stretch else f"{t.minutes} min"


def course_table(nbs: list[Notebook]) -> str:
    rows = ["| # | level | notebook | time | in one sentence |", "| --- | --- | --- | --- | --- |"]
    for nb in nbs:
        link = f"[{nb.short_title}]({nb.path.as_posix()})"
        rows.append(f"| {nb.number} | {nb.level} | {link} | {_time(nb.timing)} | {nb.sentence} |")
    total = sum(nb.timing.minutes for nb in nbs)
    core = sum(nb.timing.core_minutes for nb in nbs)
    rows.append("")
    rows.append(
        f"About {round(total / 30) / 2:g} hours in all ({total} minutes; {core} without the stretch exercises, "
        "the time in brackets)."
    )
    return "\n".join(rows)


# --------------------------------------------------------------------------- schedules

#: The day a schedule is laid out on: teaching from 09:00 to 17:00, with these breaks (start, minutes, what).
DAY_START, DAY_END = 9 * 60, 17 * 60
BREAKS = ((10 * 60 + 30, 15, "break"), (12 * 60 + 30, 60, "lunch"), (15 * 60, 15, "break"))
SETUP = 30  # the first morning: logins, the course opened, `python -m course_lib doctor` for everyone
RECAP = 15  # every later morning: yesterday in five questions, today's plan
WRAP_UP = 15  # every day's last minutes: questions, what to read tonight
SLIDES = 15  # a level's deck, before its first notebook


@dataclass(frozen=True)
class Plan:
    """A schedule: which notebooks, in which order, in how many days (0.5: a morning), stretch exercises or not."""

    name: str
    days: float
    numbers: tuple[str, ...]
    stretch: bool
    for_whom: str


PLANS = (
    Plan(
        "Half a day",
        0.5,
        ("04", "05"),
        False,
        "practitioners who have used a DataLoader: why the GPU waits, and what worker processes fix and break "
        "(give 01–03 as reading before)",
    ),
    Plan(
        "One day",
        1,
        ("01", "03", "04", "05"),
        False,
        "the DataLoader from a first dataset to tuned worker processes (give 02 as reading)",
    ),
    Plan(
        "Three days",
        3,
        ("01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "13", "14"),
        False,
        "the whole path to a distributed, resumable shard pipeline, with 11 and 12 as reading",
    ),
    Plan("Four days", 4, tuple(f"{n:02d}" for n in range(1, 16)), True, "every notebook and every exercise"),
)

#: Tracks: the notebooks one theme needs, for workshops that pick one.
TRACKS = (
    ("DataLoader", ("01", "02", "03", "04", "05", "06")),
    ("distributed", ("06", "07", "08", "09", "13")),
    ("storage", ("09", "10", "11", "12")),
    ("restarts", ("14",)),
    ("language models", ("12", "14", "15")),
)


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


@dataclass
class Slot:
    day: int
    start: int
    minutes: int
    what: str


def _days(days: float) -> tuple[int, int]:
    """How many days a plan of ``days`` is laid on, and when each ends (half a day: the morning, until lunch)."""
    return max(1, round(days + 0.49)), DAY_END if days >= 1 else BREAKS[1][0]


def _working_spans(day_end: int) -> list[tuple[int, int]]:
    """(start, end) of a day's teaching time between its breaks, up to ``day_end``."""
    spans, start = [], DAY_START
    for at, minutes, _ in BREAKS:
        if at >= day_end:
            break
        spans.append((start, at))
        start = at + minutes
    spans.append((start, day_end))
    return spans


def lay_out(plan: Plan, nbs: dict[str, Notebook]) -> tuple[list[Slot], int]:
    """The plan's slots, day by day, breaks included, and the minutes left over. An item may run across a break
    (it goes on after it) but never across days; :class:`DocsError` when the plan does not fit its days."""
    items: list[tuple[str, int]] = [("set-up: everyone logged in, the course open, `doctor` run", SETUP)]
    levels_shown: set[int] = set()
    for n in plan.numbers:
        nb = nbs[n]
        if nb.level not in levels_shown:
            levels_shown.add(nb.level)
            items.append((f"slides, level {nb.level}", SLIDES))
        t = nb.timing
        cut = [] if plan.stretch else list(t.stretch)
        left_out = f" (not {', '.join(cut)}: stretch)" if cut else ""
        items.append((f"notebook {n} · {nb.short_title}{left_out}", t.minutes if plan.stretch else t.core_minutes))
    whole_days, day_end = _days(plan.days)
    slots: list[Slot] = []
    left = 0
    queue = list(items)
    for day in range(1, whole_days + 1):
        spans = _working_spans(day_end)
        spans[-1] = (spans[-1][0], spans[-1][1] - WRAP_UP)
        day_items = [("recap of yesterday", RECAP)] if day > 1 else []
        # what fits today, whole: items never run across days
        capacity = sum(end - start for start, end in spans)
        used = sum(m for _, m in day_items)
        while queue and used + queue[0][1] <= capacity:
            day_items.append(queue.pop(0))
            used += day_items[-1][1]
        left += capacity - used
        span, clock = 0, spans[0][0]
        for what, minutes in day_items:
            remaining = minutes
            while remaining:
                start, end = spans[span]
                take = min(remaining, end - clock)
                if take == 0:
                    span += 1
                    clock = spans[span][0]
                    continue
                label = what if remaining == minutes else f"{what.split(' · ')[0]} (continued)"
                slots.append(Slot(day, clock, take, label))
                clock += take
                remaining -= take
        for at, minutes, name in BREAKS:
            if at < day_end and at < clock:
                slots.append(Slot(day, at, minutes, name))
        open_until = day_end - WRAP_UP
        if clock < open_until:
            slots.append(Slot(day, clock, open_until - clock, "open: questions, unfinished exercises, own data"))
        slots.append(Slot(day, day_end - WRAP_UP, WRAP_UP, "wrap-up: questions, what to read next"))
    if queue:
        raise DocsError(
            f"{plan.name}: {', '.join(w for w, _ in queue)} do not fit in {plan.days:g} days: "
            "take notebooks out of the plan or give it a day more"
        )
    slots.sort(key=lambda s: (s.day, s.start))
    return slots, left


def schedule(plan: Plan, nbs: dict[str, Notebook]) -> str:
    slots, left = lay_out(plan, nbs)
    cut = [n for n in nbs if n not in plan.numbers]
    teaching = sum((nbs[n].timing.minutes if plan.stretch else nbs[n].timing.core_minutes) for n in plan.numbers)
    stretch_cut = [] if plan.stretch else [e for n in plan.numbers for e in nbs[n].timing.stretch]
    says = [f"For {plan.for_whom}. Notebooks {', '.join(plan.numbers)}: {teaching} minutes of notebooks"]
    says.append(f"{left} minutes unplanned for questions and slow starts")
    cuts = []
    if cut:
        cuts.append(f"notebooks {', '.join(cut)}")
    if stretch_cut:
        cuts.append(f"the stretch exercises {', '.join(stretch_cut)}")
    head = (
        f"### {plan.name}\n\n"
        + "; ".join(says)
        + (f". It cuts {' and '.join(cuts)}." if cuts else ". It cuts nothing.")
    )
    rows = ["| day | from | to | what |", "| --- | --- | --- | --- |"]
    for s in slots:
        what = s.what if s.what.startswith(("notebook", "slides")) else f"*{s.what}*"
        rows.append(f"| {s.day} | {_clock(s.start)} | {_clock(s.start + s.minutes)} | {what} |")
    return head + "\n\n" + "\n".join(rows)


def _capacity(days: float) -> int:
    """Minutes of notebooks and slides a plan of ``days`` can hold."""
    whole, day_end = _days(days)
    per_day = sum(end - start for start, end in _working_spans(day_end)) - WRAP_UP
    return whole * per_day - SETUP - RECAP * (whole - 1)


def schedules(nbs: list[Notebook]) -> str:
    by_number = {nb.number: nb for nb in nbs}
    for plan in PLANS:
        missing = [n for n in plan.numbers if n not in by_number]
        if missing:
            raise DocsError(
                f"the plan '{plan.name}' names notebooks {', '.join(missing)}, which do not exist: "
                "change PLANS in course_tools/workshop.py"
            )
    total = sum(nb.timing.minutes for nb in nbs)
    core = sum(nb.timing.core_minutes for nb in nbs)
    slides = SLIDES * len({nb.level for nb in nbs})
    three = _capacity(3)
    lines = [
        f"A day here runs from {_clock(DAY_START)} to {_clock(DAY_END)} with "
        + ", ".join(f"a {name} at {_clock(at)} ({m} min)" for at, m, name in BREAKS)
        + f"; the first morning starts with {SETUP} minutes of set-up, every later one with a {RECAP}-minute recap, "
        f"every day ends with a {WRAP_UP}-minute wrap-up, and each level opens with its slides ({SLIDES} min). "
        f"Notebook times follow the course's rule ({authoring.TIME_RULE}).",
        "",
        f"All {len(nbs)} notebooks take {total} minutes ({total / 60:.1f} h), {core} without the stretch exercises; "
        f"with the slides, {total + slides} and {core + slides}. Three days hold {three} minutes of notebooks and "
        f"slides, so the whole course does not fit in three days"
        + (
            f"; without the stretch exercises it would, with only {three - core - slides} minutes to spare for "
            "questions and slow starts over three days."
            if three >= core + slides
            else f", not even without the stretch exercises ({core + slides - three} minutes over)."
        )
        + " The three-day plan below cuts two notebooks instead; the four-day plan keeps everything.",
        "",
    ]
    for plan in PLANS:
        lines += [schedule(plan, by_number), ""]
    lines += [
        "### Tracks",
        "",
        "A workshop on one theme takes a track; each needs the notebooks before it as prerequisites "
        "(each notebook's first cell names them).",
        "",
        "| track | notebooks | minutes (without stretch) | days |",
        "| --- | --- | --- | --- |",
    ]
    for name, numbers in TRACKS:
        t = sum(by_number[n].timing.minutes for n in numbers)
        c = sum(by_number[n].timing.core_minutes for n in numbers)
        levels = len({by_number[n].level for n in numbers})
        need = c + SLIDES * levels
        days = 0.5 if need <= _capacity(0.5) else next(d for d in range(1, 9) if need <= _capacity(d))
        lines.append(f"| {name} | {', '.join(numbers)} | {t} ({c}) | {days:g} |")
    return "\n".join(lines).rstrip()


# --------------------------------------------------------------------------- what a Run All starts


def code_digest(nb: nbformat.NotebookNode) -> str:
    """A digest of a notebook's code cells: a recorded run is stale when it changes."""
    code = "\n\0".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()[:16]


class _Watcher(threading.Thread):
    """Samples, while a notebook runs, what its kernel started: processes at once, torchrun jobs and their ranks,
    an S3 server, its scratch folders in the temporary directory, and ``/dev/shm``."""

    def __init__(self, number: str) -> None:
        super().__init__(daemon=True)
        import psutil

        self.psutil, self.me = psutil, psutil.Process()
        self.number, self.done = number, threading.Event()
        self.processes = self.ranks = 0
        self.torchrun: set[int] = set()
        self.s3 = False
        self.scratch = self.shm = 0
        self.shm_base = self._shm_used()
        self.before = set(Path(tempfile.gettempdir()).glob("course*-*"))

    @staticmethod
    def _shm_used() -> int:
        try:
            return shutil.disk_usage("/dev/shm").used
        except OSError:
            return 0

    def _scratch_bytes(self) -> int:
        """The bytes in the course's folders in the temporary directory that appeared while the notebook ran (its
        scratch folder, its S3 server's, its torchrun jobs' logs)."""
        total = 0
        for folder in set(Path(tempfile.gettempdir()).glob("course*-*")) - self.before:
            for dirpath, _, files in os.walk(folder):
                for f in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        pass
        return total

    def run(self) -> None:
        tick = 0
        while not self.done.wait(0.25):
            try:
                kernels = self.me.children()
                started = [p for k in kernels for p in k.children(recursive=True)]
            except self.psutil.Error:
                continue
            self.processes = max(self.processes, len(started))
            for p in started:
                try:
                    cmd = " ".join(p.cmdline())
                    if "torch.distributed.run" in cmd or "/torchrun" in cmd:
                        self.torchrun.add(p.pid)
                        self.ranks = max(self.ranks, len(p.children()))
                    if p.name() == "weed" or "/weed " in cmd:
                        self.s3 = True
                except self.psutil.Error:
                    pass
            self.shm = max(self.shm, self._shm_used() - self.shm_base)
            tick += 1
            if tick % 4 == 0:
                self.scratch = max(self.scratch, self._scratch_bytes())


def record(root: Path, names: list[str] | None = None, show=print) -> dict:
    """Run All each named solution notebook (all by default) in a copy, watched by :class:`_Watcher`, and write what
    it took and started into :data:`RUNS_FILE`. The notebooks themselves are not changed."""
    from nbclient import NotebookClient

    import psutil
    import torch

    path = root / RUNS_FILE
    runs = json.loads(path.read_text()) if path.exists() else {"notebooks": {}}
    for solution, _ in authoring.pairs(root / "notebooks", names):
        number = solution.name[:2]
        nb = nbformat.read(solution, as_version=4)
        digest = code_digest(nb)
        watcher = _Watcher(number)
        load = os.getloadavg()[0]
        watcher.start()
        start = time.perf_counter()
        try:
            NotebookClient(
                nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(solution.parent)}}
            ).execute()
        finally:
            watcher.done.set()
            watcher.join()
        seconds = time.perf_counter() - start
        runs["notebooks"][number] = {
            "seconds": round(seconds, 1),
            "code": digest,
            "processes": watcher.processes,
            "torchrun_jobs": len(watcher.torchrun),
            "ranks": watcher.ranks,
            "s3_server": watcher.s3,
            "scratch_mb": round(watcher.scratch / 2**20, 1),
            "shm_mb": round(max(watcher.shm, 0) / 2**20, 1),
            "load_before": round(load, 2),
        }
        show(f"{solution.name}: {seconds:.0f} s, {json.dumps(runs['notebooks'][number])}")
    runs["machine"] = {
        "cores": psutil.cpu_count(logical=True),
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
        "recorded": datetime.date.today().isoformat(),
    }
    runs["notebooks"] = dict(sorted(runs["notebooks"].items()))
    path.write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def stale_runs(root: Path) -> list[str]:
    """Notebooks whose recorded run is missing or older than their code, each with the command that fixes it."""
    path = root / RUNS_FILE
    runs = json.loads(path.read_text())["notebooks"] if path.exists() else {}
    out = []
    for solution, _ in authoring.pairs(root / "notebooks"):
        number = solution.name[:2]
        got = runs.get(number)
        if got is None or got["code"] != code_digest(nbformat.read(solution, as_version=4)):
            why = "no recorded run" if got is None else "its code changed since its recorded run"
            out.append(f"{solution.name}: {why}: run `python -m course_lib authoring runs {number}` on an idle machine")
    return out


def _minutes(seconds: float) -> str:
    """Minutes, up to the next half: 70 s -> "1.5 min"."""
    return f"{math.ceil(seconds / 30) / 2:g} min"


def _mb(mb: float) -> str:
    return "–" if mb == 0 else "<1 MB" if mb < 1 else f"{mb:.0f} MB"


def facts_table(root: Path, nbs: list[Notebook]) -> str:
    path = root / RUNS_FILE
    data = json.loads(path.read_text()) if path.exists() else {"notebooks": {}, "machine": {}}
    runs, machine = data["notebooks"], data.get("machine", {})
    rows = [
        "| # | Run All | processes at once | torchrun | S3 server | scratch in `$TMPDIR` | `/dev/shm` | claims |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for nb in nbs:
        r = runs.get(nb.number)
        if r is None:
            rows.append(f"| {nb.number} | not recorded | | | | | | |")
            continue
        jobs = r["torchrun_jobs"]
        torchrun = f"{jobs} job{'s' if jobs != 1 else ''} × {r['ranks']} ranks" if jobs else "–"
        rows.append(
            f"| {nb.number} | {_minutes(r['seconds'])} | {r['processes']} | {torchrun} | "
            f"{'yes' if r['s3_server'] else '–'} | {_mb(r['scratch_mb'])} | {_mb(r['shm_mb'])} | {nb.claims or '–'} |"
        )
    note = (
        f"Recorded by `python -m course_lib authoring runs` on {machine.get('cores', '?')} cores "
        f"(Python {machine.get('python', '?')}, torch {machine.get('torch', '?')}, {machine.get('recorded', '?')}): "
        "the solution version run top to bottom in its own kernel; *processes at once* is the most processes the "
        "kernel had started at any one time (DataLoader workers, `torchrun` and its ranks, the S3 server, helpers); "
        "scratch and `/dev/shm` are the most each held. The learner version starts the same minus what its "
        "unsolved exercises would."
    )
    return note + "\n\n" + "\n".join(rows)


# --------------------------------------------------------------------------- writing the documents


def _replace(text: str, name: str, body: str, where: str) -> str:
    pattern = re.compile(
        rf"(<!-- BEGIN generated: {re.escape(name)}[^>]*-->\n).*?(<!-- END generated: {re.escape(name)} -->)", re.S
    )
    new, n = pattern.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    if n != 1:
        raise DocsError(
            f"{where}: needs one '<!-- BEGIN generated: {name} (python -m course_lib authoring docs) -->' ... "
            f"'<!-- END generated: {name} -->' pair, found {n}"
        )
    return new


def generated(root: Path) -> dict[Path, str]:
    """The README and INSTRUCTORS.md as they should read, generated parts made anew."""
    nbs = notebooks(root)
    readme, guide = root / "README.md", root / "INSTRUCTORS.md"
    out = {readme: _replace(readme.read_text(), "course table", course_table(nbs), "README.md")}
    if not guide.exists():  # a course without the instructors' guide (a learners' hand-out, a test's tiny course)
        return out
    text = guide.read_text()
    text = _replace(text, "schedules", schedules(nbs), "INSTRUCTORS.md")
    text = _replace(text, "notebook facts", facts_table(root, nbs), "INSTRUCTORS.md")
    out[guide] = text
    return out


def out_of_step(root: Path) -> list[str]:
    """The documents whose generated parts differ from what the notebooks say now."""
    return [path.name for path, text in generated(root).items() if path.read_text() != text]


def write(root: Path, show=print) -> None:
    for path, text in generated(root).items():
        if path.read_text() != text:
            path.write_text(text)
            show(f"wrote {path.name}")
        else:
            show(f"{path.name} is up to date")
