"""The verifiable scorer of the toy editing world: was the instruction carried out, and was the rest left alone?

A result is judged against its source image (``sees_condition``: ``conditions[:, 0]``) and its record, the
``worlds.toy.edits.EditPrompt.to_dict()`` in the sample's metadata (the source scene and the edit). Without
one it parses the instruction and reads the source scene off the source image with ``detect_objects``; an
instruction that names an object the source image does not show is then not applicable (NaN).

Objects in the result come from the toy scorer's ``detect_objects``. All distances below are pixels of the 64
grid, scaled with the image width (so the scorer works the same at 32 and 64 px). Two credits per sample:

``done`` (0 or 1), the instruction carried out:

    recolor  an object of the named shape in the NEW colour within NEAR_PX of the object's centre, and none
             of the old colour and shape there
    move     exactly one object of the object's colour and shape, displaced along the direction by at least
             MOVE_MIN x MOVE_PX and at most MOVE_SIDEWAYS x MOVE_PX across it, and nothing left within NEAR_PX
             of the old centre
    add      one object of the named colour and shape more than the source had, the new one away from them
    remove   no object of the colour and shape anywhere, and nothing within NEAR_PX of the old centre

A recoloured, moved or added object must also have a plausible size: its half-extent (from its area) within
SIZE_SLACK of the object's (of SIZES for an add), so that painting half the image in one colour is not an edit.

``kept`` in [0, 1], the rest unchanged: the mean of (a) the source objects the instruction does not touch that
are still detected within NEAR_PX of their place with their colour and shape, over those objects plus the
spurious ones (detections outside the edited region that are no source object in its place; (a) is left out
when both are none), and (b) the fraction of pixels outside the edited region whose RGB distance to the source
is at most PIXEL_TOLERANCE. The edited region is the union of the boxes of the object's old place, its expected
new place (the record's move destination or added object) and the object the result shows there (a move's or
add's matched detection), each dilated by DILATE_PX: an add may put its object anywhere free. (b) alone would
let an extra object cost only its few pixels; (a) makes it cost an object.

score = done x kept: a copy of the source scores 0 (done fails), an edit that also repaints the rest scores
its kept share. ``strict`` = done and kept >= STRICT_KEPT. ``info`` lists per sample ``done``, ``kept``,
``kept_objects`` (a; NaN when left out), ``kept_pixels`` (b), ``task``, ``novel`` and ``strict`` (bool [B]), so
``rewards.toy.scorer.summarize(scores, info["strict"], info["task"])`` reports per task.

Run: ToyEditScorer()(results [B, 3, H, W] in [0, 1], instructions, [p.to_dict() for p in records],
conditions=sources [B, 1, 3, H, W] in [0, 1]) -> RewardOutput.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from rewards.base import Reward, RewardOutput
from rewards.toy.scorer import detect_objects
from worlds.toy.edits import (
    DIRECTION_VECTORS,
    MOVE_PX,
    SIZES,
    EditPrompt,
    is_novel,
    parse_instruction,
    render_target,
)
from worlds.toy.scenes import IMAGE_SIZE, ToyObject

NEAR_PX = 4.0  # an object "at" a place: detected centre within this distance
MOVE_MIN = 0.7  # a move must go at least this fraction of MOVE_PX along its direction (a smear of the
# object over its old and new place is centred halfway: it must not pass)
MOVE_SIDEWAYS = 0.3  # ... and at most this fraction of MOVE_PX across it
SIZE_SLACK = (0.6, 1.5)  # a new or changed object's half-extent / the expected one (add: / SIZES' range)
DILATE_PX = 3.0  # the edited region's boxes grow by this much (anti-aliased rims, detection error)
PIXEL_TOLERANCE = 48.0  # RGB distance (0-255 units) within which a pixel counts as unchanged (~28 per channel)
STRICT_KEPT = 0.95
_AREA_PER_SIZE2 = {"circle": math.pi, "square": 4.0, "triangle": 2.0}  # a shape's area / half-extent^2


@dataclass(frozen=True)
class _Case:
    """One sample's edit in scene units (64 grid): what to look for in its result."""

    task: str
    fields: dict  # parse_instruction of the text
    source: tuple[ToyObject, ...]
    index: int | None  # the source object the instruction names (None for add)
    expected: ToyObject | None  # the object's ground-truth new state (recolor, move; add when the record says)
    novel: bool


def _half_extent(det: dict, scale: float) -> float:
    """A detection's half-extent in scene units, from its area and shape."""
    return math.sqrt(det["area"] / _AREA_PER_SIZE2[det["shape"]]) / scale


def _as_object(det: dict, scale: float) -> ToyObject:
    return ToyObject(det["shape"], det["color"], det["cx"] / scale, det["cy"] / scale, _half_extent(det, scale))


def _case_of_record(record: EditPrompt) -> _Case:
    target = record.target_scene().objects
    if record.task == "add":
        index, expected = None, target[-1]
    else:
        index = record.edit["object"]
        expected = None if record.task == "remove" else target[index]
    return _Case(record.task, parse_instruction(record.text), record.source_scene().objects, index, expected,
                 record.novel)


