"""Plans, the method presets' plans and window schedules (samplers/plans.py, samplers/compose.py, samplers/schedules.py).

NFE and trained-transition counts are checked against the closed forms of docs/math.md §2, both from
the plan and from what the executor actually does; window positions against the strategies' laws.
Run: pytest tests/samplers/test_plans.py -q
"""

import math

import pytest
import torch

from flowgrpo.config import preset_names, preset_plan
from samplers import (
    Plan,
    StepSpec,
    WindowSchedule,
    build_schedule,
    compose_plan,
    kernel_coefficients,
    rollout,
    time_grid,
)


def preset_schedule(name, *, window=None, seed=0, **plan):
    """The schedule of preset ``name``'s plan (configs/presets/<name>.yaml: sampling.plan, sampling.window) with
    ``plan`` / ``window`` keys changed, as a run's config would change them."""
    base, moving = preset_plan(name)
    return build_schedule({**base, **plan}, {**moving, **(window or {})} if moving else window, seed=seed, name=name)


def distinct_plans():
    """One preset per distinct (plan, window) the presets write (flow_grpo and grpo_guard share theirs, diffusion_nft
    and awm theirs: the DPM-Solver++(2M) ODE plan, named after diffusion_nft)."""
    seen, names = [], []
    for name in sorted(preset_names(), key=lambda n: n != "diffusion_nft"):
        spec = preset_plan(name)
        if spec not in seen:
            seen.append(spec)
            names.append(name)
    return names


PLAN_PRESETS = distinct_plans()


def velocity(x, sigma, cond_index):
    """Cheap, smooth, conditioning-dependent, and exact per row (only + and ×)."""
    s = sigma.view(-1, *([1] * (x.dim() - 1)))
    c = cond_index.to(x.dtype).view_as(s)
    return x * (0.5 + s * s) - 0.1 * s * x * x + 0.05 * (c + 1.0)


def run(plan, prompts=2, latent=(3, 2, 2), **kwargs):
    return rollout(velocity, plan, prompt_ids=list(range(prompts)), latent_shape=latent, seed=0, **kwargs)


def test_branch_grpo_costs_203_forwards_for_16_leaves():
    plan = preset_schedule("branchgrpo").plan(0)
    assert plan.counts()["nfe"] == 203 and plan.counts()["leaves"] == 16
    record = run(plan, prompts=3)
    assert record.nfe == {"rollout": 3 * 203} and record.num_leaves == 3 * 16
    assert 16 * 20 == 320  # the 16 independent chains it replaces
    # levels double at every split: depth d holds 2^(number of splits < d) nodes
    depth_sizes = torch.bincount(record.node_depth).tolist()
    assert depth_sizes == [1] + [2] * 3 + [4] * 3 + [8] * 3 + [16] * 11
    # every edge is trained except the last step's
    assert record.num_transitions == 3 * (sum(depth_sizes[1:20]))


@pytest.mark.parametrize("T,steps,K", [(10, tuple(range(9)), 6), (8, (0, 2, 5), 3), (6, (1,), 2)])
def test_tempflow_cost_is_trunk_plus_k_completions(T, steps, K):
    plan = compose_plan(T, kernel="ode", side_steps=steps, side_children=K, side_weight="noise_aware")
    expected = T + K * sum(T - j - 1 for j in steps)
    assert plan.counts()["nfe"] == expected
    record = run(plan)
    assert record.nfe["rollout"] == 2 * expected
    assert record.num_leaves == 2 * (1 + K * len(steps))
    assert record.num_transitions == 2 * K * len(steps)  # only the one-step SDE children train
    assert set(record.step.tolist()) == set(steps) and set(record.kernel_names()) == {"flow_sde"}
    # the K siblings of one branch point share an advantage group; every group has K members
    counts = torch.bincount(record.group)
    assert sorted(set(counts[counts > 0].tolist())) == [K]
    leaves_per_group = torch.bincount(record.leaf_group).tolist()
    assert sorted(set(leaves_per_group)) == ([1, K] if K != 1 else [1])


