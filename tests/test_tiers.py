"""The two test tiers: a test without exactly one tier marker fails the collection (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.quick

CONFTEST = (Path(__file__).resolve().parent / "conftest.py").read_text()


def collect(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample="import pytest\n\n" + body)
    return pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")


def test_a_test_without_a_tier_fails_the_collection(pytester: pytest.Pytester) -> None:
    result = collect(pytester, "def test_untiered():\n    pass\n")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*every test needs exactly one tier marker*", "*test_untiered: no tier*"])


def test_two_tiers_fail_and_one_passes(pytester: pytest.Pytester) -> None:
    result = collect(pytester, "pytestmark = pytest.mark.quick\n\n@pytest.mark.full\ndef test_both():\n    pass\n")
    assert result.ret != 0
    assert "test_sample.py::test_both: ['full', 'quick']" in result.stderr.str()
    assert collect(pytester, "@pytest.mark.full\ndef test_one():\n    pass\n").ret == 0


# --------------------------------------------------------------------------- the order scopes are handed out in


class _Config:
    """What xdist's scheduler reads of a config: ``-n 2 --dist loadscope``, no ``-m``."""

    def __init__(self) -> None:
        self.option = SimpleNamespace(markexpr="", loadscopereorder=True)

    def getvalue(self, name: str) -> list[str]:
        assert name == "tx"
        return ["2*popen"]


class _Node:
    """A worker as the scheduler sees it: it records the tests sent to it."""

    def __init__(self, name: str) -> None:
        self.gateway, self.sent, self.shutting_down = SimpleNamespace(id=name), [], False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        pass


def _item(nodeid: str) -> SimpleNamespace:
    """A collected test as the tier hook sees it: a notebook cell, or a quick test."""
    return SimpleNamespace(nodeid=nodeid, add_marker=lambda mark: None, iter_markers=lambda: [pytest.mark.quick.mark])


def test_the_longest_scopes_are_collected_and_handed_out_first(pytestconfig: pytest.Config) -> None:
    here = str(Path(__file__).with_name("conftest.py"))  # tests/conftest.py (sys.modules holds one "conftest")
    tests_conftest = next(p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == here)
    longest = tests_conftest.LONGEST_FIRST
    root = Path(__file__).resolve().parents[1]
    assert [name for name in longest if not (root / name).is_file()] == []  # no stale name
    few = [f"tests/test_few.py::test_{i}" for i in range(3)]
    many = [f"tests/test_many.py::test_{i}" for i in range(50)]  # more tests than test_few: before it
    items = [_item(n) for n in [*few, "notebooks/11_x.ipynb::Cell 0", f"{longest[1]}::test_a", *many,
                                f"{longest[0]}::test_a", f"{longest[0]}::test_b", "notebooks/solutions/11_x.ipynb::Cell 0"]]
    tests_conftest.pytest_collection_modifyitems(pytestconfig, items)
    collection = [item.nodeid for item in items]
    assert collection[:4] == [f"{longest[0]}::test_a", f"{longest[0]}::test_b", f"{longest[1]}::test_a", many[0]]
    assert collection.index("notebooks/11_x.ipynb::Cell 0") < collection.index("notebooks/solutions/11_x.ipynb::Cell 0")

    scheduler = tests_conftest.pytest_xdist_make_scheduler(_Config(), None)
    nodes = [_Node("gw0"), _Node("gw1")]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    handed = [[scheduler._split_scope(collection[i]) for i in node.sent] for node in nodes]
    assert [scopes[0] for scopes in handed] == [longest[0], longest[1]]  # each process starts with a long one
    assert [collection[i] for i in nodes[0].sent[:2]] == [f"{longest[0]}::test_a", f"{longest[0]}::test_b"]
    scopes = {scope for node_scopes in handed for scope in node_scopes} | set(scheduler.workqueue)
    assert "notebooks/solutions/11_x.ipynb" not in scopes and "notebooks/11_x.ipynb" in scopes  # 11: one scope
