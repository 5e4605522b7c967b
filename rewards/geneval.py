"""GenEval (Ghosh et al. 2023): does the image hold the objects, counts, colours and positions the prompt asks
for? One implementation for the benchmark (``flowgrpo eval --benchmark geneval``) and the training reward
(``rewards: [{name: geneval}]``), as Flow-GRPO trains on it.

An image is judged from its detections (rewards/geneval_models.py: an instance-segmentation detector over the
80 COCO classes, and a CLIP zero-shot colour classifier for the object crops) and the prompt's metadata
(configs/evaluation/geneval_prompts.jsonl: ``tag``, ``include`` [{class, count, color?, position?}],
``exclude`` [{class, count}]). The decision rules are the official evaluator's (djghosh13/geneval,
evaluation/evaluate_images.py), written here from its behaviour and tested rule by rule
(tests/rewards/test_geneval.py):

    keep        a class's detections with confidence > 0.3 (> 0.9 when the tag is "counting"; compared in float32,
                the detector's precision), the most confident first (numpy's argsort, reversed), at most 16; a greedy overlap filter drops boxes whose IoU (inclusive pixel
                boxes, +1) with a kept one is >= max_overlap (1.0: none is dropped)
    include     the `count` most confident of the class must exist; with `color`, at least `count` of them
                must be classified that colour; with `position` [relation, j], every one of them must stand in
                that relation to every object of include j, and include j must have matched
    exclude     fewer than `count` of the class (all kept detections) may be found
    position    A relative to B: offset = centre_A - centre_B; each axis shrinks towards 0 by
                0.1 * (size_A + size_B) on that axis; no relation when both are < 1e-3; else, divided by |offset|,
                x < -0.5 "left of", x > 0.5 "right of", y < -0.5 "above", y > 0.5 "below" (image y grows down)

    score = "official"  the official evaluator's correct (0/1): what the GenEval table counts
            "exact"     Flow-GRPO's strict reward: every include found exactly `count` times (all kept
                        detections), its colours and positions right; exclude clauses are not read
            "partial"   Flow-GRPO's training reward (reward-server's gen_eval.py): the mean of one term per
                        include, 1 - |count - found| / count (negative past twice the count), plus a colour term
                        1 - |count - right colour| / count, or 0 when the count was wrong and the include asks a
                        colour or position, plus a position term: 0 with no target, 1 when it holds; when it fails the
                        reference appends 0 and then 1 (two terms), which is kept

``info`` carries all three per image ("correct", "strict" (exact), "partial") with the failure "reason" and the
kept "detections", so the benchmark reports the official table and training logs Flow-GRPO's strict accuracy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rewards.base import Reward, RewardOutput

TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
SCORES = ("official", "exact", "partial")


@dataclass(frozen=True)
class Rules:
    """The official evaluator's thresholds (its --options names in brackets)."""

    confidence: float = 0.3  # [threshold] a detection counts when its confidence is above this
    counting_confidence: float = 0.9  # [counting_threshold] ... for prompts tagged "counting"
    max_objects: int = 16  # [max_objects] most confident detections kept per class
    max_overlap: float = 1.0  # [max_overlap] IoU at which a less confident box is dropped; 1.0 keeps every box
    position: float = 0.1  # [position_threshold] margin, in units of the two objects' summed size


