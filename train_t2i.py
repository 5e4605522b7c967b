"""Text-to-image GRPO: ``accelerate launch train_t2i.py [--preset NAME] [--model NAME] [key=value ...]``.

With no arguments it trains the embedded default (configs/default.yaml: DiffusionNFT on the shipped tiny
SD3 in the toy world, on CPU, about 15 minutes). ``--preset`` picks a method (configs/presets/: flow_grpo, dancegrpo, mixgrpo,
mixgrpo_flash, branchgrpo, branchgrpo_mix, tempflow, grpo_guard, sage, flow_grpo_fast, and the
forward-process learners diffusion_nft, awm, dgpo), ``--config configs/analytic.yaml`` the analytic world,
``--model`` a model config (configs/models/), and ``key=value`` overrides any field
(e.g. ``train.iterations=100 sampling.plan.group_size=12``); see flowgrpo/config/schema.py.
"""

import sys

from flowgrpo.cli.train import main as launch


def main(argv=None) -> int:
    return launch(argv, prog="train_t2i.py", description=__doc__.split("\n\n")[0], default="default")


if __name__ == "__main__":
    sys.exit(main())
