"""The Wan2.1 adapter against the real diffusers classes at tiny sizes (random weights, no downloads).

Each test loads the adapter from a folder written by ``save_pretrained`` and checks numbers: 5-D
shapes, decoding to [N, F, 3, H, W], CFG batching, one Euler step against ``WanPipeline`` itself
(also inside ``reference()`` after the LoRA changed), LoRA targets and round trips, the scheduler
shift, and sampling + scoring a video batch end to end.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.models import load_model
from flowgrpo.models.families import FAMILIES
from flowgrpo.tiny import TinyWanSizes, build_t5_tokenizer, build_tiny_wan_pipeline
from model_helpers import latents, load_family, perturb_lora  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["a video of a circle moving left", "a video of a red square moving up", "a video of a triangle moving down"]
SIZES = TinyWanSizes(
    num_frames=5, image_size=32, vae_base_dim=8, latent_channels=8, text_width=32, num_layers=2, num_heads=2,
    head_dim=12, ffn_dim=32, freq_dim=32, patch_size=(1, 2, 2),  # Wan2.1's patching (the shipped tiny model uses 1x1x1)
)


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_wan")
    build_tiny_wan_pipeline(build_t5_tokenizer(PROMPTS, max_length=16), SIZES, seed=0).save_pretrained(folder)
    return str(folder)


def load(folder, **overrides):
    return load_family("wan", folder, 5.0, **{"num_frames": 5, **overrides})


def pipeline(folder):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_shapes_decode_and_encode(wan_folder):
    model = load(wan_folder)
    assert model.modality == "video"
    assert model.latent_shape() == (8, 2, 8, 8)  # 5 frames -> 2 latent frames; 32 px / 4
    assert model.latent_shape(64, 32, 9) == (8, 3, 16, 8)
    cond = model.encode_prompts(PROMPTS)
    assert tuple(cond.prompt_embeds.shape) == (3, 16, 32) and cond.pooled_prompt_embeds is None
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 16, 32)

    x = latents(model, 4)
    assert x.shape == (4, 8, 2, 8, 8)
    index = torch.tensor([2, 2, 0, 1])
    v = model.velocity(x, torch.full((4,), 0.7), cond.select(index))
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    torch.testing.assert_close(model.velocity_fn(cond)(x, torch.full((4,), 0.7), index), v, rtol=0, atol=0)

    videos = model.decode(x)
    assert videos.shape == (4, 5, 3, 32, 32) and videos.dtype == torch.float32  # the video reward layout
    assert videos.min() >= 0 and videos.max() <= 1 and videos.std() > 0
    assert model.encode_videos(videos).shape == x.shape
    assert model.encode_images(videos).shape == x.shape

    with pytest.raises(ValueError, match=r"\[N, 8, f, h, w\].*latent_shape"):
        model.velocity(x[:, :, 0], 0.5, cond.select(index))  # a 4-D (image) latent
    with pytest.raises(ValueError, match="4k \\+ 1"):
        model.latent_shape(num_frames=6)


def test_frames_and_resolution_that_do_not_fit_raise(wan_folder):
    with pytest.raises(ValueError, match=r"'num_frames' is 6; allowed: 4k \+ 1 for 'wan'.*5 or 9"):
        load(wan_folder, num_frames=6)
    with pytest.raises(ValueError, match="multiples of 8"):
        load(wan_folder, resolution=36)
    assert load(wan_folder, width=64).latent_shape() == (8, 2, 8, 16)  # 32 x 64 frames


def test_decode_matches_the_pipeline(wan_folder):
    """The adapter's decode is WanPipeline's: latents_mean/std un-normalisation, VAE, postprocess."""
    model = load(wan_folder)
    with torch.no_grad():  # non-trivial latent statistics, so the un-normalisation is checked
        model.vae.register_to_config(latents_mean=[0.1 * i for i in range(8)],
                                     latents_std=[1 + 0.2 * i for i in range(8)])
    pipe = model.pipeline
    x = latents(model, 2, seed=4)
    out = pipe(
        prompt=PROMPTS[:2], height=32, width=32, num_frames=5, num_inference_steps=1, guidance_scale=1.0,
        latents=x.clone(), max_sequence_length=16, output_type="pt",
        callback_on_step_end=lambda p, i, t, kw: {"latents": x.clone()},  # decode x itself
        callback_on_step_end_tensor_inputs=["latents"],
    ).frames
    torch.testing.assert_close(model.decode(x), out, rtol=0, atol=1e-6)


def test_cfg_is_one_batched_call_equal_to_two_passes(wan_folder):
    model = load(wan_folder)
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    sigma = torch.tensor([0.9, 0.4])
    v_cfg = model.velocity(x, sigma, cond, guidance_scale=5.0)
    v_cond = model.velocity(x, sigma, cond, guidance_scale=1.0)
    v_uncond = model.velocity(x, sigma, cond.unconditional(), guidance_scale=1.0)
    # each pass rounds by a few ulps; the combination multiplies that by up to 1 + 2·scale
    assert_close_ulps(v_cfg, v_uncond + 5.0 * (v_cond - v_uncond), ulps=4 * (1 + 2 * 5.0))
    assert (v_cfg - v_cond).abs().max() > 1e-3
    torch.testing.assert_close(model.velocity(x, sigma, cond), v_cfg, rtol=0, atol=0)  # None reads the config


def test_euler_step_matches_the_pipeline(wan_folder):
    """x + (sigma' - sigma) v from the adapter == WanPipeline's own first step (CFG on, two passes there)."""
    model = load(wan_folder)
    pipe = pipeline(wan_folder)
    x0 = latents(model, 2, seed=3)
    recorded = {}

    def record(pipe_, step, t, kwargs):
        recorded.setdefault(step, kwargs["latents"].clone())
        return {}

    pipe(
        prompt=PROMPTS[:2], height=32, width=32, num_frames=5, num_inference_steps=4, guidance_scale=5.0,
        latents=x0.clone(), max_sequence_length=16, output_type="latent",
        callback_on_step_end=record, callback_on_step_end_tensor_inputs=["latents"],
    )
    sigmas = pipe.scheduler.sigmas  # the pipeline's own (shifted) grid; the adapter steps on it
    assert model.shift == pipe.scheduler.config.shift == 3.0 and sigmas[0] == 1.0

    cond = model.encode_prompts(PROMPTS[:2])
    x = x0
    for step in range(2):  # two steps: the second starts from the pipeline's own first result
        v = model.velocity(x, sigmas[step].expand(2), cond)
        x = x + (sigmas[step + 1] - sigmas[step]) * v
        torch.testing.assert_close(x, recorded[step], rtol=0, atol=1e-5)
    assert (recorded[0] - x0).abs().max() > 1e-2

    perturb_lora(model)
    v_lora = model.velocity(x0, sigmas[0].expand(2), cond)
    assert (x0 + (sigmas[1] - sigmas[0]) * v_lora - recorded[0]).abs().max() > 1e-3
    with model.reference():
        x1_ref = x0 + (sigmas[1] - sigmas[0]) * model.velocity(x0, sigmas[0].expand(2), cond)
    torch.testing.assert_close(x1_ref, recorded[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("reference", ["auto", "frozen_copy"])
def test_lora_changes_output_only_when_enabled(wan_folder, reference):
    model = load(wan_folder, reference=reference)
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v_base = model.velocity(x, 0.6, cond)
    perturb_lora(model)
    v_lora = model.velocity(x, 0.6, cond)
    assert (v_lora - v_base).abs().max() > 1e-3
    with model.reference():
        v_ref = model.velocity(x.clone().requires_grad_(True), 0.6, cond)
    torch.testing.assert_close(v_ref, v_base, rtol=0, atol=0)
    assert not v_ref.requires_grad
    torch.testing.assert_close(model.velocity(x, 0.6, cond), v_lora, rtol=0, atol=0)


def test_lora_targets_every_attention_projection_and_all_get_gradients(wan_folder):
    model = load(wan_folder)  # lora_target_modules left at the SD3/FLUX default -> Wan's own
    trainable = {id(p) for p in model.trainable_parameters()}
    names = [n for n, p in model.transformer.named_parameters() if id(p) in trainable]
    # 2 blocks x (self-attention attn1 + cross-attention attn2) x (to_q, to_k, to_v, to_out.0) x (A, B)
    assert len(names) == 2 * 2 * 4 * 2 and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {n.split(".")[2] for n in names} == {"attn1", "attn2"}
    assert all(p.dtype == torch.float32 for p in model.trainable_parameters())
    perturb_lora(model)
    model.velocity(latents(model, 1), 0.5, model.encode_prompts(PROMPTS[:1])).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.trainable_parameters())

    only_self = load(wan_folder, lora_target_modules=["attn1.to_q", "attn1.to_v"])  # an explicit list is kept
    assert len(only_self.trainable_parameters()) == 2 * 2 * 2
    assert tuple(model._lora_targets()) == FAMILIES["wan"].lora_targets == ("to_q", "to_k", "to_v", "to_out.0")


def test_gradient_checkpointing_gives_the_same_gradients(wan_folder):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = load(wan_folder, gradient_checkpointing=checkpointing)
        model.transformer.train()  # diffusers checkpoints only in training mode
        perturb_lora(model)
        model.velocity(latents(model, 2), 0.5, model.encode_prompts(PROMPTS[:2])).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_save_and_load_lora_round_trips_and_loads_into_the_pipeline(wan_folder, tmp_path):
    model = load(wan_folder)
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v = model.velocity(x, 0.6, cond)

    fresh = load(wan_folder)
    fresh.load_trainable(tmp_path / "lora")
    torch.testing.assert_close(fresh.velocity(x, 0.6, cond), v, rtol=0, atol=0)

    pipe = pipeline(wan_folder)
    pipe.load_lora_weights(tmp_path / "lora")  # an ordinary diffusers Wan LoRA, alpha kept
    both = cond.unconditional().concat(cond)
    out = pipe.transformer(hidden_states=torch.cat([x, x]), timestep=torch.full((4,), 600.0),
                           encoder_hidden_states=both.prompt_embeds, return_dict=False)[0]
    v_uncond, v_cond = out.chunk(2)
    torch.testing.assert_close(v_uncond + 5.0 * (v_cond - v_uncond), v, rtol=0, atol=1e-5)


def test_unipc_flow_shift_is_read(wan_folder, tmp_path):
    """Wan ships UniPC with `flow_shift`; the adapter reports that shift (the samplers apply it)."""
    from diffusers import UniPCMultistepScheduler

    pipe = pipeline(wan_folder)
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    pipe.save_pretrained(tmp_path / "unipc")
    assert load(str(tmp_path / "unipc")).shift == 5.0
    assert load(str(tmp_path / "unipc"), shift=2.0).shift == 2.0


def test_bfloat16_weights_give_float32_velocity(wan_folder):
    model = load(wan_folder, dtype="bfloat16")
    assert model.transformer.dtype == torch.bfloat16 and model.vae.dtype == torch.float32
    v = model.velocity(latents(model, 1), 0.5, model.encode_prompts(PROMPTS[:1]))
    assert v.dtype == torch.float32 and torch.isfinite(v).all()


def test_generate_and_score_a_video_batch(wan_folder):
    """The evaluation path: ODE-sample videos, decode to [N, F, 3, H, W], score with toy_video."""
    from flowgrpo.evaluate import evaluate
    from worlds.toy.clips import parse_prompt

    model = load_model({"family": "wan", "pretrained": wan_folder, "resolution": 32, "num_frames": 5,
                        "device": "cpu", "max_sequence_length": 16, "guidance_scale": 5.0,
                        "finetune": "full", "reference": "none"})
    meta = [parse_prompt(p).to_dict() for p in PROMPTS]
    summary, videos, _ = evaluate(model, PROMPTS, "toy_video", meta, steps=2, progress=False)
    assert videos.shape == (3, 5, 3, 32, 32) and 0 <= videos.min() and videos.max() <= 1
    assert summary["num_images"] == 3 and 0.0 <= summary["mean_score"] <= 1.0
    assert set(summary["per_task"]) == {"direction", "color_direction"}
