"""Tests of the toy editing world (worlds/toy/edits.py) and its scorer (rewards/toy/edit_scorer.py).

Run: .venv/bin/python -m pytest -q tests/worlds/test_toy_edit_world.py
"""

import functools
import json
import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from rewards import load_reward
from rewards.toy.edit_scorer import ToyEditScorer
from rewards.toy.scorer import detect_objects, summarize
from worlds.toy import edits
from worlds.toy.edits import (
    EDIT_TASKS,
    EVAL_PER_TASK,
    MOVE_PX,
    EditPrompt,
    eval_edits,
    instruction,
    is_novel,
    parse_instruction,
    render_source,
    render_target,
    train_edits,
)
from worlds.toy.scenes import BACKGROUND, COLORS, IMAGE_SIZE, SHAPES, Scene, ToyObject, render


def _floats(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255


@functools.lru_cache(maxsize=2)
def _eval_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sources, targets) float [128, 3, size, size] of the eval records."""
    records = eval_edits()
    return _floats([render_source(p, size) for p in records]), _floats([render_target(p, size) for p in records])


def _score(images: torch.Tensor, sources: torch.Tensor, records: list[EditPrompt], with_metadata: bool = True):
    metadata = [p.to_dict() for p in records] if with_metadata else None
    return ToyEditScorer()(images, [p.text for p in records], metadata, conditions=sources[:, None])


def test_splits_are_fixed_sized_and_disjoint():
    train, evals = train_edits(), eval_edits()
    assert len(train) == 4 * edits.TRAIN_PER_TASK and len(evals) == 4 * EVAL_PER_TASK
    assert Counter(p.task for p in evals) == {t: EVAL_PER_TASK for t in EDIT_TASKS}
    assert len(set(train)) == len(train) and len(set(evals)) == len(evals) and not set(train) & set(evals)
    edits._splits.cache_clear()  # drawn again from the seeds: the same records
    assert train_edits() == train and eval_edits() == evals
    for task in EDIT_TASKS:  # held-out combinations and seen ones on new scenes
        novel = [p.novel for p in evals if p.task == task]
        assert sum(novel) == edits.EVAL_NOVEL_PER_TASK and not all(novel)


def test_held_out_combinations_occur_only_in_eval():
    train, evals = train_edits(), eval_edits()
    assert not any(p.novel for p in train)
    held = {
        "recolor": lambda f: (f["new_color"], f["shape"]) in edits.HELD_OUT_RECOLORS,
        "move": lambda f: (f["shape"], f["direction"]) in edits.HELD_OUT_MOVES,
        "add": lambda f: (f["color"], f["shape"]) in edits.HELD_OUT_ADDS,
        "remove": lambda f: (f["color"], f["shape"]) in edits.HELD_OUT_REMOVES,
    }
    for p in train + evals:
        assert p.novel == held[p.task](parse_instruction(p.text))
    keys = {"recolor": ("new_color", "shape"), "move": ("shape", "direction"), "add": ("color", "shape"),
            "remove": ("color", "shape")}
    lists = {"recolor": edits.HELD_OUT_RECOLORS, "move": edits.HELD_OUT_MOVES, "add": edits.HELD_OUT_ADDS,
             "remove": edits.HELD_OUT_REMOVES}
    for task in EDIT_TASKS:  # every held-out combination is asked in eval
        asked = {tuple(parse_instruction(p.text)[k] for k in keys[task]) for p in evals if p.novel and p.task == task}
        assert asked == set(lists[task])


def test_detector_reads_every_object_size_and_phase_exactly():
    """SIZES and the POSITION_STEP grid are the values detect_objects reads exactly at 32 and 64 px, for every
    shape, colour and sub-pixel phase (module docstring): the ground truth's strict 1.0 rests on it."""
    for image_size in (32, 64):
        phases = np.arange(0, IMAGE_SIZE / image_size, edits.POSITION_STEP)  # within one pixel of the image
        objects = [ToyObject(shape, color, 30 + px, 30 + py, size) for shape in SHAPES for color in COLORS
                   for size in edits.SIZES for px in phases for py in phases]
        images = _floats([render(Scene((o,)), image_size, scene_size=IMAGE_SIZE) for o in objects])
        found = detect_objects((images * 255).round().to(torch.uint8))
        assert [[(d["color"], d["shape"]) for d in dets] for dets in found] == [[(o.color, o.shape)] for o in objects]


def test_fresh_training_draws_are_task_balanced_and_never_held_out():
    drawn = edits.draw_train_edits(random.Random(0), 40)
    assert Counter(p.task for p in drawn) == {t: 10 for t in EDIT_TASKS}
    assert not any(p.novel for p in drawn) and not set(drawn) & set(eval_edits())
    assert drawn == edits.draw_train_edits(random.Random(0), 40)


