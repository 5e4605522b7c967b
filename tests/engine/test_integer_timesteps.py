"""sampling.integer_timesteps: the rollout's network calls and the transition learner's recompute are told ⌊1000σ⌋
(as DiffusionNFT's and DGPO's SD3 rollouts and the FLUX codes of DanceGRPO, MixGRPO and BranchGRPO tell theirs),
while the kernels step the exact σ; the ratio == 1 contract holds with it."""

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.models import load_model
from train_fixtures import PLUGIN_REWARD, overrides, train_and_check


def _timesteps(transformer, seen: list):
    def hook(module, args, kwargs):
        seen.append(kwargs["timestep"].detach().double().clone())

    return transformer.register_forward_pre_hook(hook, with_kwargs=True)


def test_the_network_is_told_the_floor_of_the_timestep_inside_the_context(tiny_sd3_dir):
    model = load_model(dict(family="sd3", pretrained=tiny_sd3_dir, resolution=32, device="cpu", max_sequence_length=16,
                            guidance_scale=1.0, lora_rank=4, lora_alpha=4.0))
    cond = model.encode_prompts(["a red circle", "a blue square"])
    x = torch.randn(2, *model.latent_shape(), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.46699, 0.25], dtype=torch.float32)
    seen: list = []
    handle = _timesteps(model.transformer, seen)
    try:
        exact = model.velocity(x, sigma, cond)
        with model.integer_timesteps():
            floored = model.velocity(x, sigma, cond)
        again = model.velocity(x, sigma, cond)
    finally:
        handle.remove()
    assert seen[0].tolist() == pytest.approx((sigma.double() * 1000).tolist(), rel=1e-6)
    assert seen[1].tolist() == [466.0, 250.0] and torch.equal(seen[2], seen[0])  # the context restores σ·1000
    assert not torch.equal(exact, floored) and torch.equal(exact, again)


def test_a_run_with_integer_timesteps_keeps_the_ratio_contract(tiny_sd3_dir, tmp_path):
    """Rollout and recompute both floor: ρ = 1 exactly at inner epoch 0 (train_and_check), and every timestep the
    network was told in the run is an integer."""
    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "sampling.integer_timesteps": True,
        "loss.kl_coef": 0.05, "log.samples_every": 0, "log.save_every": 0}), base=PLUGIN_REWARD)
    seen: list = []
    from flowgrpo.engine import trainer as trainer_module

    original = trainer_module.Trainer.__init__

    def hooked(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _timesteps(self.model.transformer, seen)

    trainer_module.Trainer.__init__ = hooked
    try:
        train_and_check(cfg)
    finally:
        trainer_module.Trainer.__init__ = original
    told = torch.cat(seen)
    assert told.numel() > 0 and torch.equal(told, told.floor())


def test_integer_training_times_train_at_the_schedulers_integer_timesteps(tiny_sd3_dir, tmp_path):
    """learner.integer_times (DGPO's code: σ = t/1000 of its scheduler's int64 timesteps, the network told t): every
    training draw is ⌊1000σ⌋/1000 of a grid point and every training call is told that integer exactly (the nearest
    integer to 1000·t: float32 1000·(k/1000) is k ± an ulp, 251 of them below); the rollout keeps σ·1000."""
    import samplers
    from flowgrpo.engine.trainer import Trainer

    cfg = load_config("dgpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 7, "learner.integer_times": True,
        "learner.time_min": 0.0, "learner.train_times": 3, "train.iterations": 1, "log.samples_every": 0,
        "log.save_every": 0}), base=PLUGIN_REWARD)
    trainer = Trainer(cfg)
    seen: list = []
    _timesteps(trainer.model.transformer, seen)
    trainer.train()
    grid = samplers.time_grid(7, trainer.model.shift_for(7)).float()[:-1]
    told = torch.cat(seen)
    rollout = (grid * 1000).double()
    assert not torch.equal(rollout, rollout.floor())  # a grid whose σ·1000 are not integers
    evaluation = (samplers.time_grid(2, trainer.model.shift_for(2)).float()[:-1] * 1000).double()  # eval.steps=2
    training = told[~torch.isin(told, torch.cat([rollout, evaluation]))]  # rollout and evaluation: σ·1000
    assert training.numel() > 0 and set(training.tolist()) <= set(torch.floor(grid * 1000).double().tolist())
    k = torch.arange(1001, dtype=torch.float32)
    assert int((torch.floor(k / 1000 * 1000) != k).sum()) > 0 and torch.equal(torch.round(k / 1000 * 1000), k)
