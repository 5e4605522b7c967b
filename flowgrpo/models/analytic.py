"""The analytic family: a Gaussian-mixture world whose base velocity is exact (docs/math.md §6).

The world (modes, prompts, scores, the KL-regularised optimum) is ``worlds/analytic.py``; this file
is its model, behind the same adapter interface as SD3, FLUX and Wan, so the same trainer, plans,
executor, kernels, losses, advantages, checkpoints and run directory run it. Nothing else knows it
is not a diffusion transformer:

- ``encode_prompts``: a prompt's "embedding" is what the model reads of it: its base mixture
  weights w [K] (``prompt_embeds`` [P, 1, K], read by the exact velocity) and the multi-hot of its
  target modes (``pooled_prompt_embeds`` [P, K], read by the trainable network). The unconditional
  row (classifier-free guidance) has uniform weights and no targets.
- ``velocity(x, σ, cond)`` = the exact rectified-flow velocity of the prompt's mixture, in float64:
      v(x, σ) = Σ_k π_k(x, σ)·v_k(x, σ),  v_k = −m_k + (σ − (1−σ)·s_k²)/c_k² · (x − (1−σ)·m_k),
      c_k² = (1−σ)²·s_k² + σ²,  π_k ∝ w_k·N(x; (1−σ)·m_k, c_k²·I)
  plus a small trainable network (``ResidualVelocity``: an MLP on x, Fourier features of σ and the
  target multi-hot) whose output layer starts at zero, so the initial policy *is* the base. The
  reference policy is the base (a frozen copy of the zero-initialised network).
- ``decode`` is the identity: samples are [N, d] vectors, scored by vector rewards
  (``analytic_hit``, ``analytic_smooth``); ``preview`` draws each as a scatter plot (the plane of
  the modes) among the other samples of its group, for the run directory and the gallery.

``pretrained: analytic`` starts from the zero network; a folder saved by ``save_trainable`` (a
checkpoint's ``model/``) loads a trained one. Only ``finetune: full`` applies (the network is the
whole trainable part). Docs: docs/analytic_world.md.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin

from flowgrpo.models.base import FlowModel
from flowgrpo.models.conditioning import Conditioning
from worlds import analytic as world

HIDDEN = 64  # width of the residual network's hidden layers
LAYERS = 2  # hidden layers
FREQUENCIES = 4  # Fourier features sin/cos(2^j·π·σ), j < FREQUENCIES
PREVIEW_SIZE = 128  # pixels of a scatter-plot preview
PREVIEW_EXTENT = 3.4  # the preview shows [−extent, extent]² of the modes' plane


class ResidualVelocity(ModelMixin, ConfigMixin):
    """The trainable part of the analytic policy: r_θ(x, σ, c) added to the exact base velocity.

    An MLP on [x, targets c, sin/cos(2^j·π·σ)] with SiLU activations; its output layer is zero at
    initialisation, so r_θ ≡ 0 and the policy starts as the base model exactly."""

    @register_to_config
    def __init__(self, dim: int = 2, cond_dim: int = world.NUM_MODES, hidden: int = HIDDEN, layers: int = LAYERS,
                 frequencies: int = FREQUENCIES):
        super().__init__()
        widths = [dim + cond_dim + 2 * frequencies] + [hidden] * layers
        body: list[torch.nn.Module] = []
        for width_in, width_out in zip(widths[:-1], widths[1:]):
            body += [torch.nn.Linear(width_in, width_out), torch.nn.SiLU()]
        self.body = torch.nn.Sequential(*body)
        self.out = torch.nn.Linear(hidden, dim)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(frequencies, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """x [N, d], sigma [N], cond [N, K] -> r [N, d] in x's dtype."""
        angles = sigma.to(x.dtype).unsqueeze(1) * self.freqs.to(x.dtype)
        features = torch.cat([x, cond.to(x.dtype), angles.sin(), angles.cos()], 1)
        return self.out(self.body(features))


def mixture_velocity(x: torch.Tensor, sigma: torch.Tensor, weights: torch.Tensor, means: torch.Tensor,
                     stds: torch.Tensor) -> torch.Tensor:
    """The exact velocity E[x1 − x0 | x_σ = x] of the mixture Σ_k w_k·N(m_k, s_k²·I) (docs/math.md §6).

    x [N, d], sigma [N], weights [N, K] (rows sum to 1), means [K, d], stds [K] -> v [N, d] float64.
    Distances expand as |x|² − 2a·x·m_k + a²·|m_k|² (a = 1 − σ), so the cost is two [N, d]×[d, K]
    products, whatever the number of modes."""
    x = x.double()
    d = x.shape[1]
    sigma = sigma.double().reshape(-1, 1)  # [N, 1]
    a = 1.0 - sigma
    var = stds.double().square().unsqueeze(0)  # [1, K]
    c2 = a.square() * var + sigma.square()  # [N, K]
    means = means.double()
    sq = x.square().sum(1, keepdim=True) - 2.0 * a * (x @ means.T) + a.square() * means.square().sum(1)  # |x − a·m_k|²
    logits = torch.log(weights.double()) - sq / (2.0 * c2) - 0.5 * d * torch.log(c2)
    post = torch.softmax(logits, 1)  # π_k(x, σ)
    gain = post * (sigma - a * var) / c2  # π_k · (σ − (1−σ)s_k²)/c_k²
    # Σ_k π_k·[gain_k·(x − a·m_k) − m_k]
    return gain.sum(1, keepdim=True) * x - (a * gain + post) @ means


