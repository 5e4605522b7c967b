"""Rollout plans: which step does what, for one training iteration (docs/math.md §2, docs/design.md).

A ``Plan`` is a frozen record: the σ grid, one ``StepSpec`` per step, the number of roots per prompt
and how their initial noise is shared. Every node of the rollout tree is on the *main lane* or on a
*side lane*:
- main-lane nodes take the step's ``kernel`` (ODE or an SDE kernel); a split step (``branch`` = K)
  gives each of them K children with shared μ and (by default) correlated noise;
- a step with ``side`` = K also spawns K side children from each main node, drawn with
  ``side_kernel`` (TempFlow's one-step SDE branches); side-lane nodes then follow the ODE (the
  step's ``solver``) to the end and are never trained.
Chains, windows, splits and side branches are all edges of that one tree, so one executor runs them.

``compose_plan`` builds every published method from a handful of orthogonal options (kernel, SDE
window, Flash post-window compression, split points, side branches, training subset); a method's plan is
just an argument set for it (each preset's ``sampling.plan`` in configs/presets/), and they compose: a
BranchGRPO tree with a MixGRPO window and the sage_sde kernel is ``compose_plan(20, kernel="sage_sde",
splits=(0, 3, 6, 9), window=(l, 4))``. Plans that move with training come from ``samplers.schedules``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from samplers.grids import GRIDS, flash_grid, time_grid
from samplers.kernels import DEFAULT_ETA, KERNEL_NAMES, kernel_coefficients
from samplers.rules import (
    FLAG, Rule, at_least, in_open_closed, integer, integers, interval, is_number, one_of, optional,
)
from samplers.solvers import SA_CORRECTOR_ORDERS, SA_PREDICTOR_ORDERS, SOLVER_NAMES
from samplers.tree import template_for

SPLIT_NOISE_MODES = ("correlated", "independent", "scaled_compat")
INITIAL_NOISE_MODES = ("shared", "independent")
SIDE_WEIGHTS = ("none", "noise_aware", "noise_aware_mean_one")
NFE_CATEGORIES = ("rollout", "probe")
GRID_ENDS = ("exact", "awm")
LEAVES = ("sample", "predicted")  # what a rollout returns as its samples: x' of the last step, or its x̂0
AWM_FIRST_SIGMA = 1.0 - 1e-3  # AWM's first grid point for SA-Solver (λ stays finite)


@dataclass(frozen=True)
class StepSpec:
    """What one step σ → σ' does to the nodes that reach it.

    Split noise (``branch`` > 1): ``correlated`` (BranchGRPO paper) gives child b the noise
    ξ_b = (ξ_0 + c·η_b)/√(1 + c²), c = ``split_noise_scale``, each child N(μ, s²) marginally;
    ``independent`` draws each child alone; ``scaled_compat`` reproduces the public BranchGRPO code:
    x' = μ + s·c·η_b scored with the unscaled s (not a true density; for comparisons only)."""

    kernel: str = "ode"  # main-lane kernel: one of KERNEL_NAMES
    eta: float = 0.0  # noise level of that kernel
    solver: str = "euler"  # ODE solver of this step for main ODE steps and for side lanes
    trained: bool = False  # main-lane transitions of this step enter the loss
    loss_weight: float = 1.0  # per-transition loss weight of trained main-lane transitions
    branch: int = 1  # children per main node (K > 1: a split step)
    split_noise: str = "correlated"  # noise of split children, see SPLIT_NOISE_MODES
    split_noise_scale: float = 4.0  # c of the correlated / scaled_compat split noise
    side: int = 0  # side children per main node (TempFlow branch point), each one side_kernel step
    side_kernel: str = "flow_sde"
    side_eta: float = 0.7
    side_trained: bool = True
    side_loss_weight: float = 1.0
    side_category: str = "rollout"  # NFE category of side-lane forwards ("probe" for probes)
    # E-GRPO's merged SDE step: the side step spans this many grid intervals, σ_i → σ_{i+span} in one draw (the side
    # child then waits, without forwards, until the level whose σ its state is at)
    side_span: int = 1
    # the ODE tails each side child is finished with, one lane per stride (G²RPO's and E-GRPO's granularities): a
    # lane steps σ_c → σ_{c+1}, then every ``stride`` grid points; each lane is its own advantage group and the side
    # child's advantage is the sum of its lanes' z-scores
    side_strides: tuple = (1,)
    sa_tau: float = 0.0  # SA-Solver's noise τ on this step (solver sa_solver; 0: deterministic)
    sa_predictor_order: int = 2  # SA-Solver's predictor order (1 or 2)
    sa_corrector_order: int = 2  # SA-Solver's corrector order (0 = none, 1 or 2), refining this step at the next

    def __post_init__(self):
        for name in (self.kernel, self.side_kernel):
            if name not in KERNEL_NAMES:
                raise ValueError(f"unknown kernel {name!r}; use one of {KERNEL_NAMES}")
        if self.solver not in SOLVER_NAMES:
            raise ValueError(f"unknown ODE solver {self.solver!r}; use one of {SOLVER_NAMES}")
        if self.split_noise not in SPLIT_NOISE_MODES:
            raise ValueError(f"unknown split_noise {self.split_noise!r}; use {SPLIT_NOISE_MODES}")
        if self.side_category not in NFE_CATEGORIES:
            raise ValueError(f"side_category must be one of {NFE_CATEGORIES}")
        if self.branch < 1 or self.side < 0:
            raise ValueError(f"branch must be ≥ 1 and side ≥ 0, got {self.branch}, {self.side}")
        if self.kernel == "ode" and (self.trained or self.branch > 1):
            raise ValueError(
                "an ode step can neither be trained nor split (it has no density and its children "
                "would be identical); use an SDE kernel for that step"
            )
        if self.side and self.side_kernel == "ode" and (self.side_trained or self.side > 1):
            raise ValueError("ode side children must be single (side=1) and untrained (probes)")
        if self.side_span < 1:
            raise ValueError(f"side_span must be ≥ 1, got {self.side_span}")
        strides = tuple(int(g) for g in self.side_strides)
        if not strides or min(strides) < 1 or len(set(strides)) != len(strides):
            raise ValueError(f"side_strides must be distinct integers ≥ 1, got {list(self.side_strides)}")
        if not (self.sa_tau >= 0 and math.isfinite(self.sa_tau)):
            raise ValueError(f"sa_tau must be a finite number ≥ 0, got {self.sa_tau}")
        if self.sa_predictor_order not in SA_PREDICTOR_ORDERS or self.sa_corrector_order not in SA_CORRECTOR_ORDERS:
            raise ValueError(f"SA-Solver orders: predictor one of {SA_PREDICTOR_ORDERS}, corrector one of "
                             f"{SA_CORRECTOR_ORDERS}; got {self.sa_predictor_order}, {self.sa_corrector_order}")

    @property
    def stochastic(self) -> bool:
        return self.kernel != "ode"


