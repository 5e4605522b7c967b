"""The suite's own machinery: the multi-process tests share one pytest worker (tests/xdist_groups.py ``group_items``), and
the cost log (tests/cost_log.py) that benchmarks/suite_cost.py tables."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from xdist_groups import group_items

ROOT = Path(__file__).resolve().parents[2]


class _Item:
    """What group_items reads and writes of a collected test: its markers and its node id (pytest 9 keeps ``_id``)."""

    def __init__(self, nodeid: str, groups: list[str]):
        from _pytest.nodeid import NodeId

        self._id, self.groups = NodeId.parse(nodeid), groups

    @property
    def nodeid(self) -> str:
        return str(self._id)

    def iter_markers(self, name):
        return [SimpleNamespace(args=(g,), kwargs={}) for g in self.groups] if name == "xdist_group" else []


def test_the_multi_process_tests_reach_one_worker():
    """A test marked ``xdist_group("processes")`` carries ``@processes`` in its node id, which pytest-xdist's
    loadgroup scheduler reads as its group (so every multi-process test runs on one worker, one at a time); the
    others keep their ids; an id xdist already suffixed is left alone; without --dist loadgroup nothing changes."""
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    items = [_Item("example/test_a.py::test_x[1]", ["processes"]), _Item("example/test_a.py::test_y", []),
             _Item("example/test_a.py::test_z@processes", ["processes"])]
    assert group_items(SimpleNamespace(option=SimpleNamespace(loadgroup=True)), items) == 1
    assert [i.nodeid for i in items] == ["example/test_a.py::test_x[1]@processes", "example/test_a.py::test_y",
                                         "example/test_a.py::test_z@processes"]
    scheduler = LoadGroupScheduling.__new__(LoadGroupScheduling)
    assert scheduler._split_scope(items[0].nodeid) == "processes" == scheduler._split_scope(items[2].nodeid)
    assert scheduler._split_scope(items[1].nodeid) == items[1].nodeid
    plain = [_Item("example/test_a.py::test_x", ["processes"])]
    assert group_items(SimpleNamespace(option=SimpleNamespace(loadgroup=False)), plain) == 0
    assert plain[0].nodeid == "example/test_a.py::test_x"


def test_the_cost_log_records_each_test_and_the_report_tables_it(tmp_path):
    """``--cost-log`` writes a row per test (seconds, the worker's memory after it and its peak during it, markers),
    and benchmarks/suite_cost.py's report tables it per file and per marker, lists the slowest and flags a test whose
    peak passed 4 GB."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import suite_cost as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import subprocess

    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_some.py").write_text(
        "import pytest\n"
        "@pytest.mark.slow\n"
        "def test_holds_memory():\n"
        "    block = bytearray(300 * 1024 * 1024)\n"
        "    block[::4096] = b'x' * len(block[::4096])\n"
        "def test_quick():\n"
        "    pass\n")
    (folder / "conftest.py").write_text("pytest_plugins = ['cost_log']\n")
    env = {"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                             "-o", "markers=slow", f"--cost-log={tmp_path / 'cost'}", str(folder)],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["nodeid"].split("::")[1]: r for r in map(json.loads, (tmp_path / "cost" / "main.jsonl").read_text().splitlines())}
    assert rows.keys() == {"test_holds_memory", "test_quick"}
    big, small = rows["test_holds_memory"], rows["test_quick"]
    assert big["markers"] == ["slow"] and small["markers"] == []
    assert big["peak_gb"] - small["rss_gb"] > 0.25  # its 300 MB held during the test, freed after it
    text = bench.report(tmp_path / "cost")
    assert "## Per file" in text and "## Per marker" in text and "| slow | 1 |" in text
    assert "test_holds_memory" in text.split("## The 25 slowest tests")[1]
    bench.HEAVY_GB = 0.2  # the flag's threshold, lowered to this test's size
    assert "worker" in bench.report(tmp_path / "cost").split("peaked over")[1]