def test_records_are_consistent_and_round_trip():
    for p in train_edits()[::50] + eval_edits():
        source, target = p.source_scene().objects, p.target_scene().objects
        assert 1 <= len(source) <= 3
        assert len({(o.color, o.shape) for o in target}) == len(target)  # references stay unambiguous
        assert EditPrompt.from_dict(json.loads(json.dumps(p.to_dict()))) == p
        lo = edits.EDGE_MARGIN_PX
        assert all(lo + o.size <= o.cx <= IMAGE_SIZE - lo - o.size and lo + o.size <= o.cy <= IMAGE_SIZE - lo - o.size
                   for o in target)
        if p.task == "move":
            i = p.edit["object"]
            assert abs(target[i].cx - source[i].cx) + abs(target[i].cy - source[i].cy) == MOVE_PX
    p = eval_edits()[0]
    with pytest.raises(ValueError, match="is not the source's"):
        EditPrompt.from_dict({**p.to_dict(), "edit": {**p.edit, "object": (p.edit["object"] + 1) % 4}})
    with pytest.raises(ValueError, match="missing keys"):
        EditPrompt.from_dict({"text": p.text, "task": p.task})


def test_parse_instruction_inverts_every_instruction():
    texts = {p.text for p in train_edits() + eval_edits()}
    for task in EDIT_TASKS:
        for fields in edits.all_instructions(task):
            assert parse_instruction(instruction(fields)) == fields
    for text in texts:
        assert instruction(parse_instruction(text)) == text
    assert parse_instruction("make the red circle blue") == {"task": "recolor", "color": "red", "shape": "circle",
                                                              "new_color": "blue"}
    assert parse_instruction("move the cyan square up")["direction"] == "up"
    assert is_novel(parse_instruction("make the red triangle purple"))
    for bad in ("make the red circle red", "move the red circle sideways", "add the red circle", "paint it black"):
        with pytest.raises(ValueError, match="Grammar: one of"):
            parse_instruction(bad)


@pytest.mark.parametrize("size", [32, 64])
def test_ground_truth_scores_one_and_the_source_copy_zero(size):
    records = eval_edits()
    sources, targets = _eval_batch(size)
    out = _score(targets, sources, records)
    assert out.scores.tolist() == [1.0] * len(records) and bool(out.info["strict"].all())
    assert summarize(out.scores, out.info["strict"], out.info["task"])["per_task"] == {t: 1.0 for t in
                                                                                      sorted(EDIT_TASKS)}
    assert out.info["novel"] == [p.novel for p in records]
    copy = _score(sources, sources, records)
    assert copy.info["done"] == [0.0] * len(records) and copy.scores.tolist() == [0.0] * len(records)
    # without metadata the scorer reads the source scene off the source image: the same verdicts
    assert _score(targets, sources, records, with_metadata=False).scores.tolist() == [1.0] * len(records)
    assert _score(sources, sources, records, with_metadata=False).scores.tolist() == [0.0] * len(records)


def test_changing_another_object_or_the_background_costs_kept():
    records = [p for p in eval_edits() if len(p.source) >= 2][:24]
    sources = _floats([render_source(p, 32) for p in records])
    changed = []
    for p in records:  # the edit done, and one untouched object recoloured
        target = list(p.target_scene().objects)
        j = 0 if p.task == "add" or p.edit["object"] != 0 else 1  # an untouched source object ...
        if p.task == "remove" and p.edit["object"] < j:
            j -= 1  # ... and its index in the target
        used = {(o.color, o.shape) for o in target}
        target[j] = replace(target[j], color=next(c for c in COLORS if (c, target[j].shape) not in used))
        changed.append(render(Scene(tuple(target)), 32, scene_size=IMAGE_SIZE))
    out = _score(_floats(changed), sources, records)
    assert out.info["done"] == [1.0] * len(records)
    assert max(out.info["kept"]) <= 0.75 and not out.info["strict"].any()
    targets = _floats([render_target(p, 32) for p in records])
    background = (targets == torch.tensor(BACKGROUND).view(1, 3, 1, 1) / 255).all(1, keepdim=True)
    repainted = torch.where(background, torch.tensor([200.0, 200.0, 200.0]).view(1, 3, 1, 1) / 255, targets)
    out = _score(repainted, sources, records)
    assert out.info["done"] == [1.0] * len(records) and max(out.info["kept"]) <= 0.8


def test_a_move_that_leaves_the_original_behind_is_not_done():
    records = [p for p in eval_edits() if p.task == "move"]
    smeared = [render(Scene(p.target_scene().objects + (p.source_scene().objects[p.edit["object"]],)), 32,
                      scene_size=IMAGE_SIZE) for p in records]
    out = _score(_floats(smeared), _eval_batch(32)[0][[eval_edits().index(p) for p in records]], records)
    assert out.info["done"] == [0.0] * len(records)


def test_scorer_needs_the_source_images_and_is_registered():
    records = eval_edits()[:2]
    images = _eval_batch(32)[1][:2]
    with pytest.raises(ValueError, match="judges a result against its source image"):
        ToyEditScorer()(images, [p.text for p in records], [p.to_dict() for p in records])
    reward = load_reward("toy_edit")
    assert isinstance(reward, ToyEditScorer) and reward.sees_condition
    # without metadata: an instruction naming an object the source does not show is not applicable (NaN)
    blank = torch.full((2, 1, 3, 32, 32), BACKGROUND[0] / 255)
    added = _floats([render(Scene((ToyObject("circle", "red", 30.0, 30.0, 8.0),)), 32, scene_size=IMAGE_SIZE)] * 2)
    out = reward(added, ["remove the red circle", "add a red circle"], None, conditions=blank)
    assert out.scores[0].isnan() and out.scores[1] == 1.0
