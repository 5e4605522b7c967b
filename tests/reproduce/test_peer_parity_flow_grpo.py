"""reproduce/parity/flow_grpo.py: Flow-GRPO's own samplers (its SD3 and FLUX pipelines with Flow-SDE, the Fast
pipelines' CPS window at every start the official draw can take, its FLUX.1-Kontext editing pipeline) against
flowgrpo's ``flow_grpo`` and ``flow_grpo_fast`` presets on the real model configs (tiny weights), step by step, when
FLOW_GRPO_PATH names a checkout of yifan123/flow_grpo (its code is loaded from there at run time; the project ships
none of it)."""

import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

CODE = "flow_grpo"
pytestmark = pytest.mark.usefixtures("one_thread")
needs_checkout = needs_checkout(CODE)  # the tests that compare with the checkout (the bookkeeping test needs none)


def test_per_root_step_puts_each_trained_transition_at_its_root_and_step():
    """The bookkeeping the comparison reads flowgrpo's log-probs with (no checkout needed)."""
    import samplers
    from flowgrpo.config import preset_plan
    from parity.flow_grpo import per_root_step

    plan, window = preset_plan("flow_grpo_fast")
    plan = samplers.build_schedule({**plan, "num_steps": 6, "group_size": 3},
                                   {**window, "size": 2, "low": 1, "high": 1}).plan(0)
    rec = samplers.rollout(lambda x, s, c: 0.1 * x + c.view(-1, 1, 1, 1).float(), plan, prompt_ids=[4, 7],
                           latent_shape=(2, 4, 4), seed=0)
    steps = per_root_step(rec, rec.step.double(), 6)
    assert steps.shape == (6, 6)
    assert torch.isnan(steps[:, [0, 3, 4, 5]]).all() and bool((steps[:, 1:3] == torch.tensor([1.0, 2.0])).all())
    first = per_root_step(rec, rec.state.flatten(1)[:, 0].double(), 6)[:, 1]
    x1 = rec.root_state.flatten(1)[:, 0].double()  # step 0 is an ODE step here: x_1 ≠ x_T, but per root
    assert torch.isfinite(first).all() and not torch.equal(first, x1)


@needs_checkout
def test_every_flow_grpo_sampler_equals_the_official_code_step_by_step(reports):
    assert sorted(reports) == ["flow_grpo flux", "flow_grpo flux_kontext", "flow_grpo sd3", "flow_grpo_fast flux window 0",
                               "flow_grpo_fast sd3 window 0", "flow_grpo_fast sd3 window 1", "flow_grpo_fast sd3 window 2"]
    bad = {name: [s for s in r.steps if not s.ok] for name, r in reports.items() if not r.ok}
    assert not bad, bad
    for r in reports.values():
        print(r.line())