def iou(a, b) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes counted as inclusive pixel ranges (+1)."""
    def area(box) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def keep(detections: dict, tag: str, rules: Rules = Rules()) -> dict:
    """The detections the rules read: {class: [Detection, ...] most confident first} (classes with none left out).
    ``detections``: {class: [Detection]} of one image, any order (rewards.geneval_models.Detection: box, score, mask)."""
    # as the official: the detector's float32 scores against the threshold in float32 (a score of float32(0.3) is not
    # above 0.3), ordered by numpy's default argsort reversed (which also fixes the order of equal scores)
    threshold = np.float32(rules.counting_confidence if tag == "counting" else rules.confidence)
    kept = {}
    for name, found in detections.items():
        scores = np.array([d.score for d in found], dtype=np.float32)
        order = np.argsort(scores)[::-1]
        ordered = [found[i] for i in order[scores[order] > threshold][: rules.max_objects]]
        chosen = []
        while ordered:
            best = ordered.pop(0)
            chosen.append(best)
            if rules.max_overlap < 1:
                ordered = [d for d in ordered if iou(best.box, d.box) < rules.max_overlap]
        if chosen:
            kept[name] = chosen
    return kept


def relative_position(box_a, box_b, margin: float = 0.1) -> set[str]:
    """The relations of box A to box B ("left of", "right of", "above", "below"; see the module docstring), computed
    in float32 as the official does on the detector's float32 boxes."""
    boxes = np.array([list(box_a)[:4], list(box_b)[:4]], dtype=np.float32).reshape(2, 2, 2)  # [box, corner, xy]
    centre = boxes.mean(axis=1)
    size = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = centre[0] - centre[1]
    shrunk = np.maximum(np.abs(offset) - np.float32(margin) * (size[0] + size[1]), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


ColourFn = Callable[[list, str], list]  # (detections of a class, class name) -> their colours


def _position_holds(found: list, targets: list, relation: str, margin: float) -> tuple[bool, str]:
    for obj in found:
        for target in targets:
            seen = relative_position(obj.box, target.box, margin)
            if relation not in seen:
                return False, f"{' and '.join(sorted(seen)) or 'no relation'} to target"
    return True, ""


def judge(objects: dict, metadata: dict, colours: ColourFn, rules: Rules = Rules()) -> tuple[bool, str]:
    """The official evaluator's verdict on one image: (correct, reason). ``objects``: ``keep``'s output;
    ``colours``: classifies a list of detections of a class."""
    correct, reasons, matched_groups = True, [], []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        found = objects.get(name, [])[:count]
        matched = len(found) >= count
        if not matched:
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        else:
            if "color" in req:
                seen = colours(found, name)
                if seen.count(req["color"]) < count:
                    matched = False
                    reasons.append(f"expected {req['color']} {name}>={count}, found {seen.count(req['color'])} "
                                   f"{req['color']} ({', '.join(seen)})")
            if "position" in req and matched:
                relation, target = req["position"]
                if matched_groups[target] is None:
                    matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    matched, seen = _position_holds(found, matched_groups[target], relation, rules.position)
                    if not matched:
                        reasons.append(f"expected {name} {relation} target, found {seen}")
        correct &= matched
        matched_groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        found = len(objects.get(req["class"], []))
        if found >= req["count"]:
            correct = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {found}")
    return correct, "; ".join(reasons)


def partial_credit(objects: dict, metadata: dict, colours: ColourFn, rules: Rules = Rules()) -> tuple[bool, float, str]:
    """Flow-GRPO's training reward on one image: (exact, partial, reason) (see the module docstring)."""
    exact, terms, reasons, matched_groups = True, [], [], []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        found = objects.get(name, [])
        terms.append(1 - abs(count - len(found)) / count)
        matched = len(found) == count
        if not matched:
            reasons.append(f"expected {name}=={count}, found {len(found)}")
            if "color" in req or "position" in req:
                terms.append(0.0)
        else:
            if "color" in req:
                right = colours(found, name).count(req["color"])
                terms.append(1 - abs(count - right) / count)
                if right != count:
                    matched = False
                    reasons.append(f"expected {req['color']} {name}=={count}, found {right} {req['color']}")
            if "position" in req and matched:
                relation, target = req["position"]
                if matched_groups[target] is None:
                    matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                    terms.append(0.0)
                else:
                    matched, seen = _position_holds(found, matched_groups[target], relation, rules.position)
                    if not matched:
                        reasons.append(f"expected {name} {relation} target, found {seen}")
                        terms.append(0.0)
                    terms.append(1.0)  # the reference's: also after a failed position
        exact &= matched
        matched_groups.append(found if matched else None)
    return exact, (sum(terms) / len(terms) if terms else 0.0), "; ".join(reasons)


def jpeg_roundtrip(image, quality: int):
    """uint8 [3, H, W] -> the same image saved as JPEG at ``quality`` and read back (Flow-GRPO sends its reward
    server JPEGs at PIL's default quality, 75)."""
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return torch.from_numpy(np.array(Image.open(buffer).convert("RGB"))).permute(2, 0, 1)


class GenEval(Reward):
    """The GenEval scorer (module docstring). Needs each prompt's GenEval metadata (``include`` ...); a prompt
    without it scores NaN (not applicable).

    score: "partial" (default: Flow-GRPO's training reward), "exact" or "official" (the benchmark's).
    detector: "transformers" (transformers' Mask2Former; detector_path default
    facebook/mask2former-swin-small-coco-instance) or "mmdetection" (the official evaluator's; detector_path: its
    .pth checkpoint, detector_config: its config file). colour_arch / colour_pretrained: the open_clip colour
    classifier (ViT-L-14 / openai as the official; a .json config file and a state-dict path for tiny models).
    jpeg_quality: score the images after a JPEG round trip at this quality (Flow-GRPO's training: 75; None: as
    the official evaluation, lossless). The rules' thresholds: ``Rules``' fields, as keyword arguments.
    detector_model / colour_model: ready objects (tests)."""

    name = "geneval"
    modality = "image"

    def __init__(self, score: str = "partial", *, detector: str = "transformers", detector_path: str | None = None,
                 detector_config: str | None = None, colour_arch: str | dict = "ViT-L-14",
                 colour_pretrained: str = "openai", jpeg_quality: int | None = None, confidence: float = 0.3,
                 counting_confidence: float = 0.9, max_objects: int = 16, max_overlap: float = 1.0,
                 position_threshold: float = 0.1, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 detector_model=None, colour_model=None):
        from rewards.geneval_models import ColourClassifier, load_detector

        if score not in SCORES:
            raise ValueError(f"geneval: score={score!r} is not one of {SCORES}")
        if jpeg_quality is not None and not 1 <= int(jpeg_quality) <= 95:
            raise ValueError(f"geneval: jpeg_quality={jpeg_quality!r} must be in 1..95 (or None for lossless)")
        self.score_kind, self.jpeg_quality = score, jpeg_quality
        self.rules = Rules(confidence, counting_confidence, int(max_objects), max_overlap, position_threshold)
        self.detector = detector_model or load_detector(detector, detector_path, config=detector_config,
                                                        device=device, dtype=dtype)
        self.colour = colour_model or ColourClassifier(colour_arch, colour_pretrained, device=device, dtype=dtype)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        metadata = metadata or [{} for _ in prompts]
        if self.jpeg_quality is not None:
            images = torch.stack([jpeg_roundtrip(image, int(self.jpeg_quality)) for image in images])
        wanted = [i for i, m in enumerate(metadata) if isinstance(m, dict) and m.get("include")]
        detections = self.detector(images[wanted]) if wanted else []
        nan = float("nan")
        scores, correct, exact, partial = [nan] * len(prompts), [nan] * len(prompts), [nan] * len(prompts), [nan] * len(prompts)
        reasons, kept_boxes = [""] * len(prompts), [""] * len(prompts)
        for i, found in zip(wanted, detections):
            meta = metadata[i]
            objects = keep(found, meta.get("tag", ""), self.rules)
            cache: dict = {}

            def colours(dets, name, image=images[i], cache=cache):  # one classification per object of an image
                key = (name, tuple(id(d) for d in dets))
                if key not in cache:
                    cache[key] = self.colour(image, dets, name)
                return cache[key]

            ok, reason = judge(objects, meta, colours, self.rules)
            ex, part, ex_reason = partial_credit(objects, meta, colours, self.rules)
            correct[i], exact[i], partial[i] = float(ok), float(ex), float(part)
            scores[i] = {"official": correct[i], "exact": exact[i], "partial": partial[i]}[self.score_kind]
            reasons[i] = reason if self.score_kind == "official" else ex_reason
            kept_boxes[i] = json.dumps({name: [[round(float(v), 1) for v in d.box] + [round(float(d.score), 4)]
                                               for d in dets] for name, dets in objects.items()})
        info = {"correct": torch.tensor(correct), "strict": torch.tensor(exact), "partial": torch.tensor(partial),
                "reason": reasons, "detections": kept_boxes,
                "task": [m.get("tag", "") if isinstance(m, dict) else "" for m in metadata]}
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), info=info)


__all__ = ["GenEval", "Rules", "SCORES", "TASKS", "iou", "judge", "keep", "partial_credit", "relative_position"]
