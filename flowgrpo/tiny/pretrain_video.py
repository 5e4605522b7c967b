"""Pretrain the embedded tiny Wan2.1 on the toy video world: ``flowgrpo pretrain-toy-video``.

The stages of the pretraining scaffold (flowgrpo/tiny/pretrain.py, each resumable from ``--work-dir``) on
9-frame 32x32 clips: an ``AutoencoderKLWan`` (4x in time, 4x in space) learns to reconstruct rendered
training clips; a task-balanced set of clips is encoded once and its per-channel latent mean/std become
the VAE's ``latents_mean``/``latents_std`` (the normalisation ``WanPipeline`` undoes before decoding);
the ``WanTransformer3DModel`` and the UMT5 text encoder learn rectified flow matching, their EMA
evaluated with the ``toy_video`` reward until the held-out score reaches ``target_score``.

The result is a ``WanPipeline`` folder (``save_pretrained``) that loads with
``WanPipeline.from_pretrained`` and, as ``pretrained: tiny-wan``, with ``configs/models/tiny_wan.yaml``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flowgrpo.tiny.builders import TinyWanSizes, build_t5_tokenizer, build_tiny_wan_pipeline
from flowgrpo.tiny.pretrain import TEXT_TOKENS, PretrainSettings, ToyWorld, pretrain, snapshot_model
from worlds.toy import clips


@dataclass
class PretrainVideoConfig(PretrainSettings):
    """The tiny Wan on the toy videos (measured on one thread: a VAE step of 8 clips 0.9 s, a flow step of 32
    clips 0.41 s; the shipped model stopped at step 5,000 with a held-out score of 0.452)."""

    output_dir: str = "flowgrpo/tiny/assets/tiny-wan"
    work_dir: str = "runs/pretrain-toy-video"
    vae_steps: int = 1500
    vae_batch: int = 8  # clips (72 frames)
    dataset_size: int = 12000
    flow_steps: int = 6000
    flow_batch: int = 32
    sizes: TinyWanSizes = field(default_factory=TinyWanSizes)


def _render(prompts, seeds, sizes: TinyWanSizes) -> torch.Tensor:
    """Clips as the VAE takes them: float [B, 3, F, H, W] in [0, 1]."""
    rendered = [clips.render_prompt(p, s, sizes.num_frames, sizes.image_size) for p, s in zip(prompts, seeds)]
    return clips.clips_to_tensor(rendered).permute(0, 2, 1, 3, 4)


def _clip_pixels(sizes: TinyWanSizes):
    """The VAE stage's batches: n training clips, the prompts drawn first, then their seeds."""
    train = clips.train_prompts()

    def sample(rng: random.Random, n: int) -> torch.Tensor:
        prompts = [rng.choice(train) for _ in range(n)]
        return _render(prompts, [rng.randrange(2**31) for _ in range(n)], sizes)

    return sample


def _normalise_wan(pipe, raw: torch.Tensor) -> torch.Tensor:
    """Wan's normalisation: a mean and std per latent channel, stored in the VAE's config."""
    channels = [0] + list(range(2, raw.ndim))
    mean, std = raw.mean(dim=channels), raw.std(dim=channels)
    pipe.vae.register_to_config(latents_mean=mean.tolist(), latents_std=std.tolist())
    return (raw - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)


def _wan_predict(pipe, xt: torch.Tensor, sigma: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """The Wan transformer's velocity for noisy latents xt at sigma, with gradients into UMT5."""
    embeds, _ = pipe.encode_prompt(
        captions, do_classifier_free_guidance=False, max_sequence_length=pipe.tokenizer.model_max_length
    )
    return pipe.transformer(hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=embeds).sample


def evaluate_snapshot(folder: Path, cfg: PretrainVideoConfig, prompts: list | None = None) -> dict:
    """Score a saved pipeline folder on the held-out video eval prompts (or ``prompts``, some of them), as
    ``flowgrpo eval`` would."""
    from flowgrpo.evaluate import evaluate

    prompts = clips.eval_prompts() if prompts is None else prompts
    model = snapshot_model(folder, "wan", cfg, num_frames=cfg.sizes.num_frames)
    summary, _, _ = evaluate(model, [p.text for p in prompts], "toy_video", [p.to_dict() for p in prompts],
                             seed=cfg.seed, progress=False)
    return summary


def pretrain_toy_video(cfg: PretrainVideoConfig) -> dict:
    """Run (or resume) every stage on the toy videos and write the tiny Wan pipeline to ``cfg.output_dir``."""
    corpus = [p.text for p in clips.train_prompts() + clips.eval_prompts()]
    pipe = build_tiny_wan_pipeline(build_t5_tokenizer(corpus, max_length=TEXT_TOKENS), cfg.sizes, seed=cfg.seed)
    return pretrain(cfg, ToyWorld(
        pipe=pipe, train_prompts=clips.train_prompts(), render=lambda prompts, seeds: _render(prompts, seeds, cfg.sizes),
        sample_pixels=_clip_pixels(cfg.sizes), normalise=_normalise_wan, predict=_wan_predict, evaluate=evaluate_snapshot,
        modules={"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}, encode_batch=64,
    ))
