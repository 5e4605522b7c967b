"""Tests of the toy video world (clips, grammar, splits) and its scorer (ground truth high, junk low).

Run: .venv/bin/pytest tests/worlds/test_toy_video.py -q
"""

import json
import random
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rewards import load_reward
from rewards.base import Reward
from worlds.toy import clips as vw
from rewards.toy.video_scorer import ToyVideoScorer, summarize
from worlds.toy.scenes import BACKGROUND, COLORS

torch.set_num_threads(1)
SCORER = ToyVideoScorer()


def _score(clips: torch.Tensor, prompts) -> dict:
    out = SCORER(clips, [p.text for p in prompts])
    return {"out": out, **summarize(out.scores, out.info["strict"], out.info["task"])}


def _credits(out, kind: str) -> list[float]:
    return [c["credit"] for clauses in out.info["clauses"] for c in clauses if c["type"] == kind]


@pytest.fixture(scope="module")
def ground_truth():
    prompts = [p for seed in (0, 1) for p in vw.eval_prompts()]
    clips = [vw.render_prompt(p, seed) for seed in (0, 1) for p in vw.eval_prompts()]
    return prompts, vw.clips_to_tensor(clips)


# ----------------------------------------------------------------------------- the world


def test_split_sizes_are_pinned():
    # A model is pretrained on these sets: a change here must be deliberate.
    assert Counter(p.task for p in vw.train_prompts()) == {
        "direction": 10, "color_direction": 56, "two_directions": 72, "speed": 18,
    }
    evals = vw.eval_prompts()
    assert [p.task for p in evals] == [t for t in vw.VIDEO_TASKS for _ in range(32)]
    assert len({p.text for p in evals}) == 48 and sum(p.novel for p in evals) == 114
    assert vw.train_prompts() == vw.train_prompts() and vw.eval_prompts() == evals


def test_train_and_eval_are_disjoint_and_held_out_combinations_stay_out_of_train():
    train, evals = vw.train_prompts(), vw.eval_prompts()
    assert len({p.text for p in train}) == len(train)
    assert not {p.text for p in train} & {p.text for p in evals}
    assert not any(p.novel for p in train)
    assert {p.task for p in evals if p.novel} == set(vw.VIDEO_TASKS)  # every task measures generalisation
    for p in train:
        objects = [c for c in p.clauses if c["type"] == "object"]
        directions = [c["direction"] for c in p.clauses if c["type"] == "motion"]
        colors = {(c["color"], objects[c["object"]]["shape"]) for c in p.clauses if c["type"] == "color"}
        assert not colors & set(vw.HELD_OUT_VIDEO_COLOR_SHAPES), p.text
        if p.task == "direction":
            assert (objects[0]["shape"], directions[0]) not in vw.HELD_OUT_SHAPE_DIRECTIONS
        if p.task == "two_directions":
            assert tuple(directions) not in vw.HELD_OUT_DIRECTION_PAIRS
    # a held-out shape-direction pair of the direction task is seen in training elsewhere
    assert any(p.task == "speed" and p.text.startswith("a video of a triangle moving up ") for p in train)


def test_parse_prompt_inverts_every_prompt_and_examples():
    for p in vw.train_prompts() + vw.eval_prompts():
        assert vw.parse_prompt(p.text) == p
    p = vw.parse_prompt("a video of a circle moving left and a square moving down")
    assert p.task == "two_directions" and not p.novel
    assert p.clauses == (
        {"type": "object", "shape": "circle", "count": 1},
        {"type": "object", "shape": "square", "count": 1},
        {"type": "motion", "object": 0, "direction": "left"},
        {"type": "motion", "object": 1, "direction": "down"},
    )
    red = vw.parse_prompt("a video of a red circle moving up")
    assert red.clauses[1] == {"type": "color", "object": 0, "color": "red"}
    assert vw.parse_prompt("a video of a square moving left quickly").clauses[-1] == {
        "type": "speed", "object": 0, "speed": "quickly"}
    assert vw.parse_prompt("a video of a triangle moving up").novel
    assert vw.parse_prompt("a video of a circle moving up and a square moving left").novel
    assert not vw.parse_prompt("a video of a circle moving left and a square moving up").novel  # reverse order seen


