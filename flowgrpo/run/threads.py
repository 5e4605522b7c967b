"""How many CPU threads torch uses: the ``threads`` config key and ``--threads`` (training and
``flowgrpo eval``), printed at start-up.

PyTorch's OpenMP workers spin while they wait, so a process with more threads than there are free
cores runs many times slower, not a little: on the 2-core machine with another process busy on one
core, ``flowgrpo eval`` took 56.6 s with torch's default (2 threads) and 2.3 s with one, and the first
training iteration's sampling 32 s against 5 s. One thread too few costs at most the share of one core.
So the automatic choice (``threads=0``, the default) leaves out the cores other processes are using:

1. ``OMP_NUM_THREADS``, when set, is the user's (or launcher's) choice and is kept;
2. else the CPUs this process may run on (its affinity mask, and the cgroup CPU quota of a container)
   are shared among the processes of this launch on this machine (``LOCAL_WORLD_SIZE``), and, with one
   process, the cores other processes kept busy during 0.2 s at start-up (``/proc/stat``) are left out;
3. never more than torch's own default (the physical cores), never fewer than 1.

The count is measured once, at start-up: on a machine whose load changes, set it (``--threads 1`` on a
shared machine).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

_TORCH_DEFAULT = torch.get_num_threads()  # before flowgrpo changes it: torch's choice (physical cores, or OMP_NUM_THREADS)
_BUSY_STATES = (0, 1, 2, 5, 6, 7)  # /proc/stat columns: user nice system (idle iowait) irq softirq steal


@dataclass
class ThreadChoice:
    threads: int
    reason: str

    def line(self, how: str = "--threads N or threads=N") -> str:
        plural = "s" if self.threads != 1 else ""
        hint = "" if self.reason == "as asked" else f"; set with {how}"
        return f"using {self.threads} CPU thread{plural} ({self.reason}{hint})"


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def _cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy ticks, total ticks) since boot, from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(v) for v in values[:8]]
            out[int(name[3:])] = (sum(ticks[i] for i in _BUSY_STATES if i < len(ticks)), sum(ticks))
    return out


def busy_cores(seconds: float = 0.2) -> float:
    """Cores' worth of CPU time other processes used on this process's CPUs during ``seconds``, while
    this process sleeps (0.0 where /proc/stat cannot be read)."""
    try:
        mine = os.sched_getaffinity(0)
        before = _cpu_times()
        time.sleep(seconds)
        after = _cpu_times()
    except (AttributeError, OSError, ValueError):
        return 0.0
    busy = 0.0
    for cpu in mine & before.keys() & after.keys():
        total = after[cpu][1] - before[cpu][1]
        if total > 0:
            busy += (after[cpu][0] - before[cpu][0]) / total
    return busy


def auto_threads(cpus: int, busy: float, local_processes: int, torch_default: int) -> int:
    """The rule: this process's share of the CPUs, less the cores others keep busy, within [1, torch's default]."""
    share = cpus // max(1, local_processes)
    free = cpus - math.floor(busy + 0.5) if local_processes <= 1 else share
    return max(1, min(share, free, torch_default))


def choose_threads(requested: int = 0) -> ThreadChoice:
    """``requested`` > 0: exactly that; 0: the automatic rule (module docstring)."""
    if requested < 0:
        from flowgrpo.run.errors import UserError

        raise UserError(f"threads={requested} is not allowed; use a number >= 0 (0 = automatic, N = exactly N CPU threads)")
    if requested:
        return ThreadChoice(requested, "as asked")
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        launched = any(k in os.environ for k in ("ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"))
        return ThreadChoice(int(omp), "from OMP_NUM_THREADS" + (  # accelerate launch sets it (1) unless told otherwise
            ", which accelerate launch sets (1 unless --num_cpu_threads_per_process N)" if launched else ""))
    cpus = available_cpus()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local > 1:
        return ThreadChoice(auto_threads(cpus, 0.0, local, _TORCH_DEFAULT),
                            f"auto: {cpus} CPUs shared by {local} processes")
    busy = busy_cores()
    n = auto_threads(cpus, busy, 1, _TORCH_DEFAULT)
    return ThreadChoice(n, f"auto: {cpus} CPUs, {busy:.1f} busy with other processes")


_chosen: ThreadChoice | None = None  # the last set_threads choice: startup_line() gives its reason


def set_threads(requested: int = 0) -> ThreadChoice:
    """Choose the thread count (``choose_threads``) and give it to torch."""
    global _chosen
    _chosen = choose_threads(requested)
    torch.set_num_threads(_chosen.threads)
    return _chosen


def startup_line(how: str = "--threads N or threads=N") -> str:
    """The line a job prints when it starts: the thread count torch uses, and why."""
    threads = torch.get_num_threads()
    if _chosen is not None and _chosen.threads == threads:
        return _chosen.line(how)
    return ThreadChoice(threads, "torch's setting").line(how)
