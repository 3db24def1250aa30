"""Everything the notebooks read from the data folder, as a list of named preparation steps.

An instructor runs ``python -m course_lib prepare --all`` once on a login node (with a shared
data folder) so that compute nodes without internet, where the folder may even be read-only,
find everything already made. Each notebook then *reuses* what is there: the preparation
functions (:func:`course_lib.data.prepare_data`, :func:`course_lib.shards.write_image_shards`)
return an existing, complete result without writing a byte.

A step is a name, the notebooks that use it, a ``run`` that makes (or reuses) its data and
returns a one-line summary, and a ``ready`` that says whether it is there. To add the data of a
later notebook, write its two functions and append a :class:`Step` to :data:`STEPS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from course_lib import data
from course_lib.shards import shard_folder

#: Shards of notebook 09, per split: ``maxcount`` (samples per shard), as the notebook writes them.
NB09_SHARDS: dict[str, int] = {"train": 100, "val": 25}


@dataclass(frozen=True)
class Options:
    """What a preparation run makes: the image set's size and seed, the data folder, a rebuild."""

    size: str = data.DEFAULT_SIZE
    seed: int = 0
    root: str | os.PathLike[str] | None = None
    force: bool = False
    progress: bool = False
    checksums: bool = False


@dataclass(frozen=True)
class Step:
    """One named piece of course data: ``run`` makes or reuses it, ``ready`` checks it is there."""

    name: str
    notebooks: str
    what: str
    run: Callable[[Options], str]
    ready: Callable[[Options], bool]


def _images_run(o: Options) -> str:
    folder = data.prepare_data(o.size, o.seed, o.root, progress=o.progress, force=o.force, checksums=o.checksums)
    return data.describe(folder)


def _images_ready(o: Options) -> bool:
    folder = data.data_dir(o.root) / data.dataset_name(o.size, o.seed)
    try:
        data.verify(folder)
    except data.DataError:
        return False
    return True


def _shards_run(o: Options) -> str:
    from course_lib import shards

    parts = []
    for split, maxcount in NB09_SHARDS.items():
        made = shards.write_image_shards(
            shard_folder(split, o.size, o.seed, o.root),
            split=split,
            size=o.size,
            seed=o.seed,
            root=o.root,
            maxcount=maxcount,
            force=o.force,
        )
        if o.checksums:
            shards.verify_shards(made)  # reads every member: a damaged shard raises ShardError
        parts.append(f"{split}: {made.pattern}, {made.samples} samples")
    return "; ".join(parts)


def _shards_ready(o: Options) -> bool:
    from course_lib import shards

    try:
        for split in NB09_SHARDS:
            shards.read_shardset(shard_folder(split, o.size, o.seed, o.root))
    except shards.ShardError:
        return False
    return True


def _text_run(o: Options) -> str:
    from course_lib import tokens

    folder = tokens.prepare_corpus(o.root, force=o.force)
    manifest = tokens.verify_corpus(o.root, checksums=o.checksums)
    documents = tokens.read_corpus(o.root)
    counts = ", ".join(f"{source} {len(docs)}" for source, docs in documents.items())
    return f"{folder.name}: {len(manifest['files'])} files from Python {manifest['python']}, documents: {counts}"


def _text_ready(o: Options) -> bool:
    from course_lib import tokens

    try:
        tokens.verify_corpus(o.root, checksums=False)
    except tokens.TokenDataError:
        return False
    return True


#: The preparation steps, in the order they run (the shards are written from the images).
STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step("images", "01-09", "the shapes images (JPEG files, ImageFolder layout)", _images_run, _images_ready),
        Step("shards", "09", "the shapes images as WebDataset tar shards", _shards_run, _shards_ready),
        Step("text", "15", "a text corpus: Python's reference documentation and named modules", _text_run, _text_ready),
    )
}
#: What ``prepare`` makes without ``--all``: the image set alone.
DEFAULT_STEPS = ("images",)


class PrepareError(RuntimeError):
    """A step failed; the message names the step and what to do."""


@dataclass(frozen=True)
class Outcome:
    """The result of one step for one image set: its printable summary."""

    step: str
    size: str
    seed: int
    summary: str


def plan(names: list[str] | tuple[str, ...], size: str, seed: int, everything: bool) -> list[tuple[str, str, int]]:
    """The (step, size, seed) triples a run makes, in order.

    ``everything`` (``--all``) runs every step for the notebooks' own set (the default size, seed
    0), which is what the notebooks read, and for the requested size/seed if that differs.
    """
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise ValueError(f"unknown step {unknown[0]!r}; the steps are: {', '.join(STEPS)}")
    if everything:
        sets = [(data.DEFAULT_SIZE, 0)] + ([(size, seed)] if (size, seed) != (data.DEFAULT_SIZE, 0) else [])
        return [(n, s, sd) for s, sd in sets for n in STEPS]
    chosen = [n for n in STEPS if n in (names or DEFAULT_STEPS)]  # in STEPS order: images before shards
    return [(n, size, seed) for n in chosen]


def run_steps(
    triples: list[tuple[str, str, int]], base: Options, report: Callable[[Outcome], None] | None = None
) -> list[Outcome]:
    """Run the planned steps, each for its size and seed; a failing step raises :class:`PrepareError`."""
    from course_lib.shards import ShardError

    outcomes = []
    for name, size, seed in triples:
        o = Options(size, seed, base.root, base.force, base.progress, base.checksums)
        try:
            summary = STEPS[name].run(o)
        except (data.DataError, ShardError, OSError) as exc:
            raise PrepareError(f"step {name!r} ({data.dataset_name(size, seed)}) failed: {exc}") from exc
        outcome = Outcome(name, size, seed, summary)
        if report is not None:
            report(outcome)
        outcomes.append(outcome)
    return outcomes


def status(root: str | os.PathLike[str] | None = None, size: str = data.DEFAULT_SIZE, seed: int = 0) -> dict[str, bool]:
    """``{step name: ready}`` for one image set in the data folder (what the doctor reports)."""
    o = Options(size, seed, root)
    return {name: step.ready(o) for name, step in STEPS.items()}


def unreadable_by_others(folder: Path) -> list[Path]:
    """Folders under ``folder`` (itself included) that other users cannot enter: a shared data
    folder needs ``chmod -R a+rX``. Looks at folders only, and stops at the first 5."""
    bad: list[Path] = []
    for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        if path.stat().st_mode & 0o005 != 0o005:
            bad.append(path)
            if len(bad) >= 5:
                break
    return bad
