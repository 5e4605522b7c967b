"""The training configuration: OmegaConf structured dataclasses, every field commented.

A run's config is built in layers, later ones winning:
  configs/default.yaml  →  configs/presets/<method>.yaml  →  configs/models/<model>.yaml (under
  ``model``)  →  the preset's paper recipe (real models only)  →  ``key=value`` overrides from the command line.
The first layer is the entry point's embedded default: ``configs/default.yaml`` (train_t2i.py, the
tiny SD3 on toy images) or ``configs/default_t2v.yaml`` (train_t2v.py, the tiny Wan on toy videos),
chosen with ``load_config(..., default=...)``.
``load_config`` merges and validates: unknown keys fail (with a "did you mean"), and impossible
numbers fail with an error that prints them.

    schema.py   the keys: each declared once with its rule (``key``), its default and a comment
    load.py     the layers and their merge, which layer set each key (``resolve``, ``load_config``)
    check.py    the checks before anything loads (``validate``, ``check_plan``)
"""

from flowgrpo.config.check import (
    MAX_ROLLOUT_NODES, check_plan, check_rules, plan_arguments, processes_check, resolved_plan, validate,
)
from flowgrpo.config.load import (
    LAYER_NAMES, METHOD_SECTIONS, RENAMED_METHODS, RETIRED_KEYS, TINY_WORLD_MODELS, WORLD_BLOCKS, Resolved,
    _resolve_yaml, is_real_model, load_config, preset_names, preset_plan, resolve,
)
from flowgrpo.config.schema import (
    LEARNERS, AdvantageConfig, AWMConfig, Config, DGPOConfig, EvalConfig, LearnerConfig, LogConfig, LossConfig,
    NFTConfig, RewardSpec, SamplingConfig, SoftCopyConfig, TrainConfig, key, rules_of, schema_defaults, to_yaml,
)
from flowgrpo.run.errors import ConfigError

__all__ = [
    "AWMConfig", "AdvantageConfig", "Config", "ConfigError", "DGPOConfig", "EvalConfig", "LAYER_NAMES", "LEARNERS",
    "LearnerConfig", "LogConfig", "LossConfig", "MAX_ROLLOUT_NODES", "METHOD_SECTIONS", "NFTConfig", "RENAMED_METHODS",
    "RETIRED_KEYS", "Resolved", "RewardSpec", "SamplingConfig", "SoftCopyConfig", "TINY_WORLD_MODELS", "TrainConfig",
    "WORLD_BLOCKS", "check_plan", "check_rules", "is_real_model", "key", "load_config", "plan_arguments", "preset_names",
    "preset_plan", "processes_check", "resolve", "resolved_plan", "rules_of", "schema_defaults", "to_yaml", "validate",
    "_resolve_yaml",  # the CLI reads a model config's family with it
]