@needs_checkout
def test_flow_grpo_on_sd3_steps_on_the_schedulers_own_grid(reports):
    """The official pipeline's sigmas=None grid is diffusers' FlowMatchEulerDiscreteScheduler(shift=3) at 10 steps,
    ending 0.4649, 0.278, 0.0089, 0; flowgrpo's preset on sd3_5_medium steps on exactly those float32 values."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    for name in ("flow_grpo sd3", "flow_grpo_fast sd3 window 0"):
        ours = [s.sigma[0] for s in reports[name].steps] + [reports[name].steps[-1].sigma_next[0]]
        assert ours == scheduler.sigmas.tolist()
    assert [round(s, 4) for s in scheduler.sigmas.tolist()[-4:]] == [0.4649, 0.278, 0.0089, 0.0]
    r = reports["flow_grpo sd3"]
    assert all(s.stochastic == (True, True) for s in r.steps)  # Flow-SDE at every step, the last included
    assert [s.step for s in r.steps if s.trained[0]] == list(range(9))  # int(10 · 0.99)


@needs_checkout
def test_the_fast_window_is_stochastic_and_trained_where_the_official_draw_puts_it(reports):
    for start in (0, 1, 2):
        r = reports[f"flow_grpo_fast sd3 window {start}"]
        window = list(range(start, start + 3))
        assert [s.step for s in r.steps if s.stochastic[1]] == window
        assert [s.step for s in r.steps if s.trained[1]] == window
        assert f"randint(0, 2) answered {start}" in r.notes[0]
    flux = reports["flow_grpo_fast flux window 0"]  # 6 steps, sde_window_range (0, 3): the only start is 0
    assert [s.step for s in flux.steps if s.trained[1]] == [0, 1, 2]


@needs_checkout
@pytest.mark.parametrize("override, broken", [
    ("sampling.plan.grid=linear", "sigma"),  # the grid issue 44 found: the linear grid instead of the scheduler's
    ("sampling.log_prob=gaussian", "log_prob"),  # CPS scored as a Gaussian instead of the official squared error
    ("sampling.integer_timesteps=true", "x"),  # the model told ⌊1000σ⌋ where the official pipeline gives it σ·1000
])
def test_a_changed_plan_is_caught(checkout, override, broken):
    """Negative controls: the comparison with one setting of flowgrpo's side changed fails where it should."""
    from parity import flow_grpo

    report = flow_grpo.run(checkout, families=("sd3",), presets=("flow_grpo_fast",), extra=(override,))[0]
    assert not report.ok
    wrong = [s for s in report.steps if not s.ok]
    if broken == "sigma":
        assert report.steps[7].sigma[0] == pytest.approx(3 * 0.3 / (1 + 2 * 0.3), rel=1e-6)  # linear: 0.5625
        assert report.steps[7].sigma[1] == pytest.approx(0.4649, abs=1e-4)
    elif broken == "log_prob":
        assert [s.step for s in wrong] == [0, 1, 2] and all(s.dlogp > s.tol_logp for s in wrong)
    else:  # σ_1 = 0.96013 of the scheduler's grid: 960, not 960.13 (step 0 at σ = 1 is 1000 either way)
        assert all(s.sigma[0] == s.sigma[1] for s in report.steps) and report.steps[0].ok
        assert max(s.dx for s in wrong) > 10 * max(s.tol_x for s in wrong)


@needs_checkout
def test_the_kontext_edit_run_steps_as_the_official_kontext_pipeline(reports):
    """Flow-GRPO's editing run on FLUX.1-Kontext (counting_flux_kontext, scripts/train_flux_kontext.py): its pipeline
    (the source VAE-encoded at the output size, its tokens after the latent's) against the preset on
    flux1_kontext_dev, on a tiny random guidance-embedded FLUX.1-Kontext with the same sources: FLUX's grid at 6 steps,
    Flow-SDE at every step, the first int(6 · 0.99) = 5 trained, every x' and log-prob equal within tolerance."""
    r = reports["flow_grpo flux_kontext"]
    assert r.ok, [s for s in r.steps if not s.ok]
    assert len(r.steps) == 6 and all(s.sigma[0] == s.sigma[1] for s in r.steps)
    assert all(s.stochastic == (True, True) for s in r.steps)
    assert [s.step for s in r.steps if s.trained == (True, True)] == [0, 1, 2, 3, 4]
    assert not any(s.trained[0] or s.trained[1] for s in r.steps[5:])


@needs_checkout
@pytest.mark.parametrize("override", ["sampling.guidance_scale=3.5", "sampling.plan.eta=0.7"])
def test_a_changed_kontext_plan_is_caught(checkout, override):
    """Negative controls of the editing run: another embedded guidance or noise level on flowgrpo's side is a
    difference the comparison reports (x' from the first step on)."""
    from parity import flow_grpo

    report = flow_grpo.run(checkout, families=("flux_kontext",), extra=(override,))[0]
    assert not report.ok and not report.steps[0].ok


@needs_checkout
def test_grpo_guards_ratio_is_flowgrpos_plus_the_batch_mean_of_its_bias_term(checkout):
    """GRPO-Guard's own code (scripts/train_sd3_GRPO_Guard.py): its regulated log-ratio on a training batch is
    flowgrpo's per-sample mean_D(ε_s·δ) plus (⟨δ²⟩_batch − δ²_i)/(2s): its bias term mean(δ²) is taken with
    mean(dim=()) on a [B] tensor, which torch reduces over the whole batch (reproduce/official/map/flow_grpo.yaml,
    code.guard_bias_reduce). Exactly that, within float32 tolerance; and the term is far above the tolerance once
    the weights moved off the rollout's."""
    from parity import flow_grpo

    result = flow_grpo.guard_ratio(checkout, step=7)
    assert result["max_diff_with_batch_mean_term"] <= result["tolerance"], result
    assert result["max_diff"] > 100 * result["tolerance"], result
