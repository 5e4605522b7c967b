"""Text-to-video GRPO: ``accelerate launch train_t2v.py [--preset NAME] [--model NAME] [key=value ...]``.

The same loop as train_t2i.py on a video model, with video rewards. With no arguments it trains the
embedded video default (configs/default_t2v.yaml: the tiny Wan2.1 built by ``flowgrpo
pretrain-toy-video`` on the toy video world, rewarded by ``toy_video``, on CPU). ``--preset`` picks a
method (configs/presets/, as for images), ``--model`` a model config (configs/models/: tiny_wan,
wan2_1_t2v_1_3b, wan2_1_t2v_14b), and ``key=value`` overrides any field (e.g.
``train.iterations=10 sampling.plan.group_size=4``); see flowgrpo/config/schema.py. Samples are written as
MP4s with a poster PNG each in runs/<name>/samples/step_<n>/.
"""

import sys

from flowgrpo.cli.train import main as launch


def main(argv=None) -> int:
    return launch(argv, prog="train_t2v.py", description=__doc__.split("\n\n")[0], default="default_t2v")


if __name__ == "__main__":
    sys.exit(main())
