"""The toy image world (renderer, prompt grammar, fixed splits) and its verifiable scorer; the toy
video world (``rewards.toy.video_world``) and its scorer (``ToyVideoScorer``, reward "toy_video").

See docs/toy_world.md.
"""

from rewards.toy.world import (
    BACKGROUND,
    COLORS,
    IMAGE_SIZE,
    RELATIONS,
    SHAPES,
    TASKS,
    Scene,
    ToyObject,
    ToyPrompt,
    eval_prompts,
    make_prompt,
    parse_prompt,
    render,
    render_prompt,
    scene_for_prompt,
    train_prompts,
)
from rewards.toy.scorer import ToyScorer, detect_objects, summarize
from rewards.toy import video_world
from rewards.toy.video_scorer import ToyVideoScorer

__all__ = [
    "BACKGROUND",
    "COLORS",
    "IMAGE_SIZE",
    "RELATIONS",
    "SHAPES",
    "TASKS",
    "Scene",
    "ToyObject",
    "ToyPrompt",
    "ToyScorer",
    "ToyVideoScorer",
    "detect_objects",
    "eval_prompts",
    "make_prompt",
    "parse_prompt",
    "render",
    "render_prompt",
    "scene_for_prompt",
    "summarize",
    "train_prompts",
    "video_world",
]
