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
