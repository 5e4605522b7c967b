"""Helpers shared by the SD3 and FLUX adapter tests."""

import torch

from flowgrpo.models import load_model


def load_family(family: str, folder, default_guidance: float, **overrides):
    cfg = dict(family=family, pretrained=folder, resolution=32, device="cpu", max_sequence_length=16,
               guidance_scale=default_guidance, lora_rank=4, lora_alpha=8.0)
    cfg.update(overrides)
    return load_model(cfg)


def latents(model, n, seed=0):
    return torch.randn(n, *model.latent_shape(), generator=torch.Generator().manual_seed(seed))


def perturb_lora(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def flowgrpo_ode_latents(model, prompts, x_T, num_steps, guidance_scale=None, sigmas=None):
    """flowgrpo's own evaluation sampler through the adapter: Euler ODE from x_T [N, *latent_shape] (unpacked)
    along ``time_grid(num_steps, model.shift)`` (or the grid ``sigmas`` [T + 1], e.g. a pipeline scheduler's own),
    one prompt per latent; returns float32 x_0."""
    from samplers.grids import time_grid
    from samplers.solvers import sample_ode

    cond = model.encode_prompts(list(prompts))
    velocity = model.velocity_fn(cond, guidance_scale)
    index = torch.arange(len(prompts))
    grid = time_grid(num_steps, model.shift_for(num_steps), model.shift_terminal) if sigmas is None else sigmas
    return sample_ode(velocity, x_T.float(), grid, index).float()


def pipeline_sigmas(num_steps):
    """The unshifted sigmas the pipelines are given (their default ``np.linspace(1, 1 / T, T)``): with the
    scheduler's shift they are flowgrpo's ``time_grid`` without its final 0."""
    import numpy as np

    return list(np.linspace(1.0, 1.0 / num_steps, num_steps))
