"""Instructors' slide decks: one short reveal.js deck per course level, built to work offline.

Each deck is a Markdown file, ``slides/decks/levelN.md``. A line holding only ``---`` starts a
new slide; a line starting with ``Note:`` starts that slide's speaker notes. Pictures come from
the committed solution notebooks' own outputs::

    ![The loop waits while one process loads](notebook:04#c010)

names the PNG figure stored in the output of cell ``c010`` of ``notebooks/solutions/04_*.ipynb``
(``python -m course_lib slides figures 04`` lists them). A relative path (``images/x.svg``, next
to the deck) works too. Web addresses are refused: the decks are shown in rooms without internet.
A slide whose body is a heading and one picture, nothing else, is a *figure slide*: the picture gets
most of the slide, so that a small figure's tick labels stay readable from the back of the room.

The build writes one self-contained HTML file per deck (reveal.js, its CSS and every picture
inlined), so a deck can be copied to a USB stick and opened in any browser::

    python -m course_lib slides build                 # all decks into slides/build/ (run in the course folder)
    python -m course_lib slides build 2 4 --out /tmp/decks
    python -m course_lib slides figures 04            # the figures notebook 04 offers
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import mimetypes
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import mistune
from mistune.renderers.html import HTMLRenderer
from PIL import Image, UnidentifiedImageError

from course_lib.support import write_atomic


# The slide size reveal.js lays out at (and scales to the screen): a 16:9 projector.
WIDTH, HEIGHT = 1280, 720
# The largest a figure is drawn (CSS pixels of the slide): below a heading and a few lines of text,
FIGURE_BOX = (1240, 400)
# and on a figure slide, whose body is a heading and one picture, nothing else (course.css: .figure-slide).
FIGURE_SLIDE_BOX = (1240, 560)
# Figures are enlarged to at most this many CSS pixels per inch of the figure: 1.5x a 100-dpi PNG, 1.875x an 80-dpi one.
MAX_PIXELS_PER_INCH = 150

_FENCE = re.compile(r"^\s*(```|~~~)")
_SEPARATOR = re.compile(r"^---\s*$")
_NOTES = re.compile(r"^Notes?:\s*", re.IGNORECASE)
# A figure slide: an optional heading, then one picture on a line of its own, and nothing else.
_FIGURE_ONLY = re.compile(r"\A(?:#{1,6}[ \t][^\n]*\n\s*)?!\[[^\]\n]*\]\([^)\n]+\)\Z")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
# Anything in the output that a browser would fetch from a network.
_NETWORK = re.compile(
    r"""(?:\b(?:src|href|srcset|action|poster)\s*=\s*["']?\s*|url\(\s*["']?\s*)(?:[a-z]+:)?//""", re.I
)


class SlideError(ValueError):
    """A deck cannot be built; the message names the deck, the slide and what to change."""


def course_folder(start: Path | None = None) -> Path:
    """The course's folder (it holds ``slides/decks`` and ``notebooks/solutions``): ``start`` (default:
    the current folder) or a folder above it, else the source checkout this package lies in."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if (folder / "slides" / "decks").is_dir() and (folder / "notebooks" / "solutions").is_dir():
            return folder
    raise SlideError(
        f"{here} is not in the course's folder (the one holding slides/ and notebooks/): "
        "run from there, or pass --course DIR"
    )


@dataclass
class Deck:
    """One built deck: its source, title, number of slides and the HTML page."""

    source: Path
    title: str
    slides: int
    html: str
    figures: list[str] = field(default_factory=list)


def deck_paths(levels: list[str] | None = None, decks: Path | None = None) -> list[Path]:
    """The deck sources for the given levels ("3" or "level3"), or all of them in order."""
    decks = decks or course_folder() / "slides" / "decks"
    if not decks.is_dir():
        raise SlideError(f"no deck folder {decks}: run from a checkout of the course, or pass --decks")
    every = sorted(decks.glob("level*.md"))
    if not levels:
        if not every:
            raise SlideError(f"no levelN.md deck in {decks}")
        return every
    chosen = []
    for level in levels:
        name = level if level.startswith("level") else f"level{level}"
        path = decks / f"{name.removesuffix('.md')}.md"
        if not path.is_file():
            known = ", ".join(p.stem.removeprefix("level") for p in every) or "none"
            raise SlideError(f"no deck for level {level!r} in {decks} (levels: {known})")
        chosen.append(path)
    return chosen


def split_slides(text: str) -> list[tuple[str, str]]:
    """(body, speaker notes) Markdown for each slide; ``---`` inside a code fence is not a break."""
    slides: list[tuple[list[str], list[str]]] = [([], [])]
    fence: str | None = None
    in_notes = False
    for line in text.splitlines():
        match = _FENCE.match(line)
        if match:
            fence = None if fence == match.group(1) else (fence or match.group(1))
        if fence is None and _SEPARATOR.match(line):
            slides.append(([], []))
            in_notes = False
            continue
        if fence is None and not in_notes and _NOTES.match(line):
            in_notes = True
            line = _NOTES.sub("", line, count=1)
        slides[-1][1 if in_notes else 0].append(line)
    result = [("\n".join(body).strip(), "\n".join(notes).strip()) for body, notes in slides]
    return [(body, notes) for body, notes in result if body or notes]


class NotebookFigures:
    """The PNG figures stored in the solution notebooks' outputs, found by notebook and cell id."""

    def __init__(self, solutions: Path | None = None) -> None:
        solutions = solutions or course_folder() / "notebooks" / "solutions"
        self.solutions = solutions
        self._cache: dict[str, dict] = {}

    def notebook(self, name: str) -> Path:
        """The solution notebook for "04" or "04_dataloader_performance"."""
        matches = sorted(self.solutions.glob(f"{name}.ipynb")) or sorted(self.solutions.glob(f"{name}_*.ipynb"))
        if len(matches) != 1:
            found = "no" if not matches else f"{len(matches)}"
            raise LookupError(
                f"{found} notebook {name}_*.ipynb in {self.solutions} (not written yet? "
                "remove the reference until it exists)"
            )
        return matches[0]

    def _cells(self, name: str) -> dict:
        if name not in self._cache:
            self._cache[name] = json.loads(self.notebook(name).read_text(encoding="utf-8"))
        return self._cache[name]

    def png(self, name: str, cell_id: str) -> bytes:
        """The one PNG that cell ``cell_id`` of notebook ``name`` shows."""
        nb = self._cells(name)
        cells = [c for c in nb["cells"] if c.get("id") == cell_id]
        if not cells:
            raise LookupError(
                f"notebook {self.notebook(name).name} has no cell {cell_id!r} "
                f"(`python -m course_lib slides figures {name}` lists its figures)"
            )
        pngs = [o["data"]["image/png"] for o in cells[0].get("outputs", []) if "image/png" in o.get("data", {})]
        if len(pngs) != 1:
            raise LookupError(
                f"cell {cell_id!r} of {self.notebook(name).name} shows {len(pngs)} PNG figures, "
                "not 1 (is the notebook executed? `python -m course_lib authoring build`)"
            )
        data = pngs[0]
        return base64.b64decode("".join(data) if isinstance(data, list) else data)

    def listing(self, name: str) -> list[tuple[str, str, str]]:
        """(cell id, section heading above it, last line of its code) for every figure of a notebook."""
        rows, heading = [], ""
        for cell in self._cells(name)["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "markdown":
                heading = next((t.lstrip("# ") for t in source.splitlines() if t.startswith("#")), heading)
            elif any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
                lines = [t.strip() for t in source.splitlines() if t.strip()]
                rows.append((cell.get("id", "?"), heading, lines[-1] if lines else ""))
        return rows


def _raster_size(data: bytes) -> tuple[int, int, float | None] | None:
    """Width, height and dpi (None when the file does not say) of a raster image; None for SVG and anything
    Pillow cannot read. matplotlib writes the figure's dpi into a PNG's pHYs chunk, which Pillow reads."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            dpi = image.info.get("dpi")
            return image.size[0], image.size[1], float(dpi[0]) if dpi and dpi[0] > 0 else None
    except (UnidentifiedImageError, OSError):
        return None


def _display_width(width: int, height: int, dpi: float | None = None, box: tuple[int, int] = FIGURE_BOX) -> int:
    """Notebook figures are drawn at 80 or 100 dpi, small for a projector: enlarge them to fill ``box``, but to
    at most ``MAX_PIXELS_PER_INCH`` of the figure (a picture without a dpi counts as 100 dpi), so that a figure's
    text comes out the same size whatever dpi it was drawn at; CSS still caps them to the slide."""
    most = MAX_PIXELS_PER_INCH / (dpi or 100)
    return round(width * min(most, box[0] / width, box[1] / height))


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class _SlideRenderer(HTMLRenderer):
    """Mistune's HTML renderer, with pictures inlined and web addresses refused."""

    def __init__(self, deck: Path, figures: NotebookFigures) -> None:
        super().__init__(escape=False)
        self.deck, self.figures = deck, figures
        self.problems: list[str] = []
        self.used: list[str] = []
        self.box = FIGURE_BOX  # the room a picture has on the slide being rendered

    def image(self, text: str, url: str, title: str | None = None) -> str:
        src, size = self._resolve(url)
        alt = html.escape(text)
        caption = f'<span class="caption">{alt}</span>' if text else ""
        width = f' style="width: {_display_width(*size, box=self.box)}px"' if size else ""
        # data-figure names a notebook figure's reference: the browser test measures its tick labels by it
        source = f' data-figure="{html.escape(url)}"' if url.startswith("notebook:") and src else ""
        return f'<span class="figure"><img src="{src}" alt="{alt}"{source}{width}>{caption}</span>'

    def _resolve(self, url: str) -> tuple[str, tuple[int, int, float | None] | None]:
        """The picture as a data: URL, and its pixel size and dpi when it is a raster image."""
        scheme = _SCHEME.match(url)
        if url.startswith("notebook:"):
            name, _, cell_id = url.removeprefix("notebook:").partition("#")
            if not name or not cell_id:
                self.problems.append(f"figure reference {url!r}: write it as notebook:NN#<cell id>")
                return "", None
            try:
                png = self.figures.png(name, cell_id)
            except LookupError as err:
                self.problems.append(f"unresolved figure reference {url!r}: {err}")
                return "", None
            self.used.append(url)
            return _data_url("image/png", png), _raster_size(png)
        if scheme or url.startswith("//"):
            self.problems.append(
                f"picture {url!r} is not local: decks must work offline; save it next to "
                "the deck and give its relative path"
            )
            return "", None
        path = self.deck.parent / url
        if not path.is_file():
            self.problems.append(f"picture {url!r}: no file {path}")
            return "", None
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        data = path.read_bytes()
        return _data_url(mime, data), _raster_size(data) if mime.startswith("image/") else None

    def link(self, text: str, url: str, title: str | None = None) -> str:
        if _SCHEME.match(url) or url.startswith("//"):
            self.problems.append(f"link to {url!r}: decks must work offline; write the address as text")
        return super().link(text, url, title)

    def block_code(self, code: str, info: str | None = None) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import TextLexer, get_lexer_by_name
        from pygments.util import ClassNotFound

        try:
            lexer = get_lexer_by_name((info or "text").split()[0])
        except ClassNotFound:
            lexer = TextLexer()
        # Inline styles: no stylesheet to ship, and the colours survive copying the file anywhere.
        return highlight(code, lexer, HtmlFormatter(noclasses=True, nowrap=False, style="default"))


def _vendor(slides: Path, rel: str) -> str:
    path = slides / "vendor" / "reveal.js" / rel
    if not path.is_file():
        raise SlideError(f"missing {path}: the vendored reveal.js is incomplete (see slides/README.md)")
    return path.read_text(encoding="utf-8")


def _styles(slides: Path) -> str:
    theme = _vendor(slides, "dist/theme/white.css")
    # The theme imports its web font; we use the system's fonts instead (course.css), so nothing loads.
    theme = re.sub(r"^@import[^;]*;\s*$", "", theme, flags=re.M)
    course = (slides / "course.css").read_text(encoding="utf-8")
    return "\n".join([_vendor(slides, "dist/reset.css"), _vendor(slides, "dist/reveal.css"), theme, course])


def _page(title: str, sections: list[str], slides: Path) -> str:
    scripts = "\n".join(
        f'<script src="{_data_url("text/javascript", _vendor(slides, rel).encode("utf-8"))}"></script>'
        for rel in ("dist/reveal.js", "plugin/notes/notes.js")
    )
    config = json.dumps(
        {
            "width": WIDTH,
            "height": HEIGHT,
            "margin": 0.04,
            "hash": True,
            "slideNumber": "c/t",
            "transition": "none",
            "center": False,
        }
    )
    body = "\n".join(sections)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="python -m course_lib slides build">
<title>{html.escape(title)}</title>
<style>
{_styles(slides)}
</style>
</head>
<body>
<div class="reveal"><div class="slides">
{body}
</div></div>
{scripts}
<script>
Reveal.initialize(Object.assign({config}, {{ plugins: [RevealNotes] }}));
</script>
</body>
</html>
"""


def build_deck(source: Path, figures: NotebookFigures | None = None, slides_folder: Path | None = None) -> Deck:
    """Render one Markdown deck into a self-contained reveal.js page; SlideError on any problem.

    ``slides_folder`` holds ``course.css`` and the vendored reveal.js (default: the course's ``slides/``)."""
    figures = figures or NotebookFigures()
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as err:
        raise SlideError(f"cannot read deck {source}: {err}") from err
    slides = split_slides(text)
    if not slides:
        raise SlideError(f"{source}: the deck is empty (slides are separated by lines holding only ---)")
    renderer = _SlideRenderer(source, figures)
    markdown = mistune.create_markdown(renderer=renderer, plugins=["table", "strikethrough"])
    sections, problems = [], []
    for n, (body, notes) in enumerate(slides, 1):
        before = len(renderer.problems)
        figure_slide = n > 1 and bool(_FIGURE_ONLY.match(body))  # a heading and one picture: the picture gets the room
        renderer.box = FIGURE_SLIDE_BOX if figure_slide else FIGURE_BOX
        inner = markdown(body)
        if notes:
            inner += f'\n<aside class="notes">\n{markdown(notes)}</aside>'
        problems += [f"{source.name}, slide {n}: {p}" for p in renderer.problems[before:]]
        css = ' class="title-slide"' if n == 1 else ' class="figure-slide"' if figure_slide else ""
        sections.append(f"<section{css}>\n{inner}</section>")
    heading = re.search(r"^#\s+(.+)$", slides[0][0], flags=re.M)
    if not heading:
        problems.append(f"{source.name}, slide 1: the title slide needs a '# Title' heading")
    page = _page(
        heading.group(1).strip() if heading else source.stem, sections, slides_folder or course_folder() / "slides"
    )
    problems += [f"{source.name}: the page would load {m.group(0)!r}..." for m in _NETWORK.finditer(page)]
    if problems:
        raise SlideError(f"deck {source} cannot be built:\n  " + "\n  ".join(problems))
    return Deck(source, heading.group(1).strip(), len(sections), page, renderer.used)


def build(
    out: Path,
    levels: list[str] | None = None,
    decks: Path | None = None,
    solutions: Path | None = None,
    course: Path | None = None,
) -> list[tuple[Deck, Path]]:
    """Build the chosen decks into ``out/levelN.html``; nothing is written unless all of them build."""
    figures = NotebookFigures(solutions)
    built, problems = [], []
    for source in deck_paths(levels, decks):
        try:
            built.append(build_deck(source, figures, (course or course_folder()) / "slides"))
        except SlideError as err:
            problems.append(str(err))
    if problems:
        raise SlideError("\n".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for deck in built:
        target = write_atomic(out / f"{deck.source.stem}.html", deck.html.encode("utf-8"))  # never half a deck
        written.append((deck, target))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib slides", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build self-contained HTML decks (default: all levels)")
    b.add_argument("levels", nargs="*", help="levels to build, e.g. 1 3 (default: every slides/decks/levelN.md)")
    b.add_argument("--out", type=Path, help="output folder (default: slides/build in the course folder)")
    b.add_argument("--decks", type=Path, help="folder of levelN.md sources (default: slides/decks)")
    b.add_argument(
        "--solutions", type=Path, help="solution notebooks to take figures from (default: notebooks/solutions)"
    )
    f = sub.add_parser("figures", help="list the figures a notebook offers, with their references")
    f.add_argument("notebook", help="a notebook number or name, e.g. 04")
    f.add_argument("--solutions", type=Path, help="solution notebooks folder (default: notebooks/solutions)")
    for p in (b, f):
        p.add_argument("--course", type=Path, help="the course's folder (default: this folder or one above it)")
    args = parser.parse_args(argv)
    try:
        course = course_folder(args.course)
        args.solutions = args.solutions or course / "notebooks" / "solutions"
        if args.command == "figures":
            figures = NotebookFigures(args.solutions)
            for cell_id, heading, line in figures.listing(args.notebook):
                print(f"notebook:{args.notebook}#{cell_id}  [{heading}]  {line[:70]}")
            return 0
        out = args.out or course / "slides" / "build"
        for deck, path in build(out, args.levels, args.decks or course / "slides" / "decks", args.solutions, course):
            print(
                f"wrote {path} ({deck.slides} slides, {len(deck.figures)} figures, {path.stat().st_size / 1e6:.1f} MB)"
            )
        return 0
    except (SlideError, LookupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
