"""Text-to-image GRPO: ``accelerate launch train_t2i.py [--preset NAME] [--model NAME] [key=value ...]``.

With no arguments it trains the embedded default (configs/default.yaml: the shipped tiny SD3 on the
toy world, on CPU). ``--preset`` picks a method (configs/presets/: flow_grpo, dancegrpo, mixgrpo,
mixgrpo_flash, branchgrpo, branchgrpo_mix, tempflow, grpo_guard, sage, flow_grpo_fast),
``--model`` a model config (configs/models/), and ``key=value`` overrides any field
(e.g. ``train.iterations=100 sampling.plan.group_size=12``); see flowgrpo/config.py.
"""

import argparse
import sys

from flowgrpo.config import ConfigError, load_config
from flowgrpo.trainer import train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", help="a method preset name in configs/presets or a YAML file")
    parser.add_argument("--model", help="a model config name in configs/models or a YAML file")
    parser.add_argument("--config", help="a full config YAML merged before the preset")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.preset, args.model, args.overrides, base=args.config)
    except ConfigError as exc:
        print(f"train_t2i.py: configuration error: {exc}", file=sys.stderr)
        return 2
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
