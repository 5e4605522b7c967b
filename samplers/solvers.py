"""Solvers for untrained steps, and the evaluation rollout ``sample_ode`` (docs/math.md §1).

Three solvers, all stateless functions of (x, v, σ, σ') plus, for the multistep ones, the previous
steps' (σ_prev, x̂0_prev):
- ``euler``: x' = x − Δ·v (identical to the ``ode`` kernel, so ODE steps of a plan and of
  ``sample_ode`` agree bit for bit).
- ``dpmpp_2m``: DPM-Solver++(2M) written for rectified flow: α = 1 − σ, λ = log(α/σ),
  h = λ' − λ, data prediction m = x̂0 = x − σ·v. First order (= DDIM, mathematically equal to Euler):
  x' = (σ'/σ)·x − α'·(e^{−h} − 1)·m_0. Second order: D = m_0 + (m_0 − m_{−1})/(2r), r = h_{−1}/h.
  The update is computed as x' = A·x + B·m_0 + C·m_{−1} with e^{−h} = α·σ'/(σ·α') (no infinite λ at
  σ = 1 or σ' = 0). It falls back to first order without history, when the previous σ is 1
  (λ = −∞), and at the final step (σ' = 0, where x' = x̂0).
- ``sa_solver``: SA-Solver (Xue et al. 2023), the stochastic Adams predictor-corrector in data
  prediction form, in PEC mode (one model call per step), as AWM rolls out with it. With ν = 1 + τ²,
  one step σ → σ' is x' = e^{−τ²h}(σ'/σ)·x + α'·[(1 − e^{−νh})·m_0 + P] + σ'·√(1 − e^{−2τ²h})·ε,
  where the predictor's P = ν·h²/(2·h_{−1})·(m_0 − m_{−1}) (order 2; 0 at order 1). The model is
  then called at that predicted x'; before the next step the state is corrected with the new x̂0
  m_1: the corrector's step from the same x, with the same ε, differs from the predictor's only in
  its x̂0 term, α'·[(1 − e^{−νh})·m_0 + ν·h/2·(m_1 − m_0)] (order 2), so the correction is
  x'_c = x' + (that term − the predictor's). These are the closed forms of the code's Lagrange
  integrals with its few-step modification (diffusers' SASolverScheduler, AWM's sa_solver.py).
  τ = 0 is a deterministic second-order multistep ODE solver. The first step of a rollout is never
  corrected (AWM's ``disable_first_corrector``), nor is the last one, which returns x̂0 (σ' = 0).

History is fed at every step, SDE steps included (the executor pushes x̂0 of every node), so a
post-window solver starts at full order. ``sample_ode`` is the evaluation rollout: a pure ODE on a
given grid, no log-probs and no stored states, used by ``flowgrpo eval``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from samplers.kernels import Scalar, _batch_size, column, per_sample, compute_dtype, ode

SOLVER_NAMES = ("euler", "dpmpp_2m", "sa_solver")
SA_PREDICTOR_ORDERS = (1, 2)
SA_CORRECTOR_ORDERS = (0, 1, 2)  # 0: no corrector (the predictor alone)

Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def data_prediction(x: torch.Tensor, v: torch.Tensor, sigma: Scalar) -> torch.Tensor:
    """x̂0 = x − σ·v [N, *latent] in the compute dtype (the solver history entry)."""
    dtype = compute_dtype(x.dtype)
    sigma = per_sample(sigma, x.shape[0], x.device, "sigma")
    return x.to(dtype) - column(sigma, x.to(dtype)) * v.to(dtype)


def euler_step(x, v, sigma: Scalar, sigma_next: Scalar) -> torch.Tensor:
    """x' = x − Δ·v [N, *latent] in the compute dtype."""
    return ode(x, v, sigma, sigma_next)[0]


