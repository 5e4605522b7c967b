"""What each test costs: wall time, the worker's resident and peak memory, and its children's peak.

Loaded by tests/conftest.py. ``pytest --cost-log=DIR`` writes one JSON line per test to
``DIR/<worker>.jsonl`` (``gw0``, ``gw1`` under pytest-xdist, ``main`` without it):

- ``seconds``: the test's setup + call + teardown;
- ``rss_gb``: the worker's resident memory after the test (what it keeps for the next one);
- ``peak_gb``: the worker's peak resident memory during the test. Linux keeps one high-water mark per
  process (VmHWM); writing ``5`` to ``/proc/self/clear_refs`` resets it, so it is reset before each test;
- ``children_peak_gb``: the largest peak of a child process that ended during the test (a launched
  training run, ``torchrun``'s workers), or null when no child's peak rose above the earlier ones.

Write the option with ``=``: with a space, pytest reads DIR as a test path when it chooses the root folder (under
xdist the workers then miss tests/conftest.py and refuse the option). ``benchmarks/suite_cost.py`` runs the suite with it and tables the result per file, per marker and per test.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

_GB = 1024**3


def resident_gb() -> float:
    """This process's resident memory now, in GB."""
    return _status_kb("VmRSS") * 1024 / _GB


def _status_kb(field: str) -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _children_peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def pytest_addoption(parser):
    parser.addoption("--cost-log", metavar="DIR", default=None,
                     help="write each test's seconds, resident and peak memory to DIR/<worker>.jsonl")


class CostLog:
    def __init__(self, folder: Path):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{worker}.jsonl"
        self.worker = worker

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        reset, children_before, begun = _reset_peak(), _children_peak_kb(), time.perf_counter()
        yield
        children_after = _children_peak_kb()
        row = {
            "nodeid": item.nodeid,
            "worker": self.worker,
            "markers": sorted({m.name for m in item.iter_markers() if m.name not in ("parametrize", "usefixtures")}),
            "seconds": round(time.perf_counter() - begun, 3),
            "rss_gb": round(resident_gb(), 3),
            # without a reset the high-water mark is the worker's whole life's, not this test's
            "peak_gb": round(_status_kb("VmHWM") * 1024 / _GB, 3) if reset else None,
            "children_peak_gb": round(children_after * 1024 / _GB, 3) if children_after > children_before else None,
        }
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row) + "\n")


def pytest_configure(config):
    folder = config.getoption("--cost-log", default=None)
    controller = getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER")
    if folder and not controller:  # under xdist the workers run the tests; the controller only relays their reports
        config.pluginmanager.register(CostLog(Path(folder)), "cost_log_writer")