def test_tempflow_noise_aware_weights():
    T, steps = 10, (0, 3, 6)
    plan = compose_plan(T, kernel="ode", side_steps=steps, side_weight="noise_aware")
    sig = plan.sigmas.to(torch.float32).tolist()
    for j in steps:
        std = float(kernel_coefficients("flow_sde", sig[j], sig[j + 1], 0.7)[2])
        assert plan.steps[j].side_loss_weight == pytest.approx(2.25 * std, rel=1e-12)
    record = run(plan)
    for j in steps:
        weight = torch.tensor(plan.steps[j].side_loss_weight, dtype=torch.float32)
        assert torch.all(record.loss_weight[record.step == j] == weight)
    unit = compose_plan(T, kernel="ode", side_steps=steps, side_weight="noise_aware_mean_one")
    weights = [unit.steps[j].side_loss_weight for j in steps]
    assert sum(weights) / len(weights) == pytest.approx(1.0) and weights[0] > weights[-1]


@pytest.mark.parametrize("start", [0, 5, 13, 20])
def test_mixgrpo_costs_g_t_forwards_and_g_w_trained(start):
    G, T, w = 3, 25, 4
    plan = compose_plan(T, kernel="flow_sde", group_size=G, window=(start, w))
    record = run(plan, prompts=2)
    assert record.nfe["rollout"] == 2 * G * T
    assert record.num_transitions == 2 * G * w
    assert sorted(set(record.step.tolist())) == list(range(start, start + w))


def test_mixgrpo_window_at_the_end_never_trains_the_last_step():
    plan = compose_plan(25, kernel="flow_sde", group_size=2, window=(21, 4))
    assert plan.steps[24].kernel == "flow_sde" and not plan.steps[24].trained
    assert plan.counts()["trained"] == 2 * 3


# (T, l, w, r̃, steps): the official MixGRPO-Flash grid keeps σ_0..σ_{l+w} and re-grids the rest with
# int((T − l − w + 1)·r̃) points, both ends counted (Tencent-Hunyuan/MixGRPO run_sample_step's num_post_steps):
# 11 steps for Flash and 7 for Flash* at l = 0; a tail of 1 point (no step to σ = 0 there) takes one step here
@pytest.mark.parametrize(
    "T,start,w,ratio,steps",
    [(25, 0, 4, 0.4, 11), (25, 9, 4, 0.4, 17), (25, 0, 4, 0.2, 7), (16, 5, 3, 0.3, 9), (25, 17, 4, 0.4, 22),
     (25, 18, 4, 0.4, 23)],
)
def test_flash_grid_has_l_plus_w_plus_compressed_tail_steps(T, start, w, ratio, steps):
    G = 2
    plan = compose_plan(T, group_size=G, window=(start, w), post_window_ratio=ratio)
    assert steps == start + w + max(int((T - start - w + 1) * ratio), 2) - 1
    assert plan.num_steps == steps
    assert [s.solver for s in plan.steps[start + w :]] == ["dpmpp_2m"] * (steps - start - w)
    assert all(s.solver == "euler" for s in plan.steps[:start])  # never accelerate before the window
    record = run(plan, prompts=1)
    assert record.nfe["rollout"] == G * steps and record.num_transitions == G * w


def test_flow_grpo_and_dance_grpo_training_sets():
    flow = preset_schedule("flow_grpo", group_size=3).plan(0)
    assert [s.trained for s in flow.steps] == [True] * 9 + [False]  # ⌊10·0.99⌋ = 9
    assert flow.counts()["nfe"] == 30 and flow.counts()["trained"] == 27
    dance = preset_schedule("dancegrpo", group_size=8).plan(0)
    subset = math.floor(15 * 0.6)
    assert dance.train_subset == subset == 9
    record = run(dance, prompts=2)
    assert record.num_transitions == 2 * 8 * subset
    per_sample = {}
    for p, node, step in zip(record.prompt.tolist(), record.node.tolist(), record.step.tolist()):
        root = node % 8  # chains: the node id at level d is d·G + root
        per_sample.setdefault((p, root), set()).add(step)
    assert all(len(s) == subset and 15 not in s for s in per_sample.values())
    assert len({frozenset(s) for s in per_sample.values()}) > 1  # each sample draws its own subset