def dpmpp_2m_coefficients(sigma, sigma_next, prev_sigma=None, n: int | None = None, device=None):
    """(A, B, C), float64 [n]: x' = A·x + B·x̂0 + C·x̂0_prev. C = 0 where the step is first order."""
    n, device = _batch_size((sigma, sigma_next, prev_sigma), n, device)
    sigma = per_sample(sigma, n, device, "sigma")
    sigma_next = per_sample(sigma_next, n, device, "sigma_next")
    if bool((sigma_next >= sigma).any()) or bool((sigma > 1).any()) or bool((sigma_next < 0).any()):
        raise ValueError("a step needs 1 ≥ sigma > sigma_next ≥ 0")
    alpha, alpha_next = 1.0 - sigma, 1.0 - sigma_next
    ratio = sigma_next / sigma
    beta = alpha_next - alpha * ratio  # = −α'·(e^{−h} − 1)
    if prev_sigma is None:
        return ratio, beta, torch.zeros_like(beta)
    prev_sigma = per_sample(prev_sigma, n, device, "prev_sigma")
    if bool((prev_sigma <= sigma).any()):
        raise ValueError("prev_sigma must be larger than sigma (the grid runs from 1 to 0)")
    second = (prev_sigma < 1.0) & (sigma_next > 0.0)
    one = torch.ones_like(sigma)
    # h = log(α'σ / (ασ')), h_prev = log(α·σ_prev / (α_prev·σ)); safe values where first order
    h = torch.log(torch.where(second, alpha_next * sigma / (alpha * sigma_next), one * 2.0))
    h_prev = torch.log(
        torch.where(second, alpha * prev_sigma / ((1.0 - prev_sigma) * sigma), one * 2.0)
    )
    half_inv_r = torch.where(second, h / (2.0 * h_prev), torch.zeros_like(h))  # 1/(2r)
    return ratio, beta * (1.0 + half_inv_r), -beta * half_inv_r


def dpmpp_2m_step(x, v, sigma, sigma_next, prev_sigma=None, prev_data=None) -> torch.Tensor:
    """One DPM-Solver++(2M) step [N, *latent] (compute dtype); first order without history."""
    if (prev_sigma is None) != (prev_data is None):
        raise ValueError("pass prev_sigma and prev_data together (or neither)")
    dtype = compute_dtype(x.dtype)
    xc = x.to(dtype)
    data = data_prediction(xc, v, sigma)
    a, b, c = dpmpp_2m_coefficients(sigma, sigma_next, prev_sigma, x.shape[0], x.device)
    out = xc * column(a, xc)
    out += data * column(b, xc)
    if prev_data is not None:
        out += prev_data.to(dtype) * column(c, xc)
    return out


# ---------------------------------------------------------------------------------------- SA-Solver
def _log_snr_step(sigma: float, sigma_next: float) -> float:
    """h = λ' − λ with λ = log((1 − σ)/σ); +inf from σ = 1 (λ = −∞). Needs 1 ≥ σ > σ' > 0."""
    if sigma >= 1.0:
        return math.inf
    return math.log((1.0 - sigma_next) * sigma / ((1.0 - sigma) * sigma_next))


def _exp_neg(k: float, h: float) -> float:
    """e^{−k·h}, 1 for k = 0 (also at h = inf: τ = 0 keeps the ODE's factor)."""
    return 1.0 if k == 0 else math.exp(-k * h)


def _one_minus_exp_neg(k: float, h: float) -> float:
    """1 − e^{−k·h} without cancellation for small k·h; 0 for k = 0."""
    return 0.0 if k == 0 else -math.expm1(-k * h)


def _check_sa_step(sigma: float, sigma_next: float, tau: float) -> None:
    if not 1.0 >= sigma > sigma_next > 0.0:
        raise ValueError(f"an SA-Solver step needs 1 ≥ sigma > sigma_next > 0, got {sigma} → {sigma_next}")
    if not (tau >= 0 and math.isfinite(tau)):
        raise ValueError(f"SA-Solver's tau must be a finite number ≥ 0, got {tau}")


def sa_predictor_coefficients(sigma: float, sigma_next: float, tau: float = 0.0, prev_sigma: float | None = None):
    """(A, B, C, S), python floats (float64): the SA predictor x' = A·x + B·m_0 + C·m_{−1} + S·ε from σ to σ' > 0
    with noise τ; second order where the previous point ``prev_sigma`` is given and below 1 (C = 0 otherwise)."""
    sigma, sigma_next, tau = float(sigma), float(sigma_next), float(tau)
    _check_sa_step(sigma, sigma_next, tau)
    tau2 = tau * tau
    nu, alpha_next, h = 1.0 + tau2, 1.0 - sigma_next, _log_snr_step(sigma, sigma_next)
    a = _exp_neg(tau2, h) * sigma_next / sigma
    b = alpha_next * _one_minus_exp_neg(nu, h)
    s = sigma_next * math.sqrt(_one_minus_exp_neg(2.0 * tau2, h))
    c = 0.0
    if prev_sigma is not None and float(prev_sigma) < 1.0:
        if not float(prev_sigma) > sigma:
            raise ValueError(f"prev_sigma must be larger than sigma, got {prev_sigma} and {sigma}")
        d = alpha_next * nu * h * h / (2.0 * _log_snr_step(float(prev_sigma), sigma))
        b, c = b + d, -d
    return a, b, c, s


