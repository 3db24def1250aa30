"""Every notebook's citations are links (issue 52), and every summary ends with further reading.

In each markdown cell of both versions of every notebook:

* every ``owner/repo#N`` is the text of a link to ``https://github.com/owner/repo/issues/N`` (or ``/pull/N``);
* every link is an absolute ``https://`` address, or a relative path to a file of the repository that exists;
  no ``http://`` anywhere in the prose;
* the summary cell (the one with ``## Summary``, as in ``tests/test_notebooks.py``) ends with a paragraph
  ``**Further reading:**`` and a list of 2 to 5 items, each ``- [title](https://...) — why``.

Code (fenced blocks and inline spans) is left out: a command or an output is not a citation.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ALL = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) + sorted((NOTEBOOKS / "solutions").glob("[0-9][0-9]_*.ipynb"))

FURTHER_READING = "**Further reading:**"
MIN_FURTHER, MAX_FURTHER = 2, 5

_CODE = re.compile(r"```.*?```|~~~.*?~~~|`[^`\n]*`", re.S)
_LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<url>[^)\s]*)(?:\s+\"[^\"]*\")?\)")
_REF = re.compile(r"(?<![\w/.-])(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*\w)#(?P<n>\d+)\b")
_ISSUE_URL = re.compile(r"https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/(?:issues|pull)/(?P<n>\d+)/?(?:#[\w-]*)?")
_BULLET = re.compile(r"^[-*] (?P<body>.+)$")


def prose(markdown: str) -> str:
    """``markdown`` without its code: fenced blocks and inline code spans become blanks."""
    return _CODE.sub(" ", markdown)


def link_problems(markdown: str, here: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the citations of one markdown cell; ``here`` is the notebook's folder (relative links)."""
    text = prose(markdown)
    problems = []
    for link in _LINK.finditer(text):
        url = link["url"]
        for ref in _REF.finditer(link["text"]):
            target = _ISSUE_URL.fullmatch(url)
            if not target or target["repo"].lower() != ref["repo"].lower() or target["n"] != ref["n"]:
                problems.append(
                    f"[{link['text']}]({url}): {ref[0]} links to https://github.com/{ref['repo']}/issues/{ref['n']}"
                    " (or /pull/N)"
                )
        if url.startswith("https://"):
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", url, re.I) or url.startswith("//"):
            problems.append(f"[{link['text']}]({url}): links are https:// addresses")
            continue
        path = url.split("#", 1)[0]
        if path and not (here / path).resolve().is_relative_to(root.resolve()):
            problems.append(f"[{link['text']}]({url}): a relative link leaves the repository")
        elif path and not (here / path).exists():
            problems.append(f"[{link['text']}]({url}): no such file in the repository")
    outside = _LINK.sub(" ", text)
    problems += [
        f"{ref[0]} is not a link: write [{ref[0]}](https://github.com/{ref['repo']}/issues/{ref['n']})"
        for ref in _REF.finditer(outside)
    ]
    problems += [f"{m[0]}...: an http:// address; use https://" for m in re.finditer(r"http://\S{0,40}", text)]
    return problems


def further_reading_problems(summary: str) -> list[str]:
    """What is wrong with the end of a summary cell: the ``**Further reading:**`` paragraph and its list."""
    text = summary.rstrip()
    at = text.rfind(FURTHER_READING)
    if at < 0:
        return [f"the summary does not end with a {FURTHER_READING} list"]
    lines = [line for line in text[at + len(FURTHER_READING) :].splitlines() if line.strip()]
    problems = []
    items = []
    for line in lines:
        bullet = _BULLET.match(line)
        if bullet is None:
            if items and line.startswith("  "):  # an item's continuation line
                continue
            problems.append(f"after {FURTHER_READING} comes only its list, found {line.strip()[:60]!r}")
            continue
        items.append(bullet["body"])
        link = _LINK.match(bullet["body"])
        if link is None or not link["url"].startswith("https://"):
            problems.append(f"a further-reading item is '- [title](https://...) — why', found {line.strip()[:60]!r}")
    if not MIN_FURTHER <= len(items) <= MAX_FURTHER:
        problems.append(f"{FURTHER_READING} lists {MIN_FURTHER}–{MAX_FURTHER} links, found {len(items)}")
    return problems


def markdown_cells(path: Path) -> list[tuple[int, str]]:
    nb = nbformat.read(path, as_version=4)
    return [(i, cell.source) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"]


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(NOTEBOOKS)) for p in paths]


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_citations_are_links(path: Path) -> None:
    problems = [f"cell {i}: {p}" for i, source in markdown_cells(path) for p in link_problems(source, path.parent)]
    assert problems == []


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_the_summary_ends_with_further_reading(path: Path) -> None:
    summaries = [source for _, source in markdown_cells(path) if "## Summary" in source]
    assert summaries, "no summary cell (## Summary)"
    assert further_reading_problems(summaries[-1]) == []


# --------------------------------------------------------------------------- the checkers themselves

GOOD_SUMMARY = """## Summary

* A point.

**Next:** notebook 02.

**Further reading:**

- [torch.utils.data](https://pytorch.org/docs/stable/data) — the reference
- [pytorch/pytorch#30599](https://github.com/pytorch/pytorch/issues/30599) — the report
"""


def test_a_linked_reference_passes() -> None:
    good = (
        "As [pytorch/pytorch#30599](https://github.com/pytorch/pytorch/issues/30599) and the fix "
        "[huggingface/datasets#6710](https://github.com/huggingface/datasets/pull/6710) show; see "
        "[the README](../README.md) and `pip install x  # owner/repo#1 in code is not a citation`."
    )
    assert link_problems(good, NOTEBOOKS) == []
    assert further_reading_problems(GOOD_SUMMARY) == []


@pytest.mark.parametrize(
    ("markdown", "complaint"),
    [
        ("a known bug (pytorch/pytorch#30599).", "is not a link"),
        ("[pytorch/pytorch#30599](https://github.com/pytorch/pytorch/issues/30600)", "links to"),
        ("[pytorch/pytorch#30599](https://github.com/huggingface/datasets/issues/30599)", "links to"),
        ("[pytorch/pytorch#30599](https://example.com/pytorch/pytorch/issues/30599)", "links to"),
        ("[docs](http://pytorch.org/docs/stable/data)", "https://"),
        ("see http://example.com for more", "http://"),
        ("[notes](no_such_file.md)", "no such file"),
        ("[outside](../../../etc/passwd)", "leaves the repository"),
    ],
)
def test_a_bad_citation_is_caught(markdown: str, complaint: str) -> None:
    problems = link_problems(markdown, NOTEBOOKS)
    assert any(complaint in p for p in problems), problems


@pytest.mark.parametrize(
    ("summary", "complaint"),
    [
        ("## Summary\n\n* A point.\n\n**Next:** notebook 02.\n", "does not end with"),
        (GOOD_SUMMARY.split("- [pytorch/")[0], "found 1"),
        (GOOD_SUMMARY + "\nA closing paragraph.\n", "comes only its list"),
        (GOOD_SUMMARY + "- the PyTorch forums — no link\n", "[title](https://...)"),
        (GOOD_SUMMARY + "".join(f"- [x{i}](https://example.com/{i}) — why\n" for i in range(4)), "found 6"),
    ],
)
def test_a_bad_further_reading_list_is_caught(summary: str, complaint: str) -> None:
    problems = further_reading_problems(summary)
    assert any(complaint in p for p in problems), problems
