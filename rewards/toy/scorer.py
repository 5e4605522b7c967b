"""The verifiable scorer of the toy world: GenEval-style partial credit from pixels alone.

Per image: (1) each pixel takes the nearest palette colour (or the background) and is kept only
if within COLOR_TOLERANCE of it, which drops anti-aliased edges, blends and noise; (2) 4-connected
components of one colour, at least MIN_AREA pixels and solid (fill of the bounding box >= MIN_FILL,
aspect <= MAX_ASPECT), are objects; (3) each object's shape is the nearest prototype in two
normalised moments, cross = E[dx^2 dy^2] / (var_x var_y) and top-heaviness = -skewness(y):
circle (2/3, 0), square (1, 0), triangle (0.8, 0.566) (exact for the ideal shapes; moments, unlike
bounding-box fill, barely move when noise makes an edge row ragged); (4) each prompt clause gets a
credit in [0, 1]:

    object    k objects of shape S   1 - |n - K| / K clipped at 0, n = detected S, K = S's total in the prompt
    color     object i has colour C  1 if some detected object has object i's shape and colour C
    position  object a R object b    1 if the largest detection matching a (shape, and colour when
                                     given) and the largest matching b satisfy R (rule below)

Position rule (on bounding-box centres, y down): "a left of b" holds when x_b - x_a >= margin and
x_b - x_a >= |y_b - y_a| (the offset along the relation dominates the perpendicular one);
likewise for right of / above / below. The score is the mean credit; `strict` is all credits 1.

Run: ToyScorer()(images [B, 3, H, W] in [0, 1], prompts) -> RewardOutput.
"""

from __future__ import annotations

import functools
import math

import torch

from rewards.base import Reward, RewardOutput
from worlds.toy.scenes import BACKGROUND, COLORS, IMAGE_SIZE, SHAPES, TASKS, ToyPrompt, parse_prompt

COLOR_TOLERANCE = 100.0  # max RGB distance (0-255 units) to the nearest palette colour
MIN_AREA = 24  # pixels at 64x64 (scaled with image area): smaller components are specks
MIN_FILL = 0.3  # components filling less of their bounding box are not solid shapes
MAX_ASPECT = 3.0  # components more elongated than this are not shapes
POSITION_MARGIN = 2.0  # pixels at 64 wide (scaled with width): min offset along a relation
# (cross, top-heaviness) moment prototypes of the ideal filled shapes, in SHAPES order
_PROTOTYPES = torch.tensor([[2 / 3, 0.0], [1.0, 0.0], [0.8, 0.566]], dtype=torch.float64)
_COLOR_NAMES = tuple(COLORS)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ToyPrompt:
    return parse_prompt(text)