def sa_corrector_coefficients(sigma: float, sigma_next: float, tau: float = 0.0, order: int = 2):
    """(B_1, B_0), python floats: the corrector's x̂0 term B_1·m_1 + B_0·m_0 of the step σ → σ' (m_1 at σ', the
    x̂0 at the predicted point; m_0 at σ); order 1 uses m_1 alone, order 2 the line through both."""
    sigma, sigma_next, tau = float(sigma), float(sigma_next), float(tau)
    _check_sa_step(sigma, sigma_next, tau)
    if order not in (1, 2):
        raise ValueError(f"corrector order must be 1 or 2 here, got {order}")
    nu, alpha_next, h = 1.0 + tau * tau, 1.0 - sigma_next, _log_snr_step(sigma, sigma_next)
    if not math.isfinite(h):
        raise ValueError("the SA corrector cannot refine a step from sigma = 1 (λ = −∞); start the grid below 1")
    whole = alpha_next * _one_minus_exp_neg(nu, h)
    if order == 1:
        return whole, 0.0
    slope = alpha_next * nu * h / 2.0
    return slope, whole - slope


def _combine(x: torch.Tensor, terms) -> torch.Tensor:
    """x + Σ coefficient·tensor over the (coefficient, tensor) terms whose tensor is given and coefficient non-zero."""
    out = x.clone()
    for coefficient, tensor in terms:
        if tensor is not None and coefficient != 0.0:
            out += tensor.to(x.dtype) * coefficient
    return out


def sa_solver_step(
    x,
    v,
    sigma: float,
    sigma_next: float,
    *,
    tau: float = 0.0,
    noise: torch.Tensor | None = None,
    predictor_order: int = 2,
    prev: tuple | None = None,
    prev2: tuple | None = None,
    corrected: tuple | None = None,
) -> torch.Tensor:
    """One SA-Solver step (PEC) [N, *latent] in the compute dtype, from the state x at which v was evaluated.

    - ``prev`` = (σ_{−1}, m_{−1}) and ``prev2`` = (σ_{−2}, m_{−2}): the x̂0 of the two previous points (None where
      there is none);
    - ``corrected`` = (τ, predictor order, corrector order) of the previous step when that step was an SA predictor
      step from a point with history (its state x is then corrected with this point's x̂0 first); None: x as it is;
    - ``noise`` ε [N, *latent] (standard normal), needed where the step's noise std is > 0 (τ > 0).
    The final step (σ' = 0) returns x̂0."""
    if predictor_order not in SA_PREDICTOR_ORDERS:
        raise ValueError(f"SA predictor order must be one of {SA_PREDICTOR_ORDERS}, got {predictor_order}")
    dtype = compute_dtype(x.dtype)
    xc = x.to(dtype)
    data = data_prediction(xc, v, sigma)
    sigma, sigma_next = float(sigma), float(sigma_next)
    if sigma_next == 0.0:
        return data
    prev_sigma, prev_data = prev if prev is not None else (None, None)
    if corrected is not None:
        prev_tau, prev_p, prev_c = corrected
        if prev is None:
            raise ValueError("a corrected step needs the previous point's x̂0 (prev)")
        if prev_c not in SA_CORRECTOR_ORDERS:
            raise ValueError(f"SA corrector order must be one of {SA_CORRECTOR_ORDERS}, got {prev_c}")
        if prev_c > 0:
            # the previous step's predictor term, as it was computed, replaced by the corrector's
            p2_sigma, p2_data = prev2 if (prev2 is not None and prev_p == 2) else (None, None)
            _, b, c, _ = sa_predictor_coefficients(prev_sigma, sigma, prev_tau, p2_sigma)
            b1, b0 = sa_corrector_coefficients(prev_sigma, sigma, prev_tau, prev_c)
            xc = _combine(xc, [(b1, data), (b0 - b, prev_data), (-c, p2_data)])
    use_prev = predictor_order == 2 and prev is not None
    a, b, c, s = sa_predictor_coefficients(sigma, sigma_next, tau, prev_sigma if use_prev else None)
    if s > 0 and noise is None:
        raise ValueError(f"this SA-Solver step draws noise (τ = {tau}): pass noise")
    out = xc * a
    return _combine(out, [(b, data), (c, prev_data if use_prev else None), (s, noise)])


