"""Building and loading the fused likelihood op (csrc/), and choosing the backend of a call.

The op is JIT-compiled on first use with ``torch.utils.cpp_extension.load`` into
``~/.cache/flowgrpo/ops/<hash of sources, flags, torch version>`` (``$FLOWGRPO_OPS_CACHE`` overrides the
root), under a file lock so concurrent processes (pytest-xdist workers, DDP ranks) build it once; a
library left half-written by an interrupted build is rebuilt. ``fused_available(device)`` is the
capability flag.

Backends: "reference" always runs PyTorch; "fused" runs the op and raises (with what to do) when it
cannot be built or has no kernel for the device; "auto" (default) uses the op when it can, else warns
once and runs the reference. ``set_backend_override`` / ``use_backend`` force one backend for tests,
above every call's argument; ``$FLOWGRPO_OPS_BACKEND`` sets the default.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import sys
import threading
import warnings
from pathlib import Path

import torch

from flowgrpo.likelihood.fused import register_python_parts

BACKENDS = ("auto", "fused", "reference")
OP_NAME = "flowgrpo_ops"
CPU_SOURCES = ("likelihood.cpp",)
CUDA_SOURCES = ("likelihood_cuda.cu",)
HEADERS = ("likelihood.h",)
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]  # no fma contraction: μ stays bit-identical
LDFLAGS = ["-fopenmp"]
CUDA_CFLAGS = ["-O3"]


_override: str | None = None
_warned: set[str] = set()


def _check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown likelihood backend {name!r}; use one of {BACKENDS}")
    return name


def set_backend_override(backend: str | None) -> None:
    """Force ``backend`` for every call (tests); None removes the override."""
    global _override
    _override = None if backend is None else _check_backend(backend)


@contextlib.contextmanager
def use_backend(backend: str | None):
    """Context manager form of ``set_backend_override``; restores the previous override."""
    previous = _override
    set_backend_override(backend)
    try:
        yield
    finally:
        set_backend_override(previous)


def resolve_backend(backend: str | None = None, device: torch.device | str = "cpu") -> str:
    """"fused" or "reference" for a call on ``device``. Precedence: the test override, the
    argument, ``$FLOWGRPO_OPS_BACKEND``, "auto". Raises when "fused" is asked and unavailable."""
    choice = _check_backend(_override or backend or os.environ.get("FLOWGRPO_OPS_BACKEND") or "auto")
    if choice == "reference":
        return "reference"
    reason = fused_unavailable_reason(device)
    if reason is None:
        return "fused"
    if choice == "fused":
        raise RuntimeError(
            f"the fused likelihood op was requested (backend='fused') but cannot run on "
            f"{torch.device(device)}: {reason}\nTo fix: install a C++ compiler and ninja (and, for "
            "GPUs, a CUDA toolkit matching torch.version.cuda with CUDA_HOME set), run "
            "`python -c 'from flowgrpo import likelihood; likelihood.build(verbose=True)'` to see the build log, "
            "or select backend='reference' (the PyTorch path; same values within float tolerance)."
        )
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"flowgrpo: the fused likelihood op is unavailable ({reason}); using the PyTorch "
            "reference (same values, slower). Select backend='reference' to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
    return "reference"


class _BuildState:
    def __init__(self):
        self.lock = threading.Lock()
        self.tried = False
        self.error: str | None = None  # why the op could not be loaded
        self.with_cuda = False  # whether the loaded library has the CUDA kernels
        self.directory: Path | None = None


_state = _BuildState()


def _source_dir() -> Path:
    override = os.environ.get("FLOWGRPO_OPS_SOURCES")  # development: build another csrc/ copy
    if override:
        return Path(override)
    from flowgrpo.run.paths import csrc_dir

    return csrc_dir()


def _cuda_wanted() -> bool:
    from torch.utils import cpp_extension

    return bool(torch.cuda.is_available() and torch.version.cuda and cpp_extension.CUDA_HOME)


def build_directory(with_cuda: bool | None = None) -> Path:
    """The cache folder of the current sources, flags and torch version."""
    with_cuda = _cuda_wanted() if with_cuda is None else with_cuda
    src = _source_dir()
    digest = hashlib.sha256()
    for name in CPU_SOURCES + HEADERS + (CUDA_SOURCES if with_cuda else ()):
        path = src / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>"))
    key = [torch.__version__, str(torch.version.cuda), str(with_cuda), sys.version, platform.machine()]
    digest.update(repr((key, CFLAGS, LDFLAGS, CUDA_CFLAGS)).encode())
    root = os.environ.get("FLOWGRPO_OPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flowgrpo", "ops"
    )
    return Path(root) / digest.hexdigest()[:20]


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock, released by the kernel even if this process dies."""
    try:
        import fcntl
    except ImportError:  # not POSIX: rely on torch's own baton file
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _load(verbose: bool = False) -> None:
    from torch.utils import cpp_extension

    with_cuda = _cuda_wanted()
    src = _source_dir()
    names = CPU_SOURCES + (CUDA_SOURCES if with_cuda else ())
    missing = [n for n in names + HEADERS if not (src / n).is_file()]
    if missing:
        raise FileNotFoundError(f"missing op sources {missing} in {src}")
    directory = build_directory(with_cuda)
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"{OP_NAME}.so"
    with _file_lock(directory.parent / f"{directory.name}.lock"):
        # holding the lock, nobody else is building here: a leftover baton is from a killed build
        (directory / "lock").unlink(missing_ok=True)
        loaded = False
        if library.is_file():
            try:
                torch.ops.load_library(str(library))
                loaded = True
            except OSError:  # a half-written library from an interrupted build: rebuild
                pass
        if not loaded:
            cpp_extension.load(
                name=OP_NAME,
                sources=[str(src / n) for n in names],
                extra_cflags=CFLAGS,
                extra_ldflags=LDFLAGS,
                extra_cuda_cflags=CUDA_CFLAGS,
                extra_include_paths=[str(src)],
                build_directory=str(directory),
                is_python_module=False,
                verbose=verbose,
            )
    _state.with_cuda = with_cuda
    _state.directory = directory
    register_python_parts()


