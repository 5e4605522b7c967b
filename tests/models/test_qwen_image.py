"""The Qwen-Image adapter against the real diffusers classes at tiny sizes (random weights, no downloads).

The tiny pipeline (flowgrpo/tiny/qwen_image.py) has Qwen-Image's classes, its published scheduler configuration and
non-trivial VAE latent statistics. The adapter's whole ODE (flowgrpo's own sampler, batched true CFG with the norm
rescale, the masked and padded text) is checked against ``QwenImagePipeline.__call__`` itself, with CFG on and off,
latents and decoded images; breaking one convention on purpose must break the match. Also: the sigma grid and
Qwen-Image's ``shift_terminal``, LoRA files that ``load_lora_weights`` reads, and training end to end.
"""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

from flowgrpo.models.base import FlowModel
from flowgrpo.models.qwen_image import NEGATIVE_PROMPT, QwenImageModel
from flowgrpo.tiny.qwen_image import qwen_image_scheduler_config, save_tiny_qwen_image
from model_helpers import flowgrpo_ode_latents, latents, load_family, perturb_lora, pipeline_sigmas  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

# prompts of different lengths: the pipeline pads a batch to its longest prompt, the adapter to max_sequence_length
PROMPTS = ["a red circle", "two blue squares left of a big green triangle on the right"]
STEPS = 4
SIZE = 32  # pixels: latents [16, 8, 8], 16 packed image tokens


def _corpus() -> list[str]:
    from worlds.toy import scenes

    return PROMPTS + [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_qwen_image(tmp_path_factory.mktemp("tiny_qwen_image"), _corpus())


def load(folder, **overrides):
    return load_family("qwen_image", folder, 4.0, **overrides)


def pipeline(folder, lora=None):
    """The ordinary pipeline from the folder, with Qwen-Image's published scheduler (``shift_terminal`` 0.02)."""
    pipe = QwenImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    return pipe


def pipeline_ode(pipe, x_T, guidance_scale, output_type="latent"):
    """QwenImagePipeline's own full call from the UNPACKED noise x_T: returns unpacked x_0 (or decoded images).
    CFG as the model card runs it: negative_prompt " " and true_cfg_scale; without CFG, no negative prompt."""
    n, c, h, w = x_T.shape
    cfg = dict(negative_prompt=[NEGATIVE_PROMPT] * n) if guidance_scale > 1 else {}
    out = pipe(
        prompt=PROMPTS[:n],
        true_cfg_scale=guidance_scale,
        height=SIZE,
        width=SIZE,
        latents=QwenImagePipeline._pack_latents(x_T.clone(), n, c, h, w),
        sigmas=pipeline_sigmas(STEPS),
        max_sequence_length=16,
        output_type=output_type,
        **cfg,
    ).images
    if output_type != "latent":
        return out
    return QwenImagePipeline._unpack_latents(out, SIZE, SIZE, pipe.vae_scale_factor).squeeze(2)


def test_shapes_text_mask_and_negative_prompt(folder):
    model = load(folder)
    assert isinstance(model, QwenImageModel) and model.latent_shape() == (16, 8, 8)  # UNPACKED, one frame dropped
    with pytest.raises(ValueError, match="multiples of 8"):
        model.latent_shape(36, 32)
    cond = model.encode_prompts(PROMPTS)
    assert tuple(cond.prompt_embeds.shape) == (2, 16, 32) and cond.pooled_prompt_embeds is None
    # the pipeline's own embeddings (34 system-prompt tokens dropped), zero-padded to 16 with a mask
    embeds, mask = model.pipeline.encode_prompt(PROMPTS, device="cpu", max_sequence_length=16)
    lengths = mask.sum(1)
    assert lengths[0] < lengths[1] <= 16 and cond.prompt_mask.sum(1).tolist() == lengths.tolist()
    torch.testing.assert_close(cond.prompt_embeds[:, : embeds.shape[1]], embeds, rtol=0, atol=0)
    assert not cond.prompt_embeds[0, lengths[0]:].any() and not cond.prompt_mask[0, lengths[0]:].any()
    # the unconditional row is the model card's negative prompt " ", not ""
    neg, neg_mask = model.pipeline.encode_prompt([NEGATIVE_PROMPT], device="cpu", max_sequence_length=16)
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 16, 32) and neg_mask is None  # all real: no mask
    torch.testing.assert_close(cond.negative_prompt_embeds[:, : neg.shape[1]], neg, rtol=0, atol=0)
    assert cond.negative_prompt_mask.sum() == neg.shape[1]
    empty, _ = model.pipeline.encode_prompt([""], device="cpu", max_sequence_length=16)
    assert empty.shape[1] != neg.shape[1] or (empty - neg).abs().max() > 1e-3
    # chunks padded to the same length concatenate (one prompt per text-encoder batch rounds a little differently)
    chunked = model.encode_prompts(PROMPTS, chunk_size=1)
    assert_close_ulps(chunked.prompt_embeds, cond.prompt_embeds, ulps=16)
    assert torch.equal(chunked.prompt_mask, cond.prompt_mask)

    x = latents(model, 2)
    v = model.velocity(x, torch.tensor([0.9, 0.3]), cond)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    with pytest.raises(ValueError, match="multiples of 2"):
        model.velocity(torch.randn(2, 16, 7, 8), 0.5, cond)
    images = model.decode(x)
    assert images.shape == (2, 3, SIZE, SIZE) and 0 <= images.min() and images.max() <= 1 and images.std() > 0
    assert model.encode_images(images).shape == x.shape
    with pytest.raises(ValueError, match="at most 1024"):
        load(folder, max_sequence_length=1025).encode_prompts(PROMPTS)


