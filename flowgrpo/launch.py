"""The command line of the training scripts (train_t2i.py, train_t2v.py): one parser, one config
path, clear errors. Each script only names its embedded default config."""

from __future__ import annotations

import argparse
import sys

from flowgrpo.config import ConfigError, load_config
from flowgrpo.paths import resolve_pretrained


def main(argv: list[str] | None, *, prog: str, description: str, default: str) -> int:
    """Parse ``[--preset NAME] [--model NAME] [--config YAML] [key=value ...]``, build the config on
    top of configs/<default>.yaml and train. Exit code 2 (and a message naming the fix) for a bad
    config or a missing model."""
    from flowgrpo.trainer import train

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--preset", help="a method preset name in configs/presets or a YAML file")
    parser.add_argument("--model", help="a model config name in configs/models or a YAML file")
    parser.add_argument("--config", help="a full config YAML merged before the preset")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.preset, args.model, args.overrides, base=args.config, default=default)
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        resolve_pretrained(cfg.model.pretrained)  # a missing built-in model names the command that builds it
    except FileNotFoundError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    train(cfg)
    return 0
