"""The FLUX adapter against the real diffusers classes at tiny sizes (random weights, no downloads).

Two tiny FLUX models: one guidance-distilled like FLUX.1-dev (embedded guidance) and one without
guidance embeddings (true CFG, batched). Both use FLUX.1-dev's scheduler config (resolution-
dependent time shift), and one Euler step of the adapter is checked against ``FluxPipeline``.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER
from model_helpers import latents, load_family, perturb_lora  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow star"]


def _save_flux(folder, guidance_embeds: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0, image_size=32)
    components = dict(pipe.components, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))
    if not guidance_embeds:
        torch.manual_seed(1)
        components["transformer"] = FluxTransformer2DModel.from_config(pipe.transformer.config, guidance_embeds=False)
    FluxPipeline(**components).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    return _save_flux(tmp_path_factory.mktemp("tiny_flux_dev"), guidance_embeds=True)


@pytest.fixture(scope="module")
def flux_cfg_folder(tmp_path_factory):
    return _save_flux(tmp_path_factory.mktemp("tiny_flux_cfg"), guidance_embeds=False)


def load(folder, **overrides):
    return load_family("flux", folder, 3.5, **overrides)


def pipeline_first_step(folder, x0, guidance_scale, **call_kwargs):
    """FluxPipeline's own first denoising step from the UNPACKED latents x0, and its sigmas."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    n, c, h, w = x0.shape
    recorded = {}

    def record(pipe_, step, t, kwargs):
        recorded.setdefault(step, kwargs["latents"].clone())
        return {}

    pipe(
        prompt=PROMPTS[:n],
        height=32,
        width=32,
        num_inference_steps=2,
        sigmas=[0.8, 0.5],
        guidance_scale=guidance_scale,
        latents=FluxPipeline._pack_latents(x0.clone(), n, c, h, w),
        max_sequence_length=16,
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["latents"],
        **call_kwargs,
    )
    x1 = FluxPipeline._unpack_latents(recorded[0], 32, 32, pipe.vae_scale_factor)
    return x1, pipe.scheduler.sigmas[0], pipe.scheduler.sigmas[1]


def test_shapes_pack_and_decode(flux_folder):
    model = load(flux_folder)
    assert model.guidance_embeds
    assert model.latent_shape() == (4, 16, 16)  # UNPACKED: 4 VAE channels, 32 px / 2
    with pytest.raises(ValueError, match="multiples of 4"):
        model.latent_shape(30, 32)
    cond = model.encode_prompts(PROMPTS)
    assert tuple(cond.prompt_embeds.shape) == (3, 16, 32)  # T5 tokens
    assert tuple(cond.pooled_prompt_embeds.shape) == (3, 32)  # CLIP pooled
    assert tuple(cond.text_ids.shape) == (16, 3)
    assert cond.negative_prompt_embeds is None  # FLUX.1-dev style: no CFG, no unconditional row

    x = latents(model, 2)
    index = torch.tensor([1, 2])
    v = model.velocity(x, torch.tensor([0.9, 0.3]), cond.select(index))
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    torch.testing.assert_close(model.velocity_fn(cond)(x, torch.tensor([0.9, 0.3]), index), v, rtol=0, atol=0)
    # the embedded guidance value reaches the transformer
    assert (model.velocity(x, torch.tensor([0.9, 0.3]), cond.select(index), guidance_scale=1.0) - v).abs().max() > 1e-4
    with pytest.raises(ValueError, match="multiples of 2"):
        model.velocity(torch.randn(2, 4, 15, 16), 0.5, cond.select(index))

    images = model.decode(x)
    assert images.shape == (2, 3, 32, 32) and images.min() >= 0 and images.max() <= 1 and images.std() > 0
    assert model.encode_images(images).shape == x.shape


