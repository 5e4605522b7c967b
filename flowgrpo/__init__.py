"""flowgrpo: GRPO fine-tuning of flow-matching text-to-image and text-to-video models.

Every published method (Flow-GRPO, DanceGRPO, MixGRPO, BranchGRPO, TempFlow-GRPO, SAGE-GRPO,
GRPO-Guard) is a rollout plan (``samplers``) plus a credit-assignment rule run by one engine; rewards
are plug-ins (``rewards``). See README.md and ../shared/DESIGN.md for the layering.
"""

import flowgrpo_torchvision_compat as _tv_compat

# The .pth hook covers every interpreter of the environment; this covers running from a source tree
# on PYTHONPATH without an install (the hook is idempotent and costs nothing until torchvision loads).
_tv_compat.register_import_hook()

__version__ = "0.1.0"
