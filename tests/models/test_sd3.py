"""The SD3 adapter against the real diffusers classes at tiny sizes (random weights, no downloads).

Each test loads the adapter from a folder written by ``save_pretrained`` (the real loading path)
and checks numbers: shapes, CFG batching, one Euler step against ``StableDiffusion3Pipeline``
itself, LoRA / reference behaviour, save/load round trips and attention-backend errors.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.models import Conditioning
from flowgrpo.tiny import TinySD3Sizes, build_clip_tokenizer, build_tiny_sd3_pipeline
from model_helpers import latents, load_family, perturb_lora  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow star"]
SIZES = TinySD3Sizes(
    image_size=32,
    vae_channels=(16, 32),
    text_width=32,
    text_layers=2,
    text_projection=16,
    num_layers=2,
    num_heads=2,
    head_dim=16,
)


@pytest.fixture(scope="module")
def sd3_folder(tmp_path_factory):
    tokenizer = build_clip_tokenizer(PROMPTS, max_length=16)
    folder = tmp_path_factory.mktemp("tiny_sd3")
    build_tiny_sd3_pipeline(tokenizer, SIZES, seed=0).save_pretrained(folder)
    return str(folder)


def load(folder, **overrides):
    return load_family("sd3", folder, 4.5, **overrides)


def pipeline(folder):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_shapes_and_decode(sd3_folder):
    model = load(sd3_folder)
    assert model.latent_shape() == (4, 16, 16)
    assert model.latent_shape(64, 32) == (4, 32, 16)
    cond = model.encode_prompts(PROMPTS)
    # CLIP tokens (16) then T5 tokens (16), width = T5 width = 2 x CLIP width
    assert tuple(cond.prompt_embeds.shape) == (3, 32, 64)
    assert tuple(cond.pooled_prompt_embeds.shape) == (3, 32)
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 32, 64)
    assert tuple(cond.negative_pooled_prompt_embeds.shape) == (1, 32)
    assert len(cond) == 3 and len(cond.select(torch.tensor([2, 2, 0, 1]))) == 4

    x = latents(model, 4)
    index = torch.tensor([2, 2, 0, 1])
    v = model.velocity(x, torch.full((4,), 0.7), cond.select(index))
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    # the samplers' convention gathers the same rows
    v_fn = model.velocity_fn(cond)(x, torch.full((4,), 0.7), index)
    torch.testing.assert_close(v_fn, v, rtol=0, atol=0)
    # a float sigma is broadcast
    torch.testing.assert_close(model.velocity(x, 0.7, cond.select(index)), v, rtol=0, atol=0)

    images = model.decode(x)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1 and images.std() > 0
    assert model.encode_images(images).shape == x.shape

    with pytest.raises(ValueError, match="latent_shape"):
        model.velocity(torch.randn(4, 3, 16, 16), 0.5, cond.select(index))
    with pytest.raises(ValueError, match="rows"):
        model.velocity(x, 0.5, cond)


def test_resolution_that_does_not_fit_raises(sd3_folder):
    with pytest.raises(ValueError, match="multiples of 4"):
        load(sd3_folder, resolution=30)


def test_cfg_is_one_batched_call_equal_to_two_passes(sd3_folder):
    model = load(sd3_folder)
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    sigma = torch.tensor([0.9, 0.4])
    v_cfg = model.velocity(x, sigma, cond, guidance_scale=4.5)
    v_cond = model.velocity(x, sigma, cond, guidance_scale=1.0)  # g <= 1: one unguided pass
    v_uncond = model.velocity(x, sigma, cond.unconditional(), guidance_scale=1.0)
    # each pass rounds by a few ulps; the combination multiplies that by up to 1 + 2·scale
    assert_close_ulps(v_cfg, v_uncond + 4.5 * (v_cond - v_uncond), ulps=4 * (1 + 2 * 4.5))
    assert (v_cfg - v_cond).abs().max() > 1e-3  # guidance did something
    # guidance_scale=None reads the config
    torch.testing.assert_close(model.velocity(x, sigma, cond), v_cfg, rtol=0, atol=0)


def test_euler_step_matches_the_pipeline(sd3_folder):
    """x + (sigma' - sigma) v from the adapter == StableDiffusion3Pipeline's own first step (CFG on)."""
    model = load(sd3_folder)
    pipe = pipeline(sd3_folder)
    x0 = latents(model, 2, seed=3)
    recorded = {}

    def record(pipe_, step, t, kwargs):
        recorded.setdefault(step, kwargs["latents"].clone())
        return {}

    pipe(
        prompt=PROMPTS[:2],
        height=32,
        width=32,
        num_inference_steps=2,
        sigmas=[0.8, 0.5],
        guidance_scale=4.5,
        latents=x0.clone(),
        max_sequence_length=16,
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["latents"],
    )
    sigma, sigma_next = pipe.scheduler.sigmas[0], pipe.scheduler.sigmas[1]
    # the pipeline shifted the given sigmas with the shift the adapter reports
    s = model.shift
    assert s == 3.0
    expected = torch.tensor([s * 0.8 / (1 + (s - 1) * 0.8), s * 0.5 / (1 + (s - 1) * 0.5)])
    torch.testing.assert_close(torch.stack([sigma, sigma_next]), expected)

    cond = model.encode_prompts(PROMPTS[:2])
    v = model.velocity(x0, sigma.expand(2), cond)
    x1 = x0 + (sigma_next - sigma) * v
    torch.testing.assert_close(x1, recorded[0], rtol=0, atol=1e-5)
    assert (x1 - x0).abs().max() > 1e-2  # the step moved

    # inside reference() with a changed LoRA, the step is still the base model's
    perturb_lora(model)
    assert (x0 + (sigma_next - sigma) * model.velocity(x0, sigma.expand(2), cond) - recorded[0]).abs().max() > 1e-3
    with model.reference():
        x1_ref = x0 + (sigma_next - sigma) * model.velocity(x0, sigma.expand(2), cond)
    torch.testing.assert_close(x1_ref, recorded[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("reference", ["auto", "frozen_copy"])
def test_lora_changes_output_only_when_enabled(sd3_folder, reference):
    model = load(sd3_folder, reference=reference)
    assert model.reference_mode == {"auto": "adapter_disabled", "frozen_copy": "frozen_copy"}[reference]
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v_base = model.velocity(x, 0.6, cond)
    with model.reference():
        torch.testing.assert_close(model.velocity(x, 0.6, cond), v_base, rtol=0, atol=0)  # B = 0 at init

    perturb_lora(model)
    v_lora = model.velocity(x, 0.6, cond)
    assert (v_lora - v_base).abs().max() > 1e-3
    x_grad = x.clone().requires_grad_(True)
    with model.reference():
        v_ref = model.velocity(x_grad, 0.6, cond)
    torch.testing.assert_close(v_ref, v_base, rtol=0, atol=0)
    assert not v_ref.requires_grad  # the reference is gradient-free
    # leaving the context restores the adapter and its trainability
    torch.testing.assert_close(model.velocity(x, 0.6, cond), v_lora, rtol=0, atol=0)
    assert all(p.requires_grad for p in model.trainable_parameters())


def test_trainable_parameters_are_only_lora(sd3_folder):
    model = load(sd3_folder)
    trainable = {id(p) for p in model.trainable_parameters()}
    names = [n for n, p in model.transformer.named_parameters() if id(p) in trainable]
    # 2 layers x 8 targeted projections x (lora_A, lora_B); the last layer is context_pre_only (no to_add_out)
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * (8 + 7)
    assert all(p.dtype == torch.float32 for p in model.trainable_parameters())
    frozen = [p for c in model.pipeline.components.values() if isinstance(c, torch.nn.Module) for p in c.parameters()]
    assert sum(p.requires_grad for p in frozen) == len(trainable)

    cond = model.encode_prompts(PROMPTS[:1])
    perturb_lora(model)
    model.velocity(latents(model, 1), 0.5, cond).square().mean().backward()
    named = model.transformer.named_parameters()
    zero_grad = [n for n, p in named if id(p) in trainable and not p.grad.abs().sum() > 0]
    # only the last block's context queries get no gradient: that block's text output is discarded
    assert sorted(zero_grad) == [f"transformer_blocks.1.attn.add_q_proj.lora_{ab}.default.weight" for ab in "AB"]
    assert all(p.grad is None for p in frozen if id(p) not in trainable)


def test_gradient_checkpointing_gives_the_same_gradients(sd3_folder):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # LoRA A is drawn from the global generator
        model = load(sd3_folder, gradient_checkpointing=checkpointing)
        perturb_lora(model)
        cond = model.encode_prompts(PROMPTS[:2])
        model.velocity(latents(model, 2), 0.5, cond).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_full_finetune_reference_is_a_frozen_copy(sd3_folder):
    model = load(sd3_folder, finetune="full")
    assert model.reference_mode == "frozen_copy"
    params = list(model.transformer.parameters())
    assert [id(p) for p in model.trainable_parameters()] == [id(p) for p in params]
    assert all(p.requires_grad for p in params)
    reference = model.reference_copy.values  # a WeightCopy of the trained weights, storage of its own
    assert len(reference) == len(params) and not any(v.requires_grad for v in reference)
    assert not {v.data_ptr() for v in reference} & {p.data_ptr() for p in params}

    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v_base = model.velocity(x, 0.6, cond)
    with torch.no_grad():
        for p in params:
            p.add_(0.01 * torch.randn_like(p))
    assert (model.velocity(x, 0.6, cond) - v_base).abs().max() > 1e-3
    trained = [p.detach().clone() for p in params]
    with model.reference():
        torch.testing.assert_close(model.velocity(x, 0.6, cond), v_base, rtol=0, atol=0)
    assert all(torch.equal(p, t) and p.requires_grad for p, t in zip(params, trained))  # the trained weights back


def test_reference_none_refuses(sd3_folder):
    model = load(sd3_folder, reference="none")
    with pytest.raises(RuntimeError, match="reference: auto"):
        with model.reference():
            pass


def test_save_and_load_lora_round_trips_exactly(sd3_folder, tmp_path):
    model = load(sd3_folder)
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    cond = model.encode_prompts(PROMPTS[:2])
    x = latents(model, 2)
    v = model.velocity(x, 0.6, cond)

    fresh = load(sd3_folder)
    before = [id(p) for p in fresh.trainable_parameters()]
    fresh.load_trainable(tmp_path / "lora")
    assert [id(p) for p in fresh.trainable_parameters()] == before  # loaded in place
    for a, b in zip(model.trainable_parameters(), fresh.trainable_parameters()):
        assert torch.equal(a, b)
    torch.testing.assert_close(fresh.velocity(x, 0.6, cond), v, rtol=0, atol=0)

    # the file is an ordinary diffusers LoRA: the pipeline loads it with lora_alpha kept
    pipe = pipeline(sd3_folder)
    pipe.load_lora_weights(tmp_path / "lora")
    both = cond.unconditional().concat(cond)
    out = pipe.transformer(
        hidden_states=torch.cat([x, x]),
        timestep=torch.full((4,), 600.0),
        encoder_hidden_states=both.prompt_embeds,
        pooled_projections=both.pooled_prompt_embeds,
        return_dict=False,
    )[0]
    v_uncond, v_cond = out.chunk(2)
    torch.testing.assert_close(v_uncond + 4.5 * (v_cond - v_uncond), v, rtol=0, atol=1e-5)

    with pytest.raises(ValueError, match="lora_rank"):
        load(sd3_folder, lora_rank=8).load_trainable(tmp_path / "lora")


def test_save_and_load_full_round_trips_exactly(sd3_folder, tmp_path):
    model = load(sd3_folder, finetune="full", reference="none")
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_trainable(tmp_path / "full")
    fresh = load(sd3_folder, finetune="full", reference="none")
    fresh.load_trainable(tmp_path / "full")
    for a, b in zip(model.trainable_parameters(), fresh.trainable_parameters()):
        assert torch.equal(a, b)


def test_bfloat16_weights_give_float32_velocity(sd3_folder):
    model = load(sd3_folder, dtype="bfloat16")
    assert model.transformer.dtype == torch.bfloat16 and model.vae.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.trainable_parameters())  # LoRA trains in fp32
    cond = model.encode_prompts(PROMPTS[:1])
    v = model.velocity(latents(model, 1), 0.5, cond)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()


def test_unusable_attention_backend_raises_with_a_hint(sd3_folder):
    pytest.importorskip("diffusers")
    try:
        import xformers  # noqa: F401

        pytest.skip("xformers is installed here")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"pip install flowgrpo\[gpu\].*attention_backend: native"):
        load(sd3_folder, attention_backend="xformers")
    # SD3's joint attention calls SDPA directly (diffusers 0.42): dispatcher-only backends are refused
    with pytest.raises(ValueError, match="use 'native'"):
        load(sd3_folder, attention_backend="flex")


def test_conditioning_select_and_to():
    cond = Conditioning(
        prompt_embeds=torch.arange(3.0).view(3, 1, 1).expand(3, 2, 4),
        pooled_prompt_embeds=torch.arange(3.0).view(3, 1).expand(3, 5),
        negative_prompt_embeds=torch.full((1, 2, 4), -1.0),
        negative_pooled_prompt_embeds=torch.full((1, 5), -1.0),
    )
    picked = cond.select(torch.tensor([2, 0, 2]))
    assert picked.prompt_embeds[:, 0, 0].tolist() == [2.0, 0.0, 2.0]
    assert picked.pooled_prompt_embeds[:, 0].tolist() == [2.0, 0.0, 2.0]
    assert picked.negative_prompt_embeds is cond.negative_prompt_embeds
    uncond = picked.unconditional()
    assert uncond.prompt_embeds.shape == (3, 2, 4) and (uncond.prompt_embeds == -1).all()
    assert len(uncond.concat(picked)) == 6
    assert cond.to("cpu").prompt_embeds.device.type == "cpu"
