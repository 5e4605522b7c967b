"""Pretrain the embedded tiny Wan2.1 on the toy video world: ``flowgrpo pretrain-toy-video``.

The stages of ``flowgrpo/tiny/pretrain.py`` (each resumable from ``--work-dir``), on 9-frame 32x32 clips:
  1. VAE      an ``AutoencoderKLWan`` (4x in time, 4x in space) learns to reconstruct rendered
              train clips (L1 + tiny KL), ``pretrain.train_vae``.
  2. DATA     a fixed, task-balanced set of clips is rendered and encoded once; the per-channel
              latent mean/std become the VAE's ``latents_mean``/``latents_std``, the normalisation
              ``WanPipeline`` undoes before decoding.
  3. FLOW     rectified flow matching of the ``WanTransformer3DModel`` and the UMT5 text encoder,
              ``pretrain.train_flow`` (captions dropped 10% of the time for CFG; EMA weights ship).
  4. SHIP     every ``eval_every`` steps the EMA pipeline is saved and scored on the held-out video
              eval prompts with the ``toy_video`` reward; training stops at the first evaluation
              whose mean reaches ``target_score`` (the middle band 0.3-0.7 leaves room for RL).

The result is a ``WanPipeline`` folder (``save_pretrained``) that loads with
``WanPipeline.from_pretrained`` and, as ``pretrained: tiny-wan``, with ``configs/models/tiny_wan.yaml``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flowgrpo.tiny.pretrain import (
    TEXT_TOKENS, encode_dataset, open_work_dir, save_pipeline_from_snapshot, train_flow, train_vae,
)
from flowgrpo.tiny import TinyWanSizes, build_t5_tokenizer, build_tiny_wan_pipeline
from worlds.toy import clips


@dataclass
class PretrainVideoConfig:
    output_dir: str = "flowgrpo/tiny/assets/tiny-wan"  # where the finished pipeline is saved
    work_dir: str = "runs/pretrain-toy-video"  # checkpoints, cached data and evaluation snapshots
    seed: int = 0
    threads: int = 0  # torch CPU threads; 0 = all cores
    # stage 1: VAE (measured: 0.9 s a step of 8 clips on one thread)
    vae_steps: int = 1500
    vae_batch: int = 8  # clips (72 frames)
    vae_lr: float = 1e-3
    vae_kl_weight: float = 1e-6
    # stage 2: data
    dataset_size: int = 12000  # rendered (prompt, clip) pairs, task-balanced over the train prompts
    # stage 3: flow matching (measured: 0.41 s a step of 32 on one thread; the shipped model stopped
    # at step 5,000 with a held-out score of 0.452)
    flow_steps: int = 6000
    flow_batch: int = 32
    flow_lr: float = 3e-4
    flow_warmup: int = 200
    caption_dropout: float = 0.1  # fraction of captions replaced by "" (for CFG)
    ema_decay: float = 0.999
    checkpoint_every: int = 250
    # stage 4: evaluation and stopping
    eval_every: int = 500
    eval_steps: int = 20  # ODE steps (tiny_wan.yaml's sample_steps)
    eval_guidance: float = 3.0  # tiny_wan.yaml's guidance_scale
    target_score: float = 0.40  # stop once the held-out toy video score reaches this (band 0.3-0.7)
    sizes: TinyWanSizes = field(default_factory=TinyWanSizes)


def _balanced_prompts(n: int, seed: int) -> list[clips.ToyVideoPrompt]:
    """n train prompts, tasks drawn uniformly, prompts uniformly within a task."""
    by_task: dict[str, list] = {}
    for p in clips.train_prompts():
        by_task.setdefault(p.task, []).append(p)
    rng = random.Random(seed)
    tasks = sorted(by_task)
    return [rng.choice(by_task[rng.choice(tasks)]) for _ in range(n)]


def _render(prompts, seeds, sizes: TinyWanSizes) -> torch.Tensor:
    """Clips as the VAE takes them: float [B, 3, F, H, W] in [0, 1]."""
    rendered = [clips.render_prompt(p, s, sizes.num_frames, sizes.image_size) for p, s in zip(prompts, seeds)]
    return clips.clips_to_tensor(rendered).permute(0, 2, 1, 3, 4)


def _vae_batch(sizes: TinyWanSizes):
    train = clips.train_prompts()

    def sample(rng: random.Random, n: int) -> torch.Tensor:
        prompts = [rng.choice(train) for _ in range(n)]
        return _render(prompts, [rng.randrange(2**31) for _ in range(n)], sizes)

    return sample


def build_dataset(pipe, cfg: PretrainVideoConfig, work: Path) -> tuple[torch.Tensor, list[str]]:
    """Render and encode the flow-matching clips once (VAE means [N, C, f, h, w]); cached in the work dir."""
    prompts = _balanced_prompts(cfg.dataset_size, cfg.seed)
    latents = encode_dataset(pipe.vae, prompts, lambda chunk, seeds: _render(chunk, seeds, cfg.sizes),
                             cfg.seed, work, batch=64)
    return latents, [p.text for p in prompts]


def _wan_predict(pipe, xt: torch.Tensor, sigma: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """The Wan transformer's velocity for noisy latents xt at sigma, with gradients into UMT5."""
    embeds, _ = pipe.encode_prompt(
        captions, do_classifier_free_guidance=False, max_sequence_length=pipe.tokenizer.model_max_length
    )
    return pipe.transformer(hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=embeds).sample