def test_true_cfg_is_the_norm_rescaled_combination_in_one_batched_call(folder):
    model = load(folder, guidance_scale=4.0)
    cond = model.encode_prompts(PROMPTS)
    x, sigma = latents(model, 2, seed=4), torch.tensor([0.8, 0.6])
    calls = model.call_timer.cfg_calls
    v_cfg = model.velocity(x, sigma, cond)
    assert model.call_timer.cfg_calls == calls + 1  # one transformer call of [uncond; cond]
    v_cond = model.velocity(x, sigma, cond, guidance_scale=1.0)
    v_uncond = model.velocity(x, sigma, cond.unconditional(), guidance_scale=1.0)
    # the pipeline's combination, written out on the packed tokens [N, 16 tokens, 64]
    pack = lambda v: QwenImagePipeline._pack_latents(v, 2, 16, 8, 8)  # noqa: E731
    comb = pack(v_uncond + 4.0 * (v_cond - v_uncond))
    expected = comb * (pack(v_cond).norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
    assert_close_ulps(pack(v_cfg), expected, ulps=4 * (1 + 2 * 4.0))
    # each token keeps the conditional prediction's norm, and the direction is the guided one
    assert_close_ulps(pack(v_cfg).norm(dim=-1), pack(v_cond).norm(dim=-1), ulps=32)
    assert (v_cfg - v_cond).abs().max() > 1e-2 and (v_cfg - (v_uncond + 4.0 * (v_cond - v_uncond))).abs().max() > 1e-2


@pytest.mark.parametrize("guidance_scale", [4.0, 1.0], ids=["true_cfg", "no_cfg"])
def test_ode_and_decoding_match_the_pipeline(folder, guidance_scale):
    model = load(folder, guidance_scale=guidance_scale)
    x_T = latents(model, 2, seed=3)
    ours = flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS)
    pipe = pipeline(folder)
    expected = pipeline_ode(pipe, x_T, guidance_scale)
    assert (expected - x_T).abs().max() > 0.5  # the ODE moved
    assert_close_ulps(ours, expected, ulps=64)
    assert_close_ulps(model.decode(ours), pipeline_ode(pipe, x_T, guidance_scale, output_type="pt"), ulps=64)


def _no_rescale(monkeypatch):
    monkeypatch.setattr(QwenImageModel, "_guide", FlowModel._guide)  # plain CFG, no norm rescale


def _timestep_times_1000(monkeypatch):
    original = QwenImageModel._transformer_velocity

    def velocity(self, transformer, x, sigma, cond, guidance_scale):
        return original(self, transformer, x, sigma * 1000, cond, guidance_scale)  # the transformer gets sigma*1000

    monkeypatch.setattr(QwenImageModel, "_transformer_velocity", velocity)


def _no_text_mask(monkeypatch):
    original = QwenImageModel._encode

    def encode(self, prompts):
        embeds, pooled, ids, _ = original(self, prompts)
        return embeds, pooled, ids, None  # the padded text tokens are attended to

    monkeypatch.setattr(QwenImageModel, "_encode", encode)


def _empty_negative(monkeypatch):
    monkeypatch.setattr(QwenImageModel, "negative_prompt", "")


@pytest.mark.parametrize("broken", [_no_rescale, _timestep_times_1000, _no_text_mask, _empty_negative],
                         ids=lambda f: f.__name__.strip("_"))
def test_negative_control_a_broken_convention_fails_the_match(folder, broken, monkeypatch):
    """The comparison above can fail: with one convention broken in the adapter, the ODE ends far from the pipeline's
    (thousands of ulps; the match holds within 64)."""
    x_T = latents(load(folder), 2, seed=3)
    expected = pipeline_ode(pipeline(folder), x_T, 4.0)
    broken(monkeypatch)
    ours = flowgrpo_ode_latents(load(folder, guidance_scale=4.0), PROMPTS, x_T, STEPS)
    ulp = torch.finfo(torch.float32).eps * expected.abs().max()
    assert (ours - expected).abs().max() > 1000 * ulp


