"""The toy image world (renderer, prompt grammar, fixed splits) and its verifiable scorer.

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
    "detect_objects",
    "eval_prompts",
    "make_prompt",
    "parse_prompt",
    "render",
    "render_prompt",
    "scene_for_prompt",
    "summarize",
    "train_prompts",
]
