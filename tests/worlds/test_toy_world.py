"""Tests of the toy world: renderer, prompt grammar, fixed splits and ground-truth scenes.

Run: .venv/bin/pytest tests/worlds/test_toy_world.py -q
"""

import json
import random
from collections import Counter

import numpy as np
import pytest

from worlds.toy import scenes
from worlds.toy.scenes import (
    BACKGROUND,
    COLORS,
    IMAGE_SIZE,
    TASKS,
    Scene,
    ToyObject,
    ToyPrompt,
    eval_prompts,
    make_prompt,
    parse_prompt,
    render,
    render_prompt,
    scene_for_prompt,
    train_prompts,
)


def _objects(p: ToyPrompt) -> list[dict]:
    return [c for c in p.clauses if c["type"] == "object"]


def _color_shape_pairs(p: ToyPrompt) -> set[tuple[str, str]]:
    objs = _objects(p)
    return {(c["color"], objs[c["object"]]["shape"]) for c in p.clauses if c["type"] == "color"}


def test_palette_is_well_separated():
    colors = [*COLORS.values(), BACKGROUND]
    gaps = [np.linalg.norm(np.subtract(a, b)) for i, a in enumerate(colors) for b in colors[i + 1:]]
    assert len(COLORS) >= 6
    assert min(gaps) >= 120  # nearest pair: blue-cyan at 120.5


def test_render_shape_dtype_background_and_colours():
    scene = Scene((ToyObject("circle", "red", 16.0, 16.0, 8.0), ToyObject("triangle", "blue", 44.0, 44.0, 10.0)))
    img = render(scene)
    assert img.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and img.dtype == np.uint8
    assert tuple(img[1, 62]) == BACKGROUND and tuple(img[62, 1]) == BACKGROUND
    assert tuple(img[16, 16]) == COLORS["red"] and tuple(img[44, 44]) == COLORS["blue"]
    assert (render(Scene(())) == np.array(BACKGROUND, dtype=np.uint8)).all()
    # a square of half-extent 5 on pixel boundaries covers exactly 10 x 10 pixels
    square = render(Scene((ToyObject("square", "green", 30.0, 30.0, 5.0),)))
    assert (square == np.array(COLORS["green"], dtype=np.uint8)).all(axis=-1).sum() == 100


def test_render_is_deterministic_in_seed():
    p = eval_prompts()[100]
    assert np.array_equal(render_prompt(p, 3), render_prompt(p, 3))
    assert scene_for_prompt(p, random.Random(3)) == scene_for_prompt(p, random.Random(3))
    assert not np.array_equal(render_prompt(p, 3), render_prompt(p, 4))


def test_split_sizes_are_pinned():
    # A model is pretrained on these sets: a change here must be deliberate.
    assert Counter(p.task for p in train_prompts()) == {
        "single_object": 2, "two_objects": 4, "counting": 9, "colors": 12, "position": 744, "color_attr": 194,
    }
    evals = eval_prompts()
    assert len(evals) == 192 and Counter(p.task for p in evals) == {t: 32 for t in TASKS}
    assert [p.task for p in evals] == [t for t in TASKS for _ in range(32)]
    assert len({p.text for p in evals}) == 76
    assert sum(p.novel for p in evals) == 145
    assert train_prompts() == train_prompts() and eval_prompts() == evals


def test_train_and_eval_are_disjoint_and_held_out_combinations_stay_out_of_train():
    train, evals = train_prompts(), eval_prompts()
    assert len({p.text for p in train}) == len(train)
    assert not {p.text for p in train} & {p.text for p in evals}
    assert not any(p.novel for p in train)
    held = set(scenes.HELD_OUT_COLOR_SHAPES)
    for p in train:
        assert not _color_shape_pairs(p) & held, p.text
        if p.task == "position":
            objs = _objects(p)
            assert (objs[0]["shape"], p.clauses[-1]["relation"], objs[1]["shape"]) not in scenes.HELD_OUT_POSITIONS
    novel_tasks = Counter(p.task for p in evals if p.novel)
    assert set(novel_tasks) == set(TASKS)  # every task measures generalisation
    # every eval colour-shape pair of a novel colour prompt is one training never shows
    assert all(_color_shape_pairs(p) <= held for p in evals if p.task == "colors" and p.novel)


def test_parse_prompt_inverts_every_prompt():
    for p in train_prompts() + eval_prompts():
        assert parse_prompt(p.text) == p


