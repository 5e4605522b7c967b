"""ODE solvers for untrained steps, and the evaluation rollout ``sample_ode`` (docs/math.md §1).

Two solvers, both stateless functions of (x, v, σ, σ') plus, for the multistep one, the previous
step's (σ_prev, x̂0_prev):
- ``euler``: x' = x − Δ·v (identical to the ``ode`` kernel, so ODE steps of a plan and of
  ``sample_ode`` agree bit for bit).
- ``dpmpp_2m``: DPM-Solver++(2M) written for rectified flow: α = 1 − σ, λ = log(α/σ),
  h = λ' − λ, data prediction m = x̂0 = x − σ·v. First order (= DDIM, mathematically equal to Euler):
  x' = (σ'/σ)·x − α'·(e^{−h} − 1)·m_0. Second order: D = m_0 + (m_0 − m_{−1})/(2r), r = h_{−1}/h.
  The update is computed as x' = A·x + B·m_0 + C·m_{−1} with e^{−h} = α·σ'/(σ·α') (no infinite λ at
  σ = 1 or σ' = 0). It falls back to first order without history, when the previous σ is 1
  (λ = −∞), and at the final step (σ' = 0, where x' = x̂0).

History is fed at every step, SDE steps included (the executor pushes x̂0 of every node), so a
post-window solver starts at full order. ``sample_ode`` is the evaluation rollout: a pure ODE on a
given grid, no log-probs and no stored states, used by ``flowgrpo eval``.
"""

from __future__ import annotations

from typing import Callable

import torch

from samplers.kernels import Scalar, _batch_size, column, per_sample, compute_dtype, ode

SOLVER_NAMES = ("euler", "dpmpp_2m")

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


def ode_step(solver: str, x, v, sigma, sigma_next, prev_sigma=None, prev_data=None):
    """Dispatch one untrained ODE step to ``solver`` (``euler`` ignores the history)."""
    if solver == "euler":
        return euler_step(x, v, sigma, sigma_next)
    if solver == "dpmpp_2m":
        return dpmpp_2m_step(x, v, sigma, sigma_next, prev_sigma, prev_data)
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
    The state is kept in x_T's dtype between steps, exactly as the executor stores it."""
    if solver not in SOLVER_NAMES:
        raise ValueError(f"unknown ODE solver {solver!r}; use one of {SOLVER_NAMES}")
    cond_index = torch.as_tensor(cond_index, dtype=torch.long, device=x_T.device)
    if cond_index.shape != (x_T.shape[0],):
        raise ValueError(f"cond_index must be [{x_T.shape[0]}], got {tuple(cond_index.shape)}")
    grid = [float(s) for s in torch.as_tensor(sigmas).to(torch.float32)]
    x, prev_sigma, prev_data = x_T, None, None
    with torch.no_grad():
        for sigma, sigma_next in zip(grid[:-1], grid[1:]):
            v = call_velocity(velocity, x, sigma, cond_index, max_batch)
            if nfe is not None:
                nfe.add(category, x.shape[0])
            if solver == "dpmpp_2m":
                x_next = dpmpp_2m_step(x, v, sigma, sigma_next, prev_sigma, prev_data)
                prev_sigma, prev_data = sigma, data_prediction(x, v, sigma)
            else:
                x_next = euler_step(x, v, sigma, sigma_next)
            x = x_next.to(x_T.dtype)
    return x


__all__ = [
    "SOLVER_NAMES",
    "call_velocity",
    "data_prediction",
    "dpmpp_2m_coefficients",
    "dpmpp_2m_step",
    "euler_step",
    "ode_step",
    "sample_ode",
]