@pytest.mark.parametrize(
    "text",
    [
        "a photo of a circle",
        "a video of a circle",
        "a video of a circle moving sideways",
        "a video of a red circle moving up slowly",
        "a video of a circle moving up and a circle moving down",
        "a video of a red circle moving up and a square moving down",
        "a video of a circle moving up slowly and a square moving down",
    ],
)
def test_parse_prompt_rejects_text_outside_the_grammar(text):
    with pytest.raises(ValueError, match="outside the grammar.*Grammar"):
        vw.parse_prompt(text)


def test_to_dict_round_trip_is_json_and_tasks_are_checked():
    for p in vw.eval_prompts()[::8]:
        assert vw.ToyVideoPrompt.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError, match="ToyVideoPrompt.from_dict: task 'colors' is not one of"):
        vw.ToyVideoPrompt.from_dict({"text": "a photo of a red circle", "task": "colors", "clauses": []})


def test_make_prompt_is_deterministic_and_draws_from_its_split():
    train_texts = {p.text for p in vw.train_prompts()}
    for task in vw.VIDEO_TASKS:
        drawn = [vw.make_prompt(task, random.Random(i)) for i in range(20)]
        assert drawn == [vw.make_prompt(task, random.Random(i)) for i in range(20)]
        assert all(p.task == task and p.text in train_texts for p in drawn)
    assert vw.make_prompt("speed", random.Random(0), split="eval").text in {p.text for p in vw.eval_prompts()}
    with pytest.raises(ValueError, match="not one of"):
        vw.make_prompt("colors", random.Random(0))


def test_ground_truth_clips_follow_the_prompt_and_stay_inside():
    prompts = list(dict.fromkeys(vw.eval_prompts())) + vw.train_prompts()
    for seed in range(3):
        for p in prompts:
            clip = vw.clip_for_prompt(p, random.Random(seed))
            motions = [c["direction"] for c in p.clauses if c["type"] == "motion"]
            speeds = {c["object"]: c["speed"] for c in p.clauses if c["type"] == "speed"}
            assert [o.shape for o in clip.objects] == [c["shape"] for c in p.clauses if c["type"] == "object"]
            for i, o in enumerate(clip.objects):
                ux, uy = vw.DIRECTION_VECTORS[motions[i]]
                speed = o.vx * ux + o.vy * uy
                assert o.vx * uy - o.vy * ux == 0 and 0.6 - 1e-3 <= speed <= 1.9 + 1e-3, p.text
                if i in speeds:
                    lo, hi = vw.SPEED_RANGES[speeds[i]]
                    assert lo - 1e-3 <= speed <= hi + 1e-3
                for t in range(clip.num_frames):  # inside every frame, 1 px from the border
                    at = o.at(t)
                    for centre in (at.cx, at.cy):
                        assert at.size + 1 - 0.02 <= centre <= 32 - 1 - at.size + 0.02, p.text
            for t in range(clip.num_frames):  # two objects never closer than 2 px
                objs = clip.scene(t).objects
                for i, a in enumerate(objs):
                    for b in objs[i + 1:]:
                        reach = a.size + b.size + 2
                        assert abs(a.cx - b.cx) >= reach - 1e-6 or abs(a.cy - b.cy) >= reach - 1e-6


def test_render_is_deterministic_and_shaped():
    p = vw.eval_prompts()[70]
    clip = vw.render_prompt(p, 3)
    assert clip.shape == (9, 32, 32, 3) and clip.dtype == np.uint8
    assert np.array_equal(clip, vw.render_prompt(p, 3)) and not np.array_equal(clip, vw.render_prompt(p, 4))
    assert not np.array_equal(clip[0], clip[-1])  # it moves
    x = vw.clips_to_tensor([clip])
    assert x.shape == (1, 9, 3, 32, 32) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1


# ----------------------------------------------------------------------------- the scorer


