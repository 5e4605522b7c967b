"""Tests of the toy scorer: ground truth scores high, junk scores low, hand-made images per clause.

Run: .venv/bin/pytest tests/rewards/test_toy_scorer.py -q
"""

import math
import random
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rewards.base import Reward, RewardOutput
from rewards.toy.scorer import ToyScorer, detect_objects, relation_holds, summarize
from worlds.toy.scenes import (
    BACKGROUND,
    COLORS,
    TASKS,
    Scene,
    ToyObject,
    eval_prompts,
    render,
    render_prompt,
    scene_for_prompt,
)

SCORER = ToyScorer()


def _batch(images: list[np.ndarray]) -> torch.Tensor:
    """uint8 [H, W, 3] arrays -> float [B, 3, H, W] in [0, 1]."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255


def _score(image: np.ndarray, text: str) -> tuple[float, list[float], bool]:
    out = SCORER(_batch([image]), [text])
    score = round(out.scores[0].item(), 6)  # float32 -> comparable with hand-computed fractions
    return score, [round(c["credit"], 6) for c in out.info["clauses"][0]], bool(out.info["strict"][0])


def _blank() -> np.ndarray:
    return np.broadcast_to(np.array(BACKGROUND, dtype=np.uint8), (64, 64, 3)).copy()


@pytest.fixture(scope="module")
def ground_truth():
    prompts = [p for seed in (0, 1) for p in eval_prompts()]
    images = [render_prompt(p, seed) for seed in (0, 1) for p in eval_prompts()]
    return prompts, _batch(images)


def test_reward_contract():
    assert isinstance(SCORER, Reward) and SCORER.name == "toy" and SCORER.modality == "image"
    out = SCORER(_batch([_blank()]), ["a photo of a circle"])
    assert isinstance(out, RewardOutput) and out.scores.dtype == torch.float32 and out.scores.shape == (1,)
    assert out.info["strict"].dtype == torch.bool and out.info["task"] == ["single_object"]


def test_ground_truth_scores_high_on_every_task(ground_truth):
    prompts, images = ground_truth
    start = time.perf_counter()
    out = SCORER(images, [p.text for p in prompts])
    elapsed = time.perf_counter() - start
    summary = summarize(out.scores, out.info["strict"], out.info["task"])
    assert summary["num_images"] == 384
    assert summary["mean_score"] >= 0.97 and summary["strict_accuracy"] >= 0.95
    assert set(summary["per_task"]) == set(TASKS)
    assert all(v >= 0.97 for v in summary["per_task"].values()), summary["per_task"]
    assert elapsed < 3.0  # measured ~0.25 s for 384 images on a loaded 2-core machine


def test_metadata_path_matches_text_path(ground_truth):
    prompts, images = ground_truth
    texts = [p.text for p in prompts[:64]]
    by_text = SCORER(images[:64], texts)
    by_meta = SCORER(images[:64], texts, [p.to_dict() for p in prompts[:64]])
    assert torch.equal(by_text.scores, by_meta.scores)
    with pytest.raises(ValueError, match="does not match"):
        SCORER(images[:1], ["a photo of a square"], [prompts[0].to_dict()])


def test_mild_blur_and_noise_still_score_high(ground_truth):
    prompts, images = ground_truth
    images = images[:192]
    kernel = torch.exp(-torch.arange(-3, 4).float() ** 2 / 2)  # Gaussian, sigma 1 px
    kernel = kernel / kernel.sum()
    flat = F.pad(images.reshape(-1, 1, 64, 64), (3, 3, 3, 3), mode="replicate")
    blurred = F.conv2d(F.conv2d(flat, kernel.view(1, 1, 1, 7)), kernel.view(1, 1, 7, 1)).view(images.shape)
    noisy = (blurred + 0.05 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    out = SCORER(noisy, [p.text for p in prompts[:192]])
    assert out.scores.mean().item() >= 0.9
    drifted = (images * 0.75 + 0.25 * images.mean(1, keepdim=True)).clamp(0, 1)  # 25% desaturated
    assert SCORER(drifted, [p.text for p in prompts[:192]]).scores.mean().item() >= 0.9


def test_blank_and_noise_score_low():
    texts = [p.text for p in eval_prompts()]
    blank = _batch([_blank()] * len(texts))
    out = SCORER(blank, texts)
    assert out.scores.max().item() == 0.0 and not out.info["strict"].any()
    noise = torch.rand((len(texts), 3, 64, 64), generator=torch.Generator().manual_seed(0))
    out = SCORER(noise, texts)
    assert out.scores.mean().item() <= 0.05 and not out.info["strict"].any()


def test_wrong_colour_zeroes_every_colour_clause():
    prompts = [p for p in dict.fromkeys(eval_prompts()) if any(c["type"] == "color" for c in p.clauses)]
    images, rng = [], random.Random(0)
    for p in prompts:
        used = {c["color"] for c in p.clauses if c["type"] == "color"}
        other = next(c for c in COLORS if c not in used)  # a palette colour the prompt never names
        scene = scene_for_prompt(p, rng)
        images.append(render(Scene(tuple(ToyObject(o.shape, other, o.cx, o.cy, o.size) for o in scene.objects))))
    out = SCORER(_batch(images), [p.text for p in prompts])
    for clauses in out.info["clauses"]:
        assert all(c["credit"] == 0.0 for c in clauses if c["type"] in ("color", "position"))
        assert all(c["credit"] == 1.0 for c in clauses if c["type"] == "object")  # shapes still right
    assert out.scores.max().item() <= 0.5 and not out.info["strict"].any()


# ---------------------------------------------------------------- hand-made images, one per clause type


def _draw(*objects: tuple[str, str, float, float, float]) -> np.ndarray:
    return render(Scene(tuple(ToyObject(*o) for o in objects)))


def test_shape_classification_on_pixel_drawn_shapes():
    img = _blank()
    img[10:26, 8:24] = COLORS["green"]  # a 16 x 16 square
    yy, xx = np.mgrid[0:64, 0:64] + 0.5
    img[(xx - 46) ** 2 + (yy - 18) ** 2 <= 9**2] = COLORS["red"]  # a circle, radius 9
    tri = (yy >= 34) & (yy <= 56) & (np.abs(xx - 30) <= (yy - 34) / 2)  # apex up, base 22 wide
    img[tri] = COLORS["purple"]
    dets = detect_objects(torch.from_numpy(img).permute(2, 0, 1)[None])[0]
    assert sorted((d["shape"], d["color"]) for d in dets) == [("circle", "red"), ("square", "green"), ("triangle", "purple")]
    square = next(d for d in dets if d["shape"] == "square")
    assert (square["cx"], square["cy"], square["area"]) == (16.0, 18.0, 256)


def test_count_clause_partial_credit():
    three = _draw(("triangle", "red", 12, 12, 7), ("triangle", "blue", 40, 14, 7), ("triangle", "green", 22, 44, 7))
    assert _score(three, "a photo of three triangles") == (1.0, [1.0], True)
    assert _score(three, "a photo of four triangles") == (0.75, [0.75], False)
    assert _score(three, "a photo of two triangles") == (0.5, [0.5], False)
    assert _score(three, "a photo of one triangle") == (0.0, [0.0], False)
    assert _score(three, "a photo of two squares") == (0.0, [0.0], False)


def test_object_presence_clauses():
    circle_only = _draw(("circle", "yellow", 20, 30, 9))
    assert _score(circle_only, "a photo of a circle") == (1.0, [1.0], True)
    assert _score(circle_only, "a photo of a circle and a square") == (0.5, [1.0, 0.0], False)
    tiny = _draw(("circle", "yellow", 20, 30, 2.5))  # ~20 px: a speck below MIN_AREA
    assert _score(tiny, "a photo of a circle")[0] == 0.0


def test_colour_clause_and_binding():
    img = _draw(("circle", "red", 15, 30, 9), ("square", "blue", 48, 30, 9))
    assert _score(img, "a photo of a red circle") == (1.0, [1.0, 1.0], True)
    assert _score(img, "a photo of a blue circle") == (0.5, [1.0, 0.0], False)
    assert _score(img, "a photo of a red circle and a blue square") == (1.0, [1.0] * 4, True)
    assert _score(img, "a photo of a blue circle and a red square") == (0.5, [1.0, 1.0, 0.0, 0.0], False)


def test_position_clause():
    img = _draw(("circle", "red", 15, 30, 9), ("square", "blue", 48, 30, 9))
    assert _score(img, "a photo of a red circle left of a blue square") == (1.0, [1.0] * 5, True)
    assert _score(img, "a photo of a circle left of a square") == (1.0, [1.0, 1.0, 1.0], True)
    assert _score(img, "a photo of a circle right of a square") == (0.666667, [1.0, 1.0, 0.0], False)
    swapped = _draw(("circle", "red", 48, 30, 9), ("square", "blue", 15, 30, 9))
    assert _score(swapped, "a photo of a red circle left of a blue square")[1][-1] == 0.0
    assert _score(swapped, "a photo of a red circle right of a blue square")[1][-1] == 1.0
    stacked = _draw(("triangle", "green", 32, 14, 9), ("circle", "green", 32, 48, 9))
    assert _score(stacked, "a photo of a triangle above a circle")[1][-1] == 1.0
    assert _score(stacked, "a photo of a circle below a triangle")[1][-1] == 1.0
    assert _score(stacked, "a photo of a circle above a triangle")[1][-1] == 0.0
    # diagonal: dx = 20, dy = 30, so "above" holds and "left of" does not (the larger offset wins)
    diagonal = _draw(("circle", "red", 15, 15, 8), ("square", "blue", 35, 45, 8))
    assert _score(diagonal, "a photo of a red circle above a blue square")[1][-1] == 1.0
    assert _score(diagonal, "a photo of a red circle left of a blue square")[1][-1] == 0.0
    # two circles told apart by colour
    pair = _draw(("circle", "red", 15, 30, 9), ("circle", "blue", 48, 30, 9))
    assert _score(pair, "a photo of a blue circle right of a red circle") == (1.0, [1.0] * 5, True)


def test_relation_rule_margin():
    a = {"cx": 10.0, "cy": 10.0}
    assert relation_holds(a, {"cx": 12.0, "cy": 10.0}, "left of", margin=2.0)
    assert not relation_holds(a, {"cx": 11.5, "cy": 10.0}, "left of", margin=2.0)
    assert not relation_holds(a, {"cx": 14.0, "cy": 14.5}, "left of", margin=2.0)


# ---------------------------------------------------------------- batching, validation, summary


def test_batch_independence(ground_truth):
    prompts, images = ground_truth
    idx = [0, 40, 70, 100, 140, 180, 200, 300]
    texts = [prompts[i].text for i in idx]
    batch = images[idx].clone()
    batch[1] = torch.rand(3, 64, 64)  # a junk companion
    together = SCORER(batch, texts).scores
    alone = torch.cat([SCORER(batch[i : i + 1], texts[i : i + 1]).scores for i in range(len(idx))])
    assert torch.equal(together, alone)
    flipped = SCORER(batch.flip(0), texts[::-1]).scores
    assert torch.equal(flipped, together.flip(0))


def test_input_validation():
    good = _batch([_draw(("square", "red", 30, 30, 9))])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\].*permute"):
        SCORER(good.permute(0, 2, 3, 1), ["a photo of a circle"])
    with pytest.raises(ValueError, match=r"\[0, 1\].*x / 2 \+ 0.5"):
        SCORER(good * 2 - 1, ["a photo of a circle"])
    with pytest.raises(TypeError, match="float"):
        SCORER((good * 255).to(torch.uint8), ["a photo of a circle"])
    with pytest.raises(ValueError, match="1 images but 2 prompts"):
        SCORER(good, ["a photo of a circle"] * 2)
    with pytest.raises(ValueError, match="outside the grammar"):
        SCORER(good, ["a photo of a dog"])


def test_rounds_to_uint8_before_scoring():
    img = _batch([_draw(("square", "red", 30, 30, 9))])
    jitter = (torch.rand(img.shape, generator=torch.Generator().manual_seed(0)) - 0.5) * 0.9 / 255
    out_a = SCORER(img, ["a photo of a red square"])
    out_b = SCORER((img + jitter).clamp(0, 1), ["a photo of a red square"])  # same uint8 image
    assert torch.equal(out_a.scores, out_b.scores) and out_a.info["clauses"] == out_b.info["clauses"]


def test_summarize_numbers():
    s = summarize(
        torch.tensor([1.0, 0.5, 0.0, math.nan]),
        torch.tensor([True, False, False, False]),
        ["counting", "counting", "position", "position"],
    )
    assert s == {
        "mean_score": 0.5,
        "strict_accuracy": 1 / 3,
        "per_task": {"counting": 0.75, "position": 0.0},
        "num_images": 4,
    }
    with pytest.raises(ValueError, match="need equal"):
        summarize([1.0], [True], ["counting", "position"])
