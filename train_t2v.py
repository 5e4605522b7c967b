"""Text-to-video GRPO: ``accelerate launch train_t2v.py [--preset NAME] [--model NAME] [key=value ...]``.

The same loop as train_t2i.py on a video model, with video rewards. With no arguments it trains the
embedded video default (configs/default_t2v.yaml: the tiny Wan2.1 built by ``flowgrpo
pretrain-toy-video`` on the toy video world, rewarded by ``toy_video``, on CPU). ``--preset`` picks a
method (configs/presets/, as for images), ``--model`` a model config (configs/models/: tiny_wan,
wan2_1_t2v_1_3b, wan2_1_t2v_14b), and ``key=value`` overrides any field (e.g.
``train.iterations=10 sampling.plan.group_size=4``); see flowgrpo/config.py. Samples are written as
MP4s with a poster PNG each in runs/<name>/samples/step_<n>/.
"""

import argparse
import sys

from flowgrpo.config import ConfigError, load_config
from flowgrpo.paths import resolve_pretrained
from flowgrpo.trainer import train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", help="a method preset name in configs/presets or a YAML file")
    parser.add_argument("--model", help="a model config name in configs/models or a YAML file")
    parser.add_argument("--config", help="a full config YAML merged before the preset")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.preset, args.model, args.overrides, base=args.config, default="default_t2v")
    except ConfigError as exc:
        print(f"train_t2v.py: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        resolve_pretrained(cfg.model.pretrained)  # a missing built-in (tiny-wan) names the command that builds it
    except FileNotFoundError as exc:
        print(f"train_t2v.py: {exc}", file=sys.stderr)
        return 2
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
