"""Model adapters: one small file per family on the real diffusers components (see base.py; the config schema is config.py).

``load_model(cfg)`` picks the family from ``cfg.family`` ("sd3", "flux"); families import lazily.
"""

from flowgrpo.models.base import Conditioning, FlowModel, load_model
from flowgrpo.models.config import (
    DEFAULT_LORA_TARGETS,
    ModelConfig,
    attention_backends,
    families,
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
