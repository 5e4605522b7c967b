"""The Z-Image adapter against the real ``ZImagePipeline`` at tiny size (random weights, no downloads).

The tiny pipeline (flowgrpo/tiny/z_image.py) has the real classes: ``ZImageTransformer2DModel``, a ``Qwen3Model``
text encoder with a local Qwen-format tokenizer and chat template, the FLUX.1 VAE's scaling and shift, and
Z-Image-Turbo's scheduler (static shift 3). flowgrpo's own Euler ODE through the adapter must give the pipeline's
latents and images from the same noise, CFG off (Turbo) and on (the base model's ``v_c + g (v_c - v_u)``); with
one convention broken on purpose it must not.
"""

from __future__ import annotations

import pytest
import torch

from flowgrpo.models.families import FAMILIES
from flowgrpo.models.z_image import ZImageModel
from flowgrpo.tiny.z_image import build_z_image_tokenizer, save_tiny_z_image
from model_helpers import flowgrpo_ode_latents, latents, load_family, perturb_lora, pipeline_sigmas  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

# different lengths: one shorter than max_sequence_length (16) with the template, one truncated by it
PROMPTS = ["a red circle", "two blue squares on the left of a green triangle above a yellow star"]
STEPS = 4


def _corpus() -> list[str]:
    from worlds.toy import scenes

    return [p.text for p in scenes.train_prompts() + scenes.eval_prompts()] + PROMPTS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_z_image(tmp_path_factory.mktemp("tiny_z_image"), _corpus())


def load(folder, guidance=0.0, **overrides):
    return load_family("z_image", folder, guidance, **overrides)


def pipeline_run(folder, x_T, guidance_scale, lora=None):
    """ZImagePipeline's own call from the latents x_T on flowgrpo's grid: (final latents, images "pt")."""
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    final = {}

    def keep(pipe_, step, t, kwargs):
        final["latents"] = kwargs["latents"].clone()  # after the last step: the latents the VAE decodes
        return {}

    images = pipe(prompt=list(PROMPTS), height=32, width=32, sigmas=pipeline_sigmas(STEPS),
                  guidance_scale=guidance_scale, latents=x_T.clone(), max_sequence_length=16, output_type="pt",
                  callback_on_step_end=keep).images
    return final["latents"], images


def test_shapes_masks_and_conventions(folder):
    model = load(folder)
    assert isinstance(model, ZImageModel) and model.shift == 3.0  # Turbo's static shift
    assert model.latent_shape() == (16, 8, 8)  # the 16 FLUX-VAE channels, 32 px / 4
    with pytest.raises(ValueError, match="multiples of 8"):
        model.latent_shape(36, 32)
    cond = model.encode_prompts(PROMPTS)
    assert tuple(cond.prompt_embeds.shape) == (2, 16, 32) and cond.prompt_mask.dtype == torch.bool
    # the real tokens are the chat-templated prompt: 8 template tokens + a token per word, cut at 16
    # <|im_start|> user \n <|im_end|> \n <|im_start|> assistant \n
    template = 8
    assert cond.prompt_mask.sum(1).tolist() == [template + 3, 16]
    assert (cond.prompt_embeds[0, template + 3:] == 0).all()
    assert tuple(cond.negative_prompt_embeds.shape) == (1, 16, 32) and cond.negative_prompt_mask.sum() == template
    # the stored rows are the pipeline's own list, real tokens only
    embeds, _ = model.pipeline.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False, max_sequence_length=16)
    for row, mask, e in zip(cond.prompt_embeds, cond.prompt_mask, embeds):
        torch.testing.assert_close(row[mask], e, rtol=0, atol=0)

    x = latents(model, 2)
    v = model.velocity(x, torch.tensor([0.9, 0.3]), cond)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    # CFG is on for any guidance > 0 (ZImagePipeline.do_classifier_free_guidance) and combines v_c + g (v_c - v_u)
    assert not model._uses_cfg(0.0) and model._uses_cfg(0.5)
    v_u = model.velocity(x, torch.tensor([0.9, 0.3]), cond.unconditional())
    v_g = model.velocity(x, torch.tensor([0.9, 0.3]), cond, guidance_scale=2.0)
    assert_close_ulps(v_g, v + 2.0 * (v - v_u), ulps=4 * (1 + 2 * 2.0))
    images = model.decode(x)
    assert images.shape == (2, 3, 32, 32) and 0 <= images.min() and images.max() <= 1
    assert model.encode_images(images).shape == x.shape


@pytest.mark.parametrize("guidance", [0.0, 3.0], ids=["turbo_cfg_free", "cfg"])
def test_ode_and_images_match_the_pipeline(folder, guidance):
    model = load(folder, guidance)
    x_T = latents(model, 2, seed=5)
    ours = flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS)
    expected, images = pipeline_run(folder, x_T, guidance)
    assert (ours - x_T).abs().max() > 0.5  # the ODE moved the latents
    assert_close_ulps(ours, expected, ulps=64)
    assert_close_ulps(model.decode(ours), images, ulps=64)


