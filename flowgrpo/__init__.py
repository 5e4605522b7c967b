"""flowgrpo: reinforcement-learning fine-tuning of flow-matching text-to-image and text-to-video models.

Every published method is a rollout plan (``samplers``) plus a credit-assignment rule and a learner, run
by one engine (``flowgrpo.engine``); rewards are plug-ins (``rewards``); the toy and analytic worlds the
CPU runs on are ``worlds``. The packages of flowgrpo, by role (docs/design.md):

    flowgrpo.engine      the training loop, the policy and its copies of the weights, credit, learners, loss
    flowgrpo.likelihood  the per-transition likelihood terms: PyTorch reference and the fused C++/CUDA op
    flowgrpo.models      model adapters (SD3, FLUX, FLUX.2, Qwen-Image, Z-Image, Wan, the analytic world), their
                         family records (families.py) and model configs
    flowgrpo.memory      the memory planner (``flowgrpo plan``) and the trainer's check before the first rollout
    flowgrpo.config      the configuration: schema (each key with its rule), layers, checks
    flowgrpo.run         run bookkeeping: run folder, checkpoints, interrupts, threads, errors, paths, call timing
    flowgrpo.tiny        the tiny world's models: builders, pretraining, the shipped assets
    flowgrpo.cli         the command lines: the training scripts' parser and the ``flowgrpo`` command
    flowgrpo.data, flowgrpo.evaluate   prompt sets, sampling and scoring
"""

import os as _os

import flowgrpo_torchvision_compat as _tv_compat

# Ratio == 1 at inner epoch 0 (docs/design.md, contract 1) needs a matrix product whose rows do not depend on how many
# rows share the call: the rollout runs a step's whole level through the network, the learner the same states in its
# own micro-batches. MKL's CPU sgemm takes another kernel below 5 rows on AVX-512/AMX processors (a row of a 1-4-row
# product differs in its last bit from the same row in a larger one); its strict reproducibility mode computes every
# row alike on any processor, at no measured cost. MKL reads the variable at its first call: set before any product.
_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

# The .pth hook covers every interpreter of the environment; this covers running from a source tree
# on PYTHONPATH without an install (the hook is idempotent and costs nothing until torchvision loads).
_tv_compat.register_import_hook()

__version__ = "0.1.0"
