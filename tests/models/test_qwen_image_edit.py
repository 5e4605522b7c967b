"""Qwen-Image-Edit (``qwen_image_edit``) against ``QwenImageEditPlusPipeline`` at tiny sizes (random weights, no
downloads; the tiny pipeline: flowgrpo/tiny/qwen_image_edit.py, with 2511's ``zero_cond_t`` transformer).

The adapter's whole ODE (flowgrpo's own sampler and time grid, one batched true-CFG call with the norm rescale, the
VLM reading the condition images in both passes, the references packed after the latent's tokens) is checked against
the pipeline's own ``__call__`` (its batches are one prompt: it runs prompt by prompt) with one and with two reference
images, latents and decoded images; breaking one of its conventions on purpose must break the match. The exported
LoRA loads into the pipeline and samples what the adapter samples.

The pipeline sizes every reference to ``VAE_IMAGE_SIZE`` (1024 x 1024) of area at its aspect ratio; the tests shrink
that constant of the pipeline's module to 96 x 96 (for the pipeline and the adapter alike: the adapter reads it
there), so a square image is 144 reference tokens and a 3:2 one (128 x 64 px) 128, instead of 16384.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
from PIL import Image

from flowgrpo.models.config import ModelConfigError
from flowgrpo.models.qwen_image_edit import QwenImageEditModel
from flowgrpo.tiny.qwen_image_edit import EDIT_TEMPLATE, save_tiny_qwen_image_edit
from model_helpers import latents, load_family, perturb_lora, pipeline_sigmas  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a busy 2-core machine (tests/conftest.py)

PROMPTS = ["make the red circle blue", "put the cat from picture 2 on the sofa"]
STEPS, SIZE, CFG = 4, 32, 4.0
VAE_AREA = 96 * 96  # the tests' VAE_IMAGE_SIZE (module docstring)
TEXT = 96  # model.max_sequence_length: two pictures' vision tokens (9 + 6 here) and their labels fit


def _images(seed: int, sizes=((40, 40), (48, 32))) -> list:
    """One prompt's condition images (width x height): a square source and a 3:2 second picture."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _rows(count: int) -> list[list]:
    return [_images(seed)[:count] for seed in range(len(PROMPTS))]


@pytest.fixture(scope="module", autouse=True)
def small_vae_area():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plus, "VAE_IMAGE_SIZE", VAE_AREA)
        yield


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny_qwen_image_edit"), PROMPTS)


def load(folder, **overrides):
    overrides.setdefault("max_sequence_length", TEXT)
    return load_family("qwen_image_edit", folder, CFG, sample_steps=STEPS, **overrides)


def adapter_ode(model, x_T, rows):
    """flowgrpo's Euler ODE through the adapter on its own grid (the pipeline's shift and shift_terminal)."""
    from samplers.grids import time_grid
    from samplers.solvers import sample_ode

    cond = model.encode_prompts(PROMPTS[: len(rows)], images=rows)
    grid = time_grid(STEPS, model.shift_for(STEPS), model.shift_terminal)
    return sample_ode(model.velocity_fn(cond), x_T.float(), grid, torch.arange(len(rows))).float()


def pipeline_ode(folder, x_T, rows, output_type="latent", lora=None):
    """QwenImageEditPlusPipeline's own call, prompt by prompt (it refuses batches), from the unpacked noise x_T with
    the model card's CFG (negative prompt " ", true_cfg_scale): unpacked x_0 (or its decoded images)."""
    pipe = QwenImageEditPlusPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    out = []
    for i, row in enumerate(rows):
        _, c, h, w = x_T.shape
        result = pipe(image=row, prompt=PROMPTS[i], negative_prompt=" ", true_cfg_scale=CFG, height=SIZE, width=SIZE,
                      latents=QwenImageEditPlusPipeline._pack_latents(x_T[i : i + 1].clone(), 1, c, h, w),
                      sigmas=pipeline_sigmas(STEPS), output_type=output_type).images
        if output_type == "latent":
            result = QwenImageEditPlusPipeline._unpack_latents(result, SIZE, SIZE, pipe.vae_scale_factor).squeeze(2)
        out.append(result)
    return torch.cat(out)


