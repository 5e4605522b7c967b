"""The toy video world: 9-frame 32x32 clips of coloured shapes that move, and their prompts.

The video counterpart of ``worlds/toy/scenes.py`` (same shapes, palette, background and renderer,
at 32x32 per frame): each object moves in a straight line at constant speed, left, right, up or
down (y down). Prompts follow a small grammar (docs/toy_world.md, "The toy video world"):

    direction        "a video of a circle moving left"
    color_direction  "a video of a red circle moving up"
    two_directions   "a video of a circle moving left and a square moving down"
    speed            "a video of a triangle moving right slowly" / "... quickly"

Each prompt carries its clauses (object, color, motion, speed; JSON-serialisable) so the scorer
(``rewards/toy/video_scorer.py``) can check it; ``parse_prompt`` recovers them from text.
``train_prompts()`` and ``eval_prompts()`` are fixed and disjoint; the eval set holds out
combinations (shape-direction pairs, colour-shape pairs, ordered direction pairs, direction-speed
pairs) that never occur in training. ``clip_for_prompt`` draws a ground-truth clip: exactly the
named objects, fully inside every frame, never closer than MIN_GAP_PX to each other.

Quick look:  python -m worlds.toy.clips  (writes a contact sheet to /tmp/toy_video_world.png)
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from worlds.toy.scenes import COLORS, HELD_OUT_COLOR_SHAPES, SHAPES, Scene, ToyObject, ToyPrompt, render

NUM_FRAMES = 9  # 4k + 1, as Wan's VAE wants (1 + 8 frames -> 3 latent frames at 4x temporal compression)
FRAME_SIZE = 32  # pixels, height = width
DIRECTIONS = ("left", "right", "up", "down")
DIRECTION_VECTORS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}  # y down
SPEED_WORDS = ("slowly", "quickly")
VIDEO_TASKS = ("direction", "color_direction", "two_directions", "speed")

SIZE_RANGE = (5.0, 7.0)  # half-extent in pixels at 32x32 (the image world's 6-12 px at 64, a bit larger)
CROWDED_SIZE_RANGE = (4.0, 5.0)  # two moving objects: larger ones rarely fit 32 px frames without meeting
# Ground-truth speeds in pixels per frame at 32 px. The scorer splits slow from quick at 1.25 and
# gives full motion credit from 0.5, so every ground-truth speed is clear of both thresholds.
SPEED_RANGES = {"slowly": (0.6, 0.9), "quickly": (1.6, 1.9), None: (0.6, 1.9)}
MIN_GAP_PX = 2.0  # minimum gap between two objects' bounding boxes, in every frame
EDGE_MARGIN_PX = 1.0  # minimum gap between an object and the frame border, in every frame

# Held-out combinations: a prompt containing one is `novel` and appears only in the eval set.
HELD_OUT_SHAPE_DIRECTIONS = (("triangle", "up"), ("square", "left"))  # direction task (seen in the others)
HELD_OUT_VIDEO_COLOR_SHAPES = HELD_OUT_COLOR_SHAPES  # color_direction: red triangle, blue circle, yellow square
HELD_OUT_DIRECTION_PAIRS = (("up", "left"), ("right", "down"), ("down", "up"))  # two_directions, ordered
HELD_OUT_DIRECTION_SPEEDS = (("left", "slowly"), ("up", "quickly"))  # speed task

EVAL_PER_TASK = 32
_SPLIT_SEED = 20240607
_RESERVED_SEEN = {"color_direction": 4, "two_directions": 6}  # seen-only prompts moved from train to eval

GRAMMAR = (
    "'a video of ' + one of: M | M and M; M = 'a [COLOR] SHAPE moving DIRECTION [SPEED]', SHAPE in "
    f"{SHAPES}, COLOR in {tuple(COLORS)}, DIRECTION in {DIRECTIONS}, SPEED in {SPEED_WORDS}; a single M has "
    "a colour or a speed or neither; two Ms are uncoloured, without speed, of different shapes"
)


class ToyVideoPrompt(ToyPrompt):
    """A toy video prompt: the image world's record (text, task, clauses, novel) with video tasks.

    Clause dicts (object clause i is the i-th object clause):
      {"type": "object", "shape": S, "count": 1}             object i is a SHAPE S, present in every frame
      {"type": "color", "object": i, "color": C}             object i has colour C
      {"type": "motion", "object": i, "direction": D}        object i moves in direction D
      {"type": "speed", "object": i, "speed": "slowly"|"quickly"}
    """

    _TASKS: ClassVar[tuple[str, ...]] = VIDEO_TASKS


@dataclass(frozen=True)
class MovingObject:
    shape: str  # one of SHAPES
    color: str  # a key of COLORS
    cx: float  # bounding-box centre x at frame 0, pixels from the left edge
    cy: float  # bounding-box centre y at frame 0, pixels from the top edge
    size: float  # half-extent, pixels (as ToyObject.size)
    vx: float  # pixels per frame, + is right
    vy: float  # pixels per frame, + is down

    def at(self, frame: int) -> ToyObject:
        return ToyObject(self.shape, self.color, self.cx + self.vx * frame, self.cy + self.vy * frame, self.size)


@dataclass(frozen=True)
class Clip:
    objects: tuple[MovingObject, ...]
    num_frames: int = NUM_FRAMES
    size: int = FRAME_SIZE  # frame height = width in pixels

    def scene(self, frame: int) -> Scene:
        return Scene(tuple(o.at(frame) for o in self.objects))


def render_clip(clip: Clip) -> np.ndarray:
    """uint8 [F, H, W, 3] RGB frames of `clip` (each frame rendered like a toy image)."""
    return np.stack([render(clip.scene(t), size=clip.size) for t in range(clip.num_frames)])


def clips_to_tensor(clips: list[np.ndarray]) -> torch.Tensor:
    """uint8 [F, H, W, 3] arrays -> float [B, F, 3, H, W] in [0, 1] (the video reward layout)."""
    return torch.from_numpy(np.stack(clips)).permute(0, 1, 4, 2, 3).float().div(255.0)


# ----------------------------------------------------------------------------- prompts


def _motion_phrase(shape: str, color: str | None, direction: str, speed: str | None) -> str:
    words = ["a", color, shape, "moving", direction, speed]
    return " ".join(w for w in words if w)


def _build(task: str, objects: list[tuple[str, str | None, str, str | None]]) -> ToyVideoPrompt:
    """(shape, colour or None, direction, speed word or None) per object -> the prompt record."""
    clauses: list[dict] = [{"type": "object", "shape": s, "count": 1} for s, _, _, _ in objects]
    clauses += [{"type": "color", "object": i, "color": c} for i, (_, c, _, _) in enumerate(objects) if c]
    clauses += [{"type": "motion", "object": i, "direction": d} for i, (_, _, d, _) in enumerate(objects)]
    clauses += [{"type": "speed", "object": i, "speed": v} for i, (_, _, _, v) in enumerate(objects) if v]
    text = "a video of " + " and ".join(_motion_phrase(*o) for o in objects)
    return ToyVideoPrompt(text=text, task=task, clauses=tuple(clauses), novel=_is_novel(task, objects))


def _is_novel(task: str, objects: list[tuple[str, str | None, str, str | None]]) -> bool:
    (shape, color, direction, speed) = objects[0]
    if task == "direction":
        return (shape, direction) in HELD_OUT_SHAPE_DIRECTIONS
    if task == "color_direction":
        return (color, shape) in HELD_OUT_VIDEO_COLOR_SHAPES
    if task == "two_directions":
        return (direction, objects[1][2]) in HELD_OUT_DIRECTION_PAIRS
    return (direction, speed) in HELD_OUT_DIRECTION_SPEEDS


_M = (
    rf"a (?:({'|'.join(COLORS)}) )?({'|'.join(SHAPES)}) moving ({'|'.join(DIRECTIONS)})"
    rf"(?: ({'|'.join(SPEED_WORDS)}))?"
)
_RE_ONE = re.compile(rf"^{_M}$")
_RE_TWO = re.compile(rf"^{_M} and {_M}$")
_PREFIX = "a video of "


def parse_prompt(text: str) -> ToyVideoPrompt:
    """Inverse of the grammar: text -> ToyVideoPrompt with task, clauses and novel flag."""

    def bad(why: str) -> ValueError:
        return ValueError(f"toy video prompt {text!r} is outside the grammar ({why}). Grammar: {GRAMMAR}")

    if not text.startswith(_PREFIX):
        raise bad(f"must start with {_PREFIX!r}")
    body = text[len(_PREFIX):]
    if m := _RE_ONE.match(body):
        color, shape, direction, speed = m.groups()
        if color and speed:
            raise bad("a single object takes a colour or a speed, not both")
        task = "color_direction" if color else "speed" if speed else "direction"
        return _build(task, [(shape, color, direction, speed)])
    if m := _RE_TWO.match(body):
        g = m.groups()
        objects = [(g[1], g[0], g[2], g[3]), (g[5], g[4], g[6], g[7])]
        if any(c or v for _, c, _, v in objects):
            raise bad("two moving objects take neither colours nor speeds")
        if objects[0][0] == objects[1][0]:
            raise bad("two moving objects must be different shapes")
        return _build("two_directions", objects)
    raise bad("no rule matches")


def _all_prompts() -> dict[str, list[ToyVideoPrompt]]:
    """Every prompt the grammar allows, per task, in a fixed order."""
    return {
        "direction": [_build("direction", [(s, None, d, None)]) for s in SHAPES for d in DIRECTIONS],
        "color_direction": [
            _build("color_direction", [(s, c, d, None)]) for c in COLORS for s in SHAPES for d in DIRECTIONS
        ],
        "two_directions": [
            _build("two_directions", [(a, None, da, None), (b, None, db, None)])
            for a in SHAPES for b in SHAPES if a != b for da in DIRECTIONS for db in DIRECTIONS
        ],
        "speed": [_build("speed", [(s, None, d, v)]) for s in SHAPES for d in DIRECTIONS for v in SPEED_WORDS],
    }


@functools.lru_cache(maxsize=1)
def _splits() -> tuple[tuple[ToyVideoPrompt, ...], tuple[ToyVideoPrompt, ...]]:
    rng = random.Random(_SPLIT_SEED)
    train: list[ToyVideoPrompt] = []
    evals: list[ToyVideoPrompt] = []
    for task, prompts in _all_prompts().items():
        novel = [p for p in prompts if p.novel]
        seen = [p for p in prompts if not p.novel]
        reserved = rng.sample(seen, _RESERVED_SEEN.get(task, 0))
        reserved_texts = {p.text for p in reserved}
        train += [p for p in seen if p.text not in reserved_texts]
        pool = novel + reserved
        # few texts per task: cycle them so each task has EVAL_PER_TASK entries (one clip each)
        evals += [pool[i % len(pool)] for i in range(EVAL_PER_TASK)]
    return tuple(train), tuple(evals)


def train_prompts() -> list[ToyVideoPrompt]:
    """Fixed training prompts (unique texts, no held-out combination, no eval text)."""
    return list(_splits()[0])


def eval_prompts() -> list[ToyVideoPrompt]:
    """Fixed eval prompts: EVAL_PER_TASK per task in VIDEO_TASKS order; texts repeat."""
    return list(_splits()[1])


@functools.lru_cache(maxsize=2)
def _by_task(split: str) -> dict[str, tuple[ToyVideoPrompt, ...]]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    prompts = _splits()[0] if split == "train" else tuple(dict.fromkeys(_splits()[1]))
    return {t: tuple(p for p in prompts if p.task == t) for t in VIDEO_TASKS}


def make_prompt(task: str, rng: random.Random, split: str = "train") -> ToyVideoPrompt:
    """A random prompt of `task` from the train split (never a held-out combination) or the eval split."""
    if task not in VIDEO_TASKS:
        raise ValueError(f"task {task!r} is not one of {VIDEO_TASKS}")
    candidates = _by_task(split)[task]
    return candidates[rng.randrange(len(candidates))]


# ----------------------------------------------------------------------------- ground-truth clips


def _apart(a: ToyObject, b: ToyObject) -> bool:
    reach = a.size + b.size + MIN_GAP_PX
    return abs(a.cx - b.cx) >= reach or abs(a.cy - b.cy) >= reach


def _start_range(size: float, velocity: float, num_frames: int, frame_size: int) -> tuple[float, float]:
    """Frame-0 centres that keep the object inside the frame (with EDGE_MARGIN_PX) for the whole clip."""
    lo, hi = EDGE_MARGIN_PX + size, frame_size - EDGE_MARGIN_PX - size
    travel = velocity * (num_frames - 1)
    return (lo - min(travel, 0.0), hi - max(travel, 0.0))


def clip_for_prompt(
    prompt: ToyVideoPrompt, rng: random.Random, num_frames: int = NUM_FRAMES, frame_size: int = FRAME_SIZE
) -> Clip:
    """A ground-truth clip with exactly the prompt's objects; unspecified colours and speeds are random."""
    objects = [c for c in prompt.clauses if c["type"] == "object"]
    by_object = {(c["type"], c["object"]): c for c in prompt.clauses if "object" in c}
    scale = frame_size / FRAME_SIZE  # sizes and speeds are defined at 32 px
    size_range = CROWDED_SIZE_RANGE if len(objects) > 1 else SIZE_RANGE
    for _ in range(2000):
        placed: list[MovingObject] = []
        for i, clause in enumerate(objects):
            color = by_object[("color", i)]["color"] if ("color", i) in by_object else rng.choice(tuple(COLORS))
            speed_word = by_object[("speed", i)]["speed"] if ("speed", i) in by_object else None
            ux, uy = DIRECTION_VECTORS[by_object[("motion", i)]["direction"]]
            size = round(rng.uniform(*size_range) * scale, 2)
            speed = rng.uniform(*SPEED_RANGES[speed_word]) * scale
            vx, vy = round(ux * speed, 3), round(uy * speed, 3)
            cx = round(rng.uniform(*_start_range(size, vx, num_frames, frame_size)), 2)
            cy = round(rng.uniform(*_start_range(size, vy, num_frames, frame_size)), 2)
            placed.append(MovingObject(clause["shape"], color, cx, cy, size, vx, vy))
        if all(_apart(a.at(t), b.at(t)) for t in range(num_frames)
               for i, a in enumerate(placed) for b in placed[i + 1:]):
            return Clip(tuple(placed), num_frames, frame_size)
    raise RuntimeError(f"could not place the objects of {prompt.text!r} in {frame_size} px frames")


def render_prompt(prompt: ToyVideoPrompt, seed: int, num_frames: int = NUM_FRAMES,
                  frame_size: int = FRAME_SIZE) -> np.ndarray:
    """Ground-truth clip uint8 [F, H, W, 3] for `prompt`, deterministic in `seed`."""
    return render_clip(clip_for_prompt(prompt, random.Random(seed), num_frames, frame_size))


if __name__ == "__main__":
    from PIL import Image

    rows = []
    for task in VIDEO_TASKS:
        for i in range(2):
            prompt = make_prompt(task, random.Random(i))
            print(task, prompt.text)
            frames = [np.pad(f, ((1, 1), (1, 1), (0, 0))) for f in render_prompt(prompt, i)]  # black frame lines
            rows.append(np.concatenate(frames, axis=1))  # frames side by side
    sheet = np.concatenate(rows, axis=0)
    big = (sheet.shape[1] * 4, sheet.shape[0] * 4)
    Image.fromarray(sheet).resize(big, Image.NEAREST).save("/tmp/toy_video_world.png")
    print("train", len(train_prompts()), "eval", len(eval_prompts()))