def test_a_broken_convention_is_caught(folder):
    """The negative controls: the comparison above must fail far outside its tolerance when the transformer sees
    sigma instead of Z-Image's 1 - sigma, or when CFG is combined the SD3 way (v_u + g (v_c - v_u))."""
    x_T = latents(load(folder), 2, seed=5)
    expected, _ = pipeline_run(folder, x_T, 3.0)
    unit = torch.finfo(torch.float32).eps * expected.abs().max()

    model = load(folder, 3.0)
    call = model._transformer_velocity  # the same call with the transformer fed sigma instead of 1 - sigma
    model._transformer_velocity = lambda net, *args: call(lambda x, t, caps, **kw: net(x, 1 - t, caps, **kw), *args)
    wrong_time = (flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS) - expected).abs().max()

    model = load(folder, 3.0)
    model._guide = lambda v_u, v_c, g: v_u + g * (v_c - v_u)
    wrong_cfg = (flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS) - expected).abs().max()
    for name, diff in (("timestep", wrong_time), ("guidance", wrong_cfg)):
        assert diff > 1e4 * unit, f"breaking the {name} convention moved the latents by only {float(diff):.3g}"


def test_lora_loads_into_the_pipeline_and_round_trips(folder, tmp_path):
    model = load(folder, 3.0)
    names = [n for n, p in model.transformer.named_parameters() if p.requires_grad]
    # to_q/k/v/out.0 of the main layer, the noise refiner and the context refiner; lora_A and lora_B each
    assert len(names) == 3 * len(FAMILIES["z_image"].lora_targets) * 2 and all(".lora_" in n for n in names)
    assert any(n.startswith("context_refiner.0.attention.to_q") for n in names)
    x_T = latents(model, 2, seed=7)
    base, _ = pipeline_run(folder, x_T, 3.0)
    perturb_lora(model)
    ours = flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS)
    assert (ours - base).abs().max() > 1e-2  # the LoRA changes the model
    with model.reference():  # the LoRA disabled: the base model again
        assert_close_ulps(flowgrpo_ode_latents(model, PROMPTS, x_T, STEPS), base, ulps=64)

    model.save_trainable(tmp_path / "lora")
    with_lora, _ = pipeline_run(folder, x_T, 3.0, lora=tmp_path / "lora")
    assert (with_lora - base).abs().max() > 1e-2
    assert_close_ulps(ours, with_lora, ulps=64)  # diffusers' load_lora_weights gives the adapter's model

    fresh = load(folder, 3.0)
    fresh.load_trainable(tmp_path / "lora")
    for a, b in zip(fresh.trainable_parameters(), model.trainable_parameters()):
        assert torch.equal(a, b)


def test_gradient_checkpointing_gives_the_same_gradients(folder):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the LoRA's A matrices are drawn at load: the same in both models
        model = load(folder, 2.0, gradient_checkpointing=checkpointing)
        perturb_lora(model)
        cond = model.encode_prompts(PROMPTS)
        model.velocity(latents(model, 2, seed=2), torch.tensor([0.8, 0.4]), cond).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.trainable_parameters()]))
    assert grads[0].abs().max() > 0
    assert_close_ulps(grads[1], grads[0], ulps=64)


def test_tokenizer_renders_the_pipeline_template():
    tokenizer = build_z_image_tokenizer(["a red circle"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "a red circle"}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)
    assert text == "<|im_start|>user\na red circle<|im_end|>\n<|im_start|>assistant\n"  # no <think> block
    # a token per template word and per corpus word, as Qwen's own vocabulary splits them
    assert len(tokenizer(text).input_ids) == 8 + 3


@pytest.mark.parametrize("name, shift", [("z_image_turbo", 3.0), ("z_image", 6.0)])
def test_published_architecture_numbers(name, shift):
    """configs/models/architectures/<name>/ builds the real classes (on the meta device: no memory): the 6.15B
    transformer, Qwen3-4B, the FLUX.1 VAE, and the scheduler's static shift."""
    import json

    import diffusers
    import transformers

    from flowgrpo.run.paths import configs_dir

    folder = configs_dir() / "models" / "architectures" / name
    config = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    with torch.device("meta"):
        transformer = diffusers.ZImageTransformer2DModel.from_config(config["transformer"])
        text = {k: v for k, v in config["text_encoder"].items() if k not in ("architectures", "torch_dtype")}
        encoder = transformers.Qwen3Model(transformers.Qwen3Config(**text))
    billions = sum(p.numel() for p in transformer.parameters()) / 1e9
    assert 6.1 < billions < 6.2, billions  # "6B" (6.15B) single-stream DiT
    assert transformer.config.cap_feat_dim == encoder.config.hidden_size == 2560
    assert 3.9 < sum(p.numel() for p in encoder.parameters()) / 1e9 < 4.1  # Qwen3-4B without its (tied) head
    vae = config["vae"]
    assert (vae["latent_channels"], vae["scaling_factor"], vae["shift_factor"]) == (16, 0.3611, 0.1159)
    assert vae["latent_channels"] == transformer.config.in_channels
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(config["scheduler"])
    assert (scheduler.config.shift, scheduler.config.use_dynamic_shifting) == (shift, False)