def _label_components(cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cls: long [B, H, W], -1 = background. Returns (pix, root): pix long [P] the flat indices
    (over the whole batch) of foreground pixels, root long [P] the smallest index in `pix` of each
    pixel's 4-connected same-colour component. Works on foreground pixels only (a small share)."""
    fg = (cls >= 0).reshape(-1)
    pix = fg.nonzero().squeeze(1)  # [P]
    slot = torch.full((cls.numel(),), -1, dtype=torch.long)
    slot[pix] = torch.arange(pix.numel())
    pair_h = torch.zeros_like(cls, dtype=torch.bool)  # pixel joins its right neighbour
    pair_h[:, :, :-1] = (cls[:, :, :-1] >= 0) & (cls[:, :, :-1] == cls[:, :, 1:])
    pair_v = torch.zeros_like(cls, dtype=torch.bool)  # pixel joins the one below
    pair_v[:, :-1, :] = (cls[:, :-1, :] >= 0) & (cls[:, :-1, :] == cls[:, 1:, :])
    first_h, first_v = pair_h.reshape(-1).nonzero().squeeze(1), pair_v.reshape(-1).nonzero().squeeze(1)
    src = slot[torch.cat([first_h, first_v])]
    dst = slot[torch.cat([first_h + 1, first_v + cls.shape[2]])]
    src, dst = torch.cat([src, dst]), torch.cat([dst, src])  # undirected edges [2E]
    root = torch.arange(pix.numel())
    while True:  # min-label propagation along edges, then pointer jumping (labels stay in-component)
        new = root.scatter_reduce(0, src, root[dst], "amin", include_self=True)
        new = new[new]
        new = new[new]
        if torch.equal(new, root):
            return pix, root
        root = new


def detect_objects(images: torch.Tensor) -> list[list[dict]]:
    """images: uint8 [B, 3, H, W]. Per image, the detected objects as dicts
    {"shape", "color", "cx", "cy", "area", "fill", "cross", "top_heaviness"} (pixels, y down)."""
    batch, _, height, width = images.shape
    pixels = images.permute(0, 2, 3, 1).reshape(-1, 3).to(torch.int32)  # [N, 3]
    palette = torch.tensor([*COLORS.values(), BACKGROUND], dtype=torch.int32)  # [K+1, 3]
    # exact integer squared distances, so a pixel's class never depends on its batch companions
    dist2 = sum((pixels[:, c, None] - palette[None, :, c]) ** 2 for c in range(3))  # [N, K+1]
    nearest_dist2, nearest = dist2.min(dim=1)
    keep = (nearest < len(COLORS)) & (nearest_dist2 <= COLOR_TOLERANCE**2)
    cls = torch.where(keep, nearest, torch.tensor(-1)).view(batch, height, width)
    pix, root = _label_components(cls)
    if pix.numel() == 0:
        return [[] for _ in range(batch)]
    comp_slot, comp_of_pix, area = torch.unique(root, return_inverse=True, return_counts=True)
    comp_root = pix[comp_slot]  # flat index of each component's first pixel
    ys = ((pix % (height * width)) // width).double()
    xs = (pix % width).double()
    area = area.double()
    n_comp = comp_root.numel()

    def reduce(values: torch.Tensor, how: str) -> torch.Tensor:
        init = torch.full((n_comp,), math.inf if how == "amin" else -math.inf, dtype=torch.float64)
        return init.scatter_reduce(0, comp_of_pix, values, how, include_self=True)

    x0, x1, y0, y1 = reduce(xs, "amin"), reduce(xs, "amax"), reduce(ys, "amin"), reduce(ys, "amax")
    box_w, box_h = x1 - x0 + 1, y1 - y0 + 1
    cx, cy = (x0 + x1 + 1) / 2, (y0 + y1 + 1) / 2  # pixel i spans [i, i + 1)
    fill = area / (box_w * box_h)

    def mean(values: torch.Tensor) -> torch.Tensor:  # per-component mean of a per-pixel value
        return torch.zeros(n_comp, dtype=torch.float64).index_add_(0, comp_of_pix, values) / area

    dx, dy = xs - mean(xs)[comp_of_pix], ys - mean(ys)[comp_of_pix]
    var_x, var_y = mean(dx * dx).clamp_min(1e-6), mean(dy * dy).clamp_min(1e-6)
    # Moments, not the bounding box, so that a ragged edge row moves them little.
    cross = mean(dx * dx * dy * dy) / (var_x * var_y)  # circle 2/3, triangle 0.8, square 1
    top_heaviness = -mean(dy**3) / var_y**1.5  # minus the skewness of y: triangle 0.566, else 0
    features = torch.stack([cross, top_heaviness], dim=1)  # [C, 2]
    shape_idx = ((features[:, None, :] - _PROTOTYPES[None]) ** 2).sum(-1).argmin(dim=1)
    min_area = MIN_AREA * height * width / IMAGE_SIZE**2
    aspect = torch.maximum(box_w / box_h, box_h / box_w)
    valid = (area >= min_area) & (fill >= MIN_FILL) & (aspect <= MAX_ASPECT)
    color_idx = cls.reshape(-1)[comp_root]
    image_idx = comp_root // (height * width)
    detections: list[list[dict]] = [[] for _ in range(batch)]
    for c in valid.nonzero().squeeze(1).tolist():
        detections[int(image_idx[c])].append(
            {
                "shape": SHAPES[int(shape_idx[c])],
                "color": _COLOR_NAMES[int(color_idx[c])],
                "cx": float(cx[c]),
                "cy": float(cy[c]),
                "area": int(area[c]),
                "fill": float(fill[c]),
                "cross": float(cross[c]),
                "top_heaviness": float(top_heaviness[c]),
            }
        )
    return detections


def relation_holds(a: dict, b: dict, relation: str, margin: float) -> bool:
    """The scorer's position rule on detection centres (see the module docstring)."""
    dx, dy = b["cx"] - a["cx"], b["cy"] - a["cy"]
    along, across = {
        "left of": (dx, dy),
        "right of": (-dx, dy),
        "above": (dy, dx),
        "below": (-dy, dx),
    }[relation]
    return along >= margin and along >= abs(across)


def score_clauses(prompt: ToyPrompt, detections: list[dict], margin: float = POSITION_MARGIN) -> list[float]:
    """One credit in [0, 1] per clause of `prompt`, given the image's detections."""
    objects = [c for c in prompt.clauses if c["type"] == "object"]
    colors = {c["object"]: c["color"] for c in prompt.clauses if c["type"] == "color"}
    expected = {s: sum(o["count"] for o in objects if o["shape"] == s) for s in SHAPES}

    def matches(i: int) -> list[dict]:
        return [
            d for d in detections
            if d["shape"] == objects[i]["shape"] and (i not in colors or d["color"] == colors[i])
        ]

    credits = []
    for clause in prompt.clauses:
        if clause["type"] == "object":
            k = expected[clause["shape"]]
            n = sum(d["shape"] == clause["shape"] for d in detections)
            credits.append(max(0.0, 1.0 - abs(n - k) / k))
        elif clause["type"] == "color":
            credits.append(1.0 if matches(clause["object"]) else 0.0)
        elif clause["type"] == "position":
            cand_a = sorted(matches(clause["a"]), key=lambda d: -d["area"])  # largest first
            cand_b = [d for d in sorted(matches(clause["b"]), key=lambda d: -d["area"]) if d is not cand_a[0]] if cand_a else []
            ok = bool(cand_a and cand_b) and relation_holds(cand_a[0], cand_b[0], clause["relation"], margin)
            credits.append(1.0 if ok else 0.0)
        else:
            raise ValueError(f"unknown clause type {clause['type']!r} in {prompt.text!r}")
    return credits


class ToyScorer(Reward):
    """GenEval-style verifiable reward for the toy world; see the module docstring."""

    name = "toy"
    modality = "image"

    def score_uint8(self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None) -> RewardOutput:
        parsed = [self._prompt(text, None if metadata is None else metadata[i]) for i, text in enumerate(prompts)]
        detections = detect_objects(images)
        margin = POSITION_MARGIN * images.shape[-1] / IMAGE_SIZE
        credits = [score_clauses(prompt, dets, margin) for prompt, dets in zip(parsed, detections)]
        return clause_output(parsed, credits, [sum(c) / len(c) for c in credits],
                             num_detected=[len(d) for d in detections])

    @staticmethod
    def _prompt(text: str, meta: dict | None) -> ToyPrompt:
        return resolve_prompt(text, meta, ToyPrompt, _parse_cached, "toy")


def clause_output(parsed: list, credits: list[list[float]], scores: list[float], **info) -> RewardOutput:
    """A toy scorer's RewardOutput: the scores [B], and per sample its strict verdict (every clause credit 1),
    task, clauses with their credits, and the scorer's own ``info`` lists."""
    return RewardOutput(
        scores=torch.tensor(scores, dtype=torch.float32),
        info={
            "strict": torch.tensor([all(v == 1.0 for v in c) for c in credits], dtype=torch.bool),  # [B]
            "task": [p.task for p in parsed],
            # per sample: the prompt's clause dicts plus "credit"
            "clauses": [[{**clause, "credit": v} for clause, v in zip(p.clauses, c)] for p, c in zip(parsed, credits)],
            **info,
        },
    )


def resolve_prompt(text: str, meta: dict | None, prompt_class: type, parse, reward_name: str):
    """The prompt record from metadata (``prompt_class.to_dict()`` form; its text must equal ``text``)
    when it has clauses, else ``parse(text)``."""
    if meta is not None and "clauses" in meta:
        if meta.get("text", text) != text:
            raise ValueError(
                f"{reward_name}: metadata text {meta['text']!r} does not match prompt {text!r}; metadata misaligned?"
            )
        return prompt_class.from_dict({"text": text, **meta})
    return parse(text)


def summarize(scores, strict, tasks: list[str]) -> dict:
    """Aggregate per-image results: {"mean_score", "strict_accuracy", "per_task", "num_images"}.

    scores: [N] floats (NaN ignored), strict: [N] bools, tasks: N task names. per_task maps each
    task present to its mean score.
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    strict = torch.as_tensor(strict, dtype=torch.bool).reshape(-1)
    if not (len(scores) == len(strict) == len(tasks)):
        raise ValueError(f"summarize: {len(scores)} scores, {len(strict)} strict flags, {len(tasks)} tasks; need equal")
    valid = ~torch.isnan(scores)

    def mean(mask: torch.Tensor) -> float:
        m = mask & valid
        return float(scores[m].mean()) if m.any() else float("nan")

    order = [t for t in TASKS if t in tasks] + sorted(set(tasks) - set(TASKS))
    return {
        "mean_score": mean(torch.ones_like(valid)),
        "strict_accuracy": float(strict[valid].double().mean()) if valid.any() else float("nan"),
        "per_task": {t: mean(torch.tensor([x == t for x in tasks], dtype=torch.bool)) for t in order},
        "num_images": int(len(scores)),
    }
