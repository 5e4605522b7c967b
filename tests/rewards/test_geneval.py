"""The GenEval decision rules (rewards/geneval.py), rule by rule on hand-made detections, and on every prompt of
the shipped set: the official evaluator's verdict (judge) and Flow-GRPO's training reward (partial_credit)."""

import pytest
import torch

from flowgrpo.data import read_prompts
from rewards.geneval import Rules, iou, judge, keep, partial_credit, relative_position
from rewards.geneval_models import Detection


def det(x, y, size=20.0, score=0.95):
    """A detection of a size x size box centred at (x, y)."""
    h = size / 2
    return Detection(box=(x - h, y - h, x + h, y + h), score=score, mask=None)


def paint(colour):
    """A colour classifier that calls every object ``colour`` (a str) or the i-th one colour[i] (a list)."""
    def classify(dets, name):
        return [colour] * len(dets) if isinstance(colour, str) else list(colour[: len(dets)])
    return classify


NO_COLOUR = paint("none")


def test_iou_counts_boxes_as_inclusive_pixel_ranges():
    assert iou((0, 0, 9, 9), (5, 5, 14, 14)) == 25 / 175  # 10x10 boxes sharing a 5x5 corner
    assert iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0
    assert iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1


def test_keep_thresholds_strictly_sorts_limits_and_filters_overlap():
    found = {"cat": [det(10, 10, score=0.3), det(50, 50, score=0.31), det(90, 90, score=0.8)], "dog": [det(5, 5, score=0.2)]}
    kept = keep(found, "single_object")
    assert [d.score for d in kept["cat"]] == [0.8, 0.31]  # above 0.3, not at it; most confident first
    assert "dog" not in kept  # a class with nothing left is absent
    assert "cat" not in keep(found, "counting")  # counting prompts read confidence > 0.9 only
    # a detector's float32 score of 0.3 is 0.30000001192...: compared in float32, as the official, it is not above 0.3
    assert "cat" not in keep({"cat": [det(10, 10, score=float(torch.tensor(0.3)))]}, "single_object")
    many = {"cup": [det(10 * i, 10, score=0.5 + i / 100) for i in range(20)]}
    assert len(keep(many, "single_object")["cup"]) == 16
    twins = {"cup": [det(10, 10, score=0.9), det(11, 10, score=0.8)]}
    assert len(keep(twins, "single_object")["cup"]) == 2  # max_overlap 1.0: duplicates are all kept
    assert len(keep(twins, "single_object", Rules(max_overlap=0.5))["cup"]) == 1


def test_relative_position_margin_and_directions():
    a, b = (0, 0, 10, 10), (30, 0, 40, 10)  # centres 30 apart on x, each 10 wide: shrunk by 0.1 * 20
    assert relative_position(a, b) == {"left of"} and relative_position(b, a) == {"right of"}
    assert relative_position((0, 0, 10, 10), (0, 30, 10, 40)) == {"above"}  # image y grows downwards
    assert relative_position((0, 0, 10, 10), (1, 1, 11, 11)) == set()  # within the margin: no relation
    assert relative_position((0, 0, 10, 10), (2, 0, 12, 10)) == set()  # offset 2 == margin 0.1 * 20: none
    # past the margin the shrunk offset must still be over half the offset: |d| - 2 > |d| / 2, so |d| > 4
    assert relative_position((0, 0, 10, 10), (3, 0, 13, 10)) == set()
    assert relative_position((0, 0, 10, 10), (4, 0, 14, 10)) == set()  # 2 / 4 is not < -0.5
    assert relative_position((0, 0, 10, 10), (4.1, 0, 14.1, 10)) == {"left of"}
    assert relative_position((0, 0, 0, 0), (20, 20, 20, 20)) == {"left of", "above"}  # a diagonal is both
    # mostly vertical: x shrinks to 8 of an offset of |(-10, -30)| = 31.6, 0.25 < 0.5: only "above"
    assert relative_position((0, 0, 10, 10), (10, 30, 20, 40)) == {"above"}
    assert relative_position((0, 0, 10, 10), (30, 0, 40, 10), margin=1.5) == set()  # the margin is a rule


