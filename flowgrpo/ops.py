"""The fused per-transition likelihood op (``csrc/``) and its PyTorch reference; docs/ops.md.

For every trained transition the learner needs the kernel mean μ = a·x + b·v, the Gaussian
log-prob of x', and for GRPO-Guard / KL terms further reductions against a stored μ_old and a
reference μ_ref (MATH.md §1, §3). ``transition_terms`` computes them all, per sample, either with
the fused C++/CUDA op (one read of each input, float64 accumulation for any input dtype, one
elementwise backward pass) or with the pure-PyTorch reference built on ``samplers.kernels`` (the
specification). This module is the only importer of ``torch.ops.flowgrpo``:

    from flowgrpo import ops
    a, b, std = ops.transition_coefficients(kernel, sigma, sigma_next, eta)   # float64 [N]
    terms = ops.transition_terms(x, v, x_next, a, b, std, mu_old=mu_old, reduce="mean",
                                 backend=config.likelihood_backend)            # "auto"|"fused"|"reference"
    terms.log_prob, terms.guard, terms.log_ratio, terms.kl                      # [N] each

Backends: "reference" always runs PyTorch; "fused" runs the op and raises (with what to do) when it
cannot be built or has no kernel for the device; "auto" (default) uses the op when it can, else
warns once and runs the reference. ``set_backend_override`` / ``use_backend`` force one backend
for tests, above every call's argument. The op is JIT-compiled on first use into
``~/.cache/flowgrpo/ops/<hash of sources, flags, torch version>`` (``$FLOWGRPO_OPS_CACHE``
overrides the root), under a file lock so concurrent processes (pytest-xdist workers, DDP ranks)
build it once.
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
from typing import NamedTuple

import torch

from samplers.kernels import KERNEL_NAMES, compute_dtype, kernel_coefficients, log_prob

BACKENDS = ("auto", "fused", "reference")
OP_NAME = "flowgrpo_ops"
CPU_SOURCES = ("likelihood.cpp",)
CUDA_SOURCES = ("likelihood_cuda.cu",)
HEADERS = ("likelihood.h",)
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]  # no fma contraction: μ stays bit-identical
LDFLAGS = ["-fopenmp"]
CUDA_CFLAGS = ["-O3"]


class TransitionTerms(NamedTuple):
    """Per-sample terms of a batch of transitions (compute dtype: float32, float64 for float64 x)."""

    log_prob: torch.Tensor  # [N] log p(x' | x), reduce "mean" or "sum" over the D latent elements
    mean: torch.Tensor | None  # [N, *latent] μ = a·x + b·v (only with return_mean=True)
    guard: torch.Tensor | None  # [N] GRPO-Guard log ρ̂ = reduce_D(ε_s·δ), ε_s = (x' − μ_old)/s, δ = μ − μ_old
    log_ratio: torch.Tensor | None  # [N] lp_θ − lp_old as one difference = reduce_D(e_old·δ − δ²/2)/s²
    kl: torch.Tensor | None  # [N] reduce_D((μ − μ_ref)²)/(2s²) (only with mu_ref / v_ref)


# ---------------------------------------------------------------------------------------------
# Backend selection
# ---------------------------------------------------------------------------------------------

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
            "`python -c 'from flowgrpo import ops; ops.build(verbose=True)'` to see the build log, "
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


# ---------------------------------------------------------------------------------------------
# Building and loading the op
# ---------------------------------------------------------------------------------------------


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
    from flowgrpo.paths import csrc_dir

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
    _register_python_parts()


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


# ---------------------------------------------------------------------------------------------
# Fake (torch.compile) and autograd registrations of the C++ op
# ---------------------------------------------------------------------------------------------


def _register_python_parts() -> None:
    @torch.library.register_fake("flowgrpo::transition_terms")
    def _fake(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, return_mean):
        dtype = compute_dtype(x.dtype)
        n = x.shape[0]
        mean = x.new_empty(x.shape if return_mean else (0,), dtype=dtype)
        lp = x.new_empty((n,), dtype=dtype)
        guard = x.new_empty((n if old is not None else 0,), dtype=dtype)
        ratio = x.new_empty((n if old is not None else 0,), dtype=dtype)
        kl = x.new_empty((n if ref is not None else 0,), dtype=dtype)
        return mean, lp, guard, ratio, kl

    @torch.library.register_fake("flowgrpo::transition_terms_backward")
    def _fake_backward(grad_mean, grad_log_prob, grad_guard, grad_log_ratio, grad_kl, x, v, x_next,
                       a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, output_mask):
        likes = (x, v, x_next, old, ref)
        return tuple(
            t.new_empty(t.shape) if (want and t is not None) else (t if t is not None else x).new_empty((0,))
            for want, t in zip(output_mask, likes)
        )

    torch.library.register_autograd("flowgrpo::transition_terms", _backward, setup_context=_setup_context)


def _setup_context(ctx, inputs, output):
    x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, _ = inputs
    ctx.save_for_backward(x, v, x_next, a, b, std, old, ref)
    ctx.flags = (old_is_velocity, ref_is_velocity, reduce)
    ctx.set_materialize_grads(False)  # an unused μ output must not cost a zero [N, *latent] gradient


def _backward(ctx, grad_mean, grad_log_prob, grad_guard, grad_log_ratio, grad_kl):
    """One elementwise pass (the backward op) for every input that needs a gradient."""
    x, v, x_next, a, b, std, old, ref = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], need[1], need[2], need[6] and old is not None, need[7] and ref is not None]
    if not any(mask):
        return (None,) * 12

    def given(g):
        return None if g is None or g.numel() == 0 else g

    grads = torch.ops.flowgrpo.transition_terms_backward(
        given(grad_mean), given(grad_log_prob), given(grad_guard), given(grad_log_ratio),
        given(grad_kl), x, v, x_next, a, b, std, old, ref, *ctx.flags, mask,
    )
    gx, gv, gxn, gold, gref = (g if want else None for g, want in zip(grads, mask))
    return gx, gv, gxn, None, None, None, gold, gref, None, None, None, None


class _FusedTerms(torch.autograd.Function):
    """The op with the same backward as its registered autograd, for eager calls: Function.apply
    costs ~15 µs a call where the op's registered (torch.library) autograd costs ~80 µs, which
    dominates at tiny latent sizes. torch.compile traces either."""

    @staticmethod
    def forward(ctx, *inputs):
        output = torch.ops.flowgrpo.transition_terms(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_backward)


# ---------------------------------------------------------------------------------------------
# The public API
# ---------------------------------------------------------------------------------------------


def transition_coefficients(kernel, sigma, sigma_next, eta, n: int | None = None, device=None):
    """(a, b, std), float64 [N], of μ = a·x + b·v, x' = μ + std·ε for each row.

    ``kernel`` is a name from KERNEL_NAMES, or an int64 tensor [N] of indices into it (as
    ``Trajectory.kernel`` stores them), so one call covers a batch of mixed kernels. σ, σ', η are
    numbers or per-sample tensors [N] (``samplers.kernels.kernel_coefficients`` per kernel)."""
    if isinstance(kernel, str):
        return kernel_coefficients(kernel, sigma, sigma_next, eta, n, device)
    kernel = torch.as_tensor(kernel)
    n = kernel.shape[0]
    device = device if device is not None else kernel.device
    out = [torch.empty(n, dtype=torch.float64, device=device) for _ in range(3)]

    def rows(value, sel):
        return value[sel] if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    for k in kernel.unique().tolist():
        sel = (kernel == k).nonzero().squeeze(1)
        coefs = kernel_coefficients(
            KERNEL_NAMES[k], rows(sigma, sel), rows(sigma_next, sel), rows(eta, sel), len(sel), device
        )
        for dst, src in zip(out, coefs):
            dst[sel.to(device)] = src
    return tuple(out)


def _per_sample(value, n: int, device, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise ValueError(
                f"{name} requires grad: the per-sample coefficients a, b, std are constants of the op "
                "(compute them from sigma, sigma_next, eta under no_grad)"
            )
        if value.dtype != torch.float64 or value.device != device:
            value = value.to(device=device, dtype=torch.float64)
        if value.shape == (n,):
            return value
        if value.dim() == 0:
            return value.expand(n)
        if value.numel() != n:
            raise ValueError(f"{name} must be a number or a per-sample tensor [{n}], got {tuple(value.shape)}")
        return value.reshape(n)
    return torch.full((n,), float(value), dtype=torch.float64, device=device)


def _column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.to(like.dtype).view((-1,) + (1,) * (like.dim() - 1))


def _affine(x, w, a, b, dtype):
    """a·x + b·w rounded as samplers.kernels rounds a kernel mean (x*a, then += w*b)."""
    xc = x.to(dtype)
    out = xc * _column(a, xc)
    out += w.to(dtype) * _column(b, xc)
    return out


def kernel_mean(x: torch.Tensor, v: torch.Tensor, a, b) -> torch.Tensor:
    """μ = a·x + b·v ([N, *latent], compute dtype) with a, b from ``transition_coefficients``,
    rounded exactly as ``samplers.kernels`` and ``transition_terms`` round a kernel mean."""
    n = x.shape[0]
    a, b = _per_sample(a, n, x.device, "a"), _per_sample(b, n, x.device, "b")
    return _affine(x, v, a, b, compute_dtype(x.dtype))


def _reference_terms(x, v, x_next, a, b, std, old, old_is_velocity, ref, ref_is_velocity, reduce, return_mean):
    """The specification: samplers' kernel-mean arithmetic and log_prob, MATH.md §3 in PyTorch."""
    dtype = compute_dtype(x.dtype)
    mean = _affine(x, v, a, b, dtype)
    lp = log_prob(x_next, mean, std, reduce)

    def reduce_d(t):
        flat = t.flatten(1)
        return flat.mean(1) if reduce == "mean" else flat.sum(1)

    s = _column(std, mean)
    guard = ratio = kl = None
    if old is not None:
        mu_old = _affine(x, old, a, b, dtype) if old_is_velocity else old.to(dtype)
        e_old = x_next.to(dtype) - mu_old
        delta = mean - mu_old
        guard = reduce_d(e_old / s * delta)  # ε_s·δ, MATH.md §3 GRPO-Guard
        ratio = reduce_d((2.0 * e_old - delta) * delta) / (2.0 * std.to(dtype).square())
    if ref is not None:
        mu_ref = _affine(x, ref, a, b, dtype) if ref_is_velocity else ref.to(dtype)
        kl = reduce_d((mean - mu_ref).square()) / (2.0 * std.to(dtype).square())
    return TransitionTerms(lp, mean if return_mean else None, guard, ratio, kl)


