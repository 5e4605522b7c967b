"""A tiny random SD3 and a tiny random Wan of the real classes, saved once per test session, for training tests,
and the end-to-end contract every training test checks."""

import json
import math
from pathlib import Path

import torch

from flowgrpo.tiny import (
    TinySD3Sizes, TinyWanSizes, build_clip_tokenizer, build_t5_tokenizer, build_tiny_sd3_pipeline, build_tiny_wan_pipeline,
)
from worlds.toy import clips, scenes

TRAIN_SIZES = TinySD3Sizes(vae_channels=(16, 16, 16), text_width=32, text_layers=2, num_layers=1, num_heads=2, head_dim=16)
# 5 frames of 32x32 (tests override tiny_wan.yaml's 9: half the VAE work) -> latents 8 x 2 x 8 x 8; one small block
WAN_TRAIN_SIZES = TinyWanSizes(num_frames=5, vae_base_dim=8, latent_channels=8, text_width=32, num_layers=1, num_heads=2, head_dim=12,
                               ffn_dim=32, freq_dim=32)


def save_tiny_sd3(folder) -> str:
    corpus = [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]
    build_tiny_sd3_pipeline(build_clip_tokenizer(corpus, 16), TRAIN_SIZES, seed=0).save_pretrained(folder)
    return str(folder)


def save_tiny_wan(folder) -> str:
    corpus = [p.text for p in clips.train_prompts() + clips.eval_prompts()]
    build_tiny_wan_pipeline(build_t5_tokenizer(corpus, 16), WAN_TRAIN_SIZES, seed=0).save_pretrained(folder)
    return str(folder)


def save_tiny_wan22(folder) -> str:
    """The training tests' tiny Wan in Wan2.2 A14B's layout: two experts, switched at timestep 875."""
    corpus = [p.text for p in clips.train_prompts() + clips.eval_prompts()]
    build_tiny_wan_pipeline(build_t5_tokenizer(corpus, 16), WAN_TRAIN_SIZES, seed=0, boundary_ratio=0.875).save_pretrained(folder)
    return str(folder)


def overrides(model_dir: str, out_dir, **extra) -> list[str]:
    """Small, fast settings: 2 prompts x group 2, 2 iterations, tiny eval."""
    base = {
        "model.pretrained": model_dir, "model.lora_rank": 4, "model.lora_alpha": 4.0, "output_dir": str(out_dir),
        "train.iterations": 2, "train.prompts_per_iteration": 2, "train.cpu": True, "eval.limit": 4,
        "eval.steps": 2, "eval.every": 0, "eval.reward": "toy", "eval.at_start": False, "log.samples_every": 1, "log.save_every": 1,
        "log.progress": False, "log.tensorboard": False, "train.learning_rate": 1e-2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


from rewards.base import Reward, RewardOutput  # noqa: E402


class Brightness(Reward):
    """Mean pixel value: a reward that varies on any image, loaded by dotted path as a plug-in."""

    name = "brightness"

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(images.float().mean(dim=(1, 2, 3)) / 255.0)


PLUGIN_REWARD = {"rewards": [{"name": "train_fixtures:Brightness"}]}


def blank_reader():
    """An OCR engine for the OCR reward's `reader=train_fixtures:blank_reader` that reads no text in any image (the
    OCR protocol's wiring on a machine without PaddleOCR)."""
    return lambda image: ""


class VideoBrightness(Reward):
    """Mean pixel value of a video [B, F, 3, H, W]: varies on any clip, unlike toy_video on a random model."""

    name = "video_brightness"
    modality = "video"

    def score_uint8(self, videos, prompts, metadata):
        return RewardOutput(videos.float().mean(dim=(1, 2, 3, 4)) / 255.0)


VIDEO_PLUGIN_REWARD = {"rewards": [{"name": "train_fixtures:VideoBrightness"}]}


class BrokenShape(Reward):
    """Returns one score too many: the trainer must mask the batch and log it."""

    name = "broken_shape"

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(torch.zeros(len(prompts) + 1))


class AlwaysNaN(Reward):
    """Not applicable to anything: NaN scores are never trained on."""

    name = "always_nan"

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(torch.full((len(prompts),), float("nan")))


def train_and_check(cfg, gallery: bool = False):
    """Train ``cfg``'s two-iteration run and check the end-to-end contract: two logged updates, each with a
    finite, bounded loss and something trained (transitions, or clean samples for a forward-process
    learner); the learner's contract at inner epoch 0 — ρ = 1 exactly (the transition learner, AWM), or
    v⁺ = v_old in the first iteration, where θ_old = θ (DiffusionNFT); some trainable parameter changed.
    With ``gallery`` the entry point's end of a run follows: the review site (gallery/) is built (the tests of
    the gallery itself are tests/gallery/). Returns the trainer, the run directory and its metrics.jsonl rows."""
    from flowgrpo.cli.train import build_gallery
    from flowgrpo.engine.trainer import Trainer

    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.policy.params]
    trainer.train()
    if gallery:
        build_gallery(cfg)
    run = Path(cfg.run_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "loss" in r]
    assert [r["iteration"] for r in updates] == [1, 2]
    for r in updates:
        assert r["loss"] is not None and math.isfinite(r["loss"]) and abs(r["loss"]) < 1e3
        assert r.get("trained_transitions", 0) > 0 or r.get("trained_samples", 0) > 0
        if cfg.learner.name in ("transition", "awm"):
            assert r["max_abs_ratio_minus_1_epoch0"] < 1e-6, r["max_abs_ratio_minus_1_epoch0"]
    if cfg.learner.name == "diffusion_nft":
        assert updates[0]["max_abs_vplus_minus_vold_epoch0"] == 0.0
    if cfg.learner.name == "crd":  # θ_old = θ at the run's first step: the implicit reward is exactly 0
        assert updates[0]["max_abs_implicit_reward_epoch0"] == 0.0
    assert sum(not torch.equal(a, b) for a, b in zip(before, trainer.policy.params)) > 0, "no trainable parameter changed"
    return trainer, run, rows


