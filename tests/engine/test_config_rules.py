"""Every config key declares what values it takes (a ``RULES`` table beside its class's fields, flowgrpo/config.py),
and every value outside is refused before anything loads, in one line naming the key, the value and what is allowed."""

from dataclasses import fields, is_dataclass

import pytest

from flowgrpo.config import Config, ConfigError, load_config


def _keys(cls, prefix=""):
    """(class, field name, dotted key) of every leaf key of the config schema (the model config has its own validator;
    rewards are RewardSpecs)."""
    from flowgrpo.config import RewardSpec

    for f in fields(cls):
        if f.name == "model":
            continue
        default = f.default_factory() if callable(getattr(f, "default_factory", None)) else f.default
        if is_dataclass(default):
            yield from _keys(type(default), f"{prefix}{f.name}.")
        elif f.name == "rewards":
            yield from _keys(RewardSpec, f"{prefix}rewards[0].")
        else:
            yield cls, f.name, f"{prefix}{f.name}"


def test_every_key_declares_its_rule():
    missing = [key for cls, name, key in _keys(Config) if name not in getattr(cls, "RULES", {})]
    assert not missing, f"config keys without a rule in their class's RULES: {missing}"
    stale = [f"{cls.__name__}.{name}" for cls in {c for c, _, _ in _keys(Config)}
             for name in getattr(cls, "RULES", {}) if name not in {f.name for f in fields(cls)}]
    assert not stale, f"rules for keys that do not exist: {stale}"


@pytest.mark.parametrize("override, message", [
    ("train.adam_betas=[1.5,0.9]", r"train.adam_betas=\(1.5, 0.9\) is not allowed; use two numbers in \[0, 1\)"),
    ("train.learning_rate=-1", r"train.learning_rate=-1.0 is not allowed; use a number >= 0"),
    ("rewards=[{name: toy, weight: .nan}]", r"rewards\[0\].weight=nan is not allowed; use a finite number"),
    ("run_name=../../etc/evil", r"run_name='../../etc/evil' is not allowed; use a plain folder name"),
    ("loss.ratio=magic", r"loss.ratio='magic' is not allowed; use one of \['plain', 'guard'\]"),
    ("train.lr_final=2", r"train.lr_final=2.0 is not allowed; use a number in \[0, 1\]"),
    ("learner.nft.old.max=1.5", r"learner.nft.old.max=1.5 is not allowed; use a number in \[0, 1\]"),
    ("sampling.shift=0", r"sampling.shift=0.0 is not allowed; use null or a number > 0"),
    ("eval.steps=0", r"eval.steps=0 is not allowed; use null or a number >= 1"),
    ("train.ema_decay=1", r"train.ema_decay=1.0 is not allowed; use a number in \[0, 1\) \(0 = off\)"),
    ("log.keep_checkpoints=0", r"log.keep_checkpoints=0 is not allowed; use a number >= 1"),
])
def test_a_value_outside_its_rule_is_one_line_naming_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, None, [override])


def test_the_defaults_and_every_preset_pass_their_rules():
    from flowgrpo.run.paths import configs_dir

    for preset in [None] + sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml")):
        load_config(preset, None, [])
        load_config(preset, "sd3_5_medium", [])
