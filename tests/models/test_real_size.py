"""The real-size code path on a CPU: each real architecture (SD3.5-Medium and -Large, FLUX.1-dev, FLUX.2-dev and -klein-4B,
Z-Image-Turbo, Qwen-Image, Wan2.1-1.3B, Wan2.2-A14B's two experts) at its real
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
VIDEO = {"model.resolution": 32, "model.width": 32, "model.num_frames": 5}
SIZES = {"sd3_5_medium": {"model.resolution": 64}, "sd3_5_large": {"model.resolution": 64}, "flux_dev": {"model.resolution": 64},
         "flux2_klein_4b": {"model.resolution": 64}, "z_image_turbo": {"model.resolution": 64},
         "qwen_image": {"model.resolution": 64}, "flux2_dev": {"model.resolution": 64, "model.max_sequence_length": 48},
         "wan2_1_t2v_1_3b": VIDEO, "wan2_2_t2v_a14b": VIDEO}
# model -> (the residual width, transformer blocks at depth 1: one of each kind; Z-Image's two refiners and main
# layers are one class; Wan2.2 A14B: one block in each of its two experts)
WIDTHS = {"sd3_5_medium": (1536, 1), "sd3_5_large": (2432, 1), "flux_dev": (3072, 2), "flux2_klein_4b": (3072, 2),
          "z_image_turbo": (3840, 3), "qwen_image": (3072, 1),
          "flux2_dev": (6144, 2), "wan2_1_t2v_1_3b": (1536, 1), "wan2_2_t2v_a14b": (5120, 2)}


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
    width, count = WIDTHS[model]
    experts = list(trainer.model.experts.values())
    blocks = [m for e in experts for m in e.modules() if type(m).__name__ in e._no_split_modules]
    assert len(blocks) == count  # one block of each kind
    assert any(p.shape[-1] == width for p in trainer.model.transformer.parameters())  # the real width
    for expert in experts:
        lora = [n for n, _ in expert.named_parameters() if "lora_" in n]
        assert lora, "the config's LoRA targets name modules of the real architecture"
    before = [p.detach().clone() for p in trainer.policy.params]
    metrics = trainer.train()
    assert math.isfinite(metrics["loss"]) and metrics["trained_samples"] == 2
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.policy.params))
    run = Path(cfg.run_dir)
    assert (run / "checkpoints" / "step_1" / "model").is_dir()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["trained_samples"] == 2