def test_euler_step_matches_the_pipeline_with_embedded_guidance(flux_folder):
    model = load(flux_folder)
    x0 = latents(model, 2, seed=3)
    expected, sigma, sigma_next = pipeline_first_step(flux_folder, x0, guidance_scale=3.5)
    # dynamic shifting: 64 image tokens -> mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (64 - 256)
    mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (64 - 256)
    assert model.shift == pytest.approx(torch.tensor(mu).exp().item(), rel=1e-6)
    s = model.shift
    torch.testing.assert_close(
        torch.stack([sigma, sigma_next]),
        torch.tensor([s * 0.8 / (1 + (s - 1) * 0.8), s * 0.5 / (1 + (s - 1) * 0.5)]),
    )
    cond = model.encode_prompts(PROMPTS[:2])
    x1 = x0 + (sigma_next - sigma) * model.velocity(x0, sigma.expand(2), cond)
    torch.testing.assert_close(x1, expected, rtol=0, atol=1e-5)
    assert (x1 - x0).abs().max() > 1e-2

    perturb_lora(model)
    assert (x0 + (sigma_next - sigma) * model.velocity(x0, sigma.expand(2), cond) - expected).abs().max() > 1e-3
    with model.reference():
        x1_ref = x0 + (sigma_next - sigma) * model.velocity(x0, sigma.expand(2), cond)
    torch.testing.assert_close(x1_ref, expected, rtol=0, atol=1e-5)


def test_true_cfg_without_guidance_embeds(flux_cfg_folder):
    model = load(flux_cfg_folder, guidance_scale=4.0)
    assert not model.guidance_embeds
    cond = model.encode_prompts(PROMPTS[:2])
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 16, 32)
    x0 = latents(model, 2, seed=4)
    sigma = torch.tensor([0.8, 0.6])
    v_cfg = model.velocity(x0, sigma, cond)
    v_cond = model.velocity(x0, sigma, cond, guidance_scale=1.0)
    v_uncond = model.velocity(x0, sigma, cond.unconditional(), guidance_scale=1.0)
    # each pass rounds by a few ulps; the combination multiplies that by up to 1 + 2·scale
    assert_close_ulps(v_cfg, v_uncond + 4.0 * (v_cond - v_uncond), ulps=4 * (1 + 2 * 4.0))
    assert (v_cfg - v_cond).abs().max() > 1e-3

    # the pipeline's true CFG (two separate calls) against the adapter's one batched call
    expected, s0, s1 = pipeline_first_step(
        flux_cfg_folder, x0, guidance_scale=3.5, true_cfg_scale=4.0, negative_prompt=["", ""]
    )
    x1 = x0 + (s1 - s0) * model.velocity(x0, s0.expand(2), cond)
    torch.testing.assert_close(x1, expected, rtol=0, atol=1e-5)


def test_lora_targets_reference_and_round_trip(flux_folder, tmp_path):
    model = load(flux_folder)
    trainable = {id(p) for p in model.trainable_parameters()}
    names = [n for n, p in model.transformer.named_parameters() if id(p) in trainable]
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    # 1 joint block x 8 projections + 1 single block x 3 (to_q, to_k, to_v), each lora_A and lora_B
    assert len(names) == 2 * (8 + 3)
    assert any(n.startswith("single_transformer_blocks.0.attn.to_q") for n in names)

    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v_base = model.velocity(x, 0.6, cond)
    perturb_lora(model)
    v_lora = model.velocity(x, 0.6, cond)
    assert (v_lora - v_base).abs().max() > 1e-3
    with model.reference():
        torch.testing.assert_close(model.velocity(x, 0.6, cond), v_base, rtol=0, atol=0)

    model.save_trainable(tmp_path / "lora")
    fresh = load(flux_folder)
    fresh.load_trainable(tmp_path / "lora")
    torch.testing.assert_close(fresh.velocity(x, 0.6, cond), v_lora, rtol=0, atol=0)


def test_full_finetune_trains_every_transformer_weight(flux_folder):
    model = load(flux_folder, finetune="full")
    assert len(model.trainable_parameters()) == len(list(model.transformer.parameters()))
    assert model.reference_mode == "frozen_copy"
    # the frozen reference: a WeightCopy of every trained weight, never trained itself
    assert len(model.reference_copy.values) == len(model.trainable_parameters())
    assert not any(v.requires_grad for v in model.reference_copy.values)