def _case_of_detections(text: str, detections: list[dict], scale: float) -> _Case | None:
    """The case read off the source image; None when the instruction names an object it does not show."""
    fields = parse_instruction(text)
    source = tuple(_as_object(d, scale) for d in detections)
    if fields["task"] == "add":
        return _Case("add", fields, source, None, None, is_novel(fields))
    named = [i for i, o in enumerate(source) if (o.color, o.shape) == (fields["color"], fields["shape"])]
    if not named:
        return None
    index = max(named, key=lambda i: detections[i]["area"])
    obj = source[index]
    expected = None
    if fields["task"] == "recolor":
        expected = replace(obj, color=fields["new_color"])
    elif fields["task"] == "move":
        vx, vy = DIRECTION_VECTORS[fields["direction"]]
        expected = replace(obj, cx=obj.cx + vx * MOVE_PX, cy=obj.cy + vy * MOVE_PX)
    return _Case(fields["task"], fields, source, index, expected, is_novel(fields))


def _judge(case: _Case, detections: list[dict], scale: float) -> tuple[bool, float, list[ToyObject]]:
    """(done, kept_objects, region) of one result: the instruction carried out, the untouched source objects
    still in place over those plus the spurious objects (outside the edited region and no source object in its
    place; NaN when both are none), and the objects whose boxes make up the edited region."""
    near = NEAR_PX * scale

    def at(d: dict, o: ToyObject) -> bool:
        return math.hypot(d["cx"] - o.cx * scale, d["cy"] - o.cy * scale) <= near

    def sized(d: dict, lo: float, hi: float) -> bool:
        return SIZE_SLACK[0] * lo <= _half_extent(d, scale) <= SIZE_SLACK[1] * hi

    def same(d: dict, o: ToyObject) -> bool:
        return d["color"] == o.color and d["shape"] == o.shape

    obj = None if case.index is None else case.source[case.index]
    region = [o for o in (obj, case.expected) if o is not None]
    if case.task == "recolor":
        new = case.expected
        done = (any(same(d, new) and at(d, obj) and sized(d, obj.size, obj.size) for d in detections)
                and not any(same(d, obj) and at(d, obj) for d in detections))
    elif case.task == "move":
        vx, vy = DIRECTION_VECTORS[case.fields["direction"]]
        matching = [d for d in detections if same(d, obj)]
        hits = []
        for d in matching:
            ox, oy = d["cx"] - obj.cx * scale, d["cy"] - obj.cy * scale
            along, across = ox * vx + oy * vy, abs(ox * vy - oy * vx)
            if (along >= MOVE_MIN * MOVE_PX * scale and across <= MOVE_SIDEWAYS * MOVE_PX * scale
                    and sized(d, obj.size, obj.size)):
                hits.append(d)
        done = len(matching) == 1 and len(hits) == 1 and not any(at(d, obj) for d in detections)
        region += [_as_object(d, scale) for d in hits]
    elif case.task == "add":
        named = (case.fields["color"], case.fields["shape"])
        had = [o for o in case.source if (o.color, o.shape) == named]
        matching = [d for d in detections if (d["color"], d["shape"]) == named]
        new = [d for d in matching if not any(at(d, o) for o in had)]
        done = len(matching) == len(had) + 1 and len(new) == 1 and sized(new[0], SIZES[0], SIZES[-1])
        region += [_as_object(d, scale) for d in new]
    else:  # remove
        done = not any(same(d, obj) or at(d, obj) for d in detections)
    untouched = [o for i, o in enumerate(case.source) if i != case.index]
    in_place = [next((d for d in detections if same(d, o) and at(d, o)), None) for o in untouched]
    explained = {id(d) for d in in_place if d is not None}
    spurious = [d for d in detections if id(d) not in explained and not any(_covers(o, d, scale) for o in region)]
    total = len(untouched) + len(spurious)
    kept_objects = (len(explained) / total) if total else math.nan
    return done, kept_objects, region


def _covers(o: ToyObject, d: dict, scale: float) -> bool:
    """Whether detection d's centre lies in o's box dilated by DILATE_PX (o in scene units, d in pixels)."""
    reach = (o.size + DILATE_PX) * scale
    return abs(d["cx"] - o.cx * scale) <= reach and abs(d["cy"] - o.cy * scale) <= reach


def pixels_kept(images: torch.Tensor, sources: torch.Tensor, regions: list[list[ToyObject]]) -> torch.Tensor:
    """images, sources: uint8 [B, 3, H, W]; regions: per sample the objects (scene units) whose boxes, dilated by
    DILATE_PX, are the edited region. Returns float32 [B]: the share of pixels outside it that are within
    PIXEL_TOLERANCE of the source."""
    batch, _, height, width = images.shape
    scale = width / IMAGE_SIZE
    outside = torch.ones(batch, height, width, dtype=torch.bool)
    for i, region in enumerate(regions):
        for o in region:
            reach = o.size + DILATE_PX
            x0, x1 = max(0, math.floor((o.cx - reach) * scale)), math.ceil((o.cx + reach) * scale)
            y0, y1 = max(0, math.floor((o.cy - reach) * scale)), math.ceil((o.cy + reach) * scale)
            outside[i, y0:y1, x0:x1] = False
    diff = images.to(torch.int32) - sources.to(torch.int32)
    agree = (diff * diff).sum(dim=1) <= PIXEL_TOLERANCE**2  # [B, H, W]
    return ((agree & outside).sum(dim=(1, 2)) / outside.sum(dim=(1, 2)).clamp_min(1)).float()


