"""The FLUX.2 adapters (dev: ``Flux2Pipeline``; klein: ``Flux2KleinPipeline``) against the real diffusers classes at
tiny sizes (random weights, no downloads): flowgrpo's own Euler ODE through the adapter equals each pipeline's full
call from the same noise (klein with CFG on and off, step-distilled klein, dev's embedded guidance), decoding equals
the pipelines' images, a deliberately broken convention fails, LoRA loads into the pipelines, and the trainer runs."""

from __future__ import annotations

import math

import pytest
import torch

from model_helpers import flowgrpo_ode_latents, latents, load_family, perturb_lora
from tolerance import assert_close_ulps

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow star"]
STEPS = 4
DEV_TEXT = 48  # FLUX.2-dev's system message alone is ~30 tokens: 48 leaves the prompts visible


def _corpus():
    from worlds.toy import scenes

    return PROMPTS + [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]


@pytest.fixture(scope="module")
def klein_folder(tmp_path_factory):
    from flowgrpo.tiny.flux2 import save_tiny_flux2_klein

    return save_tiny_flux2_klein(tmp_path_factory.mktemp("tiny_flux2_klein"), _corpus())


@pytest.fixture(scope="module")
def klein_distilled_folder(tmp_path_factory):
    from flowgrpo.tiny.flux2 import save_tiny_flux2_klein

    return save_tiny_flux2_klein(tmp_path_factory.mktemp("tiny_flux2_klein_distilled"), _corpus(), is_distilled=True)


@pytest.fixture(scope="module")
def dev_folder(tmp_path_factory):
    from flowgrpo.tiny.flux2 import save_tiny_flux2

    return save_tiny_flux2(tmp_path_factory.mktemp("tiny_flux2_dev"), _corpus())


def load_klein(folder, guidance_scale=4.0, **overrides):
    return load_family("flux2_klein", folder, guidance_scale, sample_steps=STEPS, **overrides)


def load_dev(folder, guidance_scale=4.0, **overrides):
    overrides.setdefault("max_sequence_length", DEV_TEXT)
    return load_family("flux2", folder, guidance_scale, sample_steps=STEPS, **overrides)


def _bn_normalise(pipe, raw):
    """The pipelines' latent normalisation of raw VAE latents [N, C, 2h, 2w] -> the flow's [N, 4C, h, w]."""
    patched = pipe._patchify_latents(raw)
    mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
    return (patched - mean) / std


def pipeline_latents(pipe, x_T, guidance_scale, max_sequence_length=16, **kwargs):
    """The pipeline's own full call from the noise x_T [N, C, h, w] -> x_0 in the adapter's (flow) space."""
    n = x_T.shape[0]
    out = pipe(prompt=PROMPTS[:n], height=32, width=32, num_inference_steps=STEPS, guidance_scale=guidance_scale,
               latents=x_T.clone(), max_sequence_length=max_sequence_length, output_type="latent", **kwargs).images
    if out.ndim == 3:  # Flux2Pipeline returns the packed tokens [N, h*w, C]
        return pipe._unpack_latents_with_ids(out, pipe._prepare_latent_ids(x_T))
    return _bn_normalise(pipe, out)  # Flux2KleinPipeline: de-normalised, unpatchified VAE latents


def pipeline_images(pipe, x_T, guidance_scale, max_sequence_length=16):
    n = x_T.shape[0]
    return pipe(prompt=PROMPTS[:n], height=32, width=32, num_inference_steps=STEPS, guidance_scale=guidance_scale,
                latents=x_T.clone(), max_sequence_length=max_sequence_length, output_type="pt").images


def _pipe(cls, folder):
    pipe = cls.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _far(a, b) -> float:
    """max |a - b| relative to the magnitude of b."""
    return float((a - b).abs().max() / b.abs().max())


# ----------------------------------------------------------------------------- klein


