"""The rules around networks that cannot run here, compared on injected network outputs (the networks themselves are
NOT compared): OCR (PaddleOCR cannot be installed here), GenEval (mmdetection's Mask2Former and the CLIP colour
classifier), UnifiedReward (a VLM behind an OpenAI-compatible server), and JPEG compressibility (no network).

OCR: the official ``OcrScorer`` (flow_grpo/ocr.py) is built through the official ``rewards.ocr_score`` with a stand-in
``paddleocr.PaddleOCR`` whose ``ocr(image, cls=False)`` answers PaddleOCR 2.x's result format ([[box, (text,
confidence)], ...] per image, [None] when nothing is read) from a table keyed by the image's bytes; flowgrpo's ``ocr``
reads through its own ``paddleocr_reader`` on the same stand-in, so both sides parse the same engine output.
``Levenshtein.distance`` (the python-Levenshtein package the official imports) is a plain edit distance written here
(independent of flowgrpo's).

GenEval: the official evaluator functions are nested inside ``load_geneval`` (flow_grpo/gen_eval.py in DiffusionNFT,
reward_server/gen_eval.py of the reward server Flow-GRPO and AWM post to): ``compute_geneval`` and the functions and
constants it uses are taken from the file's syntax tree and run with ``inference_detector`` answering fuzzed
per-class box arrays (mmdetection's format, float32 [n, 5]) and ``color_classification`` answering fuzzed colours;
flowgrpo's ``geneval`` gets the same detections and colours through its ``detector_model`` / ``colour_model``.
"""

from __future__ import annotations

import ast
import hashlib
import io
import random
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

from scorers import ScorerReport, checkout, float32s, floats, load, packages, tolerance, uint8_images