def test_flow_grpo_fast_window_is_redrawn_in_range():
    schedule = preset_schedule("flow_grpo_fast", group_size=2, seed=3)
    starts = [schedule.window_start(n) for n in range(200)]
    assert set(starts) == {0, 1, 2, 3}  # [0, ⌊10/2⌋ − 2]
    again = preset_schedule("flow_grpo_fast", group_size=2, seed=3)
    assert [again.window_start(n) for n in range(200)] == starts  # a pure function of (seed, n)
    other = preset_schedule("flow_grpo_fast", group_size=2, seed=4)
    assert [other.window_start(n) for n in range(200)] != starts
    plan = schedule.plan(7)
    trained = [i for i, s in enumerate(plan.steps) if s.trained]
    assert trained == [starts[7], starts[7] + 1]


def _positions(schedule, n):
    return [schedule.start_at(i) for i in range(n)]


def test_progressive_window_follows_min_l_plus_s():
    T, w, tau, s = 25, 4, 25, 1
    got = _positions(WindowSchedule(T, w, "progressive", interval=tau, stride=s), 700)
    assert got == [min(s * (n // tau), T - w) for n in range(700)]
    got = _positions(WindowSchedule(T, w, "progressive", interval=3, stride=2), 60)
    assert got == [min(2 * (n // 3), T - w) for n in range(60)]


def test_progressive_window_rolls_back_after_the_last_position():
    T, w, tau, s = 10, 4, 2, 2
    got = _positions(WindowSchedule(T, w, "progressive", interval=tau, stride=s, roll_back=True), 24)
    cycle = [0, 0, 2, 2, 4, 4, 6, 6]  # 6 = T − w, then back to 0
    assert got == cycle * 3


def _hold_sequence(interval_of, last, n):
    """Independent simulation: hold position l for interval_of(l) iterations, then l + 1."""
    out, l = [], 0
    while len(out) < n:
        out += [l] * interval_of(l)
        l = min(l + 1, last)
    return out[:n]


def test_decaying_intervals():
    T, w = 25, 4
    lin = WindowSchedule(T, w, "linear_decay", interval_max=10, interval_min=1)
    assert [lin.interval_at(l) for l in (0, T - w)] == [10, 1]
    assert all(lin.interval_at(l) >= lin.interval_at(l + 1) for l in range(T - w))
    expected = _hold_sequence(lambda l: max(1, math.floor(10 - 9 * l / (T - w) + 0.5)), T - w, 150)
    assert _positions(WindowSchedule(T, w, "linear_decay"), 150) == expected
    expo = WindowSchedule(T, w, "exp_decay", interval=25)
    expected = [25, 25, math.ceil(25 * math.exp(-0.1)), math.ceil(25 * math.exp(-0.7))]
    assert [expo.interval_at(l) for l in (0, 13, 14, 20)] == expected
    expected = _hold_sequence(lambda l: math.ceil(25 * math.exp(-0.1 * max(0, l - 13))), T - w, 600)
    assert _positions(WindowSchedule(T, w, "exp_decay", interval=25), 600) == expected


def test_frozen_and_random_windows():
    assert set(_positions(WindowSchedule(25, 4, "frozen"), 50)) == {0}
    rnd = _positions(WindowSchedule(25, 4, "random", seed=1), 2000)
    counts = torch.bincount(torch.tensor(rnd), minlength=22)
    assert counts.numel() == 22 and counts.min() > 50  # uniform over [0, 21]


def test_geometric_window_draws_truncated_geometric_starts():
    """TreeGRPO's draw: P(l) ∝ r^l over [low, high], a pure function of (seed, iteration)."""
    schedule = WindowSchedule(10, 3, "geometric", ratio=0.5, high=6, seed=3)
    starts = _positions(schedule, 4000)
    counts = torch.bincount(torch.tensor(starts), minlength=7).double()
    expected = torch.tensor([0.5**k for k in range(7)], dtype=torch.float64)
    expected = expected / expected.sum() * 4000
    assert counts.numel() == 7 and float(((counts - expected).abs() / expected.sqrt()).max()) < 4.5  # within ~4 sd
    assert _positions(WindowSchedule(10, 3, "geometric", ratio=0.5, high=6, seed=3), 50) == starts[:50]
    assert WindowSchedule(10, 3, "geometric", high=6).extreme_starts() == (0, 6)
    with pytest.raises(ValueError, match="ratio"):
        WindowSchedule(10, 3, "geometric", ratio=1.0)


def test_branch_window_splits_every_window_step_into_a_tree():
    """plan.branch_window (TreeGRPO): each of the window's w steps splits in k, ODE elsewhere: k^w leaves per root,
    the window's edges the trained ones; refused without a window."""
    plan = compose_plan(10, kernel="flow_sde", window=(2, 3), branch_factor=3, branch_window=True,
                                 split_noise="independent")
    assert [s.branch for s in plan.steps] == [1, 1, 3, 3, 3, 1, 1, 1, 1, 1]
    assert [i for i, s in enumerate(plan.steps) if s.trained] == [2, 3, 4]
    assert [i for i, s in enumerate(plan.steps) if s.stochastic] == [2, 3, 4]
    assert plan.counts()["leaves"] == 27 and plan.roots_per_prompt == 1
    with pytest.raises(ValueError, match="window"):
        compose_plan(10, branch_window=True)


def test_schedule_state_round_trips():
    for strategy in ("progressive", "linear_decay", "exp_decay"):
        reference = WindowSchedule(25, 4, strategy, interval=5, roll_back=True)
        full = _positions(reference, 300)
        first = WindowSchedule(25, 4, strategy, interval=5, roll_back=True)
        _positions(first, 137)
        resumed = WindowSchedule(25, 4, strategy, interval=5, roll_back=True)
        resumed.load_state_dict(first.state_dict())
        assert [resumed.start_at(n) for n in range(136, 300)] == full[136:]
    schedule = preset_schedule("mixgrpo", window={"interval": 2})
    plans = [schedule.plan(n) for n in range(11)]
    state = schedule.state_dict()
    fresh = preset_schedule("mixgrpo", window={"interval": 2})
    fresh.load_state_dict(state)
    assert fresh.window_start(10) == schedule.window_start(10) == 5
    assert [i for i, s in enumerate(plans[10].steps) if s.trained] == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="cannot go back"):
        schedule.plan(3)
    with pytest.raises(ValueError, match="checkpoint"):
        WindowSchedule(20, 4).load_state_dict(state["window"])


def test_plans_compose_tree_window_and_sage():
    plan = compose_plan(20, kernel="sage_sde", splits=(0, 3, 6, 9), window=(12, 4))
    sde = [i for i, s in enumerate(plan.steps) if s.kernel == "sage_sde"]
    assert sde == [0, 3, 6, 9, 12, 13, 14, 15]
    assert plan.counts()["nfe"] == 203 and plan.counts()["leaves"] == 16
    record = run(plan)
    assert set(record.kernel_names()) == {"sage_sde"} and sorted(set(record.step.tolist())) == sde
    preset = preset_schedule("branchgrpo_mix", kernel="sage_sde", eta=0.5).plan(60)
    assert [i for i, s in enumerate(preset.steps) if s.stochastic] == [0, 2, 3, 4, 5, 6, 9]


def test_every_preset_builds_and_runs():
    assert {"diffusion_nft", "flow_grpo", "mixgrpo", "tempflow"} <= set(PLAN_PRESETS)  # diffusion_nft: the ODE plan
    for name in PLAN_PRESETS:
        small = {"group_size": 2} if preset_plan(name)[0].get("group_size", 1) > 1 else {}
        plan = preset_schedule(name, **small).plan(0)
        record = run(plan, prompts=1, latent=(2, 2))
        assert record.nfe["rollout"] == plan.counts()["nfe"]
        assert record.num_transitions == plan.counts()["trained"]
        assert name in plan.describe()


def test_ode_probes_ride_the_side_lane_and_count_as_probes():
    """TurningPoint-style probe: after SDE step 1, an ODE copy of the chain runs to the end."""
    sde = StepSpec("flow_sde", 0.7, trained=True)
    probe = StepSpec("flow_sde", 0.7, trained=True, side=1, side_kernel="ode", side_trained=False,
                     side_category="probe")
    plan = Plan(time_grid(4), (sde, sde, probe, StepSpec("flow_sde", 0.7)))
    assert plan.counts()["rollout"] == 4 and plan.counts()["probe"] == 1
    record = run(plan, prompts=2)
    assert record.nfe == {"rollout": 8, "probe": 2} and record.num_leaves == 4
    assert record.num_transitions == 2 * 3 and set(record.step.tolist()) == {0, 1, 2}


def test_bad_plans_raise_with_the_fix():
    compose_plan(10, kernel="cps")  # fine: the last step (cps std 0 at σ' = 0) is never trained
    last_trained = (StepSpec("cps", 0.8, trained=True), StepSpec("cps", 0.8, trained=True))
    with pytest.raises(ValueError, match="std 0"):
        Plan(time_grid(2), last_trained)
    with pytest.raises(ValueError, match="neither be trained nor split"):
        StepSpec("ode", trained=True)
    with pytest.raises(ValueError, match="window"):
        compose_plan(10, window=(8, 4))
    with pytest.raises(ValueError, match="outside the 10 steps"):
        compose_plan(10, splits=(0, 12))
    with pytest.raises(ValueError, match="chains only"):
        compose_plan(10, splits=(0,), train_subset_fraction=0.6)
    with pytest.raises(ValueError, match="bad window arguments.*sise"):
        preset_schedule("mixgrpo", window={"sise": 2})
    with pytest.raises(ValueError, match="bad plan arguments.*windw"):
        preset_schedule("flow_grpo", windw=(0, 2))
    with pytest.raises(ValueError, match="compressed post-window"):
        compose_plan(25, window=(0, 4), post_window_ratio=0.4, splits=(10,))


@pytest.mark.parametrize("num_steps, shift", [(4, 3.0), (10, 1.7), (28, 3.16)])
def test_terminal_stretch_is_the_schedulers_shift_terminal(num_steps, shift):
    """time_grid(T, shift, terminal) equals diffusers' FlowMatchEulerDiscreteScheduler with ``shift_terminal`` (the
    pipelines' sigmas linspace(1, 1/T, T), shifted, stretched, then the final 0), in float32 ulps."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    from samplers.grids import time_grid

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift, shift_terminal=0.02)
    scheduler.set_timesteps(sigmas=list(np.linspace(1.0, 1.0 / num_steps, num_steps)))
    grid = time_grid(num_steps, shift, 0.02)
    assert grid[0] == 1.0 and grid[-1] == 0.0 and float(grid[-2]) == pytest.approx(0.02, rel=1e-12)
    eps = torch.finfo(torch.float32).eps
    assert (scheduler.sigmas.double() - grid.float().double()).abs().max() <= 4 * eps
    assert torch.equal(time_grid(num_steps, shift, None), time_grid(num_steps, shift))
    with pytest.raises(ValueError, match=r"shift_terminal must be in \(0, 1\)"):
        time_grid(num_steps, shift, 1.5)


def test_a_plan_carries_the_terminal_stretch():
    plain, stretched = compose_plan(6, shift=3.0), compose_plan(6, shift=3.0, shift_terminal=0.05)
    assert float(stretched.sigmas[-2]) == pytest.approx(0.05) and plain.sigmas[-2] > 0.1
    assert stretched.sigmas[0] == 1.0 and stretched.sigmas[-1] == 0.0


@pytest.mark.parametrize("num_steps", [10, 14])
def test_the_scheduler_grid_is_diffusers_own_spacing(num_steps):
    """grid='scheduler' is FlowMatchEulerDiscreteScheduler.set_timesteps(T) at shift 3 (DiffusionNFT's and AWM's
    training grid): its last point before 0 is shift(shift(1/1000)) = 0.0089, where the linear grid of 10 steps stops
    at 0.25."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(num_steps)
    grid = compose_plan(num_steps, shift=3.0, grid="scheduler").sigmas
    eps = torch.finfo(torch.float32).eps
    assert (scheduler.sigmas.double() - grid.float().double()).abs().max() <= 4 * eps
    assert float(grid[-2]) == pytest.approx(0.0089, abs=1e-4) and grid[-1] == 0.0
    assert float(time_grid(10, 3.0)[-2]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="grid spacing must be one of"):
        time_grid(num_steps, 3.0, spacing="cosine")


def test_train_last_trains_the_step_to_zero_where_the_kernel_has_a_density():
    """SAGE-GRPO's code trains all 20 steps: sage_sde's last step (σ' = 0) has s > 0, so train_last adds it; by default
    the last step is never trained, and a kernel without a density there (cps, s = σ'·sin(ηπ/2) = 0) is refused."""
    last = compose_plan(20, kernel="sage_sde", eta=0.5, train_fraction=1.0, train_last=True)
    default = compose_plan(20, kernel="sage_sde", eta=0.5, train_fraction=1.0)
    assert [s.trained for s in last.steps] == [True] * 20
    assert [s.trained for s in default.steps] == [True] * 19 + [False]
    with pytest.raises(ValueError, match="std 0"):
        compose_plan(10, kernel="cps", eta=0.8, train_last=True)


@pytest.mark.parametrize("num_steps", [4, 10])
def test_the_dpmsolver_grid_is_diffusers_flow_sigma_dpm_solver(num_steps):
    """grid='dpmsolver' is DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3).set_timesteps(T), DGPO's
    rollout grid: σ_0 = shift(0.999) < 1, then to 0; its integer timesteps are ⌊1000σ⌋ (sampling.integer_timesteps)."""
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")
    scheduler.set_timesteps(num_steps)
    grid = compose_plan(num_steps, shift=3.0, grid="dpmsolver", kernel="ode").sigmas
    eps = torch.finfo(torch.float32).eps
    assert (scheduler.sigmas.double() - grid.float().double()).abs().max() <= 2 * eps
    assert 0.9996 < float(grid[0]) < 1 and grid[-1] == 0.0
    assert scheduler.timesteps.tolist() == torch.floor(grid[:-1].float() * 1000).long().tolist()


def test_the_linear_float32_grid_is_the_linear_grid_computed_as_the_flux_codes_compute_it():
    """grid='linear_float32': (k·t)/(1 + (k − 1)·t) of torch.linspace(1, 0, T + 1) in float32 (DanceGRPO's,
    BranchGRPO's sd3_time_shift): within a float32 ulp of 'linear', and at T = 20 its σ_6 is 0.87499994, not 0.875."""
    t = torch.linspace(1, 0, 21)
    by_hand = (3.0 * t) / (1 + 2.0 * t)
    grid = time_grid(20, 3.0, spacing="linear_float32")
    assert torch.equal(grid.float(), by_hand) and grid[0] == 1.0 and grid[-1] == 0.0
    assert (grid - time_grid(20, 3.0).float().double()).abs().max() <= torch.finfo(torch.float32).eps
    assert float(grid[6]) < 0.875 == float(time_grid(20, 3.0).float()[6])


def test_every_plan_and_window_argument_declares_its_rule():
    """PLAN_RULES / WINDOW_RULES name exactly the arguments of compose_plan (but window and name) and of
    WindowSchedule (but num_steps and seed), and every method preset's values pass them."""
    import inspect

    from samplers.compose import PLAN_RULES
    from samplers.schedules import WINDOW_RULES

    plan_args = set(inspect.signature(compose_plan).parameters) - {"window", "name"}
    window_args = set(inspect.signature(WindowSchedule).parameters) - {"num_steps", "seed"}
    assert set(PLAN_RULES) == plan_args and set(WINDOW_RULES) == window_args
    assert {"flow_grpo", "diffusion_nft", "treegrpo"} <= set(preset_names())  # the shipped files are found
    for name in preset_names():
        plan, window = preset_plan(name)
        bad = [k for k, v in plan.items() if not PLAN_RULES[k].ok(v)]
        bad += [k for k, v in (window or {}).items() if not WINDOW_RULES[k].ok(v)]
        assert not bad, (name, bad)
    assert not PLAN_RULES["group_size"].ok(True) and not PLAN_RULES["sa_corrector_order"].ok(False)  # no bools


@pytest.mark.parametrize("name", PLAN_PRESETS)
def test_the_closed_form_node_count_is_the_trees(name):
    plan = preset_schedule(name, group_size=3).plan(0)
    from samplers.tree import template_for

    assert plan.node_count() == int(template_for(plan).node_parent.numel())


def test_a_step_whose_coefficients_overflow_float32_is_refused_naming_eta():
    compose_plan(10, eta=5.0)
    with pytest.raises(ValueError, match=r"step 0 \(flow_sde, η=1e\+30.*not finite in float32.*lower eta"):
        compose_plan(10, eta=1e30)
    with pytest.raises(ValueError, match="lower side_eta"):
        compose_plan(10, kernel="ode", side_steps=(2,), side_eta=1e30)
