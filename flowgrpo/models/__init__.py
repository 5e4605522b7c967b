"""Model adapters: one small file per family on the real diffusers components (see base.py).

``load_model(cfg)`` picks the family from ``cfg.family`` ("sd3", "flux"); families import lazily.
"""

from flowgrpo.models.base import (
    DEFAULT_LORA_TARGETS,
    Conditioning,
    FlowModel,
    ModelConfig,
    attention_backends,
    families,
    load_model,
    register_family,
    validate_model_config,
)

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "Conditioning",
    "FlowModel",
    "ModelConfig",
    "attention_backends",
    "families",
    "load_model",
    "register_family",
    "validate_model_config",
]
