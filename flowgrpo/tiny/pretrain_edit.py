"""Pretrain the embedded tiny edit model, a FLUX.1-Kontext, on the toy editing world: ``flowgrpo pretrain-toy-edit``.

The stages of the pretraining scaffold (flowgrpo/tiny/pretrain.py, each resumable from ``--work-dir``) with an
edit's two images: the VAE is the shipped tiny SD3's (the same ``AutoencoderKL`` class FLUX uses, trained on the
same toy scenes, with its shift and scaling factors), so the VAE stage has nothing to do; a task-balanced set of
edits drawn fresh from the training instructions (``worlds.toy.edits.draw_train_edits``: new source scenes, never a
held-out combination) is rendered, sources and targets encoded once; the ``FluxTransformer2DModel`` and both text
encoders learn rectified flow matching of the target given the instruction and the source (the source's tokens
after the latent's, as ``FluxKontextPipeline`` runs them: ``flowgrpo.models.flux.kontext_call``), instructions
dropped 10% of the time so classifier-free guidance works (the source stays: the unconditional pass of an edit sees
it); the EMA is evaluated on the held-out edits (``toy-edit-eval``, reward ``toy_edit``) until it reaches
``target_score``, an editor that edits partly right.

The result is a ``FluxKontextPipeline`` folder (``save_pretrained``) that loads with
``FluxKontextPipeline.from_pretrained`` and, as ``pretrained: tiny-kontext``, with ``configs/models/tiny_kontext.yaml``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flowgrpo.run.paths import resolve_pretrained
from flowgrpo.tiny.builders import TinyKontextSizes, build_clip_tokenizer, build_tiny_kontext_pipeline
from flowgrpo.tiny.pretrain import TEXT_TOKENS, PretrainSettings, ToyWorld, pretrain, snapshot_model
from worlds.toy import edits


@dataclass
class PretrainEditConfig(PretrainSettings):
    """The tiny FLUX.1-Kontext on the toy edits."""

    output_dir: str = "flowgrpo/tiny/assets/tiny-kontext"
    work_dir: str = "runs/pretrain-toy-edit"
    vae_steps: int = 0  # the tiny SD3's VAE, already trained on these scenes
    dataset_size: int = 16000  # fresh edits (source, target) drawn from the training instructions
    flow_steps: int = 4000
    flow_batch: int = 64
    eval_every: int = 500
    eval_steps: int = 20
    eval_guidance: float = 2.0
    target_score: float = 0.40
    sizes: TinyKontextSizes = field(default_factory=TinyKontextSizes)


def _pixels(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div(255.0)


def _normalise_kontext(pipe, raw: torch.Tensor) -> torch.Tensor:
    """The VAE's own shift and scaling factors (the tiny SD3's, measured on the toy scenes): FLUX's normalisation."""
    return (raw - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor


def _kontext_predict(pipe, xt: torch.Tensor, sigma: torch.Tensor, captions: list[str], sources: torch.Tensor) -> torch.Tensor:
    """The Kontext transformer's velocity for noisy latents xt at sigma given the sources' latents, with gradients
    into both text encoders; no guidance input (the tiny model runs true CFG)."""
    from flowgrpo.models.flux import kontext_call

    embeds, pooled, text_ids = pipe.encode_prompt(captions, None, max_sequence_length=TEXT_TOKENS)
    return kontext_call(pipe.transformer, xt, sources, sigma, None, pooled, embeds, text_ids, pipe.vae_scale_factor)


def evaluate_snapshot(folder: Path, cfg: PretrainEditConfig, per_task: int = 0) -> dict:
    """Score a saved pipeline folder on the held-out edits (``toy-edit-eval``; ``per_task``: the first that many of
    each task) as ``flowgrpo eval`` does."""
    from flowgrpo.data import read_prompts
    from flowgrpo.evaluate import evaluate

    prompts, metadata = read_prompts("toy-edit-eval")
    if per_task:
        keep = [i for i, m in enumerate(metadata) if sum(n["task"] == m["task"] for n in metadata[:i]) < per_task]
        prompts, metadata = [prompts[i] for i in keep], [metadata[i] for i in keep]
    summary, _, _ = evaluate(snapshot_model(folder, "flux_kontext", cfg), prompts, "toy_edit", metadata, seed=cfg.seed,
                             progress=False)
    return summary


def pretrain_toy_edit(cfg: PretrainEditConfig) -> dict:
    """Run (or resume) every stage on the toy edits and write the tiny Kontext pipeline to ``cfg.output_dir``."""
    from diffusers import AutoencoderKL

    corpus = [p.text for p in edits.train_edits() + edits.eval_edits()] + [
        edits.instruction(f) for task in edits.EDIT_TASKS for f in edits.all_instructions(task)]
    vae = AutoencoderKL.from_pretrained(Path(resolve_pretrained("tiny-sd3")) / "vae")
    pipe = build_tiny_kontext_pipeline(build_clip_tokenizer(corpus, max_length=TEXT_TOKENS), cfg.sizes, seed=cfg.seed,
                                       vae=vae)
    size = cfg.sizes.image_size
    drawn = edits.draw_train_edits(random.Random(cfg.seed), cfg.dataset_size)
    return pretrain(cfg, ToyWorld(
        pipe=pipe, train_prompts=drawn, dataset=drawn, sample_pixels=None, normalise=_normalise_kontext,
        render=lambda items, seeds: _pixels([edits.render_target(p, size) for p in items]),
        predict=_kontext_predict, evaluate=evaluate_snapshot,
        modules={"transformer": pipe.transformer, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2},
        render_condition=lambda items: _pixels([edits.render_source(p, size) for p in items]),
    ))