def _key(array: np.ndarray) -> str:
    return hashlib.md5(np.ascontiguousarray(array).tobytes()).hexdigest()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance by the full dynamic-programming table (the official imports python-Levenshtein's)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        table[i][0] = i
    for j in range(len(b) + 1):
        table[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[len(a)][len(b)]


# ------------------------------------------------------------------------------------------------------ OCR
OCR_CASES = [  # (prompt, PaddleOCR 2.x lines [(text, confidence)] or None for nothing read)
    ('a sign that says "Hello World"', [("Hello World", 0.98)]),
    ('a sign that says "Hello World"', [("HELLO", 0.9), ("world", 0.8)]),
    ('a shop called "Bread & Co" at dusk', [("the bread&co bakery since 1901", 0.7)]),
    ('a poster reading "OPEN 24 HOURS"', [("OPEN 2A HOUR", 0.6)]),
    ('a poster reading "OPEN 24 HOURS"', [("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", 0.5)]),
    ('a neon sign "Cafe"', None),
    ('a neon sign "Cafe"', [("Cafe", 0.0), ("Cafx", 0.4)]),
    ('a banner "Happy Birthday Anna" and "balloons"', [("Happy Birthdy Ana", 0.95)]),
    ('a label "a b c"', [("A  B", 0.9), (" C", 0.9)]),
    ('a road sign "STOP"', [("ST", 0.9), ("OP", 0.9), ("STOP", -1.0)]),
]


def ocr_rows() -> list:
    from scorers import MissingCheckout

    n = len(OCR_CASES)
    g = torch.Generator().manual_seed(7)
    x = torch.rand(n, 3, 64, 96, generator=g)
    u8 = uint8_images(x)
    table = {_key(u8[i].permute(1, 2, 0).numpy()): OCR_CASES[i][1] for i in range(n)}
    prompts = [c[0] for c in OCR_CASES]
    built: list[dict] = []

    class PaddleOCR:  # PaddleOCR 2.x's interface, answering the table
        def __init__(self, **kwargs):
            built.append(kwargs)

        def ocr(self, image, cls=False):
            lines = table[_key(np.asarray(image))]
            box = [[0, 0], [1, 0], [1, 1], [0, 1]]
            return [None] if lines is None else [[[box, (t, c)] for t, c in lines]]

    paddle = types.ModuleType("paddleocr")
    paddle.PaddleOCR = PaddleOCR
    lev = types.ModuleType("Levenshtein")
    lev.distance = edit_distance
    rows = []
    for code, inner, launches in (("diffusion_nft", "", ["ocr_sd3 (config/nft.py)"]),
                                  ("flow_grpo", "", ["general_ocr_sd3 (config/grpo.py)"]),
                                  ("awm", "advantage_weighted_matching/", ["ocr launches of config/dgx_awm.py"]),
                                  ("dgpo", "", ["ocr launch of config/dgpo.py"])):
        try:
            co = checkout(code)
        except MissingCheckout as exc:
            rows.append(exc)
            continue
        built.clear()
        with packages({"flow_grpo": co.path / inner / "flow_grpo"}, {"paddleocr": paddle, "Levenshtein": lev}):
            fn = load("flow_grpo.rewards").ocr_score("cpu")
            theirs = float32s(fn(x, prompts, [{}] * n)[0])
        engine_kwargs = dict(built[0])
        kwargs = {"full_credit_if_contained": True, **{k: v for k, v in engine_kwargs.items() if k != "lang"}}
        with packages({}, {"paddleocr": paddle}):
            from rewards import load_reward

            reward = load_reward("ocr", **kwargs)
            ours = floats(reward(x, prompts).scores)
            default = floats(load_reward("ocr")(x, prompts).scores)
        rel = f"{inner}flow_grpo/ocr.py"
        gap = max(abs(a - b) for a, b in zip(default, theirs))
        rows.append(ScorerReport(
            "ocr", code, co.repository, co.commit_of(rel), f"{rel} (OcrScorer.__call__) via {inner}flow_grpo/"
            "rewards.py ocr_score", launches, {"name": "ocr", "kwargs": kwargs}, "rule", ours, theirs,
            tolerance(theirs, 0), "exact (0) against the official's Python floats as float32 (its training script's torch.as_tensor(rewards).float())",
            notes=["the recogniser is not compared: both sides parse the same PaddleOCR 2.x output (a stand-in "
                   f"engine); the official builds it as PaddleOCR({', '.join(f'{k}={v!r}' for k, v in engine_kwargs.items())})",
                   f"flowgrpo's ocr with its defaults differs by up to {gap:.3g} on these {n} cases "
                   "(full_credit_if_contained=false)",
                   "prompts without a double quote: the official raises IndexError (prompt.split('\"')[1]); flowgrpo "
                   "scores NaN (not applicable). An OCR failure: the official scores 0 (its except), flowgrpo "
                   "raises (the runner's retries)",
                   "normalisation: the official removes spaces only (replace(' ', '')), flowgrpo all whitespace; "
                   "PaddleOCR's lines, joined with '', hold no tabs or newlines, so the scores agree"],
            differences=["a target found inside the read text scores 1 (`if prompt in recognized_text: dist = 0`): "
                         "flowgrpo's full_credit_if_contained (default false) must be true",
                         "the engine: PaddleOCR(use_angle_cls=False, lang='en', use_gpu=False, show_log=False); "
                         "flowgrpo's paddleocr_reader passes its keyword arguments through, so the spec names them "
                         "(without use_gpu=False, PaddleOCR 2.x runs on the GPU where paddle has CUDA)"]))
    return rows


# ------------------------------------------------------------------------------------------------ GenEval
NESTED = ("compute_geneval", "evaluate_image", "evaluate_reward", "evaluate", "compute_iou", "relative_position")
CONSTANTS = ("THRESHOLD", "COUNTING_THRESHOLD", "MAX_OBJECTS", "NMS_THRESHOLD", "POSITION_THRESHOLD", "COLORS")


def official_geneval(path: Path, classnames: list[str], detections: dict, colours: dict):
    """``compute_geneval`` of the official file, defined with the functions and constants it uses (taken from the
    file's syntax tree; its module-level mmdetection / CLIP imports are not executed), ``inference_detector``
    answering ``detections`` ({image key: [per-class float32 [n, 5]]}) and ``color_classification`` ``colours``
    ({box bytes: colour})."""
    from collections import defaultdict

    from PIL import ImageOps

    source = path.read_text()
    tree = ast.parse(source)
    found = {n.name: ast.get_source_segment(source, n) for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef) and n.name in NESTED}
    consts = [ast.get_source_segment(source, n) for n in ast.walk(tree)
              if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and n.targets[0].id in CONSTANTS]
    if sorted(found) != sorted(NESTED) or len(consts) != len(CONSTANTS):
        raise RuntimeError(f"{path}: expected the functions {NESTED} and constants {CONSTANTS}")

    def inference_detector(model, arrays):
        return [detections[_key(a)] for a in arrays]

    def color_classification(image, bboxes, classname):
        return [colours[_key(np.asarray(box[:4], dtype=np.float32))] for box, _ in bboxes]

    space = {"np": np, "json": json_module(), "ImageOps": ImageOps, "defaultdict": defaultdict, "torch": torch,
             "inference_detector": inference_detector, "object_detector": None, "classnames": classnames,
             "color_classification": color_classification}
    code = "\n".join(textwrap.dedent(c) for c in consts) + "\n\n" + "\n\n".join(textwrap.dedent(found[n]) for n in NESTED)
    exec(compile(code, str(path), "exec"), space)  # noqa: S102  (the official functions, from the checkout)
    return space["compute_geneval"], {c: space[c] for c in CONSTANTS}


def json_module():
    import json

    return json


def fuzzed_geneval(n: int, seed: int = 0):
    """(metadata, images uint8 [n, 3, 32, 32] all distinct, per-image {class: [(box float32[4], score)]}, colours):
    prompts of the shipped GenEval set, 0-4 boxes for each class they name (confidences either side of both
    thresholds) and a stray class, in a 100-pixel frame."""
    from flowgrpo.data import read_prompts

    _, metadata = read_prompts("geneval")
    rng = random.Random(seed)
    metas = [rng.choice(metadata) for _ in range(n)]
    g = torch.Generator().manual_seed(seed)
    u8 = (torch.rand(n, 3, 32, 32, generator=g) * 255).round().to(torch.uint8)
    boxes, colours = [], {}
    from rewards.geneval_models import COCO_CLASSES

    for meta in metas:
        names = {r["class"] for r in meta["include"] + meta.get("exclude", [])} | {rng.choice(COCO_CLASSES)}
        per = {}
        for name in sorted(names):
            for _ in range(rng.randint(0, 4)):
                x0, y0 = rng.uniform(0, 100), rng.uniform(0, 100)
                row = np.array([x0, y0, x0 + rng.uniform(1, 40), y0 + rng.uniform(1, 40),
                                rng.choice([rng.uniform(0.2, 1.0), rng.uniform(0.85, 0.95)])], dtype=np.float32)
                colours[_key(row[:4])] = rng.choice(["red", "blue", "green", "white"])
                per.setdefault(name, []).append(row)
        boxes.append(per)
    return metas, u8, boxes, colours


def geneval_rows(n: int = 300) -> list:
    from scorers import MissingCheckout

    from rewards import load_reward
    from rewards.geneval_models import COCO_CLASSES, Detection

    metas, u8, boxes, colours = fuzzed_geneval(n)
    arrays = [u8[i].permute(1, 2, 0).numpy() for i in range(n)]
    det_arrays = {_key(a): [np.array(per.get(c, []), dtype=np.float32).reshape(-1, 5) for c in COCO_CLASSES]
                  for a, per in zip(arrays, boxes)}
    by_image = {_key(a): {c: [Detection(tuple(r[:4].tolist()), float(r[4])) for r in rows_]
                          for c, rows_ in per.items()} for a, per in zip(arrays, boxes)}

    def detector(batch):
        return [by_image[_key(img.permute(1, 2, 0).numpy())] for img in batch]

    def colour_model(image, dets, name):
        return [colours[_key(np.asarray(d.box, dtype=np.float32))] for d in dets]

    x = u8.float() / 255  # on the uint8 grid: flowgrpo's rounding gives back u8
    reward = load_reward("geneval", score="partial", detector_model=detector, colour_model=colour_model)
    out = reward(x, [m["prompt"] for m in metas], metas)
    ours = floats(out.scores)
    rows = []
    for code, env_key, rel, jpeg, launches in (
            ("diffusion_nft", "diffusion_nft", "flow_grpo/gen_eval.py", None, ["sd3_geneval (config/nft.py)"]),
            ("dgpo", "dgpo", "flow_grpo/gen_eval.py", None, ["geneval launch of config/dgpo.py"]),
            ("awm", "awm", "reward-server/reward_server/gen_eval.py", 75, ["geneval launches of config/dgx_awm.py"]),
            ("flow_grpo", "reward_server", "reward_server/gen_eval.py", 75,
             ["geneval_sd3 (config/grpo.py), through yifan123/reward-server"])):
        try:
            co = checkout(env_key)
        except MissingCheckout as exc:
            rows.append(exc)
            continue
        file = co.path / rel
        names_file = (file.parent / "assets/object_names.txt") if (file.parent / "assets").is_dir() else \
            file.parent / "object_names.txt"
        classnames = [line.strip() for line in names_file.read_text().splitlines()] if names_file.is_file() \
            else list(COCO_CLASSES)
        compute, consts = official_geneval(file, classnames, det_arrays, colours)
        from PIL import Image

        pils = [Image.fromarray(a) for a in arrays]
        scores, correct, strict, _, _ = compute(pils, metas, only_strict=False)
        theirs = float32s(scores)
        verdicts = sum(int(a == b) for a, b in zip(floats(out.info["strict"]), strict)) + \
            sum(int(a == b) for a, b in zip(floats(out.info["correct"]), correct))
        spec_kwargs = {"score": "partial"} if jpeg is None else {"score": "partial", "jpeg_quality": jpeg}
        notes = [f"the networks are not compared: {n} fuzzed cases of the shipped GenEval prompts, the same "
                 "detections (mmdetection's per-class float32 boxes) and colours injected into both sides",
                 f"strict and official verdicts equal on {verdicts} of {2 * n} (strict_correct, correct)",
                 f"official constants: {', '.join(f'{k}={v!r}' for k, v in consts.items() if k != 'COLORS')}"]
        diffs = ["none in the rule: flowgrpo's geneval score='partial' (its default) is evaluate_reward's score"]
        if jpeg is not None:
            notes.append(_jpeg_check(u8))
            diffs.append("the images reach the server as JPEG (rewards.py: PIL save format='JPEG', quality 75 by "
                         "default): flowgrpo's geneval jpeg_quality=75 (an option already; default none, lossless)")
        rows.append(ScorerReport(
            "geneval", code, co.repository, co.commit_of(rel), f"{rel} (compute_geneval → evaluate_image → "
            "evaluate_reward)", launches, {"name": "geneval", "kwargs": spec_kwargs}, "rule", ours, theirs,
            tolerance(theirs, 0), "exact (0) against the official's Python floats as float32", notes=notes,
            differences=diffs))
    return rows


def _jpeg_check(u8: torch.Tensor) -> str:
    """Flow-GRPO's / AWM's JPEG hop (rewards.py saves PIL JPEG at the default quality, the server opens it) against
    flowgrpo's geneval jpeg_roundtrip(image, 75): the largest pixel difference."""
    from PIL import Image

    from rewards.geneval import jpeg_roundtrip

    worst = 0
    for image in u8:
        buffer = io.BytesIO()
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="JPEG")
        theirs = np.array(Image.open(io.BytesIO(buffer.getvalue()), formats=["jpeg"]).convert("RGB"))
        ours = jpeg_roundtrip(image, 75).permute(1, 2, 0).numpy()
        worst = max(worst, int(np.abs(theirs.astype(int) - ours.astype(int)).max()))
    return f"the JPEG hop (PIL default quality) vs flowgrpo's jpeg_roundtrip(·, 75): max |Δpixel| {worst}"


