"""How a preset's recipe composes: the tiny world's CPU settings never reach a real model, a family's recipe sets how
the paper ran the model, overrides win, and every preset composes with every real model config (and with each
reward its recipe names). Whether the recipes are the official runs, key by key: tests/engine/test_official_recipes.py
(reproduce/official/, docs/presets.md)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from flowgrpo.config import ConfigError, is_real_model, load_config
from flowgrpo.models.families import FAMILIES
from flowgrpo.run.paths import configs_dir

PRESETS = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))
MODELS = sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml") if is_real_model(p.stem))


def _family(model: str) -> str:
    return OmegaConf.load(configs_dir() / "models" / f"{model}.yaml").family


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_with_every_real_model_and_each_reward_its_recipe_names(preset):
    """A preset runs on any model config flowgrpo ships, not only the paper's: its recipe, by-family and by-reward
    blocks merge and validate on each (a recipe key a family's config cannot take would fail here)."""
    recipe = OmegaConf.load(configs_dir() / "presets" / f"{preset}.yaml")
    rewards = sorted((recipe.get("recipe_by_reward") or {}).keys())
    for model in MODELS:
        default = "default_t2v" if FAMILIES[_family(model)].modality == "video" else "default"
        for reward in [None, *rewards]:
            names = ["pickscore", "hpsv2"] if reward == "several" else [reward] if reward else []
            extra = ["rewards=[" + ", ".join(f"{{name: {n}}}" for n in names) + "]"] if names else []
            cfg = load_config(preset, model, extra, default=default)
            assert cfg.run_name == f"{model}-{preset}"


def test_the_tiny_worlds_settings_never_reach_a_real_model():
    """The default's CPU settings (the tiny model, 520 iterations at learning rate 1e-3) stay in the tiny world; a real
    model without a preset takes the default method's (DiffusionNFT's) paper recipe, and overrides still win."""
    tiny = load_config(None, None, [])
    real = load_config(None, "sd3_5_medium", [])
    nft = load_config("diffusion_nft", "sd3_5_medium", [])
    assert tiny.train.learning_rate == 1e-3 and tiny.model.pretrained == "tiny-sd3"
    assert real.train == nft.train and real.learner == nft.learner and real.sampling == nft.sampling
    assert real.model.pretrained == "stabilityai/stable-diffusion-3.5-medium" and real.model.lora_rank == 32
    assert real.run_name == "sd3_5_medium-diffusion_nft"
    mine = load_config(None, "sd3_5_medium", ["train.learning_rate=5e-5", "run_name=mine"])
    assert mine.train.learning_rate == 5e-5 and mine.run_name == "mine"


def test_a_familys_recipe_sets_how_the_paper_ran_the_model_and_overrides_still_win(tmp_path):
    """The model config comes before the paper's recipe (flowgrpo/config/load.py: load_config), so a family's recipe sets
    the paper's model keys (128 T5 tokens, full fine-tuning at 720 px) over the model config's generic ones; the
    command line wins over both; a preset whose general or per-reward recipe sets model keys (which would reach every
    family) is refused, and so is a KL with no reference loaded."""
    assert load_config("diffusion_nft", "sd3_5_medium", []).model.max_sequence_length == 128
    assert load_config("diffusion_nft", "flux_dev", []).model.max_sequence_length == 512  # not the paper's model
    dance = load_config("dancegrpo", "flux_dev", [])
    assert (dance.model.finetune, dance.model.resolution, dance.model.reference, dance.train.learning_rate) == (
        "full", 720, "none", 1e-5)
    mine = load_config("dancegrpo", "flux_dev", ["model.finetune=lora", "model.reference=auto", "train.learning_rate=3e-4",
                                                 "model.max_sequence_length=256"])
    assert (mine.model.finetune, mine.model.reference, mine.train.learning_rate, mine.model.max_sequence_length) == (
        "lora", "auto", 3e-4, 256)
    with pytest.raises(ConfigError, match="model.reference=auto"):
        load_config("dancegrpo", "flux_dev", ["loss.kl_coef=0.01"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: {name: transition}\nrecipe:\n  model: {max_sequence_length: 128}\n")
    with pytest.raises(ConfigError, match="recipe_by_family"):
        load_config(str(bad), "sd3_5_medium", [])