def test_single_and_two_objects():
    meta = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}
    assert judge({"cat": [det(10, 10)], "dog": [det(50, 50)]}, meta, NO_COLOUR)[0]
    ok, reason = judge({"cat": [det(10, 10)]}, meta, NO_COLOUR)
    assert not ok and "dog>=1, found 0" in reason
    assert judge({"cat": [det(10, 10), det(40, 40)], "dog": [det(50, 50)]}, meta, NO_COLOUR)[0]  # extras are fine


def test_counting_needs_the_count_and_fewer_than_the_exclusion():
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]}
    cups = [det(30 * i, 10, score=0.95) for i in range(5)]
    assert judge({"cup": cups[:3]}, meta, NO_COLOUR)[0]
    assert not judge({"cup": cups[:2]}, meta, NO_COLOUR)[0]
    ok, reason = judge({"cup": cups[:4]}, meta, NO_COLOUR)
    assert not ok and "cup<4, found 4" in reason
    # the counting threshold: a fourth cup at 0.85 confidence is not counted, so three cups pass
    raw = {"cup": cups[:3] + [det(200, 10, score=0.85)]}
    assert judge(keep(raw, "counting"), meta, NO_COLOUR)[0]
    assert not judge(keep(raw, "single_object"), meta, NO_COLOUR)[0]  # under the 0.3 threshold it would count


def test_colour_reads_only_the_most_confident_count_objects():
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    cars = {"car": [det(10, 10, score=0.9), det(60, 10, score=0.5)]}
    assert judge(cars, meta, paint(["red", "blue"]))[0]
    ok, reason = judge(cars, meta, paint(["blue", "red"]))  # the most confident car is blue
    assert not ok and "expected red car>=1, found 0 red" in reason
    seen = []
    judge(cars, meta, lambda dets, name: seen.append((len(dets), name)) or ["red"] * len(dets))
    assert seen == [(1, "car")]  # the classifier sees the `count` most confident objects only


def test_colour_attribution_needs_every_include_right():
    meta = {"tag": "color_attr", "include": [{"class": "bag", "count": 1, "color": "pink"},
                                             {"class": "clock", "count": 1, "color": "black"}]}
    objects = {"bag": [det(10, 10)], "clock": [det(60, 60)]}
    colours = {"bag": "pink", "clock": "black"}
    assert judge(objects, meta, lambda dets, name: [colours[name]] * len(dets))[0]
    swapped = {"bag": "black", "clock": "pink"}  # the colours swapped between the objects: attribution fails
    assert not judge(objects, meta, lambda dets, name: [swapped[name]] * len(dets))[0]


