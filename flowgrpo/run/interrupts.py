"""Stopping a training run on SIGINT (Ctrl-C) or SIGTERM: within one model call, with a checkpoint,
one line saying how to resume, and no process left behind.

``accelerate launch train_t2i.py`` with one process runs the script as a child process and waits for
it. A Ctrl-C in a terminal goes to the whole foreground process group: the launcher dies at once with
its own ``KeyboardInterrupt`` traceback (the child cannot silence it) while the child goes on.
``kill <launcher pid>`` reaches the launcher only, which dies and leaves the child running, orphaned.
So the child looks after itself:

- :func:`follow_launcher`, at start-up: when the parent process is a launcher (``accelerate launch``,
  ``torchrun``), Linux is asked to send this process SIGTERM when the parent dies (``prctl
  PR_SET_PDEATHSIG``), and the launch command is remembered for the resume line.
- :class:`StopSignals`, for the run (the trainer installs it): the first SIGINT or SIGTERM arms a
  check on every call of the model's networks (a forward pre-hook) that raises :class:`Interrupted`
  as soon as the training state is one a checkpoint can hold (``ready()``: no optimizer step taken
  since the last finished iteration). The trainer saves that checkpoint (atomically, as always) and
  raises :class:`Interrupted` on to the entry point, which prints one line and exits with 128 + the
  signal number (130 for SIGINT, 143 for SIGTERM). A second SIGINT raises KeyboardInterrupt at once.
- :func:`hold_signals`, around the whole script: outside the training loop (loading, the final gallery)
  a signal ends the script with the same kind of line; once the run is stopping, later signals (the
  launcher's death right after the Ctrl-C that reached both) are ignored until the line is printed.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
_launcher: list[str] | None = None  # the launch command up to the script, e.g. ["accelerate", "launch", "--config_file", "x"]
_stopping = False  # a StopSignals took a signal: the script's own handlers (hold_signals) let the stop finish


class Interrupted(BaseException):
    """A run stopped by a signal. A BaseException (as KeyboardInterrupt), so that no ``except Exception``
    between the model call and the trainer swallows it."""

    def __init__(self, signum: int, iteration: int | None = None, total: int | None = None,
                 saved: Path | None = None, newest: Path | None = None):
        super().__init__(signum)
        self.signum, self.iteration, self.total, self.saved, self.newest = signum, iteration, total, saved, newest

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum)

    def line(self, command: str) -> str:
        """The one line the entry point prints."""
        name = _NAMES.get(self.signum, f"signal {self.signum}")
        if self.iteration is None:  # outside the training loop: loading, or building the gallery at the end
            return f"interrupted ({name}); rerun with: {command} (it resumes from the newest checkpoint, if any)"
        at = f"interrupted ({name}) at iteration {self.iteration} of {self.total}"
        if self.saved is not None:
            return f"{at}; checkpoint saved to {self.saved}; resume with: {command}"
        older = f"the newest checkpoint is {self.newest}" if self.newest is not None else "no checkpoint yet"
        return f"{at}; nothing new to save ({older}); resume with: {command}"


class StopSignals:
    """SIGINT/SIGTERM handlers and forward pre-hooks on ``modules`` for the length of a run (``install`` /
    ``remove``; the previous handlers come back). After the first signal, ``signum`` is set,
    ``on_signal(signum)`` is called, and the next call of a module raises :class:`Interrupted` when
    ``ready()``; until then calls go on."""

    def __init__(self, modules: Iterable, ready: Callable[[], bool], on_signal: Callable[[int], None] | None = None):
        self.modules, self.ready, self.on_signal = [m for m in modules if m is not None], ready, on_signal
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._hooks: list = []

    def install(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread (e.g. inside some test runners): no handlers
                pass
        self._hooks = [m.register_forward_pre_hook(self._check) for m in self.modules]
        return self

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handler(self, signum, frame) -> None:
        global _stopping
        if self.signum is None:
            self.signum, _stopping = signum, True
            if self.on_signal is not None:
                self.on_signal(signum)
        elif signum == signal.SIGINT == self.signum:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now (checkpoints are atomic: none is left half-written)

    def _check(self, module, args) -> None:
        if self.signum is not None and self.ready():
            raise Interrupted(self.signum)


def denoisers(model) -> list:
    """The networks a flowgrpo model calls once per denoising or training step: its experts (one, or Wan2.2's
    two) and their frozen reference copies, if it keeps them."""
    return model.networks() if hasattr(model, "networks") else [getattr(model, "transformer", None)]


def hold_signals() -> Callable[[], None]:
    """The script's own SIGINT/SIGTERM handlers, around the run (a StopSignals takes over in the training
    loop and gives them back): outside the loop a signal raises :class:`Interrupted` (nothing is being
    trained: loading, the final gallery); once the run is stopping, later signals (the launcher's death
    after a Ctrl-C reached both) are ignored, so the one line gets printed. Returns what restores the
    previous handlers."""
    global _stopping
    _stopping = False

    def handler(signum, frame) -> None:
        if not _stopping:
            raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


# ---------------------------------------------------------------- the launcher
def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def launcher_prefix(parent: list[str], script: str) -> list[str] | None:
    """The launch command before ``script`` when ``parent`` (a process's argv) is a launcher that runs
    it: ``accelerate launch [options]`` or ``torchrun [options]``; None otherwise."""
    names = [os.path.basename(a) for a in parent]
    if script not in parent:
        return None
    end = len(parent) - 1 - parent[::-1].index(script)
    for i, name in enumerate(names[:end]):
        if name == "accelerate" and i + 1 < end and parent[i + 1] == "launch":
            return ["accelerate", "launch", *parent[i + 2 : end]]
        if name == "accelerate.commands.launch" and i >= 1 and parent[i - 1] == "-m":
            return ["accelerate", "launch", *parent[i + 1 : end]]
        if name == "accelerate.commands.accelerate_cli" and i + 1 < end and parent[i + 1] == "launch":
            return ["accelerate", "launch", *parent[i + 2 : end]]
        if name == "torchrun" or (name == "torch.distributed.run" and i >= 1 and parent[i - 1] == "-m"):
            return ["torchrun", *parent[i + 1 : end]]
    return None


def follow_launcher() -> bool:
    """At start-up: when the parent is a launcher, die with it (SIGTERM on the parent's death, which the
    run turns into a checkpoint and a clean stop) and remember its command. Returns whether it is one."""
    global _launcher
    parent = os.getppid()
    _launcher = launcher_prefix(_cmdline(parent), sys.argv[0]) if sys.argv and sys.argv[0] else None
    if _launcher is None or not sys.platform.startswith("linux"):
        return _launcher is not None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return True
    if os.getppid() != parent:  # the launcher died before prctl: as if it had just died
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def resume_command(script: str, args: list[str]) -> str:
    """The command that continues the run: the same launch, script and arguments (without resume=...)."""
    kept = [a for a in args if not a.startswith("resume=")]
    prefix = _launcher if _launcher is not None else ["python"]
    return shlex.join([*prefix, script, *kept])
