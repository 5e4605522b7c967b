"""The engine's contract (docs/design.md): the policy owns the weights and every copy of them, follows and
checkpoints the copies through one mechanism, and is the whole surface a learner sees; a method has one
name; the start-up lines say what the chosen learner trains."""

import pytest
import torch
import yaml

from flowgrpo.models.copies import WeightCopy, refresh_every, soft_keep, warmed_decay
from flowgrpo.engine.policy import REFERENCE, Policy

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _policy(**kwargs):
    from accelerate import Accelerator

    from flowgrpo.models import load_model

    torch.manual_seed(0)
    model = load_model({"family": "analytic", "pretrained": "analytic", "dim": 2, "device": "cpu",
                        "finetune": "full", "reference": "auto"})
    return Policy(model, Accelerator(cpu=True), **{"learning_rate": 1e-2, "weight_decay": 0.0,
                                                    "adam_betas": (0.9, 0.999), "grad_clip": 1.0, **kwargs})


def _inputs(policy, n=6):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, *policy.latent_shape, generator=gen)
    sigma = torch.full((n,), 0.6)
    cond = policy.model.encode_prompts(["mode 0", "the left half"] * (n // 2))
    return x, sigma, cond


def _train_step(policy, target=1.0):
    x, sigma, cond = _inputs(policy)
    policy.zero_grad()
    v = policy.velocity(x, sigma, cond, 1.0)
    policy.backward((v - target).square().mean(), prompts=2)
    return policy.step(prompts=2)


def test_copies_follow_their_rule_after_steps_and_iterations():
    policy = _policy()
    start = [p.detach().clone() for p in policy.params]
    ema = policy.copy("ema", 0.5)  # every step: copy ← 0.5·copy + 0.5·θ
    old = policy.copy("old", soft_keep(0.1, 0.5), follows="iteration")
    anchor = policy.copy("anchor", refresh_every(2))
    snapshot = policy.copy("snapshot", follows="never", saved=False)
    norm, _ = _train_step(policy)
    assert norm > 0 and policy.optimizer_steps == 1
    theta1 = [p.detach().clone() for p in policy.params]
    assert any(not torch.equal(a, b) for a, b in zip(start, theta1))
    for value, s, t in zip(ema.values, start, theta1):
        torch.testing.assert_close(value, 0.5 * s + 0.5 * t, rtol=0, atol=1e-7 * float(t.abs().max() + 1))
    assert all(torch.equal(v, s) for v, s in zip(old.values, start))  # waits for the iteration's end
    assert all(torch.equal(v, s) for v, s in zip(anchor.values, start))  # step 1 of 2: kept
    policy.end_iteration()  # λ = min(0.1·1, 0.5) = 0.1
    for value, s, t in zip(old.values, start, theta1):
        torch.testing.assert_close(value, 0.1 * s + 0.9 * t, rtol=0, atol=1e-7 * float(t.abs().max() + 1))
    _train_step(policy)
    assert all(torch.equal(v, p) for v, p in zip(anchor.values, policy.params))  # step 2: refreshed exactly
    assert all(torch.equal(v, s) for v, s in zip(snapshot.values, start))  # never follows by itself
    snapshot.assign(policy.params)
    assert all(torch.equal(v, p) for v, p in zip(snapshot.values, policy.params))


def test_a_step_without_gradient_is_skipped_and_moves_no_copy():
    policy = _policy()
    ema = policy.copy("ema", 0.5)
    before = [v.clone() for v in ema.values]
    x, sigma, cond = _inputs(policy)
    policy.zero_grad()
    policy.backward(0.0 * policy.velocity(x, sigma, cond, 1.0).sum())
    norm, _ = policy.step()
    assert norm == 0.0 and policy.skipped_steps == 1 and policy.optimizer_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, ema.values)) and not policy.optimizer.state


