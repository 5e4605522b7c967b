"""rewards/geneval.py against the official code, on fuzzed detections of every shape of prompt in the shipped set:
GenEval's verdict (djghosh13/geneval, evaluation/evaluate_images.py) and Flow-GRPO's training reward (yifan123/
reward-server, reward_server/gen_eval.py). Their decision functions are read from a checkout at test time (their
module-level imports, mmdetection and a GPU, are not executed); the test skips, naming the variable, without one:

    GENEVAL_CHECKOUT=/path/to/geneval REWARD_SERVER_CHECKOUT=/path/to/reward-server pytest tests/rewards/test_geneval_official.py
"""

import ast
import os
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest

from flowgrpo.data import read_prompts
from rewards.geneval import judge, partial_credit, relative_position
from rewards.geneval_models import Detection

CHECKOUTS = {"GENEVAL_CHECKOUT": "evaluation/evaluate_images.py", "REWARD_SERVER_CHECKOUT": "reward_server/gen_eval.py"}
pytestmark = pytest.mark.skipif(not all(os.environ.get(v) for v in CHECKOUTS),
                                reason="set GENEVAL_CHECKOUT and REWARD_SERVER_CHECKOUT to checkouts of djghosh13/geneval "
                                       "and yifan123/reward-server")
COLOURS = ("red", "blue", "green")


def _functions(variable: str, names: set, colours: dict, **extra) -> dict:
    """The named functions of an official file, defined in a namespace of their globals (the margin 0.1 and a
    colour classifier reading the fuzzed colours)."""
    source = (Path(os.environ[variable]) / CHECKOUTS[variable]).read_text()
    found = [ast.get_source_segment(source, node) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.FunctionDef) and node.name in names]
    assert len(found) == len(names), f"{variable}: expected the functions {sorted(names)}"
    space = {"np": np, "POSITION_THRESHOLD": 0.1, "COLORS": list(COLOURS),
             "color_classification": lambda image, objects, name: [colours[id(o[0])] for o in objects], **extra}
    exec(compile("\n\n".join(textwrap.dedent(f) for f in found), CHECKOUTS[variable], "exec"), space)  # noqa: S102
    return space


def test_verdicts_and_rewards_equal_the_official_code_on_fuzzed_detections():
    colours: dict = {}
    official = _functions("GENEVAL_CHECKOUT", {"relative_position", "evaluate"}, colours)
    server = _functions("REWARD_SERVER_CHECKOUT", {"relative_position", "evaluate_reward"}, colours)
    _, metadata = read_prompts("geneval")
    rng = random.Random(0)
    verdicts = set()
    for _ in range(5000):
        meta = rng.choice(metadata)
        mine, theirs = {}, {}
        for name in {r["class"] for r in meta["include"] + meta.get("exclude", [])}:
            for _ in range(rng.randint(0, 4)):  # boxes in a 100 px square: positions hold, fail and sit in the margin
                x, y = rng.uniform(0, 100), rng.uniform(0, 100)
                d = Detection((x, y, x + rng.uniform(1, 40), y + rng.uniform(1, 40)), rng.uniform(0.31, 1.0))
                row = np.array([*d.box, d.score], dtype=np.float32)
                d = Detection(tuple(row[:4].tolist()), float(row[4]))  # the detector's float32 numbers
                colours[id(d)] = colours[id(row)] = rng.choice(COLOURS)
                mine.setdefault(name, []).append(d)
                theirs.setdefault(name, []).append((row, None))
        for name in mine:  # both read the most confident first
            order = sorted(range(len(mine[name])), key=lambda i: -mine[name][i].score)
            mine[name], theirs[name] = [mine[name][i] for i in order], [theirs[name][i] for i in order]
        classify = lambda dets, name: [colours[id(d)] for d in dets]  # noqa: E731
        verdict = judge(mine, meta, classify)[0]
        assert verdict == official["evaluate"](None, theirs, meta)[0], meta["prompt"]
        exact, score, _ = partial_credit(mine, meta, classify)
        their_exact, their_score, _ = server["evaluate_reward"](None, theirs, meta)
        assert (exact, score) == (their_exact, pytest.approx(their_score, abs=1e-12)), meta["prompt"]
        verdicts.add((meta["tag"], verdict))
    assert len(verdicts) == 12  # every task both passed and failed
    for _ in range(5000):
        a, b = ([*(p := [rng.uniform(0, 50), rng.uniform(0, 50)]), p[0] + rng.uniform(0, 30), p[1] + rng.uniform(0, 30)]
                for _ in range(2))
        a, b = np.array(a, dtype=np.float32), np.array(b, dtype=np.float32)  # a detector's boxes
        assert relative_position(a.tolist(), b.tolist()) == official["relative_position"]((a,), (b,))


@pytest.mark.parametrize("max_overlap", [1.0, 0.5])
def test_kept_detections_equal_the_official_image_evaluation(tmp_path, max_overlap):
    """The official evaluate_image (threshold, counting threshold, order, at most 16, overlap filter) on fuzzed raw
    detector output, fed through a stand-in for mmdetection's inference_detector: its kept boxes and verdict are
    rewards.geneval.keep's and judge's."""
    import json

    from PIL import Image, ImageOps

    from rewards.geneval import Rules, keep
    from rewards.geneval_models import COCO_CLASSES, detections_from_mmdet

    rng = np.random.default_rng(0)
    raw: dict = {}
    official = _functions("GENEVAL_CHECKOUT", {"compute_iou", "relative_position", "evaluate", "evaluate_image"}, {},
                          THRESHOLD=0.3, COUNTING_THRESHOLD=0.9, MAX_OBJECTS=16, NMS_THRESHOLD=max_overlap,
                          classnames=list(COCO_CLASSES), object_detector=None, Image=Image, ImageOps=ImageOps, json=json,
                          inference_detector=lambda detector, path: raw["result"])
    path = tmp_path / "image.png"
    Image.new("RGB", (100, 100)).save(path)
    _, metadata = read_prompts("geneval")
    rules = Rules(max_overlap=max_overlap)
    for trial in range(300):
        meta = metadata[rng.integers(len(metadata))]
        boxes = []
        for _ in COCO_CLASSES:  # a few detections of every class, scores around both thresholds, ties included
            n = int(rng.integers(0, 20 if rng.random() < 0.1 else 4))
            xy = rng.uniform(0, 60, (n, 2))
            row = np.concatenate([xy, xy + rng.uniform(2, 40, (n, 2)), rng.choice([0.2, 0.3, 0.5, 0.9, 0.95], n)[:, None]
                                  + rng.uniform(-0.05, 0.05, (n, 1)) * (rng.random(n) < 0.7)[:, None]], 1)
            boxes.append(row.astype(np.float32))
        raw["result"] = boxes
        official["color_classification"] = lambda image, objects, name: ["red"] * len(objects)
        theirs = official["evaluate_image"](str(path), meta)
        kept = keep(detections_from_mmdet(boxes), meta["tag"], rules)
        mine = {name: [list(d.box) + [d.score] for d in found] for name, found in kept.items()}
        assert mine == json.loads(theirs["details"]), trial  # the same float32 numbers, the same order
        assert judge(kept, meta, lambda dets, name: ["red"] * len(dets), rules)[0] == theirs["correct"], trial
