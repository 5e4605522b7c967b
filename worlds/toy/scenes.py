"""The toy image world: procedurally rendered 64x64 scenes of coloured shapes, and their prompts.

A scene is 1-4 filled, upright shapes (circle, square, triangle) in six saturated colours on a
plain light-grey background. Prompts follow a GenEval-like grammar (docs/toy_world.md):

    single_object  "a photo of a circle"
    two_objects    "a photo of a circle and a square"
    counting       "a photo of one circle" / "a photo of three squares"
    colors         "a photo of a red circle"
    position       "a photo of a circle left of a square" / "a photo of a red circle above a blue circle"
    color_attr     "a photo of a red circle and a blue square"

Each prompt carries its clauses (JSON-serialisable dicts) so a scorer can check it; `parse_prompt`
recovers them from text alone. `train_prompts()` and `eval_prompts()` are fixed and disjoint; the
eval set holds out combinations (colour-shape pairs, ordered position triples, count-shape pairs)
that never occur in training. `scene_for_prompt` draws a ground-truth scene: exactly the objects
the prompt names, no distractors, no overlap, relations with a clear margin.

Quick look:  python -m worlds.toy.scenes  (writes a contact sheet to /tmp/toy_world.png)
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

IMAGE_SIZE = 64
# Saturated colours ~40+ degrees apart in hue and >= 120 apart in RGB (Euclidean), so nearest-palette
# segmentation survives blur and colour drift.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "yellow": (235, 200, 30),
    "green": (40, 170, 60),
    "cyan": (30, 190, 215),
    "blue": (40, 70, 220),
    "purple": (165, 40, 200),
}
BACKGROUND: tuple[int, int, int] = (235, 235, 235)
SHAPES = ("circle", "square", "triangle")
TASKS = ("single_object", "two_objects", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")
NUMBER_WORDS = ("one", "two", "three", "four")  # counts 1..4

# Held-out combinations: any prompt containing one is `novel` and appears only in the eval set.
HELD_OUT_COLOR_SHAPES = (("red", "triangle"), ("blue", "circle"), ("yellow", "square"))
HELD_OUT_POSITIONS = (  # (shape a, relation, shape b); each one's converse stays in training
    ("circle", "above", "square"),
    ("square", "left of", "triangle"),
    ("triangle", "below", "circle"),
    ("circle", "right of", "triangle"),
)
HELD_OUT_COUNTS = ((2, "square"), (3, "triangle"), (4, "circle"))
HELD_OUT_SINGLE = ("triangle",)
HELD_OUT_TWO_OBJECTS = (("square", "circle"), ("triangle", "square"))  # ordered; reverse is in training

SIZE_RANGE = (6.0, 12.0)  # half-extent in pixels
CROWDED_SIZE_RANGE = (6.0, 10.0)  # for scenes of 3-4 objects
MIN_GAP_PX = 3.0  # minimum gap between object bounding boxes
EDGE_MARGIN_PX = 1.0  # minimum gap between an object and the image border
RELATION_DOMINANCE = 0.5  # ground truth: perpendicular offset <= this x the offset along the relation
SUPERSAMPLE = 4

EVAL_PER_TASK = 32
_SPLIT_SEED = 20240601

GRAMMAR = (
    "'a photo of ' + one of: NP | NP and NP | NP {left of|right of|above|below} NP | "
    "{one|two|three|four} SHAPE(s); NP = 'a [COLOR] SHAPE', SHAPE in "
    f"{SHAPES}, COLOR in {tuple(COLORS)}; both NPs coloured or neither"
)


@dataclass(frozen=True)
class ToyObject:
    shape: str  # one of SHAPES
    color: str  # a key of COLORS
    cx: float  # bounding-box centre x, pixels from the left edge
    cy: float  # bounding-box centre y, pixels from the top edge
    size: float  # half-extent (circle radius, half side, triangle half base = half height), pixels


@dataclass(frozen=True)
class Scene:
    objects: tuple[ToyObject, ...]


@dataclass(frozen=True)
class ToyPrompt:
    _TASKS: ClassVar[tuple[str, ...]] = TASKS  # tasks `from_dict` accepts; the video world's subclass sets its own
    text: str  # e.g. "a photo of a red circle left of a blue square"
    task: str  # one of TASKS
    # Clause dicts, JSON-serialisable, of three types:
    #   {"type": "object", "shape": S, "count": k}           k objects of shape S (object clause i)
    #   {"type": "color", "object": i, "color": C}           object clause i has colour C
    #   {"type": "position", "relation": R, "a": i, "b": j}  object clause i is R object clause j
    clauses: tuple[dict, ...]
    novel: bool = False  # True if the prompt holds a combination that never occurs in train_prompts()

    def __hash__(self) -> int:  # clauses are dicts; text determines the rest
        return hash((self.text, self.task, self.novel))

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "task": self.task,
            "clauses": [dict(c) for c in self.clauses],
            "novel": self.novel,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ToyPrompt":
        missing = {"text", "task", "clauses"} - set(d)
        if missing:
            raise ValueError(f"ToyPrompt.from_dict: missing keys {sorted(missing)} in {d!r}")
        if d["task"] not in cls._TASKS:
            raise ValueError(f"{cls.__name__}.from_dict: task {d['task']!r} is not one of {cls._TASKS}")
        return cls(
            text=d["text"],
            task=d["task"],
            clauses=tuple(dict(c) for c in d["clauses"]),
            novel=bool(d.get("novel", False)),
        )


# ----------------------------------------------------------------------------- rendering


def _object_mask(obj: ToyObject, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Boolean coverage of `obj` at sample points xs [1, W], ys [H, 1] (pixel units)."""
    dx, dy = xs - obj.cx, ys - obj.cy
    s = obj.size
    if obj.shape == "circle":
        return dx * dx + dy * dy <= s * s
    if obj.shape == "square":
        return (np.abs(dx) <= s) & (np.abs(dy) <= s)
    if obj.shape == "triangle":  # apex at top (cy - s), base at bottom (cy + s), base width 2s
        return (dy <= s) & (np.abs(dx) <= (dy + s) / 2.0)
    raise ValueError(f"unknown shape {obj.shape!r}; expected one of {SHAPES}")