# ------------------------------------------------------------------------------------------------------ JPEG
def jpeg_rows() -> list:
    from scorers import MissingCheckout

    from scorers import images
    from rewards import load_reward

    try:
        co = checkout("diffusion_nft")
    except MissingCheckout as exc:
        return [exc]
    x = images(n=4, size=256)
    with packages({"flow_grpo": co.path / "flow_grpo"}):
        rewards = load("flow_grpo.rewards")
        comp = floats(rewards.jpeg_compressibility()(x, [""] * 4, {})[0])
        incomp = floats(rewards.jpeg_incompressibility()(x, [""] * 4, {})[0])
    rel = "flow_grpo/rewards.py"
    ours_c = floats(load_reward("jpeg_compressibility")(x, [""] * 4).scores)
    ours_i = floats(load_reward("jpeg_incompressibility", divide_by=1)(x, [""] * 4).scores)
    common = dict(compared="rule", tolerance_reason="float32 rounding of flowgrpo's kB / 500 (the official is float64)")
    return [
        ScorerReport("jpeg_compressibility", "diffusion_nft", co.repository, co.commit_of(rel),
                     f"{rel} jpeg_compressibility", ["compressibility (Flow-GRPO's config/grpo.py; no preset launch)"],
                     {"name": "jpeg_compressibility", "kwargs": {}}, ours=ours_c, theirs=comp,
                     tolerance=tolerance(comp, 1), notes=["−(JPEG bytes at quality 95)/1000/500, equal in Flow-GRPO's "
                                                          "rewards.py"], differences=["none"], **common),
        ScorerReport("jpeg_incompressibility", "diffusion_nft", co.repository, co.commit_of(rel),
                     f"{rel} jpeg_incompressibility", ["none (rewards.py offers it)"],
                     {"name": "jpeg_incompressibility", "kwargs": {"divide_by": 1}}, ours=ours_i, theirs=incomp,
                     tolerance=tolerance(incomp, 1),
                     notes=["+(JPEG bytes at quality 95)/1000: the raw kB, no /500"],
                     differences=["scale: the official returns raw kB; flowgrpo's jpeg_incompressibility divides by 500 "
                                  "by default (divide_by, an option already: divide_by=1 is the official)"], **common)]


