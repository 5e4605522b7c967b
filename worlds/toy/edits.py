"""The toy editing world: a source scene of coloured shapes, an instruction, and the edited scene it asks for.

Built on the toy image world (``worlds/toy/scenes.py``: the same shapes, palette, background, 64x64 scene grid
and renderer). A model gets the SOURCE image and an instruction and must produce the edited image. Four tasks,
one instruction form each (docs/toy_world.md, "The toy editing world"):

    recolor  "make the red circle blue"    the object takes the new colour; same place, shape and size
    move     "move the red circle left"    the object shifts MOVE_PX (14 px on the 64 grid) left/right/up/down
    add      "add a blue square"           a new object of that colour and shape appears in free space
    remove   "remove the red circle"       the object disappears; background where it was

A source scene holds 1-3 objects with distinct (colour, shape) pairs, so "the red circle" always names exactly
one object (the target keeps the pairs distinct too: a recolour or an add never makes a second red circle). An
``EditPrompt`` is one record: the instruction, the source scene's objects and the edit as JSON-serialisable dicts;
``target_scene()`` applies the edit, so the ground truth is deterministic (an add records where the new object is
drawn). Every destination stays inside the image and MIN_GAP_PX clear of the other objects.

Held-out combinations (``novel=True``; they occur only in ``eval_edits()``, never in ``train_edits()``):

    recolor  to (new colour, shape): purple triangle, green circle, cyan square   (HELD_OUT_RECOLORS)
    move     (shape, direction):     triangle up, square left, circle down         (HELD_OUT_MOVES)
    add      (colour, shape):        yellow circle, blue triangle, red square      (HELD_OUT_ADDS)
    remove   (colour, shape):        cyan triangle, purple circle, green square    (HELD_OUT_REMOVES)

Each held-out pair is seen in training in every other role (a green circle is recoloured from, moved, added and
removed; triangles move left, right and down). The eval set has EVAL_PER_TASK records per task:
EVAL_NOVEL_PER_TASK of held-out combinations and the rest seen combinations on new source scenes (``novel=False``).
``draw_train_edits(rng, n)`` draws fresh training records (new scenes) for pretraining an editor.

Object sizes and positions are quantised (SIZES; centres on a half-pixel grid of the 64 grid, a quarter pixel at
32) to the values the scorer's detector (``rewards.toy.scorer.detect_objects``) reads exactly at 32 and 64 px for
every colour and sub-pixel phase: a circle of half-extent 9 (4.5 px at 32) reads as a square at some phases, so
sizes stop at 8.5. The models of this world run at 32x32 (the 64 grid rendered down).

Quick look:  python -m worlds.toy.edits  (writes source | target pairs to /tmp/toy_edits.png, prints counts)
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass, replace

import numpy as np

from worlds.toy.scenes import COLORS, IMAGE_SIZE, SHAPES, Scene, ToyObject, _apart, render

EDIT_TASKS = ("recolor", "move", "add", "remove")
DIRECTIONS = ("left", "right", "up", "down")
DIRECTION_VECTORS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}  # y down
MOVE_PX = 14.0  # how far a move shifts an object, pixels of the 64 grid (an even number keeps the 32 px phase)
SIZES = (7.0, 7.5, 8.0, 8.5)  # half-extents on the 64 grid that the detector reads exactly at 32 and 64 px
POSITION_STEP = 0.5  # object centres lie on this grid (64-grid pixels)
EDGE_MARGIN_PX = 1.0  # minimum gap between an object and the image border
MAX_SOURCE_OBJECTS = 3

HELD_OUT_RECOLORS = (("purple", "triangle"), ("green", "circle"), ("cyan", "square"))  # (new colour, shape)
HELD_OUT_MOVES = (("triangle", "up"), ("square", "left"), ("circle", "down"))  # (shape, direction)
HELD_OUT_ADDS = (("yellow", "circle"), ("blue", "triangle"), ("red", "square"))  # (colour, shape)
HELD_OUT_REMOVES = (("cyan", "triangle"), ("purple", "circle"), ("green", "square"))  # (colour, shape)

TRAIN_PER_TASK = 400
EVAL_PER_TASK = 32
EVAL_NOVEL_PER_TASK = 20  # the other EVAL_PER_TASK - EVAL_NOVEL_PER_TASK are seen combinations on new scenes
_SPLIT_SEED = 20240615
_MAX_TRIES = 5000

GRAMMAR = (
    "one of: 'make the COLOR SHAPE NEWCOLOR' (NEWCOLOR differs from COLOR) | "
    f"'move the COLOR SHAPE {{{'|'.join(DIRECTIONS)}}}' | 'add a COLOR SHAPE' | 'remove the COLOR SHAPE'; "
    f"SHAPE in {SHAPES}, COLOR in {tuple(COLORS)}"
)


@dataclass(frozen=True)
class EditPrompt:
    text: str  # the instruction, e.g. "move the red circle left"
    task: str  # one of EDIT_TASKS
    # The source scene's objects, {"shape", "color", "cx", "cy", "size"} each (ToyObject's fields, 64 grid).
    source: tuple[dict, ...]
    # The edit, by task:
    #   recolor  {"object": i, "color": C}                        source object i takes colour C
    #   move     {"object": i, "direction": D, "dx": x, "dy": y}  source object i shifts by (x, y) = MOVE_PX along D
    #   add      {"shape", "color", "cx", "cy", "size"}           this object is added (where the ground truth draws it)
    #   remove   {"object": i}                                    source object i is removed
    edit: dict
    novel: bool = False  # True if the instruction holds a held-out combination (never in train_edits())

    def __post_init__(self) -> None:
        _check_record(self)

    def __hash__(self) -> int:  # source and edit are dicts; the text, source and edit determine the record
        return hash((self.text, tuple(_object_key(o) for o in self.source), tuple(sorted(self.edit.items()))))

    def source_scene(self) -> Scene:
        return Scene(tuple(ToyObject(**o) for o in self.source))

    def target_scene(self) -> Scene:
        """The ground-truth edited scene."""
        objects = list(self.source_scene().objects)
        e = self.edit
        if self.task == "recolor":
            objects[e["object"]] = replace(objects[e["object"]], color=e["color"])
        elif self.task == "move":
            obj = objects[e["object"]]
            objects[e["object"]] = replace(obj, cx=obj.cx + e["dx"], cy=obj.cy + e["dy"])
        elif self.task == "add":
            objects.append(ToyObject(**{k: e[k] for k in ("shape", "color", "cx", "cy", "size")}))
        else:
            del objects[e["object"]]
        return Scene(tuple(objects))

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "task": self.task,
            "source": [dict(o) for o in self.source],
            "edit": dict(self.edit),
            "novel": self.novel,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "EditPrompt":
        """The record of ``to_dict()``; ``novel`` is recomputed from the text (it is a function of it), and
        a record whose text, source and edit disagree is refused."""
        missing = {"text", "task", "source", "edit"} - set(d)
        if missing:
            raise ValueError(f"EditPrompt.from_dict: missing keys {sorted(missing)} in {d!r}")
        return cls(
            text=d["text"],
            task=d["task"],
            source=tuple(dict(o) for o in d["source"]),
            edit=dict(d["edit"]),
            novel=is_novel(parse_instruction(d["text"])),
        )


def _object_key(o: dict) -> tuple:
    return (o["shape"], o["color"], float(o["cx"]), float(o["cy"]), float(o["size"]))


def _check_record(p: EditPrompt) -> None:
    """Refuse a record whose parts disagree: the text's task, object and edit must be the record's."""

    def bad(why: str) -> ValueError:
        return ValueError(f"EditPrompt {p.text!r}: {why}; record {p.to_dict()!r}")

    fields = parse_instruction(p.text)
    if p.task != fields["task"]:
        raise bad(f"task {p.task!r} but the instruction is a {fields['task']!r}")
    if p.novel != is_novel(fields):
        raise bad(f"novel={p.novel} but is_novel says {not p.novel}")
    for o in p.source:
        if set(o) != {"shape", "color", "cx", "cy", "size"}:
            raise bad(f"source object {o!r} needs exactly shape, color, cx, cy, size")
    pairs = [(o["color"], o["shape"]) for o in p.source]
    if len(set(pairs)) != len(pairs):
        raise bad("source (colour, shape) pairs repeat, so a reference to one is ambiguous")
    named = (fields["color"], fields["shape"])
    if p.task == "add":
        if (p.edit.get("color"), p.edit.get("shape")) != named:
            raise bad(f"adds {p.edit.get('color')} {p.edit.get('shape')}, the text names {named}")
        if named in pairs:
            raise bad(f"the source already has a {' '.join(named)}")
        return
    i = p.edit.get("object")
    if not isinstance(i, int) or not 0 <= i < len(p.source) or pairs[i] != named:
        raise bad(f"edit object {i!r} is not the source's {' '.join(named)}")
    if p.task == "recolor":
        new = fields["new_color"]
        if p.edit.get("color") != new or (new, named[1]) in pairs:
            raise bad(f"the new colour must be {new!r} and not make a second {new} {named[1]}")
    if p.task == "move":
        direction = fields["direction"]
        vx, vy = DIRECTION_VECTORS[direction]
        if p.edit.get("direction") != direction or (p.edit.get("dx"), p.edit.get("dy")) != (vx * MOVE_PX, vy * MOVE_PX):
            raise bad(f"a move {direction} is direction {direction!r}, (dx, dy) = MOVE_PX along it")


# ----------------------------------------------------------------------------- instructions


def instruction(fields: dict) -> str:
    """The instruction text for parsed fields (the inverse of ``parse_instruction``)."""
    task, np_ = fields["task"], f"{fields['color']} {fields['shape']}"
    if task == "recolor":
        return f"make the {np_} {fields['new_color']}"
    if task == "move":
        return f"move the {np_} {fields['direction']}"
    return f"add a {np_}" if task == "add" else f"remove the {np_}"


_C = "|".join(COLORS)
_S = "|".join(SHAPES)
_RULES = (
    ("recolor", re.compile(rf"^make the ({_C}) ({_S}) ({_C})$"), ("color", "shape", "new_color")),
    ("move", re.compile(rf"^move the ({_C}) ({_S}) ({'|'.join(DIRECTIONS)})$"), ("color", "shape", "direction")),
    ("add", re.compile(rf"^add a ({_C}) ({_S})$"), ("color", "shape")),
    ("remove", re.compile(rf"^remove the ({_C}) ({_S})$"), ("color", "shape")),
)


def parse_instruction(text: str) -> dict:
    """Instruction text -> {"task", "color", "shape"} plus "new_color" (recolor) or "direction" (move). For
    "add", colour and shape are the added object's; otherwise the object's the instruction refers to."""
    for task, rule, names in _RULES:
        if m := rule.match(text):
            fields = {"task": task, **dict(zip(names, m.groups()))}
            if task == "recolor" and fields["new_color"] == fields["color"]:
                raise ValueError(f"toy edit {text!r}: the new colour must differ from the old one. Grammar: {GRAMMAR}")
            return fields
    raise ValueError(f"toy edit {text!r} is outside the grammar. Grammar: {GRAMMAR}")


def is_novel(fields: dict) -> bool:
    """True if the parsed instruction holds a held-out combination (module docstring)."""
    task, color, shape = fields["task"], fields["color"], fields["shape"]
    if task == "recolor":
        return (fields["new_color"], shape) in HELD_OUT_RECOLORS
    if task == "move":
        return (shape, fields["direction"]) in HELD_OUT_MOVES
    return (color, shape) in (HELD_OUT_ADDS if task == "add" else HELD_OUT_REMOVES)


def all_instructions(task: str) -> list[dict]:
    """Every instruction of `task` the grammar allows, as parsed fields, in a fixed order."""
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    if task == "recolor":
        return [{"task": task, "color": c, "shape": s, "new_color": n} for c, s in pairs for n in COLORS if n != c]
    if task == "move":
        return [{"task": task, "color": c, "shape": s, "direction": d} for c, s in pairs for d in DIRECTIONS]
    return [{"task": task, "color": c, "shape": s} for c, s in pairs]


# ----------------------------------------------------------------------------- records


def _inside(o: ToyObject) -> bool:
    lo = EDGE_MARGIN_PX + o.size
    return lo <= o.cx <= IMAGE_SIZE - lo and lo <= o.cy <= IMAGE_SIZE - lo


def _layout(specs: list[tuple[str, str]], rng: random.Random, fits) -> list[ToyObject]:
    """Objects for (shape, colour) specs: sizes from SIZES, centres on the POSITION_STEP grid, inside the image,
    boxes MIN_GAP_PX apart, and ``fits(objects)`` true (a move's destination must fit too)."""
    for _ in range(_MAX_TRIES):
        objects: list[ToyObject] = []
        for shape, color in specs:
            size = rng.choice(SIZES)
            lo, hi = (math.ceil((EDGE_MARGIN_PX + size) / POSITION_STEP),
                      math.floor((IMAGE_SIZE - EDGE_MARGIN_PX - size) / POSITION_STEP))
            cx, cy = rng.randint(lo, hi) * POSITION_STEP, rng.randint(lo, hi) * POSITION_STEP
            obj = ToyObject(shape, color, cx, cy, size)
            if not all(_apart(obj, o) for o in objects):
                break
            objects.append(obj)
        else:
            if fits(objects):
                return objects
    raise RuntimeError(f"could not lay out {specs}; SIZES {SIZES} too large for {IMAGE_SIZE} px?")


def _draw_record(fields: dict, rng: random.Random) -> EditPrompt:
    """A record for the instruction `fields` on a fresh source scene of 1-3 objects."""
    task = fields["task"]
    named = (fields["shape"], fields["color"])
    taken = {named} | ({(fields["shape"], fields["new_color"])} if task == "recolor" else set())
    free = [(s, c) for c in COLORS for s in SHAPES if (s, c) not in taken]
    n_source = rng.randint(1, MAX_SOURCE_OBJECTS)
    if task == "add":
        specs = rng.sample(free, n_source) + [named]  # the added object is drawn last, with the source
        *objects, added = _layout(specs, rng, lambda objs: True)
        edit = {"shape": added.shape, "color": added.color, "cx": added.cx, "cy": added.cy, "size": added.size}
    else:
        specs = rng.sample(free, n_source - 1)
        index = rng.randint(0, len(specs))
        specs.insert(index, named)
        edit = {"object": index}
        if task == "recolor":
            edit["color"] = fields["new_color"]
            objects = _layout(specs, rng, lambda objs: True)
        elif task == "move":
            vx, vy = DIRECTION_VECTORS[fields["direction"]]
            edit.update(direction=fields["direction"], dx=vx * MOVE_PX, dy=vy * MOVE_PX)

            def fits(objs: list[ToyObject]) -> bool:
                moved = replace(objs[index], cx=objs[index].cx + edit["dx"], cy=objs[index].cy + edit["dy"])
                return _inside(moved) and all(_apart(moved, o) for j, o in enumerate(objs) if j != index)

            objects = _layout(specs, rng, fits)
        else:
            objects = _layout(specs, rng, lambda objs: True)
    source = tuple({"shape": o.shape, "color": o.color, "cx": o.cx, "cy": o.cy, "size": o.size} for o in objects)
    return EditPrompt(text=instruction(fields), task=task, source=source, edit=edit, novel=is_novel(fields))


@functools.lru_cache(maxsize=1)
def _splits() -> tuple[tuple[EditPrompt, ...], tuple[EditPrompt, ...]]:
    train: list[EditPrompt] = []
    evals: list[EditPrompt] = []
    used: set[EditPrompt] = set()

    def draw(fields: dict, rng: random.Random) -> EditPrompt:
        record = _draw_record(fields, rng)
        while record in used:  # every record is distinct, within and across the splits
            record = _draw_record(fields, rng)
        used.add(record)
        return record

    for task in EDIT_TASKS:
        instructions = all_instructions(task)
        seen = [f for f in instructions if not is_novel(f)]
        novel = [f for f in instructions if is_novel(f)]
        rng = random.Random(f"{_SPLIT_SEED}/{task}/train")
        rng.shuffle(seen)  # every seen instruction is drawn evenly often
        train += [draw(seen[k % len(seen)], rng) for k in range(TRAIN_PER_TASK)]
        rng = random.Random(f"{_SPLIT_SEED}/{task}/eval")
        rng.shuffle(novel)
        rng.shuffle(seen)
        evals += [draw(novel[k % len(novel)], rng) for k in range(EVAL_NOVEL_PER_TASK)]
        evals += [draw(seen[k % len(seen)], rng) for k in range(EVAL_PER_TASK - EVAL_NOVEL_PER_TASK)]
    return tuple(train), tuple(evals)


def draw_train_edits(rng: random.Random, n: int) -> list[EditPrompt]:
    """`n` fresh records from the training instructions (tasks in turn, an instruction uniform within its task)
    on new source scenes: never a held-out combination nor an eval record. For pretraining an editor on more
    scenes than train_edits() holds."""
    seen = {task: [f for f in all_instructions(task) if not is_novel(f)] for task in EDIT_TASKS}
    held_out = set(_splits()[1])
    records = []
    while len(records) < n:
        record = _draw_record(rng.choice(seen[EDIT_TASKS[len(records) % len(EDIT_TASKS)]]), rng)
        if record not in held_out:
            records.append(record)
    return records


def train_edits() -> list[EditPrompt]:
    """Fixed training records: TRAIN_PER_TASK per task in EDIT_TASKS order, no held-out combination."""
    return list(_splits()[0])


def eval_edits() -> list[EditPrompt]:
    """Fixed eval records: EVAL_PER_TASK per task in EDIT_TASKS order (held-out combinations first), none in
    training."""
    return list(_splits()[1])


def render_source(p: EditPrompt, size: int = IMAGE_SIZE) -> np.ndarray:
    """The source image, uint8 [size, size, 3] (the 64 grid rendered at `size`)."""
    return render(p.source_scene(), size, scene_size=IMAGE_SIZE)


def render_target(p: EditPrompt, size: int = IMAGE_SIZE) -> np.ndarray:
    """The ground-truth edited image, uint8 [size, size, 3]."""
    return render(p.target_scene(), size, scene_size=IMAGE_SIZE)


if __name__ == "__main__":
    from PIL import Image

    records = eval_edits()
    picks = [p for t in EDIT_TASKS for p in [q for q in records if q.task == t][::4][:8]]
    gap = np.full((IMAGE_SIZE, 4, 3), 255, dtype=np.uint8)
    pairs = [np.concatenate([render_source(p), gap, render_target(p), gap, gap], axis=1) for p in picks]
    rows = [np.concatenate(pairs[r * 8:(r + 1) * 8], axis=1) for r in range(len(EDIT_TASKS))]
    sheet = np.concatenate([np.pad(r, ((0, 8), (0, 0), (0, 0)), constant_values=255) for r in rows], axis=0)
    Image.fromarray(sheet).resize((sheet.shape[1] * 2, sheet.shape[0] * 2), Image.NEAREST).save("/tmp/toy_edits.png")
    for t in EDIT_TASKS:
        train_t = [p for p in train_edits() if p.task == t]
        eval_t = [p for p in records if p.task == t]
        print(f"{t:8s} train {len(train_t)} ({len({p.text for p in train_t})} texts)  eval {len(eval_t)} "
              f"({sum(p.novel for p in eval_t)} novel)  e.g. {eval_t[0].text!r}")
    print("train", len(train_edits()), "eval", len(records), "-> /tmp/toy_edits.png")
