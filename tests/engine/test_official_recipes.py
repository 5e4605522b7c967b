"""Every setting of every preset is the official run's: each official launch (reproduce/official/data/, read from the
official code by reproduce/official/extract.py) composed through flowgrpo's own resolution, every official key either
mapped to the flowgrpo key(s) it is and equal there, or listed with no counterpart (its kind and reason), or a stated
deliberate difference that really differs (reproduce/official/map/). An official key nobody mapped fails."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reproduce"))

from official import mapping  # noqa: E402
from official.mapping import NONE_KINDS, check, code_of, load_map, summary  # noqa: E402

from flowgrpo.config import resolve  # noqa: E402
from flowgrpo.run.paths import configs_dir  # noqa: E402

PRESETS = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))
BAD = ("unmapped", "wrong", "error", "differs_but_same")


def test_every_preset_has_its_official_launches_and_one_map():
    assert mapping.presets_with_data() == PRESETS
    for preset in PRESETS:
        code_of(preset)  # exactly one map lists it
        data = mapping.read_data(preset)
        assert data["launches"], preset
        for launch in data["launches"].values():
            assert (configs_dir() / "models" / f"{launch['model']}.yaml").is_file(), launch["model"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_official_key_of_every_launch_is_accounted_for(preset):
    rows = check(preset)
    bad = [f"{r.launch}: {r.official} = {r.value!r} ({r.source}): {r.status} "
           f"{ {k: v for k, v in r.flowgrpo.items()} or ''} {r.why}" for r in rows if r.status in BAD]
    counts = summary(rows)
    print(f"{preset}: {len(rows)} official values over {len({r.launch for r in rows})} launches: {counts}")
    assert not bad, f"{preset}: {len(bad)} of {len(rows)} official values not accounted for:\n" + "\n".join(bad)
    assert counts.get("same", 0) > 0


def test_every_map_entry_is_used_and_every_kind_is_known():
    """No stale entry: each mapped, listed or differing key of a map occurs in a launch of one of its presets."""
    import fnmatch

    for code in mapping.codes():
        table = load_map(code)
        keys = set()
        for preset in table["presets"]:
            for launch in mapping.read_data(preset)["launches"].values():
                keys |= set(launch["values"])
        sections = [table.get("keys") or {}, table.get("none") or {}]
        sections += [d for d in (table.get("differs") or {}).values()]
        for special in (table.get("launches") or {}).values():
            sections += [special.get("keys") or {}, special.get("none") or {}]
            sections += [d for d in (special.get("differs") or {}).values()]
        for section in sections:
            for key in section:
                assert any(fnmatch.fnmatchcase(k, key) for k in keys), f"map {code}: {key!r} is in no launch"
        for key, entry in (table.get("none") or {}).items():
            assert entry.get("kind") in NONE_KINDS and entry.get("why"), f"map {code}: {key} needs a known kind and why"


def _first(preset: str, status: str):
    return next(r for r in check(preset) if r.status == status)


def test_deleting_one_mapping_fails_the_check(monkeypatch):
    """Negative control: the official key a map no longer names comes back as unmapped."""
    row = _first("flow_grpo", "same")
    code = code_of("flow_grpo")
    table = copy.deepcopy(load_map(code))
    del table["keys"][row.official]
    monkeypatch.setattr(mapping, "load_map", lambda c: table if c == code else load_map(c))
    assert any(r.official == row.official and r.status == "unmapped" for r in check("flow_grpo"))


def test_changing_one_resolved_value_fails_the_check():
    """Negative control: a run that resolves to another value than the official one is reported wrong."""
    row = _first("dgpo", "same")
    key, (want, _) = next(iter(row.flowgrpo.items()))

    def tampered(*args, **kwargs):
        resolved = resolve(*args, **kwargs)
        section, _, name = key.rpartition(".")
        if section.startswith("sampling.plan"):
            resolved.config.sampling.plan[name] = "tampered"
        else:
            node = resolved.config
            for part in section.split("."):
                node = getattr(node, part)
            setattr(node, name, "tampered" if isinstance(want, str) else (want or 1) * 3 + 1)
        return resolved

    assert any(r.official == row.official and r.status == "wrong" for r in check("dgpo", resolve=tampered))


def test_the_presets_page_is_generated_from_the_data_the_maps_and_the_configs():
    """docs/presets.md is what reproduce/official/presets_page.py writes: regenerate it after changing a preset, a
    map or the data (python reproduce/official/presets_page.py)."""
    from official import presets_page

    assert presets_page.PAGE.read_text() == presets_page.page(), \
        "docs/presets.md is stale: run python reproduce/official/presets_page.py"


def test_flow_grpo_on_sd35_rolls_out_on_the_schedulers_own_grid():
    """The σ grid of `flow_grpo` on SD3.5 at 10 steps is diffusers' FlowMatchEulerDiscreteScheduler(shift=3)
    .set_timesteps(10), as the official pipeline leaves it (sigmas=None): ..., 0.4649, 0.278, 0.0089, 0 (the linear
    grid it replaced ended 0.4286, 0.25, 0), to float32 rounding; the tiny world keeps the linear grid."""
    import samplers
    from diffusers import FlowMatchEulerDiscreteScheduler

    from flowgrpo.config import resolved_plan

    plan_args, _ = resolved_plan(resolve("flow_grpo", "sd3_5_medium", []).config)
    plan = samplers.compose_plan(**{**plan_args, "shift": 3.0})  # SD3.5's scheduler config: shift 3.0
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    assert plan.num_steps == 10
    assert (plan.sigmas.float() - scheduler.sigmas).abs().max() <= 2 * torch.finfo(torch.float32).eps
    assert [round(float(s), 4) for s in plan.sigmas[-4:]] == [0.4649, 0.278, 0.0089, 0.0]
    tiny_args, _ = resolved_plan(resolve("flow_grpo", None, []).config)
    assert tiny_args["grid"] == "linear"


def test_a_reason_cut_short_by_an_unquoted_comma_is_refused():
    """Every map loads (each entry holds known fields only); an unquoted comma in a flow mapping's reason, which YAML
    reads as a second key, is refused with the file and the entry."""
    import yaml

    for code in mapping.codes():
        load_map(code)
    table = yaml.safe_load("none:\n  allow_tf32: {kind: hardware, why: TF32 matmuls, a speed setting}\n")
    with pytest.raises(ValueError, match="allow_tf32: unknown field"):
        mapping.check_fields(table, "x")
    mapping.check_fields(yaml.safe_load('none:\n  a: {kind: hardware, why: "TF32, a speed setting"}\n'), "x")


def test_each_reward_is_scored_as_the_official_scorer_does_and_a_reward_scaled_otherwise_fails():
    """The rewards of a launch, as its official code computes them (scale, preprocessing, input), are mapped keys
    (reward options resolved from the preset's recipe); negative control: the same run with the rewards' options
    dropped (flowgrpo's defaults: raw PickScore, 100·max(cos, 0) on PIL-resized uint8 images) is reported wrong."""
    scored = {"code.pickscore_divisor", "code.clipscore_score", "code.clipscore_transform", "code.clipscore_images",
              "code.hpsv2_images", "code.ocr_contained", "code.geneval_images", "code.multi_reward"}
    rows = check("diffusion_nft")
    assert {r.official for r in rows if r.official in scored and r.status == "same"} == scored
    multi = next(r for r in rows if r.launch == "sd3_multi_reward" and r.official == "code.clipscore_score")
    assert multi.flowgrpo == {"rewards[clipscore].kwargs.divide_by": (100.0, 100), "rewards[clipscore].kwargs.logit_scale":
                              (True, True), "rewards[clipscore].kwargs.clamp": (False, False)}

    def defaults(*args, **kwargs):
        resolved = resolve(*args, **kwargs)
        resolved.config.rewards = [dataclasses.replace(r, kwargs={}) for r in resolved.config.rewards]
        return resolved

    wrong = {r.official for r in check("diffusion_nft", resolve=defaults) if r.status == "wrong"}
    assert wrong == scored - {"code.geneval_images", "code.multi_reward"}  # in-process GenEval is lossless, the default