def ode_step(solver: str, x, v, sigma, sigma_next, prev_sigma=None, prev_data=None):
    """Dispatch one untrained ODE step to ``solver`` (``euler`` ignores the history; ``sa_solver`` needs more
    than this signature carries: the executor and ``sample_ode`` call ``sa_solver_step``)."""
    if solver == "euler":
        return euler_step(x, v, sigma, sigma_next)
    if solver == "dpmpp_2m":
        return dpmpp_2m_step(x, v, sigma, sigma_next, prev_sigma, prev_data)
    if solver == "sa_solver":
        raise ValueError("sa_solver steps go through sa_solver_step (they carry two x̂0 and noise)")
    raise ValueError(f"unknown ODE solver {solver!r}; use one of {SOLVER_NAMES}")


def call_velocity(velocity: Velocity, x, sigma: float, cond_index, max_batch: int | None = None):
    """v for every row of x at one σ (a python float), in chunks of at most ``max_batch`` rows."""
    n = x.shape[0]
    sigmas = torch.full((n,), sigma, dtype=torch.float32, device=x.device)
    step = n if not max_batch else int(max_batch)
    if step < 1:
        raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
    chunks = [
        velocity(x[i : i + step], sigmas[i : i + step], cond_index[i : i + step])
        for i in range(0, n, step)
    ]
    v = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    if v.shape != x.shape:
        raise ValueError(
            f"velocity returned shape {tuple(v.shape)} for input {tuple(x.shape)}: it must map "
            "x [N, *latent], sigma [N], cond_index [N] to a velocity [N, *latent]"
        )
    return v


def sample_ode(
    velocity: Velocity,
    x_T: torch.Tensor,
    sigmas: torch.Tensor,
    cond_index: torch.Tensor,
    solver: str = "euler",
    *,
    max_batch: int | None = None,
    nfe=None,
    category: str = "eval",
) -> torch.Tensor:
    """Evaluation rollout: solve the ODE from x_T [N, *latent] along ``sigmas`` [T + 1] and return
    x_0 [N, *latent] in x_T's dtype. No log-probs, no stored states; σ is cast to float32 once.
    The state is kept in x_T's dtype between steps, exactly as the executor stores it. ``sa_solver``
    runs noise-free (τ = 0) with predictor and corrector order 2."""
    if solver not in SOLVER_NAMES:
        raise ValueError(f"unknown ODE solver {solver!r}; use one of {SOLVER_NAMES}")
    cond_index = torch.as_tensor(cond_index, dtype=torch.long, device=x_T.device)
    if cond_index.shape != (x_T.shape[0],):
        raise ValueError(f"cond_index must be [{x_T.shape[0]}], got {tuple(cond_index.shape)}")
    grid = [float(s) for s in torch.as_tensor(sigmas).to(torch.float32)]
    x, prev_sigma, prev_data, prev2 = x_T, None, None, None
    with torch.no_grad():
        for i, (sigma, sigma_next) in enumerate(zip(grid[:-1], grid[1:])):
            v = call_velocity(velocity, x, sigma, cond_index, max_batch)
            if nfe is not None:
                nfe.add(category, x.shape[0])
            if solver == "sa_solver":
                prev = None if prev_data is None else (prev_sigma, prev_data)
                x_next = sa_solver_step(x, v, sigma, sigma_next, prev=prev, prev2=prev2,
                                        corrected=(0.0, 2, 2) if i >= 2 else None)
                prev2 = prev
                prev_sigma, prev_data = sigma, data_prediction(x, v, sigma)
            elif solver == "dpmpp_2m":
                x_next = dpmpp_2m_step(x, v, sigma, sigma_next, prev_sigma, prev_data)
                prev_sigma, prev_data = sigma, data_prediction(x, v, sigma)
            else:
                x_next = euler_step(x, v, sigma, sigma_next)
            x = x_next.to(x_T.dtype)
    return x


__all__ = [
    "SA_CORRECTOR_ORDERS",
    "SA_PREDICTOR_ORDERS",
    "SOLVER_NAMES",
    "call_velocity",
    "data_prediction",
    "dpmpp_2m_coefficients",
    "dpmpp_2m_step",
    "euler_step",
    "ode_step",
    "sa_corrector_coefficients",
    "sa_predictor_coefficients",
    "sa_solver_step",
    "sample_ode",
]