def test_sigma_grid_and_shift_terminal(folder):
    """model.shift is the pipeline's dynamic shift, and flowgrpo's grid applies the scheduler's shift_terminal (the
    published 0.02: the last sigma before 0 is 0.02), so it is the pipeline's own grid; without the stretch it would
    be far off. MixGRPO-Flash's grid keeps its window's points on the same stretched grid."""
    from samplers.grids import flash_grid, time_grid

    model = load(folder)
    mu = 0.5 + (0.9 - 0.5) / (8192 - 256) * (16 - 256)  # 16 image tokens, Qwen-Image's base/max shift and lengths
    assert model.shift == pytest.approx(math.exp(mu), rel=1e-12)
    assert model.shift_terminal == 0.02 == qwen_image_scheduler_config()["shift_terminal"]
    grid = time_grid(STEPS, model.shift, model.shift_terminal).float()
    stretched = FlowMatchEulerDiscreteScheduler(**qwen_image_scheduler_config())
    stretched.set_timesteps(sigmas=pipeline_sigmas(STEPS), mu=mu)
    assert_close_ulps(stretched.sigmas, grid, ulps=4)
    assert stretched.sigmas[-2].item() == pytest.approx(0.02)
    assert (time_grid(STEPS, model.shift).float() - grid).abs().max() > 0.1
    flash = flash_grid(STEPS, model.shift, 2, 0.5, model.shift_terminal).float()
    assert torch.equal(flash[:3], grid[:3]) and flash[-1] == 0 and (flash[:-1] > 0).all()


def test_lora_loads_into_the_pipeline_and_round_trips(folder, tmp_path):
    model = load(folder, guidance_scale=4.0)
    trainable = {id(p) for p in model.trainable_parameters()}
    names = [n for n, p in model.transformer.named_parameters() if id(p) in trainable]
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 8 * 2  # 2 blocks x 8 projections (both streams) x (A, B)
    x_T = latents(model, 2, seed=5)
    base = flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS)
    perturb_lora(model)
    ours = flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS)
    assert (ours - base).abs().max() > 1e-2
    with model.reference():
        assert_close_ulps(flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS), base, ulps=0)

    model.save_trainable(tmp_path / "lora")
    assert_close_ulps(pipeline_ode(pipeline(folder, lora=tmp_path / "lora"), x_T, 4.0), ours, ulps=64)
    fresh = load(folder, guidance_scale=4.0)
    fresh.load_trainable(tmp_path / "lora")
    for a, b in zip(fresh.trainable_parameters(), model.trainable_parameters()):
        assert torch.equal(a, b)


def test_gradient_checkpointing_and_bfloat16(folder):
    x, sigma = None, torch.tensor([0.7, 0.4])
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation in both
        model = load(folder, guidance_scale=4.0, gradient_checkpointing=checkpointing)
        perturb_lora(model)
        x = latents(model, 2, seed=6) if x is None else x
        model.velocity(x, sigma, model.encode_prompts(PROMPTS)).square().mean().backward()
        # the last block's text-stream output is discarded, so its add_q_proj / to_add_out LoRA gets no gradient
        grads.append(torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.flatten()
                                for p in model.trainable_parameters()]))
    assert grads[0].abs().max() > 0
    assert_close_ulps(grads[1], grads[0], ulps=64)

    fp32 = load(folder, guidance_scale=4.0)
    bf16 = load(folder, guidance_scale=4.0, dtype="bfloat16")
    v32 = fp32.velocity(x, sigma, fp32.encode_prompts(PROMPTS))
    v16 = bf16.velocity(x, sigma, bf16.encode_prompts(PROMPTS))
    assert v16.dtype == torch.float32 and bf16.transformer.dtype == torch.bfloat16 and bf16.vae.dtype == torch.float32
    assert (v16 - v32).abs().max() < 0.1 * v32.abs().max()  # bf16 rounding (3 significant digits), not a mismatch


@pytest.mark.slow
def test_published_architecture_builds_at_depth_one():
    """configs/models/architectures/qwen_image/ builds the real classes at real width (one block, one text layer)
    and the pipeline runs on them."""
    from flowgrpo.models.random_init import random_pipeline
    from flowgrpo.run.paths import configs_dir

    pipe = random_pipeline(QwenImagePipeline, configs_dir() / "models" / "architectures" / "qwen_image",
                           device=torch.device("cpu"), dtype=torch.float32, max_sequence_length=16, depth=1)
    assert pipe.transformer.inner_dim == 3072 and len(pipe.transformer.transformer_blocks) == 1
    assert pipe.text_encoder.config.text_config.hidden_size == 3584 and pipe.vae_scale_factor == 8
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=["a red circle"], negative_prompt=NEGATIVE_PROMPT, true_cfg_scale=4.0, height=64, width=64,
               num_inference_steps=2, max_sequence_length=16, output_type="latent").images
    assert out.shape == (1, 16, 64) and torch.isfinite(out).all()
