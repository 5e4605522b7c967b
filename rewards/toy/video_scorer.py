"""The verifiable scorer of the toy video world: GenEval-style partial credit from pixels alone.

Per frame, objects are found as the image scorer finds them (``detect_objects``: nearest palette
colour, 4-connected components, moment-based shape), keeping components of MIN_AREA to MAX_AREA
pixels. Per named object a **track** is built from the detections of its shape (and colour when
named): the largest in the first frame that has one, then in each frame the one nearest the track's
last point, unless it lies further than MAX_STEP per frame (clutter or another object; the frame
is then a gap). Each clause gets a credit in [0, 1]:

    object  SHAPE S present          mean over frames of 1 - |n - K| / K clipped at 0 (n detected S,
                                     K = S's total in the prompt): flicker and duplicates cost credit
    color   object i has colour C    fraction of frames with a detection of object i's shape and colour C
    motion  object i moves D         needs a track in at least half the frames; v = least-squares
                                     velocity of the track's centre (px/frame, scaled to 32 px wide);
                                     0 unless the component along D dominates the perpendicular one,
                                     else min(1, v_along / MIN_SPEED) x steady, the fraction of the
                                     track's steps that do not go back by more than BACKSTEP_TOLERANCE
                                     (frames where the object teleported count as bad steps)
    speed   slowly / quickly         1 if the motion is in D (as above) with v_along >= MIN_SPEED and
                                     v_along < SPEED_SPLIT (slowly) or >= SPEED_SPLIT (quickly)

A clip is about motion, so per object the motion clauses (motion, and speed when named) weigh
twice as much as the appearance clauses (object, and colour when named); within each group clauses
weigh equally. The score is the mean over objects of (appearance + 2 motion) / 3: a still clip of the
right objects scores 1/3, a clip played backwards 1/3, noise 0. `strict` is every credit 1.

Run: ToyVideoScorer()(videos [B, F, 3, H, W] in [0, 1], prompts) -> RewardOutput.
"""

from __future__ import annotations

import functools
import math

import torch

from rewards.base import Reward, RewardOutput
from rewards.toy.scorer import clause_output, detect_objects, resolve_prompt, summarize  # noqa: F401  (summarize: re-exported)
from worlds.toy.clips import DIRECTION_VECTORS, FRAME_SIZE, ToyVideoPrompt, parse_prompt

# Object size limits in pixels at 32x32 (scaled with frame area): the smallest true object (a 4 px
# triangle) has 32 px, the largest (a 7 px square) 196; smaller components are specks of noise,
# larger ones colour washes (an untrained model's frame-filling blobs), neither a toy object.
MIN_AREA = 14
MAX_AREA = 400
MIN_SPEED = 0.5  # px/frame at 32 px wide: full motion credit from here (ground truth moves >= 0.6)
SPEED_SPLIT = 1.25  # px/frame at 32 px wide: slower is "slowly", faster "quickly" (truth: <= 0.9, >= 1.6)
MAX_STEP = 4.0  # px per frame at 32 px wide: a track never jumps further (ground truth moves <= 1.9)
BACKSTEP_TOLERANCE = 0.5  # px at 32 px wide: a step back this small is pixel jitter, not a reversal
MOTION_WEIGHT = 2.0  # weight of an object's motion group relative to its appearance group
APPEARANCE = ("object", "color")
MOTION = ("motion", "speed")


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ToyVideoPrompt:
    return parse_prompt(text)


def _track(frames: list[list[dict]], shape: str, color: str | None, max_step: float) -> tuple[list, int]:
    """The track of one object, [(frame, cx, cy)]: the largest matching detection of the first frame
    that has one, then per frame the matching detection nearest the last track point if within
    max_step per frame; and the number of frames whose matches were all too far (teleports)."""
    track: list[tuple[int, float, float]] = []
    jumps = 0
    for t, detections in enumerate(frames):
        matches = [d for d in detections if d["shape"] == shape and (color is None or d["color"] == color)]
        if not matches:
            continue
        if track:
            last_t, x, y = track[-1]
            best = min(matches, key=lambda d: (d["cx"] - x) ** 2 + (d["cy"] - y) ** 2)
            if math.hypot(best["cx"] - x, best["cy"] - y) > max_step * (t - last_t):
                jumps += 1  # a jump no toy object makes: a teleport, another object, or clutter
                continue
        else:
            best = max(matches, key=lambda d: d["area"])
        track.append((t, best["cx"], best["cy"]))
    return track, jumps