def test_klein_shapes_shift_and_encoding(klein_folder):
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    model = load_klein(klein_folder)
    assert not model.is_distilled and model._cfg_possible()
    assert model.latent_shape() == (16, 4, 4)  # 4 VAE channels x 2x2 patchify, 32 px / 8
    with pytest.raises(ValueError, match="multiples of 8"):
        model.latent_shape(36, 32)
    # FLUX.2's mu depends on the image tokens AND the step count
    assert model.shift == pytest.approx(math.exp(compute_empirical_mu(16, STEPS)), rel=1e-12)
    assert model.shift_for(50) == pytest.approx(math.exp(compute_empirical_mu(16, 50)), rel=1e-12)
    assert model.shift_for(50) != pytest.approx(model.shift)
    assert model.shift_for(model.config.sample_steps) == model.shift
    cond = model.encode_prompts(PROMPTS)
    assert tuple(cond.prompt_embeds.shape) == (3, 16, 96)  # 3 stacked Qwen3 layers of width 32
    assert tuple(cond.text_ids.shape) == (16, 4)  # 4-D ids (T, H, W, L)
    assert torch.equal(cond.text_ids[:, 3], torch.arange(16))
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 16, 96)  # the empty prompt, the pipeline's negative
    images = model.decode(latents(model, 2))
    assert images.shape == (2, 3, 32, 32) and 0 <= images.min() and images.max() <= 1
    assert model.encode_images(images).shape == (2, *model.latent_shape())


@pytest.mark.parametrize("guidance_scale", [4.0, 1.0], ids=["cfg", "no_cfg"])
def test_klein_ode_equals_the_pipeline(klein_folder, guidance_scale):
    from diffusers import Flux2KleinPipeline

    model = load_klein(klein_folder, guidance_scale)
    assert model._uses_cfg(guidance_scale) == (guidance_scale > 1)
    x_T = latents(model, 2, seed=3)
    ours = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    pipe = _pipe(Flux2KleinPipeline, klein_folder)
    expected = pipeline_latents(pipe, x_T, guidance_scale)
    assert_close_ulps(ours, expected, ulps=64)  # 4 steps of two float32 computations (CFG: batched vs two calls): seen ~6 ulps
    assert _far(ours, x_T) > 0.1
    if guidance_scale > 1:  # decoding equals the pipeline's images (one check is enough: it does not depend on g)
        assert_close_ulps(model.decode(ours), pipeline_images(pipe, x_T, guidance_scale), ulps=128)


def test_klein_distilled_ignores_guidance(klein_distilled_folder):
    from diffusers import Flux2KleinPipeline

    model = load_klein(klein_distilled_folder, 4.0)
    assert model.is_distilled and not model._uses_cfg(4.0)
    assert model.encode_prompts(PROMPTS[:2]).negative_prompt_embeds is None  # no unconditional row
    x_T = latents(model, 2, seed=5)
    ours = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    expected = pipeline_latents(_pipe(Flux2KleinPipeline, klein_distilled_folder), x_T, 4.0)
    assert_close_ulps(ours, expected, ulps=64)


def test_klein_broken_timestep_scale_fails_the_comparison(klein_folder, monkeypatch):
    """Negative control: the same comparison with the timestep scale broken (the transformer given sigma / 1000
    instead of the pipeline's t / 1000 = sigma) is far outside the tolerance."""
    from diffusers import Flux2KleinPipeline

    model = load_klein(klein_folder, 4.0)
    x_T = latents(model, 2, seed=3)
    expected = pipeline_latents(_pipe(Flux2KleinPipeline, klein_folder), x_T, 4.0)
    monkeypatch.setattr(model, "_num_train_timesteps", 1)  # t = sigma, passed as sigma / 1000
    broken = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    assert _far(broken, expected) > 1e-2


def test_klein_lora_loads_into_the_pipeline(klein_folder, tmp_path):
    from diffusers import Flux2KleinPipeline

    model = load_klein(klein_folder, 4.0)
    names = [n for n, p in model.transformer.named_parameters() if p.requires_grad]
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    # 1 double block x 8 projections + 1 single block x 2 (to_qkv_mlp_proj, to_out), each lora_A and lora_B
    assert len(names) == 2 * (8 + 2)
    assert any(n.startswith("single_transformer_blocks.0.attn.to_out.") for n in names)
    x_T = latents(model, 2, seed=3)
    base = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    perturb_lora(model)
    ours = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    assert _far(ours, base) > 1e-2
    model.save_trainable(tmp_path / "lora")

    pipe = _pipe(Flux2KleinPipeline, klein_folder)
    pipe.load_lora_weights(tmp_path / "lora")
    assert_close_ulps(pipeline_latents(pipe, x_T, 4.0), ours, ulps=64)

    fresh = load_klein(klein_folder, 4.0)
    fresh.load_trainable(tmp_path / "lora")
    cond = model.encode_prompts(PROMPTS[:2])
    torch.testing.assert_close(fresh.velocity(x_T, 0.6, cond), model.velocity(x_T, 0.6, cond), rtol=0, atol=0)


