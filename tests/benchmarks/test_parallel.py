"""benchmarks/parallel.py: job order kept, one job at a time, and a SIGTERM to the benchmark ends its workers."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from parallel import map_jobs  # noqa: E402


def square(x):
    return x * x


def test_results_keep_the_job_order_serial_and_in_workers():
    assert map_jobs(square, [3, 1, 2], 1) == [9, 1, 4]
    assert map_jobs(square, list(range(7)), 2) == [x * x for x in range(7)]


SLEEPER = """
import os, sys, time
sys.path.insert(0, {bench!r})
from parallel import map_jobs

def work(path):
    open(path, "w").write(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    map_jobs(work, [{a!r}, {b!r}], 2)
"""


def test_a_sigterm_to_the_benchmark_ends_its_workers(tmp_path):
    a, b = tmp_path / "a.pid", tmp_path / "b.pid"
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER.format(bench=str(BENCH), a=str(a), b=str(b)))
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while not (a.exists() and b.exists() and a.read_text() and b.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the workers never started"
        time.sleep(0.1)
    workers = [int(a.read_text()), int(b.read_text())]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived the benchmark"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
