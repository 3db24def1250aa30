"""course_tools.hub: the nbgitpuller link an instructor hands out on a JupyterHub."""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import parse_qs, urlparse

import pytest

from course_tools import hub


@pytest.mark.quick
def test_the_link_pulls_the_repository_and_opens_the_notebook() -> None:
    link = hub.pull_link("https://hub.example.edu/", "https://github.com/ws/pytorch-data-course.git", "main")
    parts = urlparse(link)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "hub.example.edu", "/hub/user-redirect/git-pull")
    assert parse_qs(parts.query) == {
        "repo": ["https://github.com/ws/pytorch-data-course.git"],
        "branch": ["main"],
        "targetpath": ["pytorch-data-course"],
        "urlpath": ["lab/tree/pytorch-data-course/notebooks/01_map_style_datasets.ipynb"],
    }
    assert "%2F" in parts.query and "/" not in parts.query  # every value escaped: the hub sees four parameters


@pytest.mark.quick
def test_the_classic_interface_and_another_notebook() -> None:
    link = hub.pull_link(
        "http://127.0.0.1:8000",
        "file:///srv/git/course",
        "ws-2026",
        "notebooks/04_dataloader_performance.ipynb",
        interface="notebook",
    )
    query = parse_qs(urlparse(link).query)
    assert query["urlpath"] == ["tree/course/notebooks/04_dataloader_performance.ipynb"] and query["branch"] == [
        "ws-2026"
    ]


@pytest.mark.parametrize(
    "args, words",
    [
        (("hub.example.edu", "https://github.com/ws/c"), "--hub 'hub.example.edu' is not a URL"),
        (("https://hub", "github.com/ws/c"), "--repo"),
        (("https://hub", "https://github.com/"), "names no repository"),
    ],
)
@pytest.mark.quick
def test_bad_arguments_say_what_to_give(args: tuple[str, str], words: str) -> None:
    with pytest.raises(hub.LinkError, match=words.replace("(", r"\(")):
        hub.pull_link(*args)
    with pytest.raises(hub.LinkError, match="--branch"):
        hub.pull_link("https://hub", "https://github.com/ws/c", "bad branch")


@pytest.mark.parametrize(
    "notebook", ["notebooks/99_no_such_notebook.ipynb", "notebooks/", "README.md", "notebooks/01_map_style.ipynb"]
)
@pytest.mark.quick
def test_a_notebook_the_course_does_not_have_is_refused(notebook: str) -> None:
    with pytest.raises(hub.LinkError, match=r"is not a notebook of this course.*notebooks/01_map_style_datasets"):
        hub.pull_link("https://hub", "https://github.com/ws/c", "main", notebook)


@pytest.mark.quick
def test_the_command_prints_the_link_or_an_error() -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_lib",
            "hub",
            "link",
            "--hub",
            "https://hub.example.edu",
            "--repo",
            "https://github.com/ws/course",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and ok.stdout.strip().startswith(
        "https://hub.example.edu/hub/user-redirect/git-pull?repo="
    )
    bad = subprocess.run(
        [sys.executable, "-m", "course_lib", "hub", "link", "--hub", "hub", "--repo", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: --hub 'hub' is not a URL")


@pytest.mark.full
@pytest.mark.timeout(180)
def test_a_class_of_servers_starts_on_distinct_ports_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    import psutil

    before = {p.pid for p in psutil.process_iter() if p.name() == "weed"}
    rows = hub.simulate_class(3)
    assert [r.get("error") for r in rows] == [None, None, None]
    ports = [port for r in rows for port in r["ports"]]
    assert len(ports) == len(set(ports)) and all(r["pss_mb"] > 0 and r["seconds"] > 0 for r in rows)
    assert "3 of 3 servers started at once" in capsys.readouterr().out
    assert {p.pid for p in psutil.process_iter() if p.name() == "weed"} <= before, "a server outlived the simulation"
