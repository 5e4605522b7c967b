"""Model adapters: one small file per family on the real diffusers components (see base.py; the config schema is config.py).

``load_model(cfg)`` picks the family from ``cfg.family`` (its record in families.py); adapters import lazily.
"""

from flowgrpo.models.base import FlowModel, load_model
from flowgrpo.models.conditioning import Conditioning
from flowgrpo.models.config import ModelConfig, attention_backends, validate_model_config
from flowgrpo.models.families import DEFAULT_LORA_TARGETS, FAMILIES, Family, families, register_family

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "Conditioning",
    "FAMILIES",
    "Family",
    "FlowModel",
    "ModelConfig",
    "attention_backends",
    "families",
    "load_model",
    "register_family",
    "validate_model_config",
]