def _ensure_loaded(verbose: bool = False) -> str | None:
    """Build/load once per process; None on success, else the reason (cached)."""
    if _state.tried:  # lock-free once decided (also keeps torch.compile tracing through this)
        return _state.error
    with _state.lock:
        if not _state.tried:
            try:
                _load(verbose)
            except Exception as exc:  # compiler missing, build error, ...: keep the message
                lines = str(exc).strip().splitlines()
                _state.error = f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:500]
            _state.tried = True  # only now: other threads must not see "tried" mid-build
        return _state.error


def build(verbose: bool = False) -> Path:
    """Build (or load from the cache) the op now; returns its build folder, raises on failure."""
    error = _ensure_loaded(verbose)
    if error is not None:
        raise RuntimeError(f"building the fused likelihood op failed: {error}")
    return _state.directory


def fused_unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """None when the fused op can run on ``device`` (building it if needed), else why not."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return f"no kernel for device type {device.type!r}"
    error = _ensure_loaded()
    if error is not None:
        return f"the build failed ({error})"
    if device.type == "cuda" and not _state.with_cuda:
        return "the op was built without its CUDA kernels (no CUDA_HOME or no CUDA torch at build time)"
    return None


def fused_available(device: torch.device | str = "cpu") -> bool:
    """The capability flag: can the fused op run on ``device``?"""
    return fused_unavailable_reason(device) is None


__all__ = [
    "BACKENDS",
    "build",
    "build_directory",
    "fused_available",
    "fused_unavailable_reason",
    "resolve_backend",
    "set_backend_override",
    "use_backend",
]
