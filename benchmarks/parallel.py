"""Run a benchmark's independent jobs (seeds, tasks, defences) in worker processes.

``map_jobs(fn, jobs, processes)``: the results in job order; one process runs them in turn. Workers are spawned
(a fresh interpreter: torch's threads and the model caches are not forked) and take one job at a time, so a slow
job (GRPO-Guard's SDE rollouts next to DiffusionNFT's) never holds a batch of others behind it. A SIGTERM to the
benchmark (``kill``, ``timeout``) ends its workers too: without the handler the parent died at once and left them
training, writing into the run folders of the next attempt.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
from collections.abc import Callable, Sequence


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)  # SystemExit unwinds the pool's with-block, which terminates the workers


def map_jobs(fn: Callable, jobs: Sequence, processes: int) -> list:
    if processes <= 1:
        return [fn(job) for job in jobs]
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with mp.get_context("spawn").Pool(processes) as pool:
            return pool.map(fn, jobs, chunksize=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