def test_text_negative_and_references_are_the_pipelines(folder):
    model = load(folder)
    assert isinstance(model, QwenImageEditModel) and model.max_references == 3
    assert model.transformer.config.zero_cond_t  # 2511's transformer
    pipe = model.pipeline
    # the tiny tokenizer makes the template's system turn and user header the 64 tokens the pipeline drops
    prefix = EDIT_TEMPLATE.split("{}")[0]
    assert len(pipe.tokenizer(prefix)["input_ids"]) == pipe.prompt_template_encode_start_idx == 64
    rows = _rows(2)
    cond = model.encode_prompts(PROMPTS, images=rows)
    # each prompt row: the pipeline's encode_prompt of that prompt with its images at the condition size (384^2 area)
    for i, row in enumerate(rows):
        resized = [pipe.image_processor.resize(row[0], 384, 384), pipe.image_processor.resize(row[1], 320, 480)]
        embeds, _ = pipe.encode_prompt(prompt=[PROMPTS[i]], image=resized, device="cpu")
        length = embeds.shape[1]
        assert cond.prompt_mask[i].sum() == length and not cond.prompt_embeds[i, length:].any()
        torch.testing.assert_close(cond.prompt_embeds[i, :length], embeds[0], rtol=0, atol=0)
        negative, _ = pipe.encode_prompt(prompt=[" "], image=resized, device="cpu")
        torch.testing.assert_close(cond.negative_prompt_embeds[i, : negative.shape[1]], negative[0], rtol=0, atol=0)
    # the negative reads each prompt's images: one row per prompt, gathered with the prompt rows
    assert cond.negative_per_row and cond.negative_prompt_embeds.shape == cond.prompt_embeds.shape
    assert (cond.negative_prompt_embeds[0] - cond.negative_prompt_embeds[1]).abs().max() > 1e-3
    picked = cond.select(torch.tensor([1, 1, 0]))
    assert torch.equal(picked.unconditional().prompt_embeds[0], cond.negative_prompt_embeds[1])
    assert torch.equal(picked.concat(cond.select(torch.tensor([0]))).negative_prompt_embeds[3],
                       cond.negative_prompt_embeds[0])
    # references: the VAE size from each image's aspect ratio (96^2 area: 96 x 96 and 128 x 64 px), VAE mode normalised
    assert [tuple(r.shape) for r in cond.references] == [(2, 16, 24, 24), (2, 16, 16, 32)]
    pixels = pipe.image_processor.preprocess(rows[1][1], 64, 128).unsqueeze(2)
    assert_close_ulps(cond.references[1][1], pipe._encode_vae_image(pixels, None)[0, :, 0], ulps=16)  # a batch of 2
    x = latents(model, 2)
    assert model.velocity(x, torch.tensor([0.9, 0.4]), cond).shape == x.shape
    # a text-only prompt runs as the pipeline's methods without an image (no references, one shared negative)
    plain = model.encode_prompts(PROMPTS)
    assert plain.references is None and not plain.negative_per_row and plain.negative_prompt_embeds.shape[0] == 1
    assert torch.isfinite(model.velocity(x, 0.5, plain)).all()


def test_refusals_name_the_fix(folder):
    model = load(folder)
    with pytest.raises(ModelConfigError, match="takes 1 to 3 condition image"):
        model.encode_prompts(PROMPTS[:1], images=[_images(0) + _images(1)])
    with pytest.raises(ModelConfigError, match="condition image 1 of these prompts comes to 2 different sizes"):
        model.encode_prompts(PROMPTS, images=[_images(0)[:1], _images(1)[1:]])
    with pytest.raises(ValueError, match=r"set model.max_sequence_length >= \d+"):
        load(folder, max_sequence_length=16).encode_prompts(PROMPTS[:1], images=[_images(0)])


@pytest.mark.parametrize("count", [1, 2], ids=["one_reference", "two_references"])
def test_the_whole_edit_matches_the_pipeline(folder, count):
    model = load(folder)
    rows = _rows(count)
    x_T = latents(model, len(PROMPTS), seed=3)
    expected = pipeline_ode(folder, x_T, rows)
    assert (expected - x_T).abs().max() > 0.5  # the ODE moved
    ours = adapter_ode(model, x_T, rows)
    assert_close_ulps(ours, expected, ulps=64)
    assert_close_ulps(model.decode(ours), pipeline_ode(folder, x_T, rows, output_type="pt"), ulps=64)
    # the images matter: other images (same sizes) end elsewhere
    other = adapter_ode(model, x_T, [_images(seed + 7)[:count] for seed in range(len(PROMPTS))])
    assert (other - ours).abs().max() > 1e-3


def _negative_without_images(monkeypatch):
    """CFG against the plain " " (the text-to-image negative), not the template with the prompt's images."""
    monkeypatch.setattr(QwenImageEditModel, "_encode_prompts",
                        lambda self, prompts, chunk, images=None: super(QwenImageEditModel, self)._encode_prompts(
                            prompts, chunk, images))


def _vlm_without_images(monkeypatch):
    """The instruction encoded without its pictures (the VLM never sees them)."""
    monkeypatch.setattr(QwenImageEditModel, "_encode_with_images", lambda self, prompts, images: self._encode(prompts))


def _references_at_the_output_size(monkeypatch):
    """Kontext's rule (the reference resized to the output size) instead of the pipeline's VAE area."""
    monkeypatch.setattr(QwenImageEditModel, "_pipeline_module",
                        lambda self: type("sizes", (), dict(calculate_dimensions=staticmethod(lambda area, r: (SIZE, SIZE)),
                                                            CONDITION_IMAGE_SIZE=plus.CONDITION_IMAGE_SIZE,
                                                            VAE_IMAGE_SIZE=VAE_AREA)))


@pytest.mark.parametrize("broken", [_negative_without_images, _vlm_without_images, _references_at_the_output_size],
                         ids=lambda f: f.__name__.strip("_"))
def test_negative_control_a_broken_convention_fails_the_match(folder, broken, monkeypatch):
    """The comparison above can fail: with one of the pipeline's conventions broken, the edit ends far from the
    pipeline's (thousands of ulps; the match holds within 64)."""
    x_T = latents(load(folder), 1, seed=3)
    rows = _rows(1)[:1]
    expected = pipeline_ode(folder, x_T, rows)
    broken(monkeypatch)
    ours = adapter_ode(load(folder), x_T, rows)
    ulp = torch.finfo(torch.float32).eps * expected.abs().max()
    assert (ours - expected).abs().max() > 1000 * ulp


def test_lora_exported_loads_into_the_pipeline(folder, tmp_path):
    model = load(folder)
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    rows = _rows(1)
    x_T = latents(model, len(PROMPTS), seed=6)
    ours = adapter_ode(model, x_T, rows)
    assert_close_ulps(ours, pipeline_ode(folder, x_T, rows, lora=str(tmp_path / "lora")), ulps=64)
    with model.reference():
        assert (adapter_ode(model, x_T, rows) - ours).abs().max() > 1e-2
