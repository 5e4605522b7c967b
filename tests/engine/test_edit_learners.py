"""Every learner and credit rule on an editing family: each control preset of tests/engine/test_learning.py (one per
learner and per credit rule) trains two iterations on a tiny random FLUX.1-Kontext over the toy editing world's
rows (an instruction and its source image each), rewarded by a reward that sees the source (preservation), with the
end-to-end contract of train_fixtures.train_and_check (ρ = 1 at inner epoch 0, DiffusionNFT's v⁺ = v_old, weights
moved). The first run also checks that the source goes where the prompt goes: beside every saved sample and every
held-out sample in the run folder, and into the gallery's data. Whether each learns on the edit world, with its
negated control, is what benchmarks/bench_edit_methods.py measures."""

from __future__ import annotations

import json

import pytest

from flowgrpo.config import load_config
from flowgrpo.tiny.builders import save_tiny_kontext
from test_learning import CONTROLS
from train_fixtures import TINY_PRESETS, overrides, train_and_check
from worlds.toy import scenes

pytestmark = pytest.mark.usefixtures("one_thread")
EDIT = {"model.family": "flux_kontext", "model.guidance_scale": 2.0, "prompts": "toy-edit-train",
        "eval.prompts": "toy-edit-eval", "eval.reward": "toy_edit", "eval.limit": 2, "log.samples_per_prompt": 1,
        "log.eval_samples": 2}
REWARDS = {"rewards": [{"name": "preservation", "weight": 1.0}]}


@pytest.fixture(scope="module")
def kontext_dir(tmp_path_factory):
    return save_tiny_kontext(tmp_path_factory.mktemp("tiny_kontext"), [p.text for p in scenes.train_prompts()])


@pytest.mark.parametrize("preset", CONTROLS)
def test_each_learner_and_credit_rule_trains_an_editing_model(preset, kontext_dir, tmp_path):
    first = preset == CONTROLS[0]
    extra = {"eval.every": 2} if first else {}
    cfg = load_config(preset, None, overrides(kontext_dir, tmp_path, **{**TINY_PRESETS[preset], **EDIT, **extra}),
                      base=REWARDS)
    trainer, run, rows = train_and_check(cfg, gallery=first)
    assert trainer.model.config.family == "flux_kontext"
    if not first:
        return
    for folder in ("step_2", "eval_2"):
        lines = [json.loads(line) for line in (run / "samples" / folder / "manifest.jsonl").read_text().splitlines()]
        assert lines and all(len(m["sources"]) == 1 and (run / "samples" / folder / m["sources"][0]).is_file()
                             for m in lines), folder
    site = {p.name: p.read_text() for p in (run / "gallery" / "data" / "steps").glob("*.js")}
    assert all('"sources":["media/' in site[name] for name in ("step_2.js", "eval_2.js")), sorted(site)
