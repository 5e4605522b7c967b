"""Building a rollout plan from orthogonal options (docs/math.md §2): ``compose_plan`` and the rules of its arguments.

``compose_plan`` builds every published method from a handful of orthogonal options (kernel, SDE window, Flash
post-window compression, split points, side branches with merged spans and strided lanes, training subset); a
method's plan is just an argument set for it (each preset's ``sampling.plan`` in configs/presets/), and they compose:
a BranchGRPO tree with a MixGRPO window and the sage_sde kernel is ``compose_plan(20, kernel="sage_sde",
splits=(0, 3, 6, 9), window=(l, 4))``. ``PLAN_RULES`` says what each argument takes (checked before anything loads).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from samplers.grids import GRIDS, flash_grid, time_grid
from samplers.kernels import DEFAULT_ETA, KERNEL_NAMES, kernel_coefficients
from samplers.plans import INITIAL_NOISE_MODES, LEAVES, SIDE_WEIGHTS, SPLIT_NOISE_MODES, Plan, StepSpec
from samplers.rules import (
    FLAG, Rule, at_least, in_open_closed, integer, integers, interval, is_number, one_of, optional,
)
from samplers.solvers import SA_CORRECTOR_ORDERS, SA_PREDICTOR_ORDERS, SOLVER_NAMES

GRID_ENDS = ("exact", "awm")
AWM_FIRST_SIGMA = 1.0 - 1e-3  # AWM's first grid point for SA-Solver (λ stays finite)


def edit_grid_ends(sigmas: torch.Tensor, ends: str = "exact") -> torch.Tensor:
    """The grid [T + 1] with its ends as ``ends`` says: "exact" unchanged; "awm" the edits AWM's rollout makes before
    SA-Solver (scxue/advantage_weighted_matching sd3_pipeline_with_logprob.py:272-274): the last point before 0 becomes
    half the one before it, σ_{T−1} = σ_{T−2}/2, then the first becomes 1 − 1e-3 (λ = log((1 − σ)/σ) is finite)."""
    if ends not in GRID_ENDS:
        raise ValueError(f"grid_ends must be one of {GRID_ENDS}, got {ends!r}")
    if ends == "exact":
        return sigmas
    if sigmas.numel() < 3:
        raise ValueError("grid_ends='awm' edits the last point before 0 and the first: it needs at least 2 steps")
    out = sigmas.clone()
    out[-2] = out[-3] / 2.0
    out[0] = AWM_FIRST_SIGMA
    return out


def _step_set(steps: Sequence[int], num_steps: int, what: str) -> frozenset[int]:
    out = frozenset(int(s) for s in steps)
    bad = sorted(s for s in out if not 0 <= s < num_steps)
    if bad:
        raise ValueError(f"{what} {bad} are outside the {num_steps} steps [0, {num_steps - 1}]")
    return out


def compose_plan(
    num_steps: int,
    *,
    shift: float = 3.0,
    shift_terminal: float | None = None,
    grid: str = "linear",
    kernel: str = "flow_sde",
    eta: float | None = None,
    group_size: int = 1,
    initial_noise: str = "shared",
    window: tuple[int, int] | None = None,
    solver: str = "euler",
    post_window_ratio: float | None = None,
    post_window_solver: str = "dpmpp_2m",
    train_fraction: float = 1.0,
    train_last: bool = False,
    train_subset_fraction: float | None = None,
    splits: Sequence[int] = (),
    branch_factor: int = 2,
    branch_window: bool = False,
    split_noise: str = "correlated",
    split_noise_scale: float = 4.0,
    side_steps: Sequence[int] = (),
    side_children: int = 6,
    side_kernel: str = "flow_sde",
    side_eta: float | None = None,
    side_weight: str = "none",
    side_weight_scale: float = 2.25,
    side_merge: Sequence[int] = (),
    side_strides: Sequence[int] = (1,),
    sa_tau: float = 0.0,
    sa_tau_window: Sequence[float] = (0.0, 1.0),
    sa_predictor_order: int = 2,
    sa_corrector_order: int = 2,
    grid_ends: str = "exact",
    leaf: str = "sample",
    name: str = "custom",
) -> Plan:
    """Build a plan from orthogonal options (all step indices refer to the original T steps).

    - ``shift``/``shift_terminal``/``grid``: the grid's time shift, terminal stretch and spacing ("linear", or
      "scheduler": diffusers' own spacing, down to σ = 0.0089 at shift 3; ``grids.time_grid``).
    - ``kernel``/``eta``: main-lane SDE kernel (η defaults to the kernel's paper value); ``"ode"``
      makes an all-ODE trunk (TempFlow).
    - ``window=(l, w)``: SDE only on steps l..l+w−1 (and on split steps); ODE with ``solver``
      elsewhere. ``None``: SDE everywhere.
    - ``post_window_ratio`` r̃: MixGRPO-Flash; the stretch after the window is re-gridded with
      int((T − l − w + 1)·r̃) points, both ends counted (at least 2: one step to σ = 0), solved with
      ``post_window_solver`` (``grids.flash_tail_points``; T = 25, l = 0, w = 4: 11 steps at r̃ = 0.4, 7 at 0.2).
      Steps before it keep the grid.
    - ``train_fraction``: SDE steps i < ⌊T·f⌋ are trained, never the last step (its Gaussian is too
      sharp near σ' = 0; Flow-GRPO uses f = 0.99) unless ``train_last`` (SAGE-GRPO's code trains all its steps:
      sage_sde's last step has s > 0; a kernel with s = 0 there, cps, is refused). ``train_subset_fraction``
      (DanceGRPO): each root trains a random ⌊(T − 1)·f⌋ of them.
    - ``splits``/``branch_factor``/``split_noise``: BranchGRPO split steps. ``branch_window``: every step of the SDE
      window splits too (TreeGRPO's tree: branch_factor^w leaves per root, the window's edges its trained ones).
    - ``side_steps``/``side_children``/``side_kernel``/``side_eta``: TempFlow branch points;
      ``side_weight``: ``noise_aware`` multiplies each step's loss by c·σ_t(j)·√Δ_j (flow_sde's std
      with ``side_eta``, c = ``side_weight_scale``), ``noise_aware_mean_one`` rescales those weights
      to mean one over the side steps. ``side_merge`` (E-GRPO): one number per side step, in ``side_steps``' order,
      the grid intervals its SDE step spans (σ_i → σ_{i+m} in one draw; empty: 1 each). ``side_strides`` (G²RPO,
      E-GRPO): each side child is finished by one ODE lane per stride g (σ_c → σ_{c+1}, then every g grid points;
      the lane's last point is σ = 0 when ``leaf`` is "sample", the last grid point it reaches when "predicted",
      whose x̂0 is then its sample); each lane is an advantage group, the child's advantage their z-scores' sum.
    - ``sa_tau``/``sa_tau_window``/``sa_predictor_order``/``sa_corrector_order``: SA-Solver steps (``solver`` or
      ``post_window_solver`` = "sa_solver") draw noise τ = ``sa_tau`` where the point they step to, σ' (float32), lies
      in the window [lo, hi] (AWM: 0.4 in [0.3, 0.9], as its code evaluates τ at the time it steps to), else τ = 0.
    - ``grid_ends``: "exact" keeps the grid; "awm" applies AWM's SA-Solver edits: σ_{T−1} = σ_{T−2}/2, then
      σ_0 = 1 − 1e-3 (needs T ≥ 2).
    - ``leaf``: the samples returned, "sample" (the last step's x') or "predicted" (its x̂0 = x − σ·v, as
      DanceGRPO's and BranchGRPO's codes decode for the reward, their last step being an SDE step).
    """
    if kernel not in KERNEL_NAMES or side_kernel not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel {kernel!r} / {side_kernel!r}; use one of {KERNEL_NAMES}")
    eta = DEFAULT_ETA[kernel] if eta is None else float(eta)
    side_eta = DEFAULT_ETA[side_kernel] if side_eta is None else float(side_eta)
    if side_weight not in SIDE_WEIGHTS:
        raise ValueError(f"side_weight must be one of {SIDE_WEIGHTS}, got {side_weight!r}")
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    T = int(num_steps)
    splits_set = _step_set(splits, T, "split steps")
    side_set = _step_set(side_steps, T, "side-branch steps")
    merges = [int(m) for m in side_merge]
    if merges and len(merges) != len(list(side_steps)):
        raise ValueError(f"side_merge gives {len(merges)} spans for {len(list(side_steps))} side_steps: give one per "
                         "side step, in the same order, or none")
    span_of = dict(zip((int(s) for s in side_steps), merges))
    if kernel == "ode" and (splits_set or window is not None):
        raise ValueError("an all-ODE main lane (kernel='ode') cannot have splits or an SDE window")
    if window is not None:
        start, size = (int(w) for w in window)
        if size < 1 or start < 0 or start + size > T:
            raise ValueError(f"window (start={start}, size={size}) must fit in [0, {T}) with size ≥ 1")
        in_window = set(range(start, start + size))
        window_end = start + size
    else:
        in_window, window_end = set(range(T)), T
    if branch_window:
        if window is None:
            raise ValueError("branch_window (TreeGRPO) splits the SDE window's steps: give the plan a window")
        splits_set = splits_set | frozenset(in_window)
    if post_window_ratio is not None:
        if window is None:
            raise ValueError("post_window_ratio (MixGRPO-Flash) needs a window")
        late = sorted(s for s in splits_set | side_set if s >= window_end)
        if late:
            raise ValueError(f"steps {late} lie in the compressed post-window stretch; move them")
        if grid != "linear":
            raise ValueError("MixGRPO-Flash's re-gridded tail is linear in the unshifted time: use grid='linear'")
        sigmas = flash_grid(T, shift, window_end, post_window_ratio, shift_terminal)
    else:
        sigmas = time_grid(T, shift, shift_terminal, grid)
    unedited, sigmas = sigmas, edit_grid_ends(sigmas, grid_ends)
    lo, hi = (float(w) for w in sa_tau_window)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"sa_tau_window must be [lo, hi] with 0 ≤ lo ≤ hi ≤ 1, got {list(sa_tau_window)}")
    total = sigmas.numel() - 1
    train_until = min(math.floor(T * train_fraction + 1e-9), total if train_last else total - 1)
    s32 = sigmas.to(torch.float32).tolist()

    side_weights = {}
    for j in sorted(side_set):
        std = float(kernel_coefficients("flow_sde", s32[j], s32[j + 1], side_eta)[2][0])
        side_weights[j] = side_weight_scale * std if side_weight != "none" else 1.0
    if side_weight == "noise_aware_mean_one" and side_weights:
        mean_weight = sum(side_weights.values()) / len(side_weights)
        side_weights = {j: w / mean_weight for j, w in side_weights.items()}

    steps = []
    for i in range(total):
        stochastic = kernel != "ode" and (i in in_window or i in splits_set)
        step_solver = post_window_solver if (post_window_ratio and i >= window_end) else solver
        noisy = not stochastic and step_solver == "sa_solver" and lo <= s32[i + 1] <= hi
        steps.append(
            StepSpec(
                kernel=kernel if stochastic else "ode",
                eta=eta if stochastic else 0.0,
                solver=step_solver,
                trained=stochastic and i < train_until,
                branch=branch_factor if i in splits_set else 1,
                split_noise=split_noise,
                split_noise_scale=split_noise_scale,
                side=side_children if i in side_set else 0,
                side_kernel=side_kernel,
                side_eta=side_eta,
                side_loss_weight=side_weights.get(i, 1.0),
                side_span=span_of.get(i, 1),
                side_strides=tuple(int(g) for g in side_strides),
                sa_tau=float(sa_tau) if noisy else 0.0,
                sa_predictor_order=sa_predictor_order,
                sa_corrector_order=sa_corrector_order,
            )
        )
    subset = None
    if train_subset_fraction is not None:
        subset = math.floor((T - 1) * train_subset_fraction + 1e-9)
    return Plan(
        sigmas=sigmas,
        steps=tuple(steps),
        roots_per_prompt=group_size,
        initial_noise=initial_noise,
        train_subset=subset,
        name=name,
        leaf=leaf,
        shift=float(shift),
        unedited_sigmas=None if sigmas is unedited else unedited,
    )


# Every argument of compose_plan (but ``window``, which the schedule sets, and ``name``) and what it takes: a config's
# sampling.plan is checked against these before anything loads (flowgrpo/config/check.py); whether the arguments fit
# together (a window inside the grid, split steps inside the steps, a trained step with a density) is checked by
# building the plan. tests/samplers/test_plans.py checks the keys against the signature.
MAX_STEPS = 1000  # the flow schedulers' num_train_timesteps: a finer grid has no network time to tell
PLAN_RULES: dict[str, Rule] = {
    "num_steps": integer(1, MAX_STEPS),
    "shift": optional(Rule(lambda v: is_number(v) and v > 0, "a number > 0")),
    "shift_terminal": optional(Rule(lambda v: is_number(v) and 0 < v < 1, "a number in (0, 1)")),
    "grid": one_of(*GRIDS),
    "kernel": one_of(*KERNEL_NAMES),
    "eta": optional(at_least(0)),
    "group_size": integer(1),  # how many fit: the config check's cap on a batch's states, then the memory plan
    "initial_noise": one_of(*INITIAL_NOISE_MODES),
    "solver": one_of(*SOLVER_NAMES),
    "post_window_ratio": optional(in_open_closed(0, 1)),
    "post_window_solver": one_of(*SOLVER_NAMES),
    "train_fraction": in_open_closed(0, 1),
    "train_last": FLAG,
    "train_subset_fraction": optional(in_open_closed(0, 1)),
    "splits": integers(0),
    "branch_factor": integer(1, 64),
    "branch_window": FLAG,
    "split_noise": one_of(*SPLIT_NOISE_MODES),
    "split_noise_scale": at_least(0),
    "side_steps": integers(0),
    "side_children": integer(0, 256),
    "side_kernel": one_of(*KERNEL_NAMES),
    "side_eta": optional(at_least(0)),
    "side_weight": one_of(*SIDE_WEIGHTS),
    "side_weight_scale": at_least(0),
    "side_merge": integers(1),
    "side_strides": integers(1),
    "sa_tau": at_least(0),
    "sa_tau_window": interval(0.0, 1.0),
    "sa_predictor_order": one_of(*SA_PREDICTOR_ORDERS),
    "sa_corrector_order": one_of(*SA_CORRECTOR_ORDERS),
    "grid_ends": one_of(*GRID_ENDS),
    "leaf": one_of(*LEAVES),
}


__all__ = ["AWM_FIRST_SIGMA", "GRID_ENDS", "MAX_STEPS", "PLAN_RULES", "compose_plan", "edit_grid_ends"]
