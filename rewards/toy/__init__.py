"""The toy worlds' verifiable scorers: ``ToyScorer`` (reward "toy", images), ``ToyDense`` ("toy_dense", its
dense training variant) and ``ToyVideoScorer`` ("toy_video", videos). The worlds themselves (renderers,
prompt grammars, splits) are worlds/toy/; see docs/toy_world.md.
"""

from rewards.toy.dense import ToyDense
from rewards.toy.scorer import ToyScorer, detect_objects, summarize
from rewards.toy.video_scorer import ToyVideoScorer

__all__ = ["ToyDense", "ToyScorer", "ToyVideoScorer", "detect_objects", "summarize"]
