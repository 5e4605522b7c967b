"""Wan2.2 against ``WanPipeline`` at tiny sizes (random weights, no downloads): the A14B layout of two experts
switched at a boundary timestep (``transformer`` for high noise, ``transformer_2`` for low noise, each with its own
CFG scale), and TI2V-5B's per-token timestep.

The adapter routes each row of a velocity call to the expert its σ belongs to, so flowgrpo's own ODE sampler through
it reproduces the pipeline's whole run, across the switch; breaking the routing or the second scale breaks that.
Training either expert or both keeps the learner's ratio == 1 contract, and the saved LoRAs load with the pipeline's
own ``load_lora_weights`` (the second expert with ``load_into_transformer_2``).
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.tiny import TinyWanSizes, build_t5_tokenizer, build_tiny_wan_pipeline
from model_helpers import flowgrpo_ode_latents, latents, load_family, perturb_lora  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["a video of a circle moving left", "a video of a red square moving up"]
SIZES = TinyWanSizes(num_frames=5, image_size=32, vae_base_dim=8, latent_channels=8, text_width=32, num_layers=1,
                     num_heads=2, head_dim=12, ffn_dim=32, freq_dim=32, patch_size=(1, 2, 2))
BOUNDARY = 0.875  # Wan2.2 T2V A14B's boundary_ratio
# WanPipeline's own grid (it passes no sigmas: FlowMatchEulerDiscreteScheduler spaces them from 1 to its sigma_min),
# 4 steps at shift 3: timesteps 1000 (the high-noise expert), 858, 601, 9 (the low-noise one)
STEPS = 4
SCALES = {"guidance_scale": 4.0, "guidance_scale_2": 3.0}  # Wan2.2 A14B's: 4 on high noise, 3 on low


def _saved(tmp_path_factory, name: str, **layout) -> str:
    folder = tmp_path_factory.mktemp(name)
    build_tiny_wan_pipeline(build_t5_tokenizer(PROMPTS, max_length=16), SIZES, seed=0, **layout).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def wan22_folder(tmp_path_factory):  # A14B's layout: two experts switched at the boundary
    return _saved(tmp_path_factory, "tiny_wan22", boundary_ratio=BOUNDARY)


@pytest.fixture(scope="module")
def ti2v_folder(tmp_path_factory):  # TI2V-5B's layout: one network, a timestep per token
    return _saved(tmp_path_factory, "tiny_wan22_ti2v", expand_timesteps=True)


def load(folder, **overrides):
    return load_family("wan", folder, SCALES["guidance_scale"], **{"num_frames": 5, **overrides})


def pipeline_grid(folder):
    """The σ grid WanPipeline runs on, with its final 0 (flowgrpo's sampler is given the same grid)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(folder, subfolder="scheduler")
    scheduler.set_timesteps(STEPS)
    return scheduler.sigmas


def ours(model, x_T):
    return flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS, sigmas=pipeline_grid(model.config.pretrained))


def pipeline_run(folder, x_T, output_type="latent", lora=None, **scales):
    """WanPipeline's own whole run from x_T (its two-expert loop, two CFG passes per step)."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        lora(pipe)
    out = pipe(prompt=PROMPTS[: len(x_T)], height=32, width=32, num_frames=5, num_inference_steps=STEPS,
               latents=x_T.clone(), max_sequence_length=16, output_type=output_type, **scales).frames
    return out


def assert_parity(ours_, theirs):
    """Equal within float32 rounding scaled to the latents' size (the pipeline runs CFG as two calls, we batch)."""
    scale = theirs.abs().max().item()
    assert (ours_ - theirs).abs().max().item() <= 1e-5 * max(scale, 1.0), (ours_ - theirs).abs().max().item()


def test_two_experts_are_found_with_their_boundary(wan22_folder):
    model = load(wan22_folder, **SCALES)
    assert list(model.experts) == ["transformer", "transformer_2"] and model.boundary == 875.0
    assert model.trained_experts == ["transformer", "transformer_2"]
    assert len(model.networks()) == 2
    sigma = torch.tensor([1.0, 0.875, 0.87, 0.3])
    routes = model._routes(sigma)
    assert [(rows.tolist(), name) for rows, name in routes] == [([0, 1], "transformer"), ([2, 3], "transformer_2")]