def test_velocity_with_a_copy_or_the_reference_is_gradient_free_and_every_call_is_counted():
    policy = _policy()
    frozen = policy.copy("frozen", follows="never")
    _train_step(policy, target=3.0)
    x, sigma, cond = _inputs(policy)
    trained = [p.detach().clone() for p in policy.params]
    held = [v.clone() for v in frozen.values]
    with policy.using(frozen):  # the copy's values in the parameters (exchanged in place), restored after
        assert all(torch.equal(p, v) for p, v in zip(policy.params, held))
        expected = policy.model.velocity(x, sigma, cond, 1.0).detach()
    assert all(torch.equal(p, t) for p, t in zip(policy.params, trained))
    assert all(torch.equal(v, h) for v, h in zip(frozen.values, held))
    counted = policy.nfe.as_dict()
    v_copy = policy.velocity(x, sigma, cond, 1.0, weights=frozen)
    v_ref = policy.velocity(x, sigma, cond, 1.0, weights=REFERENCE)
    assert not v_copy.requires_grad and not v_ref.requires_grad and torch.equal(v_copy, expected)
    with policy.model.reference():
        assert torch.equal(v_ref, policy.model.velocity(x, sigma, cond, 1.0))
    # full fine-tuning's reference is the base weights, a WeightCopy the policy never follows nor saves
    assert policy.model.reference_mode == "frozen_copy" and torch.equal(v_ref, expected)
    assert all(torch.equal(p, t) for p, t in zip(policy.params, trained))
    assert "reference" not in policy.copies and not any(k.startswith("reference.") for k in policy.state_tensors())
    assert policy.velocity(x, sigma, cond, 1.0).requires_grad
    now = policy.nfe.as_dict()
    assert now["train_forward"] - counted["train_forward"] == 3 * x.shape[0]
    assert now["train_backward"] - counted["train_backward"] == x.shape[0]


def test_the_policy_checkpoints_every_saved_copy_and_restores_them_exactly():
    policy = _policy()
    policy.copy("ema", 0.5)
    policy.copy("anchor", refresh_every(3))
    policy.copy("awm_old", follows="never", saved=False)
    for _ in range(2):
        _train_step(policy)
        policy.end_iteration()
    tensors, state = policy.state_tensors(), policy.state_dict()
    prefixes = {k.split(".")[0] for k in tensors}
    assert prefixes == {"weights", "optim", "ema", "anchor"}  # awm_old is rebuilt every iteration, never saved
    fresh = _policy()
    fresh.copy("ema", 0.5)
    fresh.copy("anchor", refresh_every(3))
    fresh.load_state({k: v.clone() for k, v in tensors.items()}, state)
    again = fresh.state_tensors()
    assert again.keys() == tensors.keys() and all(torch.equal(again[k], tensors[k]) for k in tensors)
    assert fresh.optimizer_steps == policy.optimizer_steps == 2
    with pytest.raises(ValueError, match="exists already"):
        fresh.copy("ema", 0.5)


def test_one_copy_mechanism_serves_pretraining_state_dicts_with_integer_buffers():
    module = torch.nn.BatchNorm1d(3)  # float weights and an integer batch counter
    sources = lambda: list(module.state_dict().values())  # noqa: E731
    ema = WeightCopy("ema", sources(), keep=0.75)
    with torch.no_grad():
        module.weight.fill_(2.0)
        module.num_batches_tracked.fill_(7)
    ema.follow(sources(), 0)
    state = dict(zip(module.state_dict(), ema.values))
    assert torch.equal(state["weight"], torch.full((3,), 1.25)) and int(state["num_batches_tracked"]) == 7
    with ema.swapped_into(sources()):
        assert torch.equal(module.weight, torch.full((3,), 1.25))
    assert torch.equal(module.weight, torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="follows"):
        WeightCopy("x", sources(), follows="epoch")


def test_every_learner_name_the_config_allows_builds_a_learner():
    import importlib

    from flowgrpo.engine.learners import LEARNERS, Learner

    for name, path in LEARNERS.items():
        module, cls = path.split(":")
        assert issubclass(getattr(importlib.import_module(module), cls), Learner), name


