"""toy_dense (rewards/toy/dense.py): the toy world's soft training reward agrees with the verifiable scorer
on clean renders and moves smoothly where the scorer's shape and position verdicts jump."""

import pytest
import torch

from rewards import load_reward
from worlds.toy import scenes
from rewards.toy.dense import shape_match, soft_clause_credits


def detection(shape_moment: float, top: float = 0.0, color: str = "red", cx: float = 20.0, cy: float = 32.0) -> dict:
    return {"shape": "?", "color": color, "cx": cx, "cy": cy, "area": 100, "fill": 0.8, "cross": shape_moment,
            "top_heaviness": top}


def test_clean_renders_score_like_the_scorer():
    prompts = scenes.eval_prompts()
    images = torch.stack([torch.from_numpy(scenes.render_prompt(p, seed=i).copy()).permute(2, 0, 1).float() / 255
                          for i, p in enumerate(prompts)])
    texts, meta = [p.text for p in prompts], [p.to_dict() for p in prompts]
    toy = load_reward("toy")(images, texts, meta).scores
    dense = load_reward("toy_dense")(images, texts, meta).scores
    assert toy.min() == 1.0 and dense.mean() > 0.99 and dense.min() > 0.98, (dense.mean(), dense.min())
    factor = load_reward("toy_dense", scene="factor")(images, texts, meta).scores
    assert factor.mean() > 0.99 and factor.min() > 0.98, (factor.mean(), factor.min())


def test_shape_credit_grows_smoothly_where_the_verdict_jumps():
    """A rounded square (cross moment between the circle's 2/3 and the square's 1): the scorer's verdict
    flips from circle to square at 0.833; the soft credit rises through 0.5 there."""
    prompt = scenes.parse_prompt("a photo of a square")
    moments = [0.67, 0.72, 0.77, 0.82, 0.84, 0.9, 0.99]
    credits = [soft_clause_credits(prompt, [detection(m)], 2.0, 0.1, 2.0)[0] for m in moments]
    assert all(b > a for a, b in zip(credits, credits[1:])), credits
    assert credits[0] < 0.01 and credits[-1] > 0.99 and 0.3 < credits[3] < 0.5 < credits[4] < 0.7, credits
    assert shape_match(detection(2 / 3), "circle", 0.1) > 0.99


def test_position_credit_is_smooth_in_the_offset():
    prompt = scenes.parse_prompt("a photo of a red circle left of a blue square")
    a = detection(2 / 3, color="red", cx=30.0)
    credits = []
    for bx in (24.0, 30.0, 32.0, 34.0, 40.0):
        b = detection(1.0, color="blue", cx=bx)
        credits.append(soft_clause_credits(prompt, [a, b], 2.0, 0.1, 2.0)[-2])  # the position clause (the scene clause is last)
    assert all(y > x for x, y in zip(credits, credits[1:])) and credits[0] < 0.05 and credits[-1] > 0.95, credits
    with pytest.raises(ValueError, match="must be > 0"):
        load_reward("toy_dense", shape_tau=0)


def test_extra_objects_cost_the_scene_clause():
    """Colour and position clauses take the best match among all components, so clutter can only raise
    them; the scene clause (the last) charges each component beyond the prompt's objects."""
    prompt = scenes.parse_prompt("a photo of a red circle left of a blue square")
    scene = [detection(2 / 3, color="red", cx=20.0), detection(1.0, color="blue", cx=40.0)]
    fragments = [detection(0.8, color="green", cx=10.0 + 8 * i, cy=10.0) for i in range(3)]
    clean = soft_clause_credits(prompt, scene, 2.0, 0.1, 2.0)
    cluttered = soft_clause_credits(prompt, scene + fragments, 2.0, 0.1, 2.0)
    assert clean[-1] == 1.0 and cluttered[-1] == 0.0 and clean[:-1] == cluttered[:-1]
    assert soft_clause_credits(prompt, scene + fragments[:1], 2.0, 0.1, 2.0)[-1] == 0.5
    assert soft_clause_credits(scenes.parse_prompt("a photo of four circles"), [], 2.0, 0.1, 2.0)[-1] == 0.0


def test_scene_factor_scales_the_prompt_clauses():
    """scene="factor": the mean of the prompt's clauses times the scene clause, so a component beyond
    the prompt's objects costs every clause's credit, not one clause's share."""
    prompt = scenes.parse_prompt("a photo of a red circle left of a blue square")
    scene = [detection(2 / 3, color="red", cx=20.0), detection(1.0, color="blue", cx=40.0)]
    extra = [detection(0.8, color="green", cx=10.0, cy=10.0)]
    credits = soft_clause_credits(prompt, scene + extra, 2.0, 0.1, 2.0)
    clause, factor = load_reward("toy_dense"), load_reward("toy_dense", scene="factor")
    assert credits[-1] == 0.5
    assert clause._combine(credits) == pytest.approx(sum(credits) / len(credits), rel=1e-12)
    assert factor._combine(credits) == pytest.approx(0.5 * sum(credits[:-1]) / len(credits[:-1]), rel=1e-12)
    clean = soft_clause_credits(prompt, scene, 2.0, 0.1, 2.0)
    assert clean[-1] == 1.0 and factor._combine(clean) == pytest.approx(sum(clean[:-1]) / len(clean[:-1]), rel=1e-12)
    with pytest.raises(ValueError, match="'clause' or 'factor'"):
        load_reward("toy_dense", scene="product")