def test_reward_contract_and_registry():
    assert isinstance(load_reward("toy_video"), ToyVideoScorer)
    assert SCORER.name == "toy_video" and SCORER.modality == "video" and isinstance(SCORER, Reward)
    clip = vw.clips_to_tensor([vw.render_prompt(vw.eval_prompts()[0], 0)])
    with pytest.raises(ValueError, match=r"video reward.*\[B, F, 3, H, W\]"):
        SCORER(clip[:, 0], ["a video of a circle moving left"])
    with pytest.raises(ValueError, match="at least 3 frames"):
        SCORER(clip[:, :2], ["a video of a circle moving left"])


def test_ground_truth_scores_high_on_every_task(ground_truth):
    prompts, clips = ground_truth
    s = _score(clips, prompts)
    assert s["num_images"] == 256
    assert s["mean_score"] >= 0.97 and s["strict_accuracy"] >= 0.95
    assert set(s["per_task"]) == set(vw.VIDEO_TASKS)
    assert all(v >= 0.97 for v in s["per_task"].values()), s["per_task"]


def test_static_and_reversed_clips_score_a_third(ground_truth):
    """Right objects, no (or backward) motion: appearance credit only, so exactly 1/3, never strict."""
    prompts, clips = ground_truth
    for name, junk in (("static", clips[:, :1].expand_as(clips)), ("reversed", clips.flip(1))):
        s = _score(junk, prompts)
        assert max(_credits(s["out"], "motion") + _credits(s["out"], "speed")) == 0.0, name
        assert s["mean_score"] <= 0.34 and s["strict_accuracy"] == 0.0, (name, s)
        assert all(v <= 0.34 for v in s["per_task"].values()), (name, s["per_task"])


def test_noise_and_blank_clips_score_near_zero(ground_truth):
    prompts, clips = ground_truth
    noise = torch.rand(clips.shape, generator=torch.Generator().manual_seed(0))
    s = _score(noise, prompts)
    assert s["mean_score"] <= 0.05 and s["strict_accuracy"] == 0.0
    blank = torch.tensor(BACKGROUND).view(1, 1, 3, 1, 1).div(255).expand(8, 9, 3, 32, 32)
    assert _score(blank, prompts[:8])["mean_score"] == 0.0
    wash = torch.tensor(COLORS["red"]).view(1, 1, 3, 1, 1).div(255).expand(1, 9, 3, 32, 32)
    assert SCORER(wash, ["a video of a red square moving left"]).scores.item() == 0.0  # a wash is no square


