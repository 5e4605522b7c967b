"""FLUX.1-Kontext (``flux_kontext``) against ``FluxKontextPipeline`` at tiny sizes (random weights, no downloads).

The adapter's whole ODE (flowgrpo's own sampler over the pipeline's sigma grid, the source packed after the latent's
tokens with its ids) is checked against the pipeline's own call, latents and decoded images; moving the source to the
latent's position ids on purpose must break the match. The exported LoRA loads into the pipeline and samples what the
adapter samples. A text-only family refuses condition images in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxPipeline
from PIL import Image

from flowgrpo.models.flux import FluxKontextModel
from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER
from model_helpers import latents, load_family, perturb_lora, pipeline_sigmas  # noqa: E402

PROMPTS = ["make the red circle blue", "remove the green square"]
STEPS, SIZE, GUIDANCE = 3, 32, 2.5


def _sources(n=2, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="module")
def kontext_folder(tmp_path_factory):
    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0, image_size=SIZE)
    folder = tmp_path_factory.mktemp("tiny_kontext")
    components = dict(pipe.components, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))
    FluxKontextPipeline(**components).save_pretrained(folder)
    return str(folder)


def load(folder, **overrides):
    return load_family("flux_kontext", folder, GUIDANCE, **overrides)


def adapter_ode(model, x_T, sources, sigmas):
    from samplers.solvers import sample_ode

    cond = model.encode_prompts(PROMPTS[: len(sources)], images=[[s] for s in sources])
    return sample_ode(model.velocity_fn(cond), x_T.float(), sigmas, torch.arange(len(sources))).float()


def pipeline_ode(folder, x_T, sources, output_type="latent", lora=None):
    pipe = FluxKontextPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    n, c, h, w = x_T.shape
    out = pipe(image=sources, prompt=PROMPTS[:n], height=SIZE, width=SIZE, num_inference_steps=STEPS,
               sigmas=pipeline_sigmas(STEPS), guidance_scale=GUIDANCE, latents=FluxPipeline._pack_latents(x_T.clone(), n, c, h, w),
               max_sequence_length=16, output_type=output_type, _auto_resize=False, max_area=SIZE * SIZE,
               return_dict=False)[0]
    if output_type == "latent":
        return FluxPipeline._unpack_latents(out, SIZE, SIZE, pipe.vae_scale_factor), pipe.scheduler.sigmas
    return out


def test_the_whole_edit_matches_the_pipeline(kontext_folder, monkeypatch):
    model = load(kontext_folder)
    assert isinstance(model, FluxKontextModel) and model.max_references == 1
    sources = _sources()
    x_T = latents(model, 2, seed=5)
    expected, sigmas = pipeline_ode(kontext_folder, x_T, sources)
    grid = torch.cat([sigmas[:-1].float(), torch.zeros(1)])
    x0 = adapter_ode(model, x_T, sources, grid)
    torch.testing.assert_close(x0, expected, rtol=0, atol=1e-5)
    images = pipeline_ode(kontext_folder, x_T, sources, output_type="pt")
    torch.testing.assert_close(model.decode(x0), images.float(), rtol=0, atol=1e-5)
    # the source matters, and where the pipeline puts it: a source on the latent's own position ids is another model
    other = adapter_ode(model, x_T, _sources(seed=1), grid)
    assert (other - x0).abs().max() > 1e-3
    real = FluxPipeline._prepare_latent_image_ids
    calls = []

    def no_frame(n, h, w, device, dtype):  # every id with first coordinate 0: the source's ids become the latent's
        ids = real(n, h, w, device, dtype)
        calls.append(1)
        return _ZeroFirst(ids)

    monkeypatch.setattr(FluxPipeline, "_prepare_latent_image_ids", staticmethod(no_frame))
    broken = adapter_ode(model, x_T, sources, grid)
    assert calls and (broken - expected).abs().max() > 1e-4


class _ZeroFirst(torch.Tensor):
    """Ids whose first coordinate stays 0 when assigned (the source's ``ids[..., 0] = 1`` is lost)."""

    @staticmethod
    def __new__(cls, ids):
        return ids.as_subclass(cls)

    def __setitem__(self, key, value):
        pass


def test_lora_exported_loads_into_the_pipeline(kontext_folder, tmp_path):
    model = load(kontext_folder)
    perturb_lora(model)
    model.save_trainable(tmp_path / "lora")
    sources = _sources()
    x_T = latents(model, 2, seed=6)
    expected, sigmas = pipeline_ode(kontext_folder, x_T, sources, lora=str(tmp_path / "lora"))
    x0 = adapter_ode(model, x_T, sources, torch.cat([sigmas[:-1].float(), torch.zeros(1)]))
    torch.testing.assert_close(x0, expected, rtol=0, atol=1e-5)
    with model.reference():
        assert (adapter_ode(model, x_T, sources, torch.cat([sigmas[:-1].float(), torch.zeros(1)])) - x0).abs().max() > 1e-3


def test_condition_images_are_refused_where_they_cannot_go(kontext_folder):
    from flowgrpo.models.config import ModelConfigError

    model = load(kontext_folder)
    with pytest.raises(ModelConfigError, match="takes 1 to 1 condition image"):
        model.encode_prompts(PROMPTS, images=[_sources(2), _sources(2)])
    text_only = load_family("flux", kontext_folder, GUIDANCE)
    with pytest.raises(ModelConfigError, match="generates from text alone; train an editing family .*flux_kontext"):
        text_only.encode_prompts(PROMPTS, images=[[s] for s in _sources()])