def transition_terms(
    x: torch.Tensor,
    v: torch.Tensor,
    x_next: torch.Tensor,
    a,
    b,
    std,
    *,
    mu_old: torch.Tensor | None = None,
    v_old: torch.Tensor | None = None,
    mu_ref: torch.Tensor | None = None,
    v_ref: torch.Tensor | None = None,
    reduce: str = "mean",
    return_mean: bool = False,
    backend: str | None = None,
) -> TransitionTerms:
    """log-prob (and GRPO-Guard, exact log-ratio, KL terms) of transitions x → x' under μ = a·x + b·v.

    x, v, x_next (and mu_old / v_old / mu_ref / v_ref): [N, *latent], any float dtypes, any
    strides. a, b, std: float64 [N] from ``transition_coefficients`` (numbers broadcast).
    The old policy's mean is given either as ``mu_old`` or as its velocity ``v_old``
    (μ_old = a·x + b·v_old, bit-identical to the stored mean, half the bytes for bf16 models); the
    reference policy's likewise (``mu_ref`` / ``v_ref``). Gradients flow to every latent input
    (the learner needs v; x where the state itself is differentiated). ``backend``: see module doc.
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    if mu_old is not None and v_old is not None:
        raise ValueError("pass the old policy as mu_old (its mean) or v_old (its velocity), not both")
    if mu_ref is not None and v_ref is not None:
        raise ValueError("pass the reference policy as mu_ref (its mean) or v_ref (its velocity), not both")
    if x.dim() < 2:
        raise ValueError(f"x must be [N, *latent], got shape {tuple(x.shape)}")
    for name, t in (("v", v), ("x_next", x_next), ("mu_old", mu_old), ("v_old", v_old),
                    ("mu_ref", mu_ref), ("v_ref", v_ref)):
        if t is not None and t.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but x has {tuple(x.shape)}")
    n = x.shape[0]
    a, b, std = (_per_sample(t, n, x.device, name) for t, name in ((a, "a"), (b, "b"), (std, "std")))
    old = mu_old if mu_old is not None else v_old
    ref = mu_ref if mu_ref is not None else v_ref
    old_is_velocity, ref_is_velocity = v_old is not None, v_ref is not None
    chosen = resolve_backend(backend, x.device)
    # the reference's log_prob and the CPU op check std > 0 themselves; the CUDA op cannot cheaply
    if chosen == "fused" and x.device.type != "cpu" and not torch.compiler.is_compiling():
        if n and bool((std <= 0).any()):
            raise ValueError(
                "transition_terms needs std > 0: ODE steps, η = 0 and cps at σ' = 0 have no density; "
                "do not train those steps (plans never do)"
            )
    if chosen == "reference":
        return _reference_terms(x, v, x_next, a, b, std, old, old_is_velocity, ref, ref_is_velocity,
                                reduce, return_mean)
    mean, lp, guard, ratio, kl = _FusedTerms.apply(
        x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, return_mean
    )
    return TransitionTerms(
        lp,
        mean if return_mean else None,
        guard if old is not None else None,
        ratio if old is not None else None,
        kl if ref is not None else None,
    )


def transition_log_prob(x, v, x_next, a, b, std, *, reduce: str = "mean", backend: str | None = None):
    """Just the log-prob [N] (the rollout's and the plain GRPO learner's need)."""
    return transition_terms(x, v, x_next, a, b, std, reduce=reduce, backend=backend).log_prob


__all__ = [
    "BACKENDS",
    "TransitionTerms",
    "build",
    "build_directory",
    "fused_available",
    "fused_unavailable_reason",
    "resolve_backend",
    "set_backend_override",
    "transition_coefficients",
    "transition_log_prob",
    "transition_terms",
    "use_backend",
]
