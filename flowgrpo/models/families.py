"""The model families: one record each (``Family``), registered the same way for the built-in ones and a user's.

A family is what ``model.family`` names: its adapter (a FlowModel subclass, imported on first use so that its
optional dependencies stay optional), what it makes, the pipeline components whose published configs describe it
(the memory plan and ``model.random_weights`` read them), the LoRA targets it trains by default, and whether the
memory planner has an activation inventory of its blocks. Adding a family touches its adapter, its model config
YAML (configs/models/) and one ``register_family(Family(...))`` (docs/models.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

# Flow-GRPO's LoRA targets: every attention projection of the joint (MM-DiT) blocks. The names are the same in SD3's
# and FLUX's transformers (FLUX's single-stream blocks have no `to_out`). Also the schema default of
# model.lora_target_modules, which stands for the family's own default.
DEFAULT_LORA_TARGETS = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
)
MODALITIES = ("image", "video", "vector")


@dataclass(frozen=True)
class Family:
    """What flowgrpo knows of a model family besides its adapter's code."""

    name: str
    adapter: str  # "module:Class" of its FlowModel subclass
    # what its model makes: "image" (decode -> [N, 3, H, W]), "video" (decode -> [N, F, 3, H, W]) or "vector"
    modality: str = "image"
    temporal_factor: Optional[int] = None  # video: the VAE's temporal compression (num_frames = k * factor + 1)
    components: tuple[str, ...] = ()  # the pipeline components whose configs describe it (memory plan, random weights)
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS  # module-name suffixes LoRA wraps by default
    # the memory planner's activation inventory of its blocks ("sd3", "flux", "wan": flowgrpo/memory/inventory.py); None:
    # none, measure the family on a GPU (benchmarks/bench_memory.py)
    memory_inventory: Optional[str] = None
    transformer_class: Optional[str] = None  # its denoising network's diffusers class (memory plan, context parallelism)
    geometry: Optional[str] = None  # the family whose latent and token geometry it shares (None: its own)
    # condition images a prompt may carry (an editing family's source and references; flowgrpo/conditions.py); 0: none
    max_references: int = 0
    # the condition images a prompt carries when the memory plan is not told (``flowgrpo plan --references``; a run
    # counts its own prompt set's): 1 for a family that always edits a source, 0 where references are optional
    plan_references: int = 0

    def adapter_class(self) -> type:
        """The FlowModel subclass (imported now)."""
        module_name, class_name = self.adapter.split(":")
        return getattr(importlib.import_module(module_name), class_name)


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Add (or replace) a model family; its adapter may be given as the class itself."""
    if not isinstance(family.adapter, str):
        family = Family(**{**family.__dict__, "adapter": f"{family.adapter.__module__}:{family.adapter.__qualname__}"})
    if family.modality not in MODALITIES:
        raise ValueError(f"family {family.name!r}: modality={family.modality!r}; use one of {MODALITIES}")
    if (family.modality == "video") != (family.temporal_factor is not None):
        raise ValueError(f"family {family.name!r}: a video family gives its VAE's temporal_factor, an image family none")
    FAMILIES[family.name] = family


def families() -> list[str]:
    return sorted(FAMILIES)


# ----------------------------------------------------------------------------- the built-in families
register_family(Family("sd3", "flowgrpo.models.sd3:SD3Model", memory_inventory="sd3", transformer_class="SD3Transformer2DModel",
                       components=("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae")))
register_family(Family("flux", "flowgrpo.models.flux:FluxModel", memory_inventory="flux", transformer_class="FluxTransformer2DModel",
                       components=("transformer", "text_encoder", "text_encoder_2", "vae")))
# Wan's LoRA targets: the query/key/value/output projections of every self-attention (attn1) and cross-attention
# (attn2) block, as diffusers' and DanceGRPO's Wan LoRA training choose. Wan2.2 A14B adds transformer_2.
# FLUX.1-Kontext: FLUX.1 with the edit's source image as a second token sequence (flowgrpo/models/flux.py)
register_family(Family("flux_kontext", "flowgrpo.models.flux:FluxKontextModel", memory_inventory="flux",
                       transformer_class="FluxTransformer2DModel", components=("transformer", "text_encoder", "text_encoder_2", "vae"),
                       geometry="flux", max_references=1, plan_references=1))
register_family(Family("wan", "flowgrpo.models.wan:WanModel", modality="video", temporal_factor=4, memory_inventory="wan",
                       components=("transformer", "text_encoder", "vae"), lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
                       transformer_class="WanTransformer3DModel"))
register_family(Family("qwen_image", "flowgrpo.models.qwen_image:QwenImageModel",
                       components=("transformer", "text_encoder", "vae"), transformer_class="QwenImageTransformer2DModel"))
# Qwen-Image-Edit-2509 / 2511 (QwenImageEditPlusPipeline): Qwen-Image whose VLM reads the condition images and whose
# transformer takes their tokens after the latent's (flowgrpo/models/qwen_image_edit.py); the pipeline takes a list of
# any length, the model cards' multi-image editing is 1 to 3 images
register_family(Family("qwen_image_edit", "flowgrpo.models.qwen_image_edit:QwenImageEditModel",
                       components=("transformer", "text_encoder", "vae"), transformer_class="QwenImageTransformer2DModel",
                       geometry="qwen_image", max_references=3, plan_references=1))
# FLUX.2's adapter adds its single-stream blocks' projections to these (flowgrpo/models/flux2.py). Both pipelines take
# reference images (image=, any number); BFL's documented limits: [dev] 6 at most recommended, [klein] up to 4
register_family(Family("flux2", "flowgrpo.models.flux2:Flux2Model", components=("transformer", "text_encoder", "vae"),
                       transformer_class="Flux2Transformer2DModel", max_references=6))
register_family(Family("flux2_klein", "flowgrpo.models.flux2:Flux2KleinModel",
                       components=("transformer", "text_encoder", "vae"), transformer_class="Flux2Transformer2DModel",
                       geometry="flux2", max_references=4))
# diffusers' examples/dreambooth/train_dreambooth_lora_z_image.py default (--lora_layers unset): every attention
# projection of ZImageTransformerBlock (the main layers and both refiners)
register_family(Family("z_image", "flowgrpo.models.z_image:ZImageModel", components=("transformer", "text_encoder", "vae"),
                       lora_targets=("to_k", "to_q", "to_v", "to_out.0"), transformer_class="ZImageTransformer2DModel"))
# the Gaussian-mixture world with an exact velocity (docs/analytic_world.md): no pipeline, no LoRA
register_family(Family("analytic", "flowgrpo.models.analytic:AnalyticModel", modality="vector"))


__all__ = ["DEFAULT_LORA_TARGETS", "FAMILIES", "Family", "MODALITIES", "families", "register_family"]