def _velocity(track: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Least-squares slope of cx(t) and cy(t), px per frame."""
    n = len(track)
    t_mean = sum(p[0] for p in track) / n
    x_mean = sum(p[1] for p in track) / n
    y_mean = sum(p[2] for p in track) / n
    var_t = sum((p[0] - t_mean) ** 2 for p in track)
    vx = sum((p[0] - t_mean) * (p[1] - x_mean) for p in track) / var_t
    vy = sum((p[0] - t_mean) * (p[2] - y_mean) for p in track) / var_t
    return vx, vy


def motion_of(track: list[tuple[int, float, float]], jumps: int, direction: str, num_frames: int, scale: float) -> dict:
    """Motion of a track relative to `direction`: {"along", "across"} speeds (px/frame at 32 px wide),
    "steady" (the fraction of the track's steps, and of its `jumps`, that are steps not going back)
    and "credit" (the motion clause's)."""
    if len(track) < max(2, math.ceil(num_frames / 2)):
        return {"along": 0.0, "across": 0.0, "steady": 0.0, "credit": 0.0}
    ux, uy = DIRECTION_VECTORS[direction]
    vx, vy = _velocity(track)
    along, across = (vx * ux + vy * uy) / scale, abs(vx * uy - vy * ux) / scale
    steps = [((b[1] - a[1]) * ux + (b[2] - a[2]) * uy) / scale for a, b in zip(track, track[1:])]
    steady = sum(s >= -BACKSTEP_TOLERANCE for s in steps) / (len(steps) + jumps)
    credit = min(1.0, along / MIN_SPEED) * steady if along > 0 and along >= across else 0.0
    return {"along": along, "across": across, "steady": steady, "credit": credit}


def score_clauses(
    prompt: ToyVideoPrompt, frames: list[list[dict]], scale: float = 1.0
) -> tuple[list[float], list[dict]]:
    """One credit in [0, 1] per clause of `prompt` given per-frame detections, and per-object motion."""
    objects = [c for c in prompt.clauses if c["type"] == "object"]
    colors = {c["object"]: c["color"] for c in prompt.clauses if c["type"] == "color"}
    directions = {c["object"]: c["direction"] for c in prompt.clauses if c["type"] == "motion"}
    expected = {o["shape"]: sum(p["count"] for p in objects if p["shape"] == o["shape"]) for o in objects}
    num_frames = len(frames)
    tracks = [_track(frames, o["shape"], colors.get(i), MAX_STEP * scale) for i, o in enumerate(objects)]
    motions = [motion_of(tr, jumps, directions[i], num_frames, scale) if i in directions else None
               for i, (tr, jumps) in enumerate(tracks)]
    credits = []
    for clause in prompt.clauses:
        kind = clause["type"]
        if kind == "object":
            k = expected[clause["shape"]]
            per_frame = [max(0.0, 1.0 - abs(sum(d["shape"] == clause["shape"] for d in f) - k) / k) for f in frames]
            credits.append(sum(per_frame) / num_frames)
        elif kind == "color":
            shape = objects[clause["object"]]["shape"]
            hits = sum(any(d["shape"] == shape and d["color"] == clause["color"] for d in f) for f in frames)
            credits.append(hits / num_frames)
        elif kind == "motion":
            credits.append(motions[clause["object"]]["credit"])
        elif kind == "speed":
            m = motions[clause["object"]]
            moving = m["credit"] > 0 and m["along"] >= MIN_SPEED
            fast = m["along"] >= SPEED_SPLIT
            credits.append(1.0 if moving and fast == (clause["speed"] == "quickly") else 0.0)
        else:
            raise ValueError(f"unknown clause type {kind!r} in {prompt.text!r}")
    return credits, [{"frames_tracked": len(tr), "jumps": jumps, **(m or {})}
                     for (tr, jumps), m in zip(tracks, motions)]


def combine(prompt: ToyVideoPrompt, credits: list[float]) -> float:
    """Per object (appearance mean + MOTION_WEIGHT x motion mean) / (1 + MOTION_WEIGHT), averaged."""
    num_objects = sum(c["type"] == "object" for c in prompt.clauses)
    groups: dict[tuple[int, str], list[float]] = {}
    object_index = 0
    for clause, credit in zip(prompt.clauses, credits):
        if clause["type"] == "object":
            i, object_index = object_index, object_index + 1
        else:
            i = clause["object"]
        groups.setdefault((i, "motion" if clause["type"] in MOTION else "appearance"), []).append(credit)
    total = 0.0
    for i in range(num_objects):
        appearance = groups.get((i, "appearance"), [])
        motion = groups.get((i, "motion"), [])
        weights = (1.0 if appearance else 0.0, MOTION_WEIGHT if motion else 0.0)
        value = weights[0] * _mean(appearance) + weights[1] * _mean(motion)
        total += value / sum(weights)
    return total / num_objects


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class ToyVideoScorer(Reward):
    """GenEval-style verifiable reward for the toy video world; see the module docstring."""

    name = "toy_video"
    modality = "video"

    def score_uint8(self, videos: torch.Tensor, prompts: list[str], metadata: list[dict] | None) -> RewardOutput:
        batch, num_frames, _, height, width = videos.shape
        if num_frames < 3:
            raise ValueError(f"toy_video: clips need at least 3 frames to show motion, got {num_frames}")
        parsed = [self._prompt(text, None if metadata is None else metadata[i]) for i, text in enumerate(prompts)]
        area_scale = height * width / FRAME_SIZE**2
        detections = [
            [d for d in frame if MIN_AREA * area_scale <= d["area"] <= MAX_AREA * area_scale]
            for frame in detect_objects(videos.reshape(batch * num_frames, 3, height, width))
        ]
        scale = width / FRAME_SIZE
        credits, motions = [], []
        for b, prompt in enumerate(parsed):
            clause_credits, motion = score_clauses(prompt, detections[b * num_frames:(b + 1) * num_frames], scale)
            credits.append(clause_credits)
            motions.append(motion)  # per named object: frames tracked, along/across speed, steady fraction
        return clause_output(parsed, credits, [combine(p, c) for p, c in zip(parsed, credits)], motion=motions,
                             num_detected=[sum(len(d) for d in detections[b * num_frames:(b + 1) * num_frames])
                                           / num_frames for b in range(batch)])  # mean detections per frame

    @staticmethod
    def _prompt(text: str, meta: dict | None) -> ToyVideoPrompt:
        return resolve_prompt(text, meta, ToyVideoPrompt, _parse_cached, "toy_video")