# ----------------------------------------------------------------------------- dev


def test_dev_ode_and_decoding_equal_the_pipeline(dev_folder):
    from diffusers import Flux2Pipeline

    model = load_dev(dev_folder, 4.0)
    assert not model._cfg_possible()
    cond = model.encode_prompts(PROMPTS[:2])
    assert cond.negative_prompt_embeds is None and tuple(cond.prompt_embeds.shape) == (2, DEV_TEXT, 96)
    assert (cond.prompt_embeds[0] - cond.prompt_embeds[1]).abs().max() > 1e-3  # the prompts are inside the window
    x_T = latents(model, 2, seed=7)
    ours = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    pipe = _pipe(Flux2Pipeline, dev_folder)
    expected = pipeline_latents(pipe, x_T, 4.0, max_sequence_length=DEV_TEXT)
    assert_close_ulps(ours, expected, ulps=64)
    assert_close_ulps(model.decode(ours), pipeline_images(pipe, x_T, 4.0, max_sequence_length=DEV_TEXT), ulps=128)
    # the embedded guidance value reaches the transformer
    other = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS, guidance_scale=1.5)
    assert _far(other, ours) > 1e-3


def test_dev_without_guidance_fails_the_comparison(dev_folder, monkeypatch):
    """Negative control: dropping dev's embedded guidance makes the comparison fail."""
    from diffusers import Flux2Pipeline

    model = load_dev(dev_folder, 4.0)
    x_T = latents(model, 2, seed=7)
    expected = pipeline_latents(_pipe(Flux2Pipeline, dev_folder), x_T, 4.0, max_sequence_length=DEV_TEXT)
    monkeypatch.setattr(model, "_guidance", lambda n, scale: None)
    assert _far(flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS), expected) > 1e-3


@pytest.mark.slow
def test_dev_lora_loads_into_the_pipeline(dev_folder, tmp_path):
    from diffusers import Flux2Pipeline

    model = load_dev(dev_folder, 4.0)
    x_T = latents(model, 2, seed=7)
    perturb_lora(model)
    ours = flowgrpo_ode_latents(model, PROMPTS[:2], x_T, STEPS)
    model.save_trainable(tmp_path / "lora")
    pipe = _pipe(Flux2Pipeline, dev_folder)
    pipe.load_lora_weights(tmp_path / "lora")
    assert_close_ulps(pipeline_latents(pipe, x_T, 4.0, max_sequence_length=DEV_TEXT), ours, ulps=64)


# ----------------------------------------------------------------------------- the trainer


# ----------------------------------------------------------------------------- the published architectures


@pytest.mark.slow
def test_klein_4b_architecture_builds_at_depth_one():
    """configs/models/architectures/flux2_klein_4b at its real width, one block of each kind and one text layer. Shapes
    and counts are the point: built on the meta device (no weight memory; it took a 5.2 GB peak on the CPU);
    tests/models/test_real_size.py trains the same architecture one iteration."""
    from diffusers import Flux2KleinPipeline

    from flowgrpo.models.random_init import random_pipeline
    from flowgrpo.run.paths import configs_dir

    pipe = random_pipeline(Flux2KleinPipeline, configs_dir() / "models" / "architectures" / "flux2_klein_4b",
                           device=torch.device("meta"), dtype=torch.float32, max_sequence_length=16, depth=1)
    assert pipe.transformer.inner_dim == 3072 and len(pipe.transformer.single_transformer_blocks) == 1
    assert pipe.transformer.config.joint_attention_dim == 3 * pipe.text_encoder.config.hidden_size
