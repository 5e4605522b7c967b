"""samplers: transition kernels, ODE solvers, rollout plans and their schedules, the tree executor and
the trajectory record — every GRPO method for flow models as a plan run by one engine (torch only).

    from samplers import build_schedule, rollout, time_grid, sample_ode
    schedule = build_schedule(dict(num_steps=8, kernel="flow_sde", eta=0.7, group_size=4),   # a plan (a preset's
                              dict(size=2, strategy="progressive", interval=10, stride=1))  # sampling.plan) and its window
    plan = schedule.plan(iteration)
    record = rollout(velocity, plan, prompt_ids=ids, latent_shape=(16, 8, 8), seed=0, iteration=iteration)

``velocity(x [N, *latent], sigma [N] float32, cond_index [N] long) -> v [N, *latent]`` is the one
model interface. Formulas: docs/math.md §1–2; architecture and contracts: docs/samplers.md.
"""

from samplers.executor import rollout, sample_endpoints
from samplers.grids import (
    derive_seed, eval_noise, eval_noise_seed, flash_grid, flash_steps, make_generator, shift_sigmas, time_grid,
)
from samplers.kernels import (
    DEFAULT_ETA,
    KERNEL_NAMES,
    KERNELS,
    Transition,
    compute_dtype,
    cps,
    dance_sde,
    flow_sde,
    get_kernel,
    kernel_coefficients,
    log_prob,
    ode,
    sage_sde,
    transition,
)
from samplers.compose import compose_plan
from samplers.plans import Plan, StepSpec
from samplers.schedules import WINDOW_STRATEGIES, PlanSchedule, WindowSchedule, build_schedule
from samplers.solvers import (
    SOLVER_NAMES,
    data_prediction,
    dpmpp_2m_step,
    euler_step,
    ode_step,
    sa_solver_step,
    sample_ode,
)
from samplers.trajectory import Endpoints, NFECounter, Trajectory, score_transitions

__all__ = [
    "DEFAULT_ETA",
    "Endpoints",
    "KERNELS",
    "KERNEL_NAMES",
    "NFECounter",
    "Plan",
    "PlanSchedule",
    "SOLVER_NAMES",
    "StepSpec",
    "Trajectory",
    "Transition",
    "WINDOW_STRATEGIES",
    "WindowSchedule",
    "compose_plan",
    "compute_dtype",
    "cps",
    "dance_sde",
    "data_prediction",
    "derive_seed",
    "eval_noise",
    "eval_noise_seed",
    "dpmpp_2m_step",
    "euler_step",
    "flash_grid",
    "flash_steps",
    "flow_sde",
    "get_kernel",
    "kernel_coefficients",
    "log_prob",
    "make_generator",
    "build_schedule",
    "ode",
    "ode_step",
    "rollout",
    "sa_solver_step",
    "sage_sde",
    "sample_endpoints",
    "sample_ode",
    "score_transitions",
    "shift_sigmas",
    "time_grid",
    "transition",
]
