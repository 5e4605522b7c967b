"""The LAION aesthetic predictor ("improved aesthetic predictor", sac+logos+ava1-l14-linearMSE).

    score = MLP(e / ||e||),  e = CLIP ViT-L/14 image embedding,  MLP 768 -> 1024 -> 128 -> 64 -> 16 -> 1
    (linear layers, dropout after the first three, no activations; output roughly 1-10)

The original embeds with openai/clip ("ViT-L/14"); here the same weights through transformers
(openai/clip-vit-large-patch14) with the original's torchvision preprocessing (PIL bicubic resize of
the shortest side to 224, centre crop, CLIP mean/std). The MLP loads from the original .pth state dict
(keys layers.0.weight ... layers.7.bias) with torch.load(weights_only=True); its sizes are read from
the file, so tiny test heads load the same way.

Run: LaionAesthetic(pretrained="path/to/sac+logos+ava1-l14-linearMSE.pth")(images, prompts).
"""

from __future__ import annotations

import torch

from rewards.base import Reward, RewardOutput
from rewards.clip_rewards import CLIPBackbone
from rewards.common import LinearMLP, l2_normalize, load_exact, resolve_file, torch_load_weights

MLP_FILENAME = "sac+logos+ava1-l14-linearMSE.pth"


class LaionAesthetic(Reward):
    """pretrained: the MLP .pth (local file, folder holding it, or hub 'owner/repo[/file]');
    clip: the CLIP ViT-L/14 backbone (hub id or transformers folder)."""

    name = "aesthetic"
    modality = "image"

    def __init__(self, pretrained: str = MLP_FILENAME, clip: str = "openai/clip-vit-large-patch14", *,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, clip_model=None,
                 mlp: LinearMLP | None = None):
        source = None if clip_model is not None else clip
        self.clip = CLIPBackbone(source, source, model=clip_model, text=False, device=device, dtype=dtype,
                                 crop_rounding="round")  # openai/clip's torchvision CenterCrop
        if mlp is None:
            state = torch_load_weights(resolve_file(pretrained, MLP_FILENAME))
            mlp = LinearMLP(LinearMLP.sizes_from_state_dict(state))
            load_exact(mlp, state, f"aesthetic MLP {pretrained}")
        embed_dim = self.clip.model.config.projection_dim
        if mlp.layers[0].in_features != embed_dim:
            raise ValueError(
                f"aesthetic MLP takes {mlp.layers[0].in_features}-d embeddings but the CLIP projects to {embed_dim}; "
                "the sac+logos+ava1-l14 head needs CLIP ViT-L/14"
            )
        self.mlp = mlp.to(device=device, dtype=torch.float32).eval().requires_grad_(False)

    @torch.no_grad()
    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        embeds = l2_normalize(self.clip.image_features(images))
        scores = self.mlp(embeds.to(self.mlp.layers[0].weight.device)).squeeze(-1)
        return RewardOutput(scores=scores.float().cpu(), info={})