class AnalyticModel(FlowModel):
    """The Gaussian-mixture world as a flow model (see the module docstring)."""


    def _load_components(self) -> None:
        cfg = self.config
        if cfg.finetune != "full":
            raise ValueError(
                f"model.family=analytic trains its residual network in full (finetune={cfg.finetune!r} was asked); "
                "set model.finetune: full"
            )
        self.dim = int(cfg.dim)
        self.means = world.mode_means(self.dim).to(self.device)  # [K, d] float64
        self.stds = torch.full((world.NUM_MODES,), world.MODE_STD, dtype=torch.float64, device=self.device)
        if cfg.pretrained == "analytic":  # the base model: the zero network
            network = ResidualVelocity(dim=self.dim)
        else:
            folder = os.path.expanduser(cfg.pretrained)
            if not os.path.isdir(folder):
                raise FileNotFoundError(
                    f"model.pretrained={cfg.pretrained!r}: the analytic family starts from 'analytic' (the exact "
                    "base) or a folder its save_trainable wrote (a checkpoint's model/)"
                )
            network = ResidualVelocity.from_pretrained(folder)
            if network.config.dim != self.dim:
                raise ValueError(f"{folder} holds a network for d = {network.config.dim}, but model.dim = {self.dim}")
        # torch's own .to: diffusers' warns about keeping modules in float32, which this network has none of
        self.transformer = torch.nn.Module.to(network, self.device, self.dtype).requires_grad_(False).eval()

    def _scheduler_shift(self) -> float:
        return 1.0  # no scheduler: the configs set model.shift (configs/models/analytic.yaml: 3, as SD3)

    def _encode(self, prompts: list[str]):
        targets = torch.stack([  # the empty prompt is the unconditional row: no targets, uniform weights
            torch.zeros(world.NUM_MODES) if not p.strip() else world.target_mask([p])[0] for p in prompts])
        weights = world.base_weights(targets).float()
        return weights.unsqueeze(1).to(self.device), targets.to(self.device), None

    def _transformer_velocity(self, transformer, x, sigma, cond: Conditioning, guidance_scale):
        base = mixture_velocity(x, sigma, cond.prompt_embeds[:, 0, :], self.means, self.stds)
        return (base + transformer(x, sigma, cond.pooled_prompt_embeds).double()).float()

    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        return (int(self.config.dim),)

    def _check_latents(self, x: torch.Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.config.dim:
            raise ValueError(f"samples of shape {tuple(x.shape)} do not fit the analytic model: expected "
                             f"[N, {self.config.dim}] (model.dim)")

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The identity: samples [N, d] float32 are what the rewards score."""
        return latents.to(self.device).float()

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device).float()

    def preview(self, media: torch.Tensor, groups: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """One scatter plot per sample [N, 3, S, S] in [0, 1]: the plane of the modes (target modes
        green, the others grey), the other samples of the group as grey dots, the sample itself red
        (a hit on a target mode: blue)."""
        return scatter_previews(media.detach().cpu(), torch.as_tensor(groups).cpu(), prompts)


def scatter_previews(points: torch.Tensor, groups: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """See ``AnalyticModel.preview``: points [N, d] -> images [N, 3, S, S] float32."""
    from PIL import Image, ImageDraw

    size, extent = PREVIEW_SIZE, PREVIEW_EXTENT
    scale = (size - 1) / (2 * extent)

    def pixel(xy) -> tuple[float, float]:  # plane coordinates -> pixels (y up)
        return ((float(xy[0]) + extent) * scale, (extent - float(xy[1])) * scale)

    plane = points[:, :2].double()
    means = world.mode_means(2)
    nearest = world.nearest_mode(points)
    ring = 2 * world.MODE_STD * scale
    out = torch.empty(len(points), 3, size, size)
    for i, prompt in enumerate(prompts):
        targets = set(world.parse_targets(prompt)) if prompt.strip() else set()
        image = Image.new("RGB", (size, size), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        for k, m in enumerate(means):
            cx, cy = pixel(m)
            fill = (200, 240, 200) if k in targets else (236, 236, 236)
            draw.ellipse((cx - ring, cy - ring, cx + ring, cy + ring), fill=fill, outline=(150, 150, 150))
        for j in (groups == groups[i]).nonzero().squeeze(1).tolist():
            if j != i:
                px, py = pixel(plane[j])
                draw.ellipse((px - 1.5, py - 1.5, px + 1.5, py + 1.5), fill=(110, 110, 110))
        px, py = pixel(plane[i])
        colour = (30, 90, 220) if int(nearest[i]) in targets else (220, 40, 40)
        draw.ellipse((px - 4, py - 4, px + 4, py + 4), fill=colour, outline=(0, 0, 0))
        out[i] = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(size, size, 3).permute(2, 0, 1).float() / 255
    return out


__all__ = ["AnalyticModel", "ResidualVelocity", "mixture_velocity", "scatter_previews"]