# ------------------------------------------------------------------------------------------ shared by the engine tests
# preset -> overrides that keep it small on the tiny models but keep its structure (tests/engine/test_train_presets.py
# checks every preset file is here)
TINY_PRESETS = {
    "flow_grpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4},
    "flow_grpo_fast": {"sampling.plan.group_size": 2},
    "dancegrpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 6},
    "mixgrpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 8, "sampling.window.interval": 1},
    "mixgrpo_flash": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 8, "sampling.window.interval": 1},
    "mixgrpo_flash_star": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 8},
    "branchgrpo": {"sampling.plan.num_steps": 8, "sampling.plan.splits": "[0,3]"},
    "branchgrpo_mix": {"sampling.plan.num_steps": 8, "sampling.plan.splits": "[0,3]", "sampling.window.interval": 1},
    "tempflow": {"sampling.plan.num_steps": 4, "sampling.plan.side_steps": "[0,1,2]", "sampling.plan.side_children": 2},
    "grpo_guard": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4},
    "sage": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "loss.anchor_refresh": 1},
    "diffusion_nft": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2},
    "awm": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2},
    "dgpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2, "learner.time_min": 0.5},
    "flow_dppo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 8, "sampling.window.size": 2,
                  "train.updates_per_epoch": 2},
    "treegrpo": {"sampling.plan.num_steps": 6, "sampling.plan.branch_factor": 2, "sampling.window.size": 2,
                 "sampling.window.high": 3},
    "vgrpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2},
    "crd": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2},
    "g2rpo": {"sampling.plan.num_steps": 4, "sampling.plan.side_steps": "[0,1]", "sampling.plan.side_children": 2},
    "op_grpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4},
    "egrpo": {"sampling.plan.num_steps": 6, "sampling.plan.side_steps": "[1,2]", "sampling.plan.side_merge": "[2,1]",
              "sampling.plan.side_children": 2},
}


def analytic_trainer(tmp_path, preset, *extra):
    """A trainer of ``preset`` on the analytic world (configs/analytic.yaml) with ``extra`` overrides."""
    from flowgrpo.config import load_config
    from flowgrpo.run.paths import configs_dir
    from flowgrpo.engine.trainer import Trainer

    return Trainer(load_config(preset, None, [f"output_dir={tmp_path}", "log.progress=false", *extra],
                               base=str(configs_dir() / "analytic.yaml")))


COMMON = ["resume=false", "log.progress=false", "log.gallery=false", "log.samples_every=0", "eval.every=0",
          "eval.at_start=false", "log.save_every=0"]


def trainer_for(tmp_path, preset, *overrides):
    """An analytic-world trainer (analytic_trainer), quiet, not resuming unless told."""
    return analytic_trainer(tmp_path, preset, *COMMON, *overrides)


def analytic_rollout(tmp_path, preset, *overrides):
    """An analytic-world trainer and its first iteration's rollout: (trainer, plan, batches, records on the host)."""
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from flowgrpo.run.paths import configs_dir

    cfg = load_config(preset, None, [f"output_dir={tmp_path}", "resume=false", "log.progress=false",
                                     "log.gallery=false", "log.samples_every=0", "eval.at_start=false", *overrides],
                      base=str(configs_dir() / "analytic.yaml"))
    trainer = Trainer(cfg)
    plan = trainer.schedule.plan(0)
    batches = trainer.sample(0, plan)
    for b in batches:  # the analytic reward's own futures are not needed: the tests hand the rewards in
        for f in b.rewards:
            f.result()
    records = [b.record.bookkeeping_on_cpu() for b in batches]
    return trainer, plan, batches, records