def render(scene: Scene, size: int = IMAGE_SIZE, scene_size: int | None = None) -> np.ndarray:
    """Render a scene to uint8 [size, size, 3] RGB, anti-aliased by 4x4 supersampling per output pixel.

    The scene's coordinates are pixels of a `scene_size` grid (default: `size`). An image world
    scene lives on the IMAGE_SIZE (64) grid; rendered at a smaller `size` (the 32x32 tiny SD3) it is
    the same scene scaled down, each output pixel averaging 4x4 samples of its larger footprint."""
    n = size * SUPERSAMPLE
    per_sample = (scene_size or size) / n  # scene units per supersample
    coords = (np.arange(n, dtype=np.float32) + 0.5) * np.float32(per_sample)
    canvas = np.empty((n, n, 3), dtype=np.float32)  # [n, n, 3] supersampled RGB
    canvas[:] = BACKGROUND
    for obj in scene.objects:
        if obj.color not in COLORS:
            raise ValueError(f"unknown colour {obj.color!r}; expected one of {tuple(COLORS)}")
        # only the object's bounding box (plus one scene pixel) can be covered
        x0, x1 = (max(0, int((obj.cx + d * (obj.size + 1)) / per_sample)) for d in (-1, 1))
        y0, y1 = (max(0, int((obj.cy + d * (obj.size + 1)) / per_sample)) for d in (-1, 1))
        window = canvas[y0:y1, x0:x1]
        window[_object_mask(obj, coords[None, x0:x1], coords[y0:y1, None])] = COLORS[obj.color]
    pooled = canvas.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE, 3).mean(axis=(1, 3))
    return np.clip(np.round(pooled), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- prompts


def _noun_phrase(shape: str, color: str | None) -> str:
    return f"a {color} {shape}" if color else f"a {shape}"


def _build(task: str, nps: list[tuple[str, str | None]], relation: str | None = None, count: int = 1) -> ToyPrompt:
    """The one place that turns a structured request into (text, clauses, novel)."""
    if task == "counting":
        shape = nps[0][0]
        noun = shape if count == 1 else shape + "s"
        text = f"a photo of {NUMBER_WORDS[count - 1]} {noun}"
        clauses: list[dict] = [{"type": "object", "shape": shape, "count": count}]
    else:
        clauses = [{"type": "object", "shape": s, "count": 1} for s, _ in nps]
        clauses += [{"type": "color", "object": i, "color": c} for i, (_, c) in enumerate(nps) if c]
        phrases = [_noun_phrase(s, c) for s, c in nps]
        if task == "position":
            clauses.append({"type": "position", "relation": relation, "a": 0, "b": 1})
            text = f"a photo of {phrases[0]} {relation} {phrases[1]}"
        else:
            text = "a photo of " + " and ".join(phrases)
    return ToyPrompt(text=text, task=task, clauses=tuple(clauses), novel=_is_novel(task, nps, relation, count))


def _is_novel(task: str, nps: list[tuple[str, str | None]], relation: str | None, count: int) -> bool:
    shapes = tuple(s for s, _ in nps)
    if task == "single_object":
        return shapes[0] in HELD_OUT_SINGLE
    if task == "two_objects":
        return shapes in HELD_OUT_TWO_OBJECTS
    if task == "counting":
        return (count, shapes[0]) in HELD_OUT_COUNTS
    held_pair = any((c, s) in HELD_OUT_COLOR_SHAPES for s, c in nps if c)
    if task == "position":
        return held_pair or (shapes[0], relation, shapes[1]) in HELD_OUT_POSITIONS
    return held_pair


_COLOR_ALT = "|".join(COLORS)
_SHAPE_ALT = "|".join(SHAPES)
_NP = rf"a (?:({_COLOR_ALT}) )?({_SHAPE_ALT})"
_RE_COUNT = re.compile(rf"^({'|'.join(NUMBER_WORDS)}) ({_SHAPE_ALT})(s?)$")
_RE_POSITION = re.compile(rf"^{_NP} ({'|'.join(RELATIONS)}) {_NP}$")
_RE_AND = re.compile(rf"^{_NP} and {_NP}$")
_RE_ONE = re.compile(rf"^{_NP}$")
_PREFIX = "a photo of "


def parse_prompt(text: str) -> ToyPrompt:
    """Inverse of the grammar: text -> ToyPrompt with task, clauses and novel flag."""

    def bad(why: str) -> ValueError:
        return ValueError(f"toy prompt {text!r} is outside the grammar ({why}). Grammar: {GRAMMAR}")

    if not text.startswith(_PREFIX):
        raise bad(f"must start with {_PREFIX!r}")
    body = text[len(_PREFIX):]
    if m := _RE_COUNT.match(body):
        count = NUMBER_WORDS.index(m.group(1)) + 1
        if (count == 1) == bool(m.group(3)):
            raise bad("use 'one SHAPE' and plural 'SHAPEs' for two to four")
        return _build("counting", [(m.group(2), None)], count=count)
    if m := _RE_POSITION.match(body):
        nps = [(m.group(2), m.group(1)), (m.group(5), m.group(4))]
        relation = m.group(3)
        task = "position"
    elif m := _RE_AND.match(body):
        nps = [(m.group(2), m.group(1)), (m.group(4), m.group(3))]
        relation = None
        task = "color_attr" if nps[0][1] else "two_objects"
    elif m := _RE_ONE.match(body):
        nps = [(m.group(2), m.group(1))]
        return _build("colors" if nps[0][1] else "single_object", nps)
    else:
        raise bad("no rule matches")
    if bool(nps[0][1]) != bool(nps[1][1]):
        raise bad("colour both noun phrases or neither")
    if nps[0][1] is None and nps[0][0] == nps[1][0]:
        raise bad("two uncoloured noun phrases must name different shapes")
    if nps[0] == nps[1]:
        raise bad("the two noun phrases must differ")
    return _build(task, nps, relation=relation)


def _all_prompts() -> dict[str, list[ToyPrompt]]:
    """Every prompt the grammar allows, per task, in a fixed order."""
    colored = [(s, c) for c in COLORS for s in SHAPES]
    plain_pairs = [(a, b) for a in SHAPES for b in SHAPES if a != b]
    colored_pairs = [(a, b) for a in colored for b in colored if a != b]
    return {
        "single_object": [_build("single_object", [(s, None)]) for s in SHAPES],
        "two_objects": [_build("two_objects", [(a, None), (b, None)]) for a, b in plain_pairs],
        "counting": [_build("counting", [(s, None)], count=k) for k in range(1, 5) for s in SHAPES],
        "colors": [_build("colors", [np_]) for np_ in colored],
        "position": [_build("position", [(a, None), (b, None)], relation=r) for a, b in plain_pairs for r in RELATIONS]
        + [_build("position", [a, b], relation=r) for a, b in colored_pairs for r in RELATIONS],
        "color_attr": [_build("color_attr", [a, b]) for a, b in colored_pairs],
    }


# How many prompts made only of seen combinations are moved from train to eval (novel=False), per task.
_RESERVED_SEEN = {"colors": 3, "position": 16, "color_attr": 16}


@functools.lru_cache(maxsize=1)
def _splits() -> tuple[tuple[ToyPrompt, ...], tuple[ToyPrompt, ...]]:
    rng = random.Random(_SPLIT_SEED)
    train: list[ToyPrompt] = []
    evals: list[ToyPrompt] = []
    for task, prompts in _all_prompts().items():
        novel = [p for p in prompts if p.novel]
        seen = [p for p in prompts if not p.novel and not (task == "position" and not _is_colored(p))]
        n_reserved = _RESERVED_SEEN.get(task, 0)
        reserved = rng.sample(seen, n_reserved) if n_reserved else []
        reserved_texts = {p.text for p in reserved}
        train += [p for p in prompts if not p.novel and p.text not in reserved_texts]
        n_novel = EVAL_PER_TASK - n_reserved
        if len(novel) > n_novel:  # keep every uncoloured held-out position prompt, sample the rest
            plain = [p for p in novel if not _is_colored(p)]
            novel = plain + rng.sample([p for p in novel if _is_colored(p)], n_novel - len(plain))
        pool = novel + reserved
        # Small tasks have few texts: cycle them so each task has EVAL_PER_TASK entries (one image each).
        evals += [pool[i % len(pool)] for i in range(EVAL_PER_TASK)]
    return tuple(train), tuple(evals)


def _is_colored(p: ToyPrompt) -> bool:
    return any(c["type"] == "color" for c in p.clauses)


def train_prompts() -> list[ToyPrompt]:
    """Fixed training prompts (unique texts, no held-out combination, no eval text)."""
    return list(_splits()[0])


def eval_prompts() -> list[ToyPrompt]:
    """Fixed eval prompts: EVAL_PER_TASK per task in TASKS order; texts repeat for small tasks."""
    return list(_splits()[1])


@functools.lru_cache(maxsize=2)
def _by_task(split: str) -> dict[str, tuple[ToyPrompt, ...]]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    prompts = _splits()[0] if split == "train" else tuple(dict.fromkeys(_splits()[1]))
    return {t: tuple(p for p in prompts if p.task == t) for t in TASKS}


def make_prompt(task: str, rng: random.Random, split: str = "train") -> ToyPrompt:
    """A random prompt of `task` from the train split (never a held-out combination) or the eval split.

    Position prompts pick the uncoloured or coloured form with equal odds (the coloured form has
    far more texts).
    """
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {TASKS}")
    candidates = _by_task(split)[task]
    if task == "position":
        plain = [p for p in candidates if not _is_colored(p)]
        colored = [p for p in candidates if _is_colored(p)]
        candidates = plain if (rng.random() < 0.5 and plain) else colored
    return candidates[rng.randrange(len(candidates))]


# ----------------------------------------------------------------------------- ground-truth scenes


def _relation_holds(a: ToyObject, b: ToyObject, relation: str) -> bool:
    """Ground-truth margin: boxes disjoint along the relation axis, perpendicular offset small."""
    along = {"left of": b.cx - a.cx, "right of": a.cx - b.cx, "above": b.cy - a.cy, "below": a.cy - b.cy}[relation]
    across = abs(a.cy - b.cy) if relation in ("left of", "right of") else abs(a.cx - b.cx)
    return along >= a.size + b.size + MIN_GAP_PX and across <= RELATION_DOMINANCE * along


def _apart(a: ToyObject, b: ToyObject) -> bool:
    reach = a.size + b.size + MIN_GAP_PX
    return abs(a.cx - b.cx) >= reach or abs(a.cy - b.cy) >= reach


def _place(specs: list[tuple[str, str]], rng: random.Random, relation: str | None) -> Scene:
    lo, hi = CROWDED_SIZE_RANGE if len(specs) >= 3 else SIZE_RANGE
    if relation is not None:
        hi = min(hi, 11.0)  # leave room for a clear margin
    for attempt in range(2000):
        if attempt and attempt % 500 == 0:
            hi = max(lo, hi - 1.0)  # crowded draws: shrink rather than loop forever
        objects: list[ToyObject] = []
        for shape, color in specs:
            size = round(rng.uniform(lo, hi), 2)
            span = (EDGE_MARGIN_PX + size, IMAGE_SIZE - EDGE_MARGIN_PX - size)
            obj = ToyObject(shape, color, round(rng.uniform(*span), 2), round(rng.uniform(*span), 2), size)
            if not all(_apart(obj, o) for o in objects):
                break
            objects.append(obj)
        else:
            if relation is None or _relation_holds(objects[0], objects[1], relation):
                return Scene(tuple(objects))
    raise RuntimeError(f"could not place {specs} with relation {relation!r}; sizes {SIZE_RANGE} too large?")


def scene_for_prompt(prompt: ToyPrompt, rng: random.Random) -> Scene:
    """A ground-truth scene with exactly the prompt's objects; unspecified colours are random."""
    colors = {c["object"]: c["color"] for c in prompt.clauses if c["type"] == "color"}
    specs: list[tuple[str, str]] = []
    for i, clause in enumerate(c for c in prompt.clauses if c["type"] == "object"):
        for _ in range(clause["count"]):
            specs.append((clause["shape"], colors.get(i) or rng.choice(tuple(COLORS))))
    relation = next((c["relation"] for c in prompt.clauses if c["type"] == "position"), None)
    return _place(specs, rng, relation)


def render_prompt(prompt: ToyPrompt, seed: int, size: int = IMAGE_SIZE) -> np.ndarray:
    """Ground-truth image uint8 [size, size, 3] for `prompt`, deterministic in `seed`."""
    return render(scene_for_prompt(prompt, random.Random(seed)), size, scene_size=IMAGE_SIZE)


if __name__ == "__main__":
    from PIL import Image

    tiles = [render_prompt(make_prompt(t, random.Random(i)), i) for t in TASKS for i in range(8)]
    rows = [np.concatenate(tiles[r * 8:(r + 1) * 8], axis=1) for r in range(len(TASKS))]
    Image.fromarray(np.concatenate(rows, axis=0)).resize((8 * 128, len(TASKS) * 128), Image.NEAREST).save("/tmp/toy_world.png")
    for t in TASKS:
        print(t, make_prompt(t, random.Random(0)).text)
    print("train", len(train_prompts()), "eval", len(eval_prompts()))