class ToyEditScorer(Reward):
    """Verifiable reward of the toy editing world: done x kept against the source image (module docstring)."""

    name = "toy_edit"
    modality = "image"
    sees_condition = True

    def score_uint8(self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None,
                    conditions: torch.Tensor) -> RewardOutput:
        batch, _, height, width = images.shape
        if tuple(conditions.shape[-2:]) != (height, width):
            raise ValueError(f"{self.name}: source images {tuple(conditions.shape)} are not at the results' size "
                             f"{height}x{width}")
        scale = width / IMAGE_SIZE
        sources = conditions[:, 0]
        records = [self._record(text, None if metadata is None else metadata[i]) for i, text in enumerate(prompts)]
        cases: list[_Case | None] = [None if r is None else _case_of_record(r) for r in records]
        unrecorded = [i for i, r in enumerate(records) if r is None]
        if unrecorded:
            for i, dets in zip(unrecorded, detect_objects(sources[unrecorded])):
                cases[i] = _case_of_detections(prompts[i], dets, scale)
        done, kept_objects, regions = [], [], []
        for case, dets in zip(cases, detect_objects(images)):
            verdict = (math.nan, math.nan, []) if case is None else _judge(case, dets, scale)
            done.append(float(verdict[0]))
            kept_objects.append(verdict[1])
            regions.append(verdict[2])
        kept_pixels = pixels_kept(images, sources, regions).tolist()
        kept = [math.nan if c is None else p if math.isnan(o) else (o + p) / 2
                for c, o, p in zip(cases, kept_objects, kept_pixels)]
        scores = [d * k for d, k in zip(done, kept)]
        return RewardOutput(
            scores=torch.tensor(scores, dtype=torch.float32),
            info={
                "strict": torch.tensor([d == 1.0 and k >= STRICT_KEPT for d, k in zip(done, kept)], dtype=torch.bool),
                "task": [parse_instruction(t)["task"] for t in prompts],
                "novel": [c is not None and c.novel for c in cases],
                "done": done,
                "kept": kept,
                "kept_objects": kept_objects,
                "kept_pixels": kept_pixels,
            },
        )

    def _record(self, text: str, meta: dict | None) -> EditPrompt | None:
        """The sample's record from its metadata (``EditPrompt.to_dict()`` form, its text equal to the prompt),
        or None when the metadata has none."""
        if meta is None or "source" not in meta or "edit" not in meta:
            return None
        if meta.get("text", text) != text:
            raise ValueError(f"{self.name}: metadata text {meta['text']!r} does not match prompt {text!r}; "
                             "metadata misaligned?")
        return EditPrompt.from_dict({**meta, "text": text})


@functools.lru_cache(maxsize=8192)
def _target_pixels(record: EditPrompt, size: int) -> torch.Tensor:
    """The record's ground-truth target rendered at ``size``: uint8 [3, size, size]."""
    return torch.from_numpy(render_target(record, size).copy()).permute(2, 0, 1)


class ToyEditDense(ToyEditScorer):
    """``toy_edit`` with partial credit for an edit carried out in part, for training (as ``toy_dense`` is for the
    image world): ``max(done, progress) x kept``, ``progress`` the share of the pixels the edit changes (where the
    ground-truth target differs from the source by more than PIXEL_TOLERANCE) that the result shows as the target
    does. A copy of the source makes no progress (0); a half-recoloured object about half; the full edit 1, also
    where ``done`` holds with the object elsewhere (an add may go anywhere free). Needs the record (metadata);
    a sample without one scores as ``toy_edit``."""

    name = "toy_edit_dense"

    def score_uint8(self, images, prompts, metadata, conditions) -> RewardOutput:
        out = super().score_uint8(images, prompts, metadata, conditions)
        progress = []
        for i, text in enumerate(prompts):
            record = self._record(text, None if metadata is None else metadata[i])
            if record is None or images.shape[-1] != images.shape[-2]:
                progress.append(out.info["done"][i])
                continue
            target = _target_pixels(record, images.shape[-1]).to(torch.int32)
            source, result = conditions[i, 0].to(torch.int32), images[i].to(torch.int32)
            changed = ((target - source) ** 2).sum(0) > PIXEL_TOLERANCE**2
            shown = ((result - target) ** 2).sum(0) <= PIXEL_TOLERANCE**2
            progress.append(float((shown & changed).sum() / changed.sum()) if changed.any() else out.info["done"][i])
        scores = [max(d, p) * k for d, p, k in zip(out.info["done"], progress, out.info["kept"])]
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), info={**out.info, "progress": progress})