# ---------------------------------------------------------------------------------------------- UnifiedReward
REPLIES = ["The image matches.\nFinal Score: 4", "Final Score: 3.5 overall", "Final Score: 5\n... Final Score: 2",
           "Final Score:4.25", "no score given", "Final Score: 7", "final score: 4", "Final Score: **4**",
           "Final Score: 0.5", "Score 5/5"]


def unifiedreward_rows() -> list:
    """The reply parsing of unifiedreward_score_sglang (DiffusionNFT's and Flow-GRPO's rewards.py) against flowgrpo's
    vlm_judge pointwise parser (``rewards.vlm.parse_score``), and the request each sends."""
    from scorers import MissingCheckout

    from rewards.vlm import parse_score

    try:
        co = checkout("diffusion_nft")
    except MissingCheckout as exc:
        return [exc]
    rel = "flow_grpo/rewards.py"
    source = (co.path / rel).read_text()
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_extract_scores")
    space = {"re": __import__("re")}
    exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), rel, "exec"), space)  # noqa: S102
    theirs = float32s([s / 5.0 for s in space["_extract_scores"](REPLIES)])  # _fn: score = [sc / 5.0 for sc in score]
    ours = [parse_score(r, parse="first") for r in REPLIES]
    default = [parse_score(r) for r in REPLIES]
    return [ScorerReport(
        "vlm_judge", "diffusion_nft", co.repository, co.commit_of(rel), f"{rel} unifiedreward_score_sglang "
        "(_extract_scores, the request in evaluate_image)", ["none of the launches (rewards.py offers it)"],
        {"name": "vlm_judge", "kwargs": {"mode": "pointwise", "parse": "first", "model": "UnifiedReward-7b-v1.5"}},
        "rule", float32s(ours), theirs, 0.0, "exact (0): a parsed number / 5, as float32", notes=[
            "the server is not compared; the parsers on the same replies (official / flowgrpo parse='first' / "
            "flowgrpo's default parse='last'): " + "; ".join(
                f"{r!r}: {t:g} / {o:g} / {d:g}" for r, t, o, d in zip(REPLIES, theirs, ours, default)),
            "the request differs: the official sends its own prompt text (an '<image>' line, two criteria, 'Text "
            "Caption: [prompt]') to model UnifiedReward-7b-v1.5, the image first as data:image;base64 PNG resized to "
            "exactly 512×512 (PIL's default bicubic), temperature 0 and no max_tokens; flowgrpo's vlm_judge sends "
            "its POINTWISE_TEMPLATE (pointwise_template replaces it), the long side resized to 512, max_tokens 1024"],
        differences=["parsing: the official takes the FIRST 'Final Score:' followed by a digit 1-5 (optional "
                     "decimals) and 0.0 when none matches; flowgrpo took the LAST 'Final Score: x' of any number in "
                     "[0, 5] and NaN when none → added the option parse (default 'last'; 'first' is the official)",
                     "the prompt text is the official's own (not copied into flowgrpo): a preset that wants it passes "
                     "it as pointwise_template"])]


def rows() -> list:
    return [*ocr_rows(), *geneval_rows(), *jpeg_rows(), *unifiedreward_rows()]


__all__ = ["edit_distance", "geneval_rows", "jpeg_rows", "ocr_rows", "official_geneval", "rows", "unifiedreward_rows"]
