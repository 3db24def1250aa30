"""The instructors' slide decks (course_tools.slides): they build, resolve every notebook figure, load
nothing from a network, and work in a real headless browser (Debian's chromium, driven over the
Chrome DevTools Protocol on a pipe: no extra packages)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from PIL import Image, ImageStat

from course_tools import slides

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[2]
DECKS = sorted((ROOT / "slides" / "decks").glob("level*.md"))
LEVELS = [p.stem for p in DECKS]
# Flags for a quiet, reproducible, offline browser (it must not phone home during the check).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    f"--window-size={slides.WIDTH},{slides.HEIGHT}",
    "--remote-debugging-pipe",
]


# ---------------------------------------------------------------------------------------------
# The decks as sources and as built files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[slides.Deck, Path]]:
    out = tmp_path_factory.mktemp("slides")
    return {deck.source.stem: (deck, path) for deck, path in slides.build(out)}


def test_there_is_a_deck_per_level() -> None:
    assert LEVELS == [f"level{n}" for n in range(1, 6)]


@pytest.mark.parametrize("level", LEVELS)
def test_deck_builds_with_its_figures(level: str, built: dict[str, tuple[slides.Deck, Path]]) -> None:
    deck, path = built[level]
    assert 7 <= deck.slides <= 13, f"{level}: a short deck has a title slide and 6-12 more"
    text = path.read_text(encoding="utf-8")
    assert text.count("<section") == deck.slides
    assert text.count('<img src="data:image/png;base64,') == len(deck.figures) >= 1
    source = deck.source.read_text(encoding="utf-8")
    assert len(deck.figures) == source.count("](notebook:"), "every figure reference resolved"
    assert deck.title in text and "Reveal.initialize" in text


@pytest.mark.parametrize("level", LEVELS)
def test_output_references_no_network(level: str, built: dict[str, tuple[slides.Deck, Path]]) -> None:
    text = built[level][1].read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text, re.I)
    assert not re.search(r"""url\(\s*["']?(https?:)?//""", text, re.I)
    assert "@import" not in text and "@font-face" not in text, "no web fonts"
    assert not re.search(r"<(link|iframe)\b", text, re.I), "everything is inlined"


@pytest.mark.parametrize("level", LEVELS)
def test_every_slide_has_speaker_notes(level: str, built: dict[str, tuple[slides.Deck, Path]]) -> None:
    """Every slide, the title slide too, has a `Note:` block with something in it: what to say, and what to demo live
    (which notebook, section and cell), for the speaker view (`S`)."""
    deck, path = built[level]
    parts = slides.split_slides(deck.source.read_text(encoding="utf-8"))
    bare = [n for n, (_, notes) in enumerate(parts, 1) if not notes.strip()]
    assert bare == [], f"{level}: slides {bare} have no speaker notes: add a `Note:` block (slides/README.md)"
    assert path.read_text(encoding="utf-8").count('<aside class="notes">') == deck.slides, "the notes reach the deck"


def test_a_figure_slide_gives_its_figure_the_room(tmp_path: Path) -> None:
    """A slide of a heading and one picture is a figure slide: the picture fills up to 1240×560 instead of 1240×400,
    and is enlarged to at most 150 pixels per inch of the figure, whatever dpi its PNG was drawn at."""
    Image.new("RGB", (500, 300), "white").save(tmp_path / "p80.png", dpi=(80, 80))
    (tmp_path / "level1.md").write_text(
        "# T\n\n---\n\n## Alone\n\n![a](p80.png)\n\n---\n\n## With a point\n\n- a point\n\n![a](p80.png)\n\n"
        "---\n\n![a](p80.png)\n\nNote: no heading, still a figure slide\n",
        encoding="utf-8",
    )
    sections = slides.build_deck(tmp_path / "level1.md").html.split("<section")[1:]
    assert ['class="figure-slide"' in s for s in sections] == [False, True, False, True]
    assert "width: 933px" in sections[1], "500 × min(150 / 80, 1240 / 500, 560 / 300)"
    assert "width: 667px" in sections[2], "500 × min(150 / 80, 1240 / 500, 400 / 300)"


def test_split_slides_keeps_code_fences_and_notes() -> None:
    text = "# T\n\n---\n\n## A\n```yaml\n---\nk: v\n```\nNote: say this\n\n---\n## B\n"
    assert slides.split_slides(text) == [("# T", ""), ("## A\n```yaml\n---\nk: v\n```", "say this"), ("## B", "")]


def test_bad_references_name_deck_slide_and_reference(tmp_path: Path) -> None:
    decks = tmp_path / "decks"
    decks.mkdir()
    (decks / "level9.md").write_text(
        "# Title\n\n---\n\n## One\n\n![a plan](notebook:99#c001)\n\n---\n\n![x](notebook:04#nope)\n\n"
        "![y](https://example.org/x.png)\n\n[docs](https://pytorch.org)\n",
        encoding="utf-8",
    )
    with pytest.raises(slides.SlideError) as err:
        slides.build(tmp_path / "out", ["9"], decks=decks)
    message = str(err.value)
    assert "level9.md, slide 2: unresolved figure reference 'notebook:99#c001'" in message
    assert "no notebook 99_*.ipynb" in message and "not written yet" in message
    assert "level9.md, slide 3: unresolved figure reference 'notebook:04#nope'" in message
    assert "figures 04" in message, "tells how to list the figures that exist"
    assert "'https://example.org/x.png' is not local" in message
    assert "link to 'https://pytorch.org'" in message
    assert not (tmp_path / "out").exists(), "nothing is written when a deck fails"


def test_unknown_level_and_missing_title(tmp_path: Path) -> None:
    with pytest.raises(slides.SlideError, match=r"no deck for level '7'.*levels: 1, 2, 3, 4, 5"):
        slides.deck_paths(["7"])
    (tmp_path / "level1.md").write_text("no heading here\n", encoding="utf-8")
    with pytest.raises(slides.SlideError, match="title slide needs a '# Title' heading"):
        slides.build(tmp_path / "out", decks=tmp_path)


def test_local_pictures_are_inlined(tmp_path: Path) -> None:
    (tmp_path / "dot.png").write_bytes(_png(Image.new("RGB", (4, 4), "red")))
    (tmp_path / "level1.md").write_text("# T\n\n---\n\n![a dot](dot.png)\n", encoding="utf-8")
    deck = slides.build_deck(tmp_path / "level1.md")
    assert 'src="data:image/png;base64,' in deck.html and "a dot" in deck.html


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "course_lib", "slides", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_the_course_folder_is_found_from_where_the_command_runs(tmp_path: Path) -> None:
    """Not from the package's location: an installed course_tools builds the decks of the folder it is run in."""
    assert slides.course_folder(ROOT / "notebooks" / "solutions") == ROOT
    elsewhere = run_cli("build", "1", "--out", str(tmp_path / "out"), "--course", str(ROOT), cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["level1.html"]


def test_command_line_builds_and_lists_figures(tmp_path: Path) -> None:
    done = run_cli("build", "1", "level2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["level1.html", "level2.html"]
    assert re.search(r"wrote .*level1\.html \(\d+ slides, \d+ figures, [\d.]+ MB\)", done.stdout)
    listed = run_cli("figures", "04")
    assert listed.returncode == 0 and "notebook:04#c010" in listed.stdout
    missing = run_cli("build", "8", "--out", str(tmp_path))
    assert missing.returncode == 1 and "no deck for level '8'" in missing.stderr


# ---------------------------------------------------------------------------------------------
# A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (fd 3: commands in,
# fd 4: replies out; each message is JSON ended by a NUL byte).


class Browser:
    """A headless chromium, driven over a pipe; always killed by close()."""

    def __init__(self, binary: str, profile: Path, timeout: float = 20.0) -> None:
        self.timeout = timeout
        to_browser_r, self._to_browser = _high_pipe()
        self._from_browser, from_browser_w = _high_pipe()

        def wire() -> None:  # in the child, before exec: the pipe ends onto the fds chromium reads
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        # close_fds=False keeps 3 and 4; every other fd of ours is close-on-exec (PEP 446).
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=wire,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._inbox: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self._inbox.put(json.loads(message))
        self._inbox.put(None)  # the browser closed its end

    def _pump(self, deadline: float) -> None:
        try:
            message = self._inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return
        if message is None:
            raise RuntimeError(f"chromium exited: {self.stderr_tail()}")
        if "id" in message:
            self._replies[message["id"]] = message
        else:
            self.events.append(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its reply; raise on a protocol error or a timeout."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while self._next_id not in self._replies:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to {method} within {self.timeout} s")
            self._pump(deadline)
        reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not happen within {timeout or self.timeout} s")
            self._pump(min(deadline, time.monotonic() + 0.1))

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("Browser.close")
                self.proc.wait(timeout=5)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the browser and its helpers
                self.proc.wait(timeout=5)
            os.close(self._to_browser)


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are numbered 10 or above, so they never collide with fds 3 and 4."""
    r, w = os.pipe()
    ends = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (r, w))
    os.close(r)
    os.close(w)
    return ends  # type: ignore[return-value]


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "/usr/bin/chromium"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI must check the slides in it: apt-get install chromium")
        pytest.skip("no chromium on PATH: `apt-get install chromium` (Debian) to check the slides in a browser")
    b = Browser(binary, tmp_path_factory.mktemp("chromium-profile"))
    try:
        b.call("Browser.getVersion")
        yield b
    finally:
        b.close()


# What the page reports once reveal.js is ready: slide count, pictures, and slides that overflow.
FACTS = """(() => {
  const images = Array.from(document.images);
  const overflow = [];
  Reveal.getSlides().forEach((s, i) => {
    Reveal.slide(i);
    if (s.scrollHeight > %(h)d + 2 || s.scrollWidth > %(w)d + 2)
      overflow.push(`slide ${i + 1}: ${s.scrollWidth}x${s.scrollHeight}`);
  });
  Reveal.slide(0);
  return JSON.stringify({
    slides: Reveal.getTotalSlides(),
    images: images.length,
    broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    overflow: overflow,
    notesPlugin: Reveal.hasPlugin('notes'),
    firstFigure: Reveal.getSlides().findIndex(s => s.querySelector('img')),
  });
})()""" % {"h": slides.HEIGHT, "w": slides.WIDTH}


def _screenshot(b: Browser, session: str) -> Image.Image:
    shot = b.call("Page.captureScreenshot", {"format": "png"}, session)
    return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")


def _evaluate(b: Browser, session: str, expression: str) -> Any:
    reply = b.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
    if "exceptionDetails" in reply:
        details = reply["exceptionDetails"]
        message = details.get("exception", {}).get("description", details.get("text", ""))
        raise AssertionError(f"{expression[:60]}...: {message.splitlines()[0][:300]}")  # no data: URLs
    return reply["result"].get("value")


@contextlib.contextmanager
def opened_deck(browser: Browser, path: Path, level: str) -> Iterator[tuple[str, Callable[[str], list[dict]]]]:
    """A new tab at the deck's size (1280×720) showing the built deck, once reveal.js is ready: its session, and
    ``mine(method)``, the protocol events of that name the tab sent since it started loading. Closed at the end."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        for domain in ("Network", "Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", {}, session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": slides.WIDTH, "height": slides.HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        first_event = len(browser.events)
        navigated = browser.call("Page.navigate", {"url": path.as_uri()}, session)
        assert "errorText" not in navigated, navigated

        def mine(method: str) -> list[dict]:
            return [
                e["params"]
                for e in browser.events[first_event:]
                if e.get("sessionId") == session and e["method"] == method
            ]

        browser.wait_for("the page's load event", lambda: bool(mine("Page.loadEventFired")))
        deadline = time.monotonic() + 15
        while not _evaluate(browser, session, "typeof Reveal !== 'undefined' && Reveal.isReady()"):
            assert time.monotonic() < deadline, f"{level}: reveal.js never became ready"
            time.sleep(0.1)
        yield session, mine
    finally:
        browser.call("Target.closeTarget", {"targetId": target})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level", LEVELS)
def test_deck_works_in_a_headless_browser(
    level: str, built: dict[str, tuple[slides.Deck, Path]], browser: Browser
) -> None:
    deck, path = built[level]
    with opened_deck(browser, path, level) as (session, mine):
        facts = json.loads(_evaluate(browser, session, FACTS))
        title = _screenshot(browser, session)
        if facts["firstFigure"] >= 0:  # a slide with a picture, for the eyes of whoever runs this
            _evaluate(browser, session, f"Reveal.slide({facts['firstFigure']})")
            figure = _screenshot(browser, session)
        shots = os.environ.get("SLIDES_SCREENSHOTS")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            title.save(Path(shots) / f"{level}.png")
            if facts["firstFigure"] >= 0:
                figure.save(Path(shots) / f"{level}-figure.png")

        requests = [r["request"]["url"] for r in mine("Network.requestWillBeSent")]
        remote = [u for u in requests if u.split(":", 1)[0] not in ("file", "data", "blob", "about")]
        failed = [f"{f.get('type')}: {f.get('errorText')}" for f in mine("Network.loadingFailed")]
        failed += [
            f"{r['response']['url'][:80]}: HTTP {r['response']['status']}"
            for r in mine("Network.responseReceived")
            if r["response"].get("status", 0) >= 400
        ]
        errors = [e["exceptionDetails"].get("text", "") for e in mine("Runtime.exceptionThrown")]
        errors += [e["entry"]["text"] for e in mine("Log.entryAdded") if e["entry"]["level"] == "error"]
        assert path.as_uri() in requests
        assert remote == [], f"{level} asked the network for {remote}"
        assert failed == [], f"{level}: failed requests {failed}"
        assert errors == [], f"{level}: errors in the page {errors}"
        assert facts["slides"] == deck.slides, "reveal.js sees every slide of the source"
        assert facts["images"] == len(deck.figures) and facts["broken"] == []
        assert facts["overflow"] == [], f"{level}: content taller or wider than the slide"
        assert facts["notesPlugin"], "speaker notes (press S) are available"
        assert title.size == (slides.WIDTH, slides.HEIGHT)
        for shot in [title] + ([figure] if facts["firstFigure"] >= 0 else []):
            colours = shot.getcolors(maxcolors=1 << 16)
            assert colours is None or len(colours) >= 16, f"{level}: the screenshot is blank"
            assert max(ImageStat.Stat(shot).stddev) > 5, f"{level}: the screenshot is blank"


# The smallest tick label a room reads from the back: its font size in CSS pixels of the 1280×720 slide.
MIN_TICK_PX = 14
# Figures whose tick labels are not matplotlib's default size, in points; None: the figure has no tick labels.
TICK_POINTS: dict[str, float | None] = {
    "notebook:01#c018": None,  # course_lib.viz.show_images: a grid of pictures, axes off
    "notebook:02#c020": None,  # show_images
    "notebook:09#c009": None,  # show_images
    "notebook:06#c029": 9,  # course_lib.samplers.plot_index_orders(class_names=...): the colour bar's class names
}

# Every notebook figure of the deck as the slide shows it: its reference, natural and laid-out size, slide number.
FIGURES = """(() => {
  const rows = [];
  Reveal.getSlides().forEach((s, i) => {
    Reveal.slide(i);
    s.querySelectorAll('img[data-figure]').forEach(img => rows.push({slide: i + 1, figure: img.dataset.figure,
      natural: [img.naturalWidth, img.naturalHeight], shown: [img.clientWidth, img.clientHeight]}));
  });
  Reveal.slide(0);
  return JSON.stringify(rows);
})()"""


def default_tick_points() -> float:
    """matplotlib's default tick label size in points, from the installed matplotlib (rcParams xtick.labelsize and
    ytick.labelsize, "medium" of font.size: 10 pt). The notebooks draw with its defaults: matplotlib-inline sets no
    rcParams of its own since 0.1.4, and the course changes none but figure.dpi, which the PNG records."""
    import matplotlib
    from matplotlib import font_manager

    defaults = matplotlib.rcParamsDefault

    def points(size: Any) -> float:
        return font_manager.font_scalings[size] * defaults["font.size"] if isinstance(size, str) else float(size)

    return min(points(defaults["xtick.labelsize"]), points(defaults["ytick.labelsize"]))


def test_tick_points_name_figures_of_the_decks() -> None:
    used = {m for deck in DECKS for m in re.findall(r"\]\((notebook:[^)\s]+)\)", deck.read_text(encoding="utf-8"))}
    assert set(TICK_POINTS) <= used, f"TICK_POINTS names figures no deck shows: {sorted(set(TICK_POINTS) - used)}"
    assert 9 <= default_tick_points() <= 12


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level", LEVELS)
def test_figure_tick_labels_are_readable(
    level: str, built: dict[str, tuple[slides.Deck, Path]], browser: Browser
) -> None:
    """Every notebook figure of the deck, laid out on the 1280×720 slide, shows tick labels of MIN_TICK_PX or more.

    A tick label of ``pt`` points in a PNG drawn at ``dpi`` is ``pt × dpi / 72`` pixels of the PNG (matplotlib
    writes the figure's dpi into the PNG's pHYs chunk: 100, or 80 where a notebook asks for smaller pictures), and
    the slide shows the PNG scaled by ``min(clientWidth / naturalWidth, clientHeight / naturalHeight)`` (course.css
    draws it with ``object-fit: contain``). Pixels are CSS pixels of the 1280×720 slide, the unit of course.css's
    font sizes, measured as a font size (the em, not the height of a digit); reveal.js then scales the whole slide
    to the screen (by 0.96 in a 1280×720 window, its margin). Limits: the tick size is matplotlib's default unless
    TICK_POINTS says otherwise, so a figure that sets its own (``tick_params``, ``set_yticklabels(fontsize=...)``,
    rcParams) must be listed there, as must a figure without ticks; titles, legends and other text are not measured.
    """
    deck, path = built[level]
    figures = slides.NotebookFigures()
    default = default_tick_points()
    with opened_deck(browser, path, level) as (session, _):
        shown = json.loads(_evaluate(browser, session, FIGURES))
    assert sorted(r["figure"] for r in shown) == sorted(deck.figures), "every notebook figure is measured"
    small = []
    for r in shown:
        points = TICK_POINTS.get(r["figure"], default)
        if points is None:
            continue
        name, _, cell = r["figure"].removeprefix("notebook:").partition("#")
        with Image.open(io.BytesIO(figures.png(name, cell))) as png:
            dpi = png.info.get("dpi")
        assert dpi, f"{level}: {r['figure']} names no dpi (a PNG pHYs chunk): was it drawn by matplotlib?"
        scale = min(r["shown"][0] / r["natural"][0], r["shown"][1] / r["natural"][1])
        px = points * dpi[0] / 72 * scale
        if px < MIN_TICK_PX:
            small.append(
                f"slide {r['slide']}, {r['figure']}: {px:.1f} px ({points:g} pt at {dpi[0]:.0f} dpi × {scale:.2f})"
            )
    assert small == [], (
        f"{level}: tick labels under {MIN_TICK_PX} px at 1280×720: {'; '.join(small)}. Give the figure a slide of its "
        "own (a heading and the picture, nothing else), or draw it larger in the notebook; a figure without tick "
        "labels, or with its own tick size, goes in TICK_POINTS"
    )


def test_the_vendored_reveal_js_is_committed() -> None:
    """The decks need these files on a fresh clone: none may be left out by .gitignore."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    vendored = [p.relative_to(ROOT).as_posix() for p in (ROOT / "slides" / "vendor").rglob("*") if p.is_file()]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *vendored], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert ignored.stdout.split() == [], f"ignored by .gitignore, so missing on a fresh clone: {ignored.stdout.split()}"
    assert {"slides/vendor/reveal.js/dist/reveal.js", "slides/vendor/reveal.js/dist/reveal.css"} <= set(vendored)