def evaluate_snapshot(folder: Path, cfg: PretrainVideoConfig) -> dict:
    """Score a saved pipeline folder on the held-out video eval prompts, as ``flowgrpo eval`` would."""
    from flowgrpo.evaluate import evaluate
    from flowgrpo.models import load_model

    model = load_model(
        {
            "family": "wan",
            "pretrained": str(folder),
            "device": "cpu",
            "resolution": cfg.sizes.image_size,
            "num_frames": cfg.sizes.num_frames,
            "guidance_scale": cfg.eval_guidance,
            "sample_steps": cfg.eval_steps,
            "max_sequence_length": TEXT_TOKENS,
            "finetune": "full",
            "reference": "none",
        }
    )
    prompts = clips.eval_prompts()
    summary, _, _ = evaluate(model, [p.text for p in prompts], "toy_video", [p.to_dict() for p in prompts],
                             seed=cfg.seed, progress=False)
    return summary


def pretrain_toy_video(cfg: PretrainVideoConfig) -> dict:
    """Run (or resume) all stages and write the pipeline to ``cfg.output_dir``."""
    started, work = time.time(), open_work_dir(cfg)
    corpus = [p.text for p in clips.train_prompts() + clips.eval_prompts()]
    pipe = build_tiny_wan_pipeline(build_t5_tokenizer(corpus, max_length=TEXT_TOKENS), cfg.sizes, seed=cfg.seed)
    train_vae(pipe, cfg, work, _vae_batch(cfg.sizes))
    pipe.vae.requires_grad_(False)
    raw, texts = build_dataset(pipe, cfg, work)
    channels = [0] + list(range(2, raw.ndim))
    mean, std = raw.mean(dim=channels), raw.std(dim=channels)  # per latent channel
    pipe.vae.register_to_config(latents_mean=mean.tolist(), latents_std=std.tolist())
    latents = (raw - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)
    modules = {"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}
    final = train_flow(pipe, cfg, work, latents, texts, modules, _wan_predict, evaluate_snapshot)
    save_pipeline_from_snapshot(work / "snapshot", Path(cfg.output_dir))
    report = {"eval": final, "minutes": round((time.time() - started) / 60, 1), "output_dir": cfg.output_dir}
    (work / "report.json").write_text(json.dumps(report, indent=2))
    return report