def test_a_method_is_its_preset_file():
    """A preset file writes its whole rollout plan: compose_plan's arguments under sampling.plan and, where the SDE
    window moves, WindowSchedule's under sampling.window; no key names a method elsewhere, and every plan builds.
    GRPO-Guard rolls out with Flow-GRPO's plan, AWM with DiffusionNFT's (DPM-Solver++(2M) ODE)."""
    import samplers
    from flowgrpo.config import preset_names, preset_plan
    from flowgrpo.run.paths import configs_dir

    presets = {p.stem: yaml.safe_load(p.read_text()) for p in (configs_dir() / "presets").glob("*.yaml")}
    assert sorted(presets) == preset_names() and {"flow_grpo", "diffusion_nft", "crd"} <= set(presets)
    windowed = set()
    for name, preset in presets.items():
        assert "method" not in preset["sampling"], f"{name}.yaml still names a method (sampling.method)"
        plan, window = preset_plan(name)
        assert plan == preset["sampling"]["plan"] and {"num_steps", "kernel", "group_size"} <= set(plan), name
        if window is not None:
            windowed.add(name)
        assert samplers.build_schedule(plan, window, name=name).plan(0).name == name
    assert windowed == {"flow_grpo_fast", "mixgrpo", "mixgrpo_flash", "mixgrpo_flash_star", "branchgrpo_mix", "flow_dppo",
                        "treegrpo"}
    assert preset_plan("grpo_guard") == preset_plan("flow_grpo") and preset_plan("awm") == preset_plan("diffusion_nft")
    assert preset_plan("diffusion_nft")[0] == dict(num_steps=10, kernel="ode", solver="dpmpp_2m", group_size=24,
                                                   initial_noise="independent")


@pytest.mark.parametrize("preset, says, never", [("diffusion_nft", "training draws (t, ε) per sample: 9", "transitions"),
                                                 ("flow_grpo", "trained transitions per prompt: ", "draws")])
def test_start_up_lines_say_what_the_learner_trains(preset, says, never, tmp_path):
    from flowgrpo.config import load_config
    from flowgrpo.engine.rollout import describe_batches
    from flowgrpo.engine.trainer import Trainer
    from flowgrpo.run.paths import configs_dir

    cfg = load_config(preset, None, [f"output_dir={tmp_path}"], base=str(configs_dir() / "analytic.yaml"))
    trainer = Trainer(cfg)
    counts = trainer.schedule.plan(0).counts()
    text = describe_batches(cfg, 1, counts["leaves"], trainer.learner.describe(counts["leaves"], counts["trained"]))
    trainer.scoring.close()
    assert says in text and never not in text, text


def test_the_evaluation_ema_warms_up_as_the_official_repositories_do(tmp_path):
    """λ(n) = min(decay, (1 + n)/(10 + n)) after n optimizer steps: the trainer's EMA follows θ closely at first."""
    keep = warmed_decay(0.9)
    assert [keep(n) for n in (0, 1, 8, 80, 10_000)] == [0.1, 2 / 11, 0.5, 0.9, 0.9]
    policy = _policy()
    start = [p.detach().clone() for p in policy.params]
    ema = policy.copy("ema", keep)
    _train_step(policy)
    theta1 = [p.detach().clone() for p in policy.params]
    for value, s, t in zip(ema.values, start, theta1):  # after step 1: λ = 2/11
        torch.testing.assert_close(value, (2 / 11) * s + (9 / 11) * t, rtol=0, atol=1e-7 * float(t.abs().max() + 1))
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from flowgrpo.run.paths import configs_dir

    cfg = load_config(None, None, [f"output_dir={tmp_path}", "train.ema_decay=0.99", "log.progress=false"],
                      base=str(configs_dir() / "analytic.yaml"))
    trainer_keep = Trainer(cfg).ema.keep
    assert [trainer_keep(n) for n in (1, 8, 10_000)] == [2 / 11, 0.5, 0.99]