@dataclass(frozen=True, eq=False)
class Plan:
    """One iteration's rollout: grid, per-step specs, roots per prompt, initial-noise sharing."""

    sigmas: torch.Tensor  # [T + 1] float64, 1 → 0; cast to float32 by the executor
    steps: tuple[StepSpec, ...]  # [T] one spec per step σ_i → σ_{i+1}
    roots_per_prompt: int = 1  # G for chains, 1 for one tree per prompt
    initial_noise: str = "shared"  # "shared": every root of a prompt starts from the same x_T
    train_subset: int | None = None  # each root trains a random subset of this many trained steps
    name: str = "custom"
    # the samples the rollout returns (rewarded, and the forward learners' x0): "sample", the last step's x'; or
    # "predicted", the last step's data prediction x̂0 = x − σ·v (DanceGRPO's and BranchGRPO's codes reward it; the
    # last step's x' is still what its transition stores and trains)
    leaf: str = "sample"
    shift: float | None = None  # the time shift the grid was built with (None: a grid given as it is)
    # the grid before grid_ends edited its ends (AWM's SA-Solver rollouts), which forward learners draw training
    # times from as the reference codes do (their scheduler's timesteps); None: ``sigmas``
    unedited_sigmas: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        sig = self.sigmas
        if sig.dim() != 1 or len(self.steps) != sig.numel() - 1 or not self.steps:
            raise ValueError(
                f"a plan needs T ≥ 1 steps and T + 1 sigmas, got {len(self.steps)} steps and sigmas "
                f"of shape {tuple(sig.shape)}"
            )
        s32 = sig.to(torch.float32)
        if bool((s32[1:] >= s32[:-1]).any()) or float(s32[0]) > 1 or float(s32[-1]) < 0:
            raise ValueError("plan sigmas must decrease strictly within [0, 1] (also in float32)")
        if self.roots_per_prompt < 1:
            raise ValueError(f"roots_per_prompt must be ≥ 1, got {self.roots_per_prompt}")
        if self.initial_noise not in INITIAL_NOISE_MODES:
            raise ValueError(f"initial_noise must be one of {INITIAL_NOISE_MODES}")
        if self.leaf not in LEAVES:
            raise ValueError(f"leaf must be one of {LEAVES}, got {self.leaf!r}")
        T = len(self.steps)
        for i, step in enumerate(self.steps):
            if step.side and i + step.side_span > T:
                raise ValueError(f"step {i} merges {step.side_span} grid intervals into its side step, past the last "
                                 f"of the {T} steps; lower its side_merge to at most {T - i}")
            sigma, sigma_next = float(s32[i]), float(s32[i + 1])
            side_next = float(s32[min(i + step.side_span, T)])
            for kernel, eta, what, to in ((step.kernel, step.eta, "eta", sigma_next),
                                          (step.side_kernel if step.side else "ode", step.side_eta, "side_eta",
                                           side_next)):
                if kernel != "ode" and not self._finite(kernel, sigma, to, eta):
                    raise ValueError(
                        f"step {i} ({kernel}, η={eta:g}, σ {sigma:.4g} → {to:.4g}): its mean or noise "
                        f"coefficients are not finite in float32, so its first sample would be NaN or inf; lower {what}")
            if step.trained and self._std(step.kernel, sigma, sigma_next, step.eta) <= 0:
                raise ValueError(
                    f"step {i} ({step.kernel}, η={step.eta}, σ {sigma:.4g} → {sigma_next:.4g}) is "
                    "trained but has std 0 (no density); untrain it or raise η"
                )
            if step.side and step.side_trained:
                if self._std(step.side_kernel, sigma, side_next, step.side_eta) <= 0:
                    raise ValueError(f"step {i}: trained side children have std 0; raise side_eta")
        if any(s.side for s in self.steps) and any(s.solver == "sa_solver" for s in self.steps):
            raise ValueError(
                "side lanes (TempFlow's branches) follow a deterministic ODE solver; use solver euler or dpmpp_2m "
                "with side_steps, not sa_solver"
            )
        if self.lanes_wait and any(s.solver != "euler" for s in self.steps):
            raise ValueError(
                "merged side steps (side_merge) and strided side lanes (side_strides) wait at levels without a "
                "forward, so they keep no solver history: use solver euler")
        if self.train_subset is not None:
            if any(s.branch > 1 or s.side for s in self.steps):
                raise ValueError(
                    "train_subset (DanceGRPO's random steps per sample) applies to chains only; a "
                    "tree chooses trained edges by depth (prune them in the learner)"
                )
            available = sum(s.trained for s in self.steps)
            if not 1 <= self.train_subset <= available:
                raise ValueError(
                    f"train_subset={self.train_subset} must lie in [1, {available}] (the number of "
                    "trained steps)"
                )

    @staticmethod
    def _std(kernel, sigma, sigma_next, eta) -> float:
        return float(kernel_coefficients(kernel, sigma, sigma_next, eta)[2][0])

    @staticmethod
    def _finite(kernel, sigma, sigma_next, eta) -> bool:
        return all(bool(torch.isfinite(c.float()).all()) for c in kernel_coefficients(kernel, sigma, sigma_next, eta))

    @property
    def lanes_wait(self) -> bool:
        """Whether some side lane spans several grid intervals in one step (a merged side step, a stride > 1): its
        nodes then wait at the levels in between, without a forward."""
        return any(s.side and (s.side_span > 1 or max(s.side_strides) > 1) for s in self.steps)

    def node_count(self) -> int:
        """Nodes of one prompt's rollout tree (x_T included), in closed form from the steps: what the record stores
        per prompt, known before the tree is built (``template_for`` enumerates them). A side child is one node a
        level until its tails start (level i + span), then one per stride."""
        T = len(self.steps)
        main, total, side = self.roots_per_prompt, self.roots_per_prompt, [0] * (T + 1)
        for i, step in enumerate(self.steps):
            if step.side:
                start = i + step.side_span
                for level in range(i + 1, T + 1):
                    side[level] += main * step.side * (len(step.side_strides) if level > start else 1)
            main *= step.branch
            total += main
        return total + sum(side)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def branches(self) -> bool:
        """Whether the main lane splits (a BranchGRPO tree: advantages are depth-wise node values)."""
        return any(s.branch > 1 for s in self.steps)

    def counts(self) -> dict[str, int]:
        """Closed-form costs per prompt: forwards by NFE category, leaves, trained transitions."""
        return dict(template_for(self).counts)

    def describe(self) -> str:
        """One line per step, for logs and docs."""
        s = self.sigmas.tolist()
        lines = [f"plan {self.name}: {self.num_steps} steps, {self.roots_per_prompt} root(s)/prompt"]
        for i, st in enumerate(self.steps):
            text = f"  {i:3d} σ {s[i]:.4f}→{s[i + 1]:.4f} {st.kernel}"
            text += f" η={st.eta:g}" if st.stochastic else f" ({st.solver})"
            text += f" τ={st.sa_tau:g}" if not st.stochastic and st.solver == "sa_solver" and st.sa_tau else ""
            text += " trained" if st.trained else ""
            text += f" w={st.loss_weight:.3g}" if st.trained and st.loss_weight != 1 else ""
            text += f" split×{st.branch} {st.split_noise}" if st.branch > 1 else ""
            text += f" side×{st.side} {st.side_kernel} w={st.side_loss_weight:.3g}" if st.side else ""
            text += f" merged×{st.side_span}" if st.side and st.side_span > 1 else ""
            text += f" strides {list(st.side_strides)}" if st.side and tuple(st.side_strides) != (1,) else ""
            lines.append(text)
        return "\n".join(lines)


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


__all__ = [
    "GRID_ENDS",
    "INITIAL_NOISE_MODES",
    "LEAVES",
    "MAX_STEPS",
    "NFE_CATEGORIES",
    "PLAN_RULES",
    "Plan",
    "SIDE_WEIGHTS",
    "SPLIT_NOISE_MODES",
    "StepSpec",
    "compose_plan",
    "edit_grid_ends",
]