def test_position_every_pair_and_a_missing_target():
    meta = {"tag": "position", "include": [{"class": "bear", "count": 1},
                                           {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    assert judge({"bear": [det(10, 50)], "dog": [det(80, 50)]}, meta, NO_COLOUR)[0]
    ok, reason = judge({"bear": [det(80, 50)], "dog": [det(10, 50)]}, meta, NO_COLOUR)
    assert not ok and "expected dog right of target, found left of" in reason
    ok, reason = judge({"dog": [det(80, 50)]}, meta, NO_COLOUR)
    assert not ok and "no target for dog" in reason
    two = {"tag": "position", "include": [{"class": "bear", "count": 2},
                                          {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    assert judge({"bear": [det(10, 50), det(20, 90)], "dog": [det(80, 50)]}, two, NO_COLOUR)[0]
    # the dog must be right of every bear of the target group
    assert not judge({"bear": [det(10, 50), det(120, 50)], "dog": [det(80, 50)]}, two, NO_COLOUR)[0]
    within = {"bear": [det(50, 50)], "dog": [det(53, 50)]}  # 3 px apart, inside the 0.1 * 40 margin
    assert not judge(within, meta, NO_COLOUR)[0]


def test_flow_grpo_partial_credit_hand_numbers():
    two = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}
    assert partial_credit({"cat": [det(10, 10)]}, two, NO_COLOUR)[:2] == (False, 0.5)  # terms 1, 0
    assert partial_credit({"cat": [det(10, 10)], "dog": [det(60, 60)]}, two, NO_COLOUR)[:2] == (True, 1.0)
    count = {"tag": "counting", "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}]}
    exact, score, _ = partial_credit({"cup": [det(30 * i, 10) for i in range(4)]}, count, NO_COLOUR)
    assert not exact and score == 1 - 1 / 3  # exact count, not "at least"; exclude is not read
    one = {"tag": "single_object", "include": [{"class": "cup", "count": 1}]}
    assert partial_credit({"cup": [det(30 * i, 10) for i in range(3)]}, one, NO_COLOUR)[1] == -1.0  # 1 - 2/1
    colour = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    assert partial_credit({"car": [det(10, 10)]}, colour, paint("blue"))[:2] == (False, 0.5)  # 1, 0
    assert partial_credit({}, colour, paint("red"))[:2] == (False, 0.0)  # count 0 of 1 -> 0, and 0 for the colour
    pos = {"tag": "position", "include": [{"class": "bear", "count": 1},
                                          {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    assert partial_credit({"bear": [det(10, 50)], "dog": [det(80, 50)]}, pos, NO_COLOUR)[:2] == (True, 1.0)  # 1, 1, 1
    # a failed position appends 0 and then 1, as the reference does: terms 1, 1, 0, 1
    assert partial_credit({"bear": [det(80, 50)], "dog": [det(10, 50)]}, pos, NO_COLOUR)[:2] == (False, 0.75)
    assert partial_credit({"dog": [det(10, 50)]}, pos, NO_COLOUR)[:2] == (False, 1 / 3)  # bear 0; dog 1; no target 0


def _perfect_scene(meta):
    """Detections that satisfy a GenEval prompt: each include's objects in a column of its own, objects with a
    position placed 200 px from their target in that direction, colours as asked."""
    step = {"left of": (-200, 0), "right of": (200, 0), "above": (0, -200), "below": (0, 200)}
    objects, colours, places = {}, {}, []
    for j, req in enumerate(meta["include"]):
        if "position" in req:
            relation, target = req["position"]
            tx, ty = places[target]
            x, y = tx + step[relation][0], ty + step[relation][1]
        else:
            x, y = 1000 + 400 * j, 1000 + 400 * j
        places.append((x, y))
        objects[req["class"]] = objects.get(req["class"], []) + [det(x + 3 * k, y + 3 * k, size=4) for k in range(req["count"])]
        colours[req["class"]] = req.get("color", "none")
    return objects, lambda dets, name: [colours[name]] * len(dets)


def test_every_shipped_prompt_passes_its_perfect_scene_and_fails_without_an_object():
    prompts, metadata = read_prompts("geneval")
    assert {m["tag"] for m in metadata} == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    for prompt, meta in zip(prompts, metadata):
        objects, colours = _perfect_scene(meta)
        assert judge(objects, meta, colours) == (True, ""), prompt
        assert partial_credit(objects, meta, colours)[:2] == (True, 1.0), prompt
        first = meta["include"][0]["class"]
        missing = {**objects, first: objects[first][:-1]}
        assert not judge(missing, meta, colours)[0], prompt
        assert not partial_credit(missing, meta, colours)[0], prompt


@pytest.mark.parametrize("score", ["official", "exact", "partial"])
def test_the_reward_reports_the_chosen_score_and_all_three_in_info(score):
    import torch

    from rewards.geneval import GenEval

    class Fixed:  # a detector that sees two cats, one very confident
        def __call__(self, images):
            return [{"cat": [det(10, 10, score=0.95), det(40, 40, score=0.5)]} for _ in images]

    reward = GenEval(score, detector_model=Fixed(), colour_model=lambda image, dets, name: ["black"] * len(dets))
    meta = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}]},
            {"tag": "colors", "include": [{"class": "cat", "count": 1, "color": "black"}]}, {}]
    out = reward(torch.zeros(3, 3, 8, 8), ["a photo of a cat", "a photo of a black cat", "no metadata"], meta)
    # official: at least one cat, the most confident black -> correct; exact: two cats found, not one
    assert out.info["correct"][:2].tolist() == [1.0, 1.0] and out.info["strict"][:2].tolist() == [0.0, 0.0]
    assert out.info["partial"][:2].tolist() == [0.0, 0.0]  # 1 - |1 - 2| / 1 = 0; the colour term is 0 too
    expected = {"official": out.info["correct"], "exact": out.info["strict"], "partial": out.info["partial"]}[score]
    assert out.scores[:2].tolist() == expected[:2].tolist() and torch.isnan(out.scores[2])
    assert out.info["task"] == ["single_object", "colors", ""]