def test_parse_prompt_examples():
    p = parse_prompt("a photo of a red circle left of a blue square")
    assert p.task == "position" and not p.novel
    assert p.clauses == (
        {"type": "object", "shape": "circle", "count": 1},
        {"type": "object", "shape": "square", "count": 1},
        {"type": "color", "object": 0, "color": "red"},
        {"type": "color", "object": 1, "color": "blue"},
        {"type": "position", "relation": "left of", "a": 0, "b": 1},
    )
    assert parse_prompt("a photo of four triangles").clauses == ({"type": "object", "shape": "triangle", "count": 4},)
    assert parse_prompt("a photo of a red triangle").novel  # held-out colour-shape pair
    assert parse_prompt("a photo of a circle above a square").novel  # held-out ordered triple
    assert not parse_prompt("a photo of a square below a circle").novel  # its converse is seen


@pytest.mark.parametrize(
    "text",
    [
        "a dog",
        "a photo of a pink circle",
        "a photo of two circle",
        "a photo of one circles",
        "a photo of five circles",
        "a photo of a red circle and a square",
        "a photo of a circle and a circle",
        "a photo of a red circle left of a red circle",
        "a photo of a circle next to a square",
    ],
)
def test_parse_prompt_rejects_text_outside_grammar(text):
    with pytest.raises(ValueError, match="outside the grammar.*Grammar"):
        parse_prompt(text)


def test_to_dict_round_trip_is_json():
    for p in eval_prompts()[::16]:
        d = json.loads(json.dumps(p.to_dict()))
        assert ToyPrompt.from_dict(d) == p
    assert len(set(train_prompts())) == 965  # hashable despite dict clauses
    with pytest.raises(ValueError, match="missing keys"):
        ToyPrompt.from_dict({"text": "a photo of a circle"})


def test_make_prompt_is_deterministic_and_draws_from_train():
    train_texts = {p.text for p in train_prompts()}
    for task in TASKS:
        drawn = [make_prompt(task, random.Random(i)) for i in range(40)]
        assert drawn == [make_prompt(task, random.Random(i)) for i in range(40)]
        assert all(p.task == task and p.text in train_texts for p in drawn)
    plain = sum(not scenes._is_colored(make_prompt("position", random.Random(i))) for i in range(200))
    assert 60 <= plain <= 140  # uncoloured position form about half the time
    assert make_prompt("colors", random.Random(0), split="eval").text in {p.text for p in eval_prompts()}
    with pytest.raises(ValueError, match="not one of"):
        make_prompt("spatial", random.Random(0))


def _check_scene(p: ToyPrompt, scene: Scene) -> None:
    objs = _objects(p)
    expected = Counter()
    for c in objs:
        expected[c["shape"]] += c["count"]
    assert Counter(o.shape for o in scene.objects) == expected, p.text
    for o in scene.objects:
        assert 6.0 <= o.size <= 12.0
        for centre in (o.cx, o.cy):  # 1 px from the border, up to the 0.01 px rounding of positions
            assert o.size + 1 - 0.01 <= centre <= IMAGE_SIZE - 1 - o.size + 0.01
    for i, a in enumerate(scene.objects):  # bounding boxes at least 3 px apart
        for b in scene.objects[i + 1:]:
            reach = a.size + b.size + 3
            assert abs(a.cx - b.cx) >= reach or abs(a.cy - b.cy) >= reach, p.text
    # clause object i is scene object i for prompts with one object per clause
    for c in p.clauses:
        if c["type"] == "color":
            assert scene.objects[c["object"]].color == c["color"], p.text
        if c["type"] == "position":
            a, b = scene.objects[c["a"]], scene.objects[c["b"]]
            along = {"left of": b.cx - a.cx, "right of": a.cx - b.cx, "above": b.cy - a.cy, "below": a.cy - b.cy}
            across = abs(a.cy - b.cy) if c["relation"] in ("left of", "right of") else abs(a.cx - b.cx)
            assert along[c["relation"]] >= a.size + b.size + 3 and across <= 0.5 * along[c["relation"]], p.text


def test_ground_truth_scenes_satisfy_every_clause():
    prompts = list(dict.fromkeys(eval_prompts())) + train_prompts()[::5]
    for seed in range(3):
        for p in prompts:
            _check_scene(p, scene_for_prompt(p, random.Random(seed)))
    four = parse_prompt("a photo of four circles")
    for seed in range(50):  # the most crowded scene still places without overlap
        _check_scene(four, scene_for_prompt(four, random.Random(seed)))


def test_unspecified_colours_vary():
    p = parse_prompt("a photo of three squares")
    colours = {o.color for s in range(20) for o in scene_for_prompt(p, random.Random(s)).objects}
    assert colours == set(COLORS)
