"""Shared test set-up.

Under pytest-xdist every worker is its own process: one torch thread each, or the workers' OpenMP
pools fight over the cores and run ~10x slower (measured on the 2-core CI machine).
"""

import os

import pytest

pytest_plugins = ["cost_log"]  # --cost-log=DIR: each test's seconds and memory (tests/cost_log.py)
import flowgrpo  # noqa: F401  (installs the torchvision compatibility hook for source-tree runs)
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """Small tensors on a busy 2-core machine: a second intra-op thread only adds contention (seen: 3 s →
    35 s in the marginal tests). Restored after the test. Use with pytestmark = pytest.mark.usefixtures("one_thread")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    group_items(config, items)


def group_items(config, items) -> int:
    """``--dist loadgroup`` (pyproject's addopts): pytest-xdist sends the tests marked ``xdist_group(NAME)`` to one
    worker by the suffix ``@NAME`` it adds to their node ids on the worker. pytest-xdist 3.8 writes that suffix to
    ``item._nodeid``, which pytest 9 no longer reads (a node id is ``item._id``): the suffix was lost and the
    multi-process tests ran on both workers at once, each launch's processes fighting the other's for the 2 cores.
    This adds the suffix where the installed pytest keeps the id, unless xdist's own hook already did. Returns the
    number of items grouped (tests/project/test_suite_cost.py checks it)."""
    if not getattr(config.option, "loadgroup", False):
        return 0
    grouped = 0
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid:
            continue
        nodeid = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid)
        else:
            item._nodeid = nodeid
        grouped += 1
    return grouped


RETURN_MEMORY_ABOVE_GB = 1.0  # a worker above this after a test gives back what the test freed (tests/cost_log.py measures it)


def _resident_gb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024**3


@pytest.fixture(autouse=True)
def _worker_keeps_nothing():
    """A pytest worker runs hundreds of tests: what one test freed goes back to the system before the next, so a
    worker does not carry a large test's memory on (the objects it left, collected; glibc's free heap pages,
    returned with malloc_trim). Only when the worker is large: a collection costs milliseconds, most tests need none."""
    yield
    if _resident_gb() > RETURN_MEMORY_ABOVE_GB:
        import ctypes
        import gc

        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: the collection alone
            pass


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide state: a test that builds an Accelerator(mixed_precision="no")
    would make a later bf16 test in the same process fail, so every test starts without one."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory):
    """A tiny random SD3 pipeline folder (real classes) shared by the training tests."""
    from train_fixtures import save_tiny_sd3

    return save_tiny_sd3(tmp_path_factory.mktemp("tiny_sd3"))


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory):
    """A tiny random Wan2.1 pipeline folder (real classes, 9 x 32 x 32 clips) for the video training tests."""
    from train_fixtures import save_tiny_wan

    return save_tiny_wan(tmp_path_factory.mktemp("tiny_wan"))
