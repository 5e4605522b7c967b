"""FLUX.2 with reference images (``Flux2KleinPipeline`` / ``Flux2Pipeline``, ``image=``) against the pipelines at tiny
sizes (random weights, no downloads; flowgrpo/tiny/flux2.py).

The adapters' whole ODE (flowgrpo's sampler and grid; klein with batched CFG, dev with embedded guidance; each prompt's
references encoded at their own size, packed after the latent's tokens with ids T = 10, 20, ...) equals the pipelines'
own call (prompt by prompt: a pipeline call shares its references across its batch) with one and with two
references, latents and decoded images; a reference on the latent's time coordinate, or resized where the pipeline
crops, breaks the match; the exported LoRA loads into the pipeline and samples the same. Text-only prompts are
tests/models/test_flux2.py's, unchanged.

The references: 64 x 64 px (the pipelines' smallest side) and 100 x 70 px, which the pipelines floor to 96 x 64 and
center-crop: 64 and 96 reference tokens at the tiny VAE's 4x compression and 2x2 patchify.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from flowgrpo.models.config import ModelConfigError
from model_helpers import latents, load_family, perturb_lora  # noqa: E402
from tolerance import assert_close_ulps  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a busy 2-core machine (tests/conftest.py)

PROMPTS = ["put the red circle on the blue square", "a green triangle left of a yellow star"]
STEPS, SIZE, GUIDANCE = 4, 32, 4.0
DEV_TEXT = 48  # FLUX.2-dev's system message alone is ~30 tokens (tests/models/test_flux2.py)


def _images(seed: int, sizes=((64, 64), (100, 70))) -> list:
    """One prompt's reference images (width x height)."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _rows(count: int, offset: int = 0) -> list[list]:
    return [_images(seed + offset)[:count] for seed in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def klein_folder(tmp_path_factory):
    from flowgrpo.tiny.flux2 import save_tiny_flux2_klein

    return save_tiny_flux2_klein(tmp_path_factory.mktemp("tiny_flux2_klein_refs"), PROMPTS)


@pytest.fixture(scope="module")
def dev_folder(tmp_path_factory):
    from flowgrpo.tiny.flux2 import save_tiny_flux2

    return save_tiny_flux2(tmp_path_factory.mktemp("tiny_flux2_dev_refs"), PROMPTS)


def load_klein(folder):
    return load_family("flux2_klein", folder, GUIDANCE, sample_steps=STEPS)


def load_dev(folder):
    return load_family("flux2", folder, GUIDANCE, sample_steps=STEPS, max_sequence_length=DEV_TEXT)


def _pipe(folder, dev=False, lora=None):
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    pipe = (Flux2Pipeline if dev else Flux2KleinPipeline).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    return pipe


def adapter_ode(model, x_T, rows):
    from samplers.grids import time_grid
    from samplers.solvers import sample_ode

    cond = model.encode_prompts(PROMPTS[: len(rows)], images=rows)
    grid = time_grid(STEPS, model.shift_for(STEPS), model.shift_terminal)
    return sample_ode(model.velocity_fn(cond), x_T.float(), grid, torch.arange(len(rows))).float()


def pipeline_ode(pipe, x_T, rows, output_type="latent", text=16):
    """The pipeline's own call prompt by prompt from the noise x_T [N, C, h, w]: x_0 in the flow's space (or its
    decoded images)."""
    out = []
    for i, row in enumerate(rows):
        result = pipe(image=row, prompt=PROMPTS[i], height=SIZE, width=SIZE, num_inference_steps=STEPS,
                      guidance_scale=GUIDANCE, latents=x_T[i : i + 1].clone(), max_sequence_length=text,
                      output_type=output_type).images
        if output_type == "latent":
            if result.ndim == 3:  # Flux2Pipeline: the packed tokens
                result = pipe._unpack_latents_with_ids(result, pipe._prepare_latent_ids(x_T[i : i + 1]))
            else:  # Flux2KleinPipeline: de-normalised, unpatchified VAE latents
                mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
                std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
                result = (pipe._patchify_latents(result) - mean) / std
        out.append(result)
    return torch.cat(out)


def test_references_are_the_pipelines(klein_folder):
    model = load_klein(klein_folder)
    assert model.max_references == 4
    rows = _rows(2)
    cond = model.encode_prompts(PROMPTS, images=rows)
    plain = model.encode_prompts(PROMPTS)
    # the text encoder does not read the images; the negative is the shared empty prompt
    assert torch.equal(cond.prompt_embeds, plain.prompt_embeds) and not cond.negative_per_row
    assert [tuple(r.shape) for r in cond.references] == [(2, 16, 8, 8), (2, 16, 8, 12)]
    # the pipeline's own preprocessing (crop to 96 x 64) and prepare_image_latents, for the second prompt
    pipe = model.pipeline
    pixels = [pipe.image_processor.preprocess(rows[1][0], height=64, width=64, resize_mode="crop"),
              pipe.image_processor.preprocess(rows[1][1], height=64, width=96, resize_mode="crop")]
    tokens, ids = pipe.prepare_image_latents(pixels, batch_size=1, generator=None, device="cpu", dtype=torch.float32)
    ours = torch.cat([pipe._pack_latents(r[1:2]) for r in cond.references], dim=1)
    assert_close_ulps(ours, tokens, ulps=16)  # a batch of 2 VAE encodings against one
    assert ids[0, :64, 0].eq(10).all() and ids[0, 64:, 0].eq(20).all()
    x = latents(model, 2)
    assert model.velocity(x, torch.tensor([0.9, 0.4]), cond).shape == x.shape


def test_refusals(klein_folder):
    model = load_klein(klein_folder)
    with pytest.raises(ModelConfigError, match="takes 1 to 4 condition image"):
        model.encode_prompts(PROMPTS[:1], images=[_images(0) + _images(1) + _images(2)[:1]])
    with pytest.raises(ModelConfigError, match="reference image 1 of these prompts comes to 2 different sizes"):
        model.encode_prompts(PROMPTS, images=[_images(0)[:1], _images(1)[1:]])
    with pytest.raises(ValueError, match="at least 64px"):  # the pipelines' own check
        model.encode_prompts(PROMPTS[:1], images=[_images(0, sizes=((48, 64),))])


@pytest.mark.parametrize("count", [1, 2], ids=["one_reference", "two_references"])
def test_klein_edit_matches_the_pipeline(klein_folder, count):
    model = load_klein(klein_folder)
    assert model._uses_cfg(GUIDANCE)  # the base klein: CFG, the references in both passes
    rows = _rows(count)
    x_T = latents(model, len(PROMPTS), seed=3)
    pipe = _pipe(klein_folder)
    expected = pipeline_ode(pipe, x_T, rows)
    assert (expected - x_T).abs().max() > 0.5  # the ODE moved
    ours = adapter_ode(model, x_T, rows)
    assert_close_ulps(ours, expected, ulps=64)
    assert_close_ulps(model.decode(ours), pipeline_ode(pipe, x_T, rows, output_type="pt"), ulps=128)
    assert (adapter_ode(model, x_T, _rows(count, offset=5)) - ours).abs().max() > 1e-3  # the references matter


def test_dev_edit_matches_the_pipeline(dev_folder):
    model = load_dev(dev_folder)
    rows = _rows(2)
    x_T = latents(model, len(PROMPTS), seed=4)
    expected = pipeline_ode(_pipe(dev_folder, dev=True), x_T, rows, text=DEV_TEXT)
    assert_close_ulps(adapter_ode(model, x_T, rows), expected, ulps=64)


def _references_on_the_latents_frame(monkeypatch):
    """Every reference id with T = 0 (the latent's), instead of 10, 20, ..."""
    from diffusers import Flux2KleinPipeline

    real = Flux2KleinPipeline._prepare_image_ids
    monkeypatch.setattr(Flux2KleinPipeline, "_prepare_image_ids", staticmethod(lambda latents: real(latents, scale=0)))


def _references_resized_not_cropped(monkeypatch):
    """The 100 x 70 reference resized to 96 x 64 (the image processor's default) where the pipelines crop it."""
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    real = Flux2ImageProcessor.preprocess
    monkeypatch.setattr(Flux2ImageProcessor, "preprocess",
                        lambda self, image, height=None, width=None, resize_mode="default", **kw: real(
                            self, image, height=height, width=width, **kw))


@pytest.mark.parametrize("broken", [_references_on_the_latents_frame, _references_resized_not_cropped],
                         ids=lambda f: f.__name__.strip("_"))
def test_negative_control_a_broken_convention_fails_the_match(klein_folder, broken, monkeypatch):
    """The comparison above can fail: with one of the pipelines' conventions broken in the adapter, the edit ends
    far from the pipeline's (thousands of ulps; the match holds within 64)."""
    model = load_klein(klein_folder)
    rows = _rows(2)[:1]
    x_T = latents(model, 1, seed=3)
    expected = pipeline_ode(_pipe(klein_folder), x_T, rows)
    broken(monkeypatch)
    ours = adapter_ode(model, x_T, rows)
    ulp = torch.finfo(torch.float32).eps * expected.abs().max()
    assert (ours - expected).abs().max() > 1000 * ulp


def test_lora_exported_loads_into_the_pipeline(klein_folder, tmp_path):
    model = load_klein(klein_folder)
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    rows = _rows(1)
    x_T = latents(model, len(PROMPTS), seed=6)
    ours = adapter_ode(model, x_T, rows)
    assert_close_ulps(ours, pipeline_ode(_pipe(klein_folder, lora=str(tmp_path / "lora")), x_T, rows), ulps=64)
    with model.reference():
        assert (adapter_ode(model, x_T, rows) - ours).abs().max() > 1e-2
