"""Shared test set-up.

Under pytest-xdist every worker is its own process: one torch thread each, or the workers' OpenMP
pools fight over the cores and run ~10x slower (measured on the 2-core CI machine).
"""

import os

import pytest

pytest_plugins = [
    "cost_log",  # --cost-log=DIR: each test's seconds and memory (tests/cost_log.py)
    "xdist_groups",  # xdist_group("processes") on pytest 9 (tests/xdist_groups.py)
]
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


RETURN_MEMORY_ABOVE_GB = 1.0  # a worker above this after a test gives back what the test freed (tests/cost_log.py measures it)


@pytest.fixture(autouse=True)
def _worker_keeps_nothing():
    """A pytest worker runs hundreds of tests: what one test freed goes back to the system before the next, so a
    worker does not carry a large test's memory on (the objects it left, collected; glibc's free heap pages,
    returned with malloc_trim). Only when the worker is large: a collection costs milliseconds, most tests need none."""
    yield
    from cost_log import resident_gb  # registered as a plugin above: imported here, after pytest has loaded it

    if resident_gb() > RETURN_MEMORY_ABOVE_GB:
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