def test_ode_sampling_equals_the_pipeline_across_the_expert_switch(wan22_folder):
    model = load(wan22_folder, **SCALES)
    x_T = latents(model, 2, seed=5)
    sampled = ours(model, x_T)
    theirs = pipeline_run(wan22_folder, x_T, **SCALES)
    assert pipeline_grid(wan22_folder)[1] * 1000 < model.boundary  # one high-noise step, then three low-noise ones
    assert_parity(sampled, theirs)
    videos = pipeline_run(wan22_folder, x_T, output_type="pt", **SCALES)
    torch.testing.assert_close(model.decode(sampled), videos, rtol=0, atol=1e-4)

    # negative controls: one expert for every step, or the high-noise scale on the low-noise steps, is far off
    one_expert = load(wan22_folder, **SCALES)
    one_expert.boundary = 0.0
    assert (ours(one_expert, x_T) - theirs).abs().max() > 1e-2
    one_scale = load(wan22_folder, guidance_scale=4.0)
    assert (ours(one_scale, x_T) - theirs).abs().max() > 1e-2


def test_a_mixed_batch_routes_each_row_to_its_expert(wan22_folder):
    """Forward-process learners draw a time per row: one call with rows on both sides of the boundary equals
    each row alone, in order, and its gradient reaches both experts' LoRAs."""
    model = load(wan22_folder, **SCALES)
    perturb_lora(model)
    cond = model.encode_prompts(PROMPTS).select(torch.tensor([0, 1, 0]))
    x = latents(model, 3, seed=2)
    sigma = torch.tensor([0.3, 0.95, 0.9])
    v = model.velocity(x, sigma, cond)
    for i in range(3):
        alone = model.velocity(x[i : i + 1], sigma[i : i + 1], cond.select(torch.tensor([i])))
        assert_close_ulps(v[i : i + 1], alone, ulps=64)  # a batch of 3 vs 1: matmuls of other shapes
    v.square().mean().backward()
    for name in ("transformer", "transformer_2"):
        grads = [p.grad for n, p in model.experts[name].named_parameters() if "lora_" in n]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), name


@pytest.mark.parametrize("trained", [None, ["transformer_2"]], ids=["both", "low_noise_only"])
def test_saved_loras_load_into_the_pipeline(wan22_folder, tmp_path, trained):
    model = load(wan22_folder, trained_experts=trained, **SCALES)
    if trained:
        assert not any("lora_" in n for n, _ in model.experts["transformer"].named_parameters())
        assert model.transformer is model.experts["transformer_2"]
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    x_T = latents(model, 2, seed=6)
    sampled = ours(model, x_T)

    def load_loras(pipe):
        if trained is None:
            pipe.load_lora_weights(str(tmp_path / "lora"))
        pipe.load_lora_weights(str(tmp_path / "lora"), weight_name="pytorch_lora_weights_transformer_2.safetensors",
                               load_into_transformer_2=True)

    theirs = pipeline_run(wan22_folder, x_T, lora=load_loras, **SCALES)
    assert_parity(sampled, theirs)
    assert (theirs - pipeline_run(wan22_folder, x_T, **SCALES)).abs().max() > 1e-3  # the LoRAs changed it

    fresh = load(wan22_folder, trained_experts=trained, **SCALES)
    fresh.load_trainable(tmp_path / "lora")
    assert all(torch.equal(a, b) for a, b in zip(model.trainable_parameters(), fresh.trainable_parameters()))
    with model.reference():  # the reference is the base pipeline: both experts without their LoRA
        reference = ours(model, x_T)
    assert_parity(reference, pipeline_run(wan22_folder, x_T, **SCALES))


def test_full_fine_tuning_of_both_experts_round_trips(wan22_folder, tmp_path):
    model = load(wan22_folder, finetune="full", **SCALES)
    # two experts, and the frozen reference: a WeightCopy of both experts' weights, the base model inside reference()
    assert len(model.networks()) == 2 and len(model.reference_copy.values) == len(model.trainable_parameters())
    cond = model.encode_prompts(PROMPTS).select(torch.tensor([0, 1]))
    x, sigma = latents(model, 2, seed=2), torch.tensor([0.3, 0.95])  # a row on each expert
    base = model.velocity(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters()[::7]:
            p.add_(0.01)
    assert (model.velocity(x, sigma, cond) - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.velocity(x, sigma, cond), base)
    model.save_trainable(tmp_path / "full")
    assert (tmp_path / "full" / "transformer_2" / "config.json").is_file()
    fresh = load(wan22_folder, finetune="full", **SCALES)
    fresh.load_trainable(tmp_path / "full")
    assert all(torch.equal(a, b) for a, b in zip(model.trainable_parameters(), fresh.trainable_parameters()))


def test_ti2v_per_token_timestep_equals_the_pipeline(ti2v_folder):
    """TI2V-5B's layout: one network, the timestep given per latent token (``expand_timesteps``)."""
    model = load(ti2v_folder, guidance_scale=5.0)
    assert model.boundary is None and list(model.experts) == ["transformer"]
    x_T = latents(model, 2, seed=7)
    theirs = pipeline_run(ti2v_folder, x_T, guidance_scale=5.0)
    assert_parity(ours(model, x_T), theirs)
