"""The real-size code path on a CPU: each real architecture (SD3.5-Medium and -Large, FLUX.1-dev, Wan2.1-1.3B) at its real
width and head count, one block of each kind and one text-encoder layer (``model.random_weights: true
model.depth: 1``: random weights, no download), trains one iteration of the default at a small resolution.
It proves the adapters, the LoRA target names, dtype handling and gradient checkpointing at real dimensions,
where the tiny models' widths could hide a mismatch."""

import json
import math
from pathlib import Path

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.engine.trainer import Trainer
from train_fixtures import PLUGIN_REWARD

SMALL = {  # a real model at one block per kind, a small picture, a short text and a short run
    "model.random_weights": True, "model.depth": 1, "model.dtype": "float32", "model.device": "cpu",
    "model.max_sequence_length": 16, "model.sample_steps": 2, "train.iterations": 1, "train.prompts_per_iteration": 1,
    "train.cpu": True, "sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "learner.train_times": 1,
    "eval.every": 0, "eval.at_start": False, "eval.limit": 1, "eval.steps": 1, "log.samples_every": 0,
    "log.save_every": 0, "log.progress": False, "log.tensorboard": False, "log.eval_samples": 0,
}
SIZES = {"sd3_5_medium": {"model.resolution": 64}, "sd3_5_large": {"model.resolution": 64}, "flux_dev": {"model.resolution": 64},
         "wan2_1_t2v_1_3b": {"model.resolution": 32, "model.width": 32, "model.num_frames": 5}}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(SIZES))
def test_real_architecture_trains_one_iteration(model, tmp_path):
    settings = {**SMALL, **SIZES[model], "output_dir": str(tmp_path)}
    if model.startswith("wan"):
        settings["eval.reward"] = "toy_video"
        reward = {"rewards": [{"name": "per_frame", "kwargs": {"reward": "train_fixtures:Brightness"}}]}
    else:
        reward = PLUGIN_REWARD
    cfg = load_config(None, model, [f"{k}={v}" for k, v in settings.items()], base=reward,
                      default="default_t2v" if model.startswith("wan") else "default")
    trainer = Trainer(cfg)
    width = {"sd3_5_medium": 1536, "sd3_5_large": 2432, "flux_dev": 3072, "wan2_1_t2v_1_3b": 1536}[model]
    blocks = [m for m in trainer.model.transformer.modules() if type(m).__name__ in trainer.model.transformer._no_split_modules]
    assert len(blocks) == (2 if model == "flux_dev" else 1)  # one block of each kind
    assert any(p.shape[-1] == width for p in trainer.model.transformer.parameters())  # the real width
    lora = [n for n, _ in trainer.model.transformer.named_parameters() if "lora_" in n]
    assert lora, "the config's LoRA targets name modules of the real architecture"
    before = [p.detach().clone() for p in trainer.policy.params]
    metrics = trainer.train()
    assert math.isfinite(metrics["loss"]) and metrics["trained_samples"] == 2
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.policy.params))
    run = Path(cfg.run_dir)
    assert (run / "checkpoints" / "step_1" / "model").is_dir()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["trained_samples"] == 2
