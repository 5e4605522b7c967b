"""Each preset is its paper's recipe on real models and the tiny world's scaled settings on the CPU, as docs/presets.md
tables them: the test reads the tables, composes every preset with every real model config (and with none: the tiny
world), and checks every row, so the page cannot drift from the configs.

A row is ``| `key` | paper's value | source | real models | tiny world | why they differ |``. The key may end in
``(family)``: that row is the value for the model configs of that family, the row without it for the others. A ``—``
cell is not checked (the paper does not say, or the world does not use it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from flowgrpo.config import ConfigError, is_real_model, load_config
from flowgrpo.models.config import _VIDEO_FAMILIES
from flowgrpo.run.paths import configs_dir

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "presets.md"
PRESETS = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))
MODELS = sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml") if is_real_model(p.stem))


def _family(model: str) -> str:
    return OmegaConf.load(configs_dir() / "models" / f"{model}.yaml").family


def tables() -> dict[str, list[tuple[str, str | None, str | None, str, str]]]:
    """preset -> [(key, family or None, reward or None, real cell, tiny cell)] from the page's ``## `preset` `` sections."""
    out, current = {}, None
    for line in PAGE.read_text().splitlines():
        heading = re.match(r"^## `(\w+)`", line)
        if heading:
            current = heading.group(1)
            out[current] = []
            continue
        row = re.match(r"^\| `([\w.]+)`(?: \((\w+)\))?(?: \[(\w+)\])? \|(.*)\|\s*$", line)
        if current and row:
            cells = [c.strip() for c in row.group(4).split("|")]
            out[current].append((row.group(1), row.group(2), row.group(3), cells[2], cells[3]))
    return out


def _value(cell: str):
    text = cell.strip("`").replace("`", "")
    try:  # YAML 1.1 reads 1e-05 (no decimal point) as a string
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return yaml.safe_load(text)


def effective(cfg, key: str):
    """The value a run uses for ``key``: the config's, and for ``sampling.plan.*`` / ``sampling.window.*`` what the
    method's plan and window take (its METHOD_PRESETS entry under the config's overrides, else the builders'
    defaults)."""
    import inspect

    import samplers
    from flowgrpo.config import plan_arguments

    section, _, name = key.rpartition(".")
    if section == "sampling.plan":
        defaults = {k: p.default for k, p in inspect.signature(samplers.compose_plan).parameters.items()}
        return {**defaults, **plan_arguments(cfg)}.get(name)
    if section == "sampling.window":
        window = samplers.METHOD_PRESETS[cfg.sampling.method]["window"]
        if window is None:
            return None
        defaults = {k: p.default for k, p in inspect.signature(samplers.WindowSchedule).parameters.items()}
        return {**defaults, **window, **dict(cfg.sampling.window)}.get(name)
    got = OmegaConf.select(OmegaConf.structured(cfg), key)
    return OmegaConf.to_container(got) if OmegaConf.is_config(got) else got


def _check(cfg, key: str, cell: str, where: str) -> None:
    if cell in ("—", ""):
        return
    got = effective(cfg, key)
    got = list(got) if isinstance(got, tuple) else got  # a tuple key (adam_betas) as the page writes it
    want = _value(cell)
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-12), f"{where}: {key} is {got!r}, docs/presets.md says {want!r}"
    else:
        assert got == want, f"{where}: {key} is {got!r}, docs/presets.md says {want!r}"


def test_every_preset_has_its_table():
    assert sorted(tables()) == PRESETS


def _rewards(reward: str | None) -> list[str]:
    if reward is None:
        return []
    return ["rewards=[{name: pickscore}, {name: hpsv2}]"] if reward == "several" else [f"rewards=[{{name: {reward}}}]"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_on_a_real_model_is_its_papers_recipe(preset, model):
    """Every row on every real model config: a (family) row on that family's models, a [reward] row with that reward
    trained (or several rewards) where no (family) row sets the key, the plain rows where neither does."""
    family = _family(model)
    default = "default_t2v" if family in _VIDEO_FAMILIES else "default"
    rows = tables()[preset]
    by_family = {key for key, fam, _, _, _ in rows if fam == family}
    for reward in [None] + sorted({r for _, _, r, _, _ in rows if r}):
        cfg = load_config(preset, model, _rewards(reward), default=default)
        by_reward = {key for key, _, r, _, _ in rows if reward and r == reward}
        for key, fam, r, real, _ in rows:
            if fam == family or (fam is None and r == reward and key not in by_family) or (
                    fam is None and r is None and key not in by_family and key not in by_reward):
                _check(cfg, key, real, f"{preset} on {model}" + (f" trained on {reward}" if reward else ""))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_in_the_tiny_world_keeps_the_cpu_settings(preset):
    cfg = load_config(preset, None, [])
    for key, fam, reward, _, tiny in tables()[preset]:
        if fam is None and reward is None:
            _check(cfg, key, tiny, f"{preset} in the tiny world")


def test_a_rows_value_is_what_the_run_uses():
    """The checker reads what a run uses, and fails on a wrong value: the test cannot pass a drifted page."""
    cfg = load_config("awm", "sd3_5_medium", [])
    assert effective(cfg, "sampling.plan.num_steps") == 14 and effective(cfg, "sampling.plan.kernel") == "ode"
    assert effective(load_config("mixgrpo", None, []), "sampling.window.interval") == 25
    with pytest.raises(AssertionError, match="docs/presets.md says 10"):
        _check(cfg, "sampling.plan.num_steps", "`10`", "awm")


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
    """The model config comes before the paper's recipe (flowgrpo/config.py: load_config), so a family's recipe sets
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
