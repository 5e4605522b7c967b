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

Plans are built from orthogonal options by ``samplers.compose.compose_plan``; plans that move with training come from
``samplers.schedules``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from samplers.kernels import KERNEL_NAMES, kernel_coefficients
from samplers.solvers import SA_CORRECTOR_ORDERS, SA_PREDICTOR_ORDERS, SOLVER_NAMES
from samplers.tree import template_for

SPLIT_NOISE_MODES = ("correlated", "independent", "scaled_compat")
INITIAL_NOISE_MODES = ("shared", "independent")
SIDE_WEIGHTS = ("none", "noise_aware", "noise_aware_mean_one")
NFE_CATEGORIES = ("rollout", "probe")
LEAVES = ("sample", "predicted")  # what a rollout returns as its samples: x' of the last step, or its x̂0


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


__all__ = ["INITIAL_NOISE_MODES", "LEAVES", "NFE_CATEGORIES", "Plan", "SIDE_WEIGHTS", "SPLIT_NOISE_MODES", "StepSpec"]
