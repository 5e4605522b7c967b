"""The toy worlds' verifiable scorers: ``ToyScorer`` (reward "toy", images), ``ToyDense`` ("toy_dense", its
dense training variant), ``ToyVideoScorer`` ("toy_video", videos) and ``ToyEditScorer`` ("toy_edit", edits
judged against their source image). The worlds themselves (renderers, prompt grammars, splits) are worlds/toy/;
see docs/toy_world.md.
"""

from rewards.toy.dense import ToyDense
from rewards.toy.edit_scorer import ToyEditScorer
from rewards.toy.scorer import ToyScorer, detect_objects, summarize
from rewards.toy.video_scorer import ToyVideoScorer

__all__ = ["ToyDense", "ToyEditScorer", "ToyScorer", "ToyVideoScorer", "detect_objects", "summarize"]