def test_mild_blur_noise_and_desaturation_still_score_high(ground_truth):
    prompts, clips = ground_truth
    kernel = torch.exp(-torch.arange(-3, 4).float() ** 2 / (2 * 0.7**2))  # Gaussian, sigma 0.7 px
    kernel = kernel / kernel.sum()
    flat = F.pad(clips.reshape(-1, 1, 32, 32), (3, 3, 3, 3), mode="replicate")
    blurred = F.conv2d(F.conv2d(flat, kernel.view(1, 1, 1, 7)), kernel.view(1, 1, 7, 1)).view(clips.shape)
    noisy = (blurred + 0.05 * torch.randn(clips.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    assert _score(noisy, prompts)["mean_score"] >= 0.95
    drifted = (clips * 0.75 + 0.25 * clips.mean(2, keepdim=True)).clamp(0, 1)  # 25% desaturated
    assert _score(drifted, prompts)["mean_score"] >= 0.95


def _single(text: str, seed: int = 0) -> tuple[torch.Tensor, vw.ToyVideoPrompt]:
    p = vw.parse_prompt(text)
    return vw.clips_to_tensor([vw.render_prompt(p, seed)]), p


def test_flicker_costs_appearance_and_too_little_track_costs_motion():
    clip, p = _single("a video of a red square moving right")
    blank = torch.tensor(BACKGROUND).view(3, 1, 1).div(255)
    flicker = clip.clone()
    flicker[0, 1::2] = blank  # gone in frames 1, 3, 5, 7: seen in 5 of 9
    out = SCORER(flicker, [p.text])
    credits = [c["credit"] for c in out.info["clauses"][0]]
    assert credits[:2] == pytest.approx([5 / 9, 5 / 9]) and credits[2] == 1.0
    assert out.scores.item() == pytest.approx((5 / 9 + 2) / 3)
    mostly_gone = clip.clone()
    mostly_gone[0, 1:6] = blank  # seen in 4 of 9 frames: too short a track for a motion
    assert [c["credit"] for c in SCORER(mostly_gone, [p.text]).info["clauses"][0]][2] == 0.0


def test_motion_and_speed_clauses():
    clip, _ = _single("a video of a circle moving up quickly")
    scores = {text: SCORER(clip, [text]).info["clauses"][0] for text in (
        "a video of a circle moving up quickly",
        "a video of a circle moving up slowly",
        "a video of a circle moving left",
        "a video of a circle moving down",
    )}
    assert [c["credit"] for c in scores["a video of a circle moving up quickly"]] == [1.0, 1.0, 1.0]
    assert [c["credit"] for c in scores["a video of a circle moving up slowly"]] == [1.0, 1.0, 0.0]
    assert scores["a video of a circle moving left"][-1]["credit"] == 0.0  # perpendicular motion
    assert scores["a video of a circle moving down"][-1]["credit"] == 0.0  # opposite motion
    slow, _ = _single("a video of a circle moving up slowly", seed=5)
    assert [c["credit"] for c in SCORER(slow, ["a video of a circle moving up slowly"]).info["clauses"][0]] == [1.0] * 3
    # shuffled frames: the object teleports ahead in every other frame; those frames are jumps the
    # track skips, and each costs motion credit as a bad step would
    shuffled = clip[:, torch.tensor([0, 5, 1, 6, 2, 7, 3, 8, 4])]
    motion = SCORER(shuffled, ["a video of a circle moving up"]).info["motion"][0][0]
    assert (motion["frames_tracked"], motion["jumps"]) == (5, 4)
    assert motion["steady"] == 0.5 and motion["credit"] == 0.5
    backwards_and_forwards = clip[:, torch.tensor([0, 1, 2, 3, 4, 3, 2, 1, 0])]
    motion = SCORER(backwards_and_forwards, ["a video of a circle moving up"]).info["motion"][0][0]
    assert motion["credit"] == 0.0  # the net velocity is zero


def test_wrong_colour_and_shape():
    clip, _ = _single("a video of a green circle moving left")
    out = SCORER(clip, ["a video of a purple circle moving left"])
    assert [c["credit"] for c in out.info["clauses"][0]] == [1.0, 0.0, 0.0]  # no purple circle to track
    out = SCORER(clip, ["a video of a square moving left"])
    assert out.scores.item() == 0.0


def test_deterministic_batch_independent_and_metadata_path(ground_truth):
    prompts, clips = ground_truth
    idx = [0, 40, 70, 100, 140, 200]
    texts = [prompts[i].text for i in idx]
    batch = clips[idx].clone()
    batch[1] = torch.rand(batch[1].shape, generator=torch.Generator().manual_seed(1))  # a junk companion
    together = SCORER(batch, texts)
    assert torch.equal(together.scores, SCORER(batch, texts).scores)
    alone = torch.cat([SCORER(batch[i:i + 1], texts[i:i + 1]).scores for i in range(len(idx))])
    assert torch.equal(together.scores, alone)
    by_meta = SCORER(batch, texts, [prompts[i].to_dict() for i in idx])
    assert torch.equal(by_meta.scores, together.scores)
    with pytest.raises(ValueError, match="does not match"):
        SCORER(batch[:1], ["a video of a circle moving left"], [prompts[40].to_dict()])


def test_other_frame_sizes_and_lengths_score_the_same_way():
    """Sizes, speeds and thresholds are defined at 32 px and scale with the frame width."""
    prompts = list(dict.fromkeys(vw.eval_prompts()))
    clips = [vw.render_prompt(p, i, num_frames=13, frame_size=48) for i, p in enumerate(prompts)]
    s = _score(vw.clips_to_tensor(clips), prompts)
    assert s["mean_score"] >= 0.97
