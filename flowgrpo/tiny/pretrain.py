"""Pretraining the tiny world's models: one scaffold of resumable stages, and the image world's use of it.

``flowgrpo pretrain-toy`` builds the embedded tiny SD3 on the toy images; ``flowgrpo pretrain-toy-video``
(pretrain_video.py) the tiny Wan on the toy videos. Both run the same stages (``pretrain``), each
resumable from ``--work-dir`` (rerunning the same command continues where it stopped):
  1. VAE      the VAE learns to reconstruct rendered training scenes or clips (L1 + tiny KL).
  2. DATA     a fixed, task-balanced set of scenes or clips is rendered from the training prompts and
              encoded once; the latents' statistics set the VAE's normalisation the pipeline undoes
              before decoding (SD3's shift/scaling factors, Wan's per-channel mean/std).
  3. FLOW     rectified-flow matching of the transformer and the text encoders, v ≈ noise − data at σ
              drawn on the sampling grid's density, captions dropped 10% of the time so classifier-free
              guidance works; an EMA of the weights (a WeightCopy, flowgrpo/models/copies.py) is what ships.
  4. SHIP     every ``eval_every`` steps the EMA pipeline is saved and scored on the held-out prompts with
              the world's scorer (ODE sampling, the model config's default steps); training stops at the
              first evaluation whose mean score reaches ``target_score``: the model is meant to be
              competent but imperfect, leaving headroom that reinforcement learning shows.

A world plugs in as a ``ToyWorld``: its pipeline, training prompts, renderer, latent normalisation, the
network's velocity with gradients into the text encoders, and the evaluation of a snapshot. Every random
draw is a pure function of (seed, stage, step), so a resumed run repeats the uninterrupted one. The
result is a pipeline folder written with ``save_pretrained`` that loads with the pipeline's
``from_pretrained`` (and, as ``pretrained: tiny-sd3`` / ``tiny-wan``, with the model configs).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from flowgrpo.models.copies import WeightCopy, warmed_decay
from flowgrpo.run.checkpoint import write_folder_atomically
from flowgrpo.run.errors import UserError
from flowgrpo.tiny.builders import TinySD3Sizes, build_clip_tokenizer, build_tiny_sd3_pipeline
from worlds.toy import scenes

TEXT_TOKENS = 16  # padded prompt length of every text encoder (toy prompts have <= 12 words)


@dataclass
class PretrainSettings:
    """The scaffold's settings, the same for every world; a world's config extends it with its model's
    sizes and its own defaults (PretrainConfig below, PretrainVideoConfig in pretrain_video.py)."""

    output_dir: str = ""  # where the finished pipeline is saved
    work_dir: str = ""  # checkpoints, cached data and evaluation snapshots
    seed: int = 0
    threads: int = 0  # torch CPU threads; 0 = all cores
    # stage 1: VAE
    vae_steps: int = 1200
    vae_batch: int = 32
    vae_lr: float = 1e-3
    vae_kl_weight: float = 1e-6  # times the KL summed over latent elements
    # stage 2: data
    dataset_size: int = 24000  # rendered (prompt, scene or clip) pairs, task-balanced over the training prompts
    # stage 3: flow matching
    flow_steps: int = 3000
    flow_batch: int = 64
    flow_lr: float = 3e-4
    flow_warmup: int = 200
    caption_dropout: float = 0.1  # fraction of captions replaced by "" (for CFG)
    ema_decay: float = 0.999
    checkpoint_every: int = 250
    # stage 4: evaluation and stopping
    eval_every: int = 500
    eval_steps: int = 20  # ODE steps (the shipped model config's sample_steps)
    eval_guidance: float = 3.0  # the shipped model config's guidance_scale
    target_score: float = 0.40  # stop early once the held-out score reaches this (band 0.3-0.7)


@dataclass
class PretrainConfig(PretrainSettings):
    """The tiny SD3 on the toy images: the shipped model is the EMA at step 3,000 (held-out 0.32); guidance 3
    was the best of {1.5, 3, 4.5, 7} on a step-2000 snapshot (0.30 against 0.24 at 4.5)."""

    output_dir: str = "flowgrpo/tiny/assets/tiny-sd3"
    work_dir: str = "runs/pretrain-toy"
    sizes: TinySD3Sizes = field(default_factory=TinySD3Sizes)


def _generator(seed: int, stage: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + stage * 10_007 + step) % (2**63))


class _State:
    """Checkpoint of one stage: module weights (safetensors), optimizer, EMA, step counter."""

    def __init__(self, folder: Path):
        self.folder = folder

    def exists(self) -> bool:
        return (self.folder / "meta.json").is_file()

    def save(self, modules: dict, optimizer, ema: WeightCopy | None, meta: dict) -> None:
        from safetensors.torch import save_file, save_model

        def build(tmp: Path) -> None:
            for name, module in modules.items():
                save_model(module, str(tmp / f"{name}.safetensors"))  # handles T5's tied embeddings
            if ema is not None:
                save_file({k: v.contiguous() for k, v in zip(_state_names(modules), ema.values)}, tmp / "ema.safetensors")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "meta.json").write_text(json.dumps(meta))

        write_folder_atomically(self.folder, build)

    def load(self, modules: dict, optimizer, ema: WeightCopy | None) -> dict:
        from safetensors.torch import load_file, load_model

        for name, module in modules.items():
            load_model(module, str(self.folder / f"{name}.safetensors"))
        if ema is not None:
            saved = load_file(self.folder / "ema.safetensors")
            ema.assign([saved[k] for k in _state_names(modules)])
        optimizer.load_state_dict(torch.load(self.folder / "optimizer.pt", weights_only=True))
        return json.loads((self.folder / "meta.json").read_text())


def balanced_prompts(train: list, n: int, seed: int) -> list:
    """n of the ``train`` prompts, tasks drawn uniformly, prompts uniformly within a task."""
    by_task: dict[str, list] = {}
    for p in train:
        by_task.setdefault(p.task, []).append(p)
    rng = random.Random(seed)
    tasks = sorted(by_task)
    return [rng.choice(by_task[rng.choice(tasks)]) for _ in range(n)]


def _state_names(modules: dict) -> list[str]:
    """``<module>.<key>`` of every tensor of the modules' state dicts, in order (the EMA's checkpoint names)."""
    return [f"{n}.{k}" for n, m in modules.items() for k in m.state_dict()]


def _state_tensors(modules: dict) -> list[torch.Tensor]:
    """The modules' state-dict tensors (views of their parameters and buffers), in ``_state_names`` order."""
    return [v for m in modules.values() for v in m.state_dict().values()]


@dataclass
class ToyWorld:
    """What the scaffold needs of a world to pretrain a model on it."""

    pipe: object  # the diffusers pipeline being trained (random weights at first)
    train_prompts: list  # the world's training prompts (each with .text and .task)
    render: Callable[[list, list[int]], torch.Tensor]  # (prompts, seeds) -> pixels in [0, 1], as the VAE takes them
    sample_pixels: Callable[[random.Random, int], torch.Tensor]  # (rng, n) -> n rendered training scenes or clips
    normalise: Callable[[object, torch.Tensor], torch.Tensor]  # (pipe, raw VAE means) -> latents; sets the VAE's config
    modules: dict[str, torch.nn.Module]  # what flow matching trains (the transformer and the text encoders)
    predict: Callable  # (pipe, x_t, sigma, captions) -> velocity, with gradients into the text encoders
    evaluate: Callable[[Path, object], dict]  # (snapshot folder, cfg) -> the evaluation summary
    encode_batch: int = 256  # scenes or clips per VAE encoding call
    # a conditioned world (the editing world): its fixed data set (else ``dataset_size`` task-balanced draws of
    # ``train_prompts``) and each item's condition pixels (an edit's source), encoded once like the targets and
    # handed to ``predict`` as a fifth argument
    dataset: list | None = None
    render_condition: Callable[[list], torch.Tensor] | None = None


def pretrain(cfg, world: ToyWorld) -> dict:
    """Run (or resume) every stage for ``world`` and write the pipeline to ``cfg.output_dir``."""
    started, work = time.time(), open_work_dir(cfg)
    pipe = world.pipe
    train_vae(pipe, cfg, work, world.sample_pixels)
    pipe.vae.requires_grad_(False)
    prompts = world.dataset or balanced_prompts(world.train_prompts, cfg.dataset_size, cfg.seed)
    raw = encode_dataset(pipe.vae, prompts, world.render, cfg.seed, work, batch=world.encode_batch)
    latents = world.normalise(pipe, raw)
    conditions = None
    if world.render_condition is not None:
        raw = encode_dataset(pipe.vae, prompts, lambda items, seeds: world.render_condition(items), cfg.seed, work,
                             batch=world.encode_batch, name="conditions")
        conditions = world.normalise(pipe, raw)
    final = train_flow(pipe, cfg, work, latents, [p.text for p in prompts], world.modules, world.predict, world.evaluate,
                       conditions=conditions)
    save_pipeline_from_snapshot(work / "snapshot", Path(cfg.output_dir))
    report = {"eval": final, "minutes": round((time.time() - started) / 60, 1), "output_dir": cfg.output_dir}
    (work / "report.json").write_text(json.dumps(report, indent=2))
    return report


def train_vae(pipe, cfg, work: Path, sample_pixels: Callable[[random.Random, int], torch.Tensor]) -> None:
    """Stage 1: the VAE learns to reconstruct ``sample_pixels(rng, vae_batch)`` (floats in [0, 1];
    images [B, 3, H, W] or, for a video VAE, clips [B, 3, F, H, W]) with L1 + a tiny KL."""
    vae = pipe.vae
    state = _State(work / "vae")
    optimizer = torch.optim.Adam(vae.parameters(), lr=cfg.vae_lr)
    start = state.load({"vae": vae}, optimizer, None)["step"] if state.exists() else 0
    if start >= cfg.vae_steps:
        return
    vae.train()
    bar = tqdm(range(start, cfg.vae_steps), desc="1/3 vae", initial=start, total=cfg.vae_steps)
    for step in bar:
        images = sample_pixels(random.Random(cfg.seed * 7919 + step), cfg.vae_batch)
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # the posterior sample
        posterior = vae.encode(images * 2 - 1).latent_dist
        recon = vae.decode(posterior.sample()).sample
        loss = F.l1_loss(recon, images * 2 - 1) + cfg.vae_kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.vae_steps:
            state.save({"vae": vae}, optimizer, None, {"step": step + 1})
    vae.eval()


@torch.no_grad()
def encode_dataset(vae, prompts: list, render, seed: int, work: Path, batch: int, name: str = "data") -> torch.Tensor:
    """VAE means of ``render(prompts, seeds)`` for every prompt (sample j of chunk i is seeded with
    seed·1000003 + i + j), encoded once and cached in ``work/<name>.safetensors``."""
    from safetensors.torch import load_file, save_file

    cache = work / f"{name}.safetensors"
    if cache.is_file():
        return load_file(cache)["latents"]
    latents = []
    for i in tqdm(range(0, len(prompts), batch), desc=f"2/3 {name}"):
        chunk = prompts[i : i + batch]
        pixels = render(chunk, [seed * 1_000_003 + i + j for j in range(len(chunk))])
        latents.append(vae.encode(pixels * 2 - 1).latent_dist.mean)
    raw = torch.cat(latents)
    save_file({"latents": raw.contiguous()}, cache)
    return raw


def _shifted_sigmas(u: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * u / (1 + (shift - 1) * u)


def train_flow(pipe, cfg, work: Path, latents: torch.Tensor, texts: list[str], modules: dict[str, torch.nn.Module],
               predict: Callable, evaluate: Callable[[Path, object], dict],
               conditions: torch.Tensor | None = None) -> dict | None:
    """Stage 3: rectified flow matching of ``modules`` on normalised ``latents`` [N, ...] with captions
    ``texts``; ``predict(pipe, xt, sigma, captions)`` is the model's velocity (``predict(..., conditions[batch])``
    with the items' condition latents, an edit's source: never dropped), ``evaluate(snapshot_folder,
    cfg)`` scores an EMA snapshot. The EMA follows every step with λ = min(ema_decay, (1 + step)/(10 + step))."""
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.flow_lr, weight_decay=0.0)
    ema = WeightCopy("ema", _state_tensors(modules), keep=warmed_decay(cfg.ema_decay))
    state = _State(work / "flow")
    meta = state.load(modules, optimizer, ema) if state.exists() else {"step": 0, "evals": [], "reached": False}
    if meta["reached"] or meta["step"] >= cfg.flow_steps:
        return meta["evals"][-1] if meta["evals"] else None
    shift = pipe.scheduler.config.shift
    for m in modules.values():
        m.train()
    bar = tqdm(range(meta["step"], cfg.flow_steps), desc="3/3 flow", initial=meta["step"], total=cfg.flow_steps)
    for step in bar:
        g = _generator(cfg.seed, 3, step)
        index = torch.randint(len(texts), (cfg.flow_batch,), generator=g)
        drop = torch.rand(cfg.flow_batch, generator=g) < cfg.caption_dropout
        captions = ["" if d else texts[i] for i, d in zip(index.tolist(), drop.tolist())]
        x0 = latents[index]
        noise = torch.randn(x0.shape, generator=g)
        sigma = _shifted_sigmas(torch.rand(cfg.flow_batch, generator=g), shift)
        s = sigma.view(-1, *([1] * (x0.ndim - 1)))
        xt = (1 - s) * x0 + s * noise
        pred = predict(pipe, xt, sigma, captions, *(() if conditions is None else (conditions[index],)))
        loss = F.mse_loss(pred, noise - x0)
        for group in optimizer.param_groups:
            group["lr"] = cfg.flow_lr * min(1.0, (step + 1) / cfg.flow_warmup)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        ema.follow(_state_tensors(modules), step)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        last = step + 1 == cfg.flow_steps
        if (step + 1) % cfg.eval_every == 0 or last:
            with ema.swapped_into(_state_tensors(modules)):  # the snapshot is the EMA's; training weights come back
                save_pipeline(pipe, work / "snapshot")
            summary = evaluate(work / "snapshot", cfg)
            summary["step"] = step + 1
            meta["evals"].append(summary)
            tqdm.write(json.dumps(summary))
            meta["reached"] = summary["mean_score"] >= cfg.target_score
        if (step + 1) % cfg.checkpoint_every == 0 or last or meta["reached"]:
            meta["step"] = step + 1
            state.save(modules, optimizer, ema, meta)
        if meta["reached"]:
            break
    return meta["evals"][-1] if meta["evals"] else None


def save_pipeline(pipe, folder: Path) -> None:
    write_folder_atomically(folder, lambda tmp: pipe.save_pretrained(tmp))


def snapshot_model(folder: Path, family: str, cfg, **model_config):
    """A saved pipeline folder loaded as ``flowgrpo eval`` loads a model (full weights, no reference), at the
    pretraining's size, guidance, steps and text length."""
    from flowgrpo.models import load_model

    return load_model({"family": family, "pretrained": str(folder), "device": "cpu",
                       "resolution": cfg.sizes.image_size, "guidance_scale": cfg.eval_guidance,
                       "sample_steps": cfg.eval_steps, "max_sequence_length": TEXT_TOKENS, "finetune": "full",
                       "reference": "none", **model_config})


def open_work_dir(cfg) -> Path:
    """Apply ``cfg.threads``, create the work dir and record the config in it (every pretraining)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    work = Path(cfg.work_dir)
    record, sizes = work / "pretrain_config.json", json.loads(json.dumps(asdict(cfg)["sizes"]))
    saved = json.loads(record.read_text()).get("sizes") if record.is_file() else None
    if saved is not None and saved != sizes:  # its checkpoints are of another architecture: resuming cannot load them
        changed = ", ".join(f"{k} {saved.get(k)} -> {v}" for k, v in sizes.items() if saved.get(k) != v)
        raise UserError(f"{work} holds a pretraining of other model sizes ({changed}); give a new --work-dir for "
                         "these sizes, or resume it with the sizes it was started with")
    work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(asdict(cfg), indent=2))
    return work


def save_pipeline_from_snapshot(snapshot: Path, output: Path) -> None:
    """The shipped model is the last evaluated EMA snapshot (the one whose score was reported)."""
    if not (snapshot / "model_index.json").is_file():
        raise FileNotFoundError(f"no evaluated snapshot in {snapshot}; run the flow stage to its first evaluation")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_folder_atomically(output, lambda tmp: shutil.copytree(snapshot, tmp, dirs_exist_ok=True))


# ---------------------------------------------------------------------------------------------------- the image world
def _render_scenes(prompts: list, seeds: list[int], size: int) -> torch.Tensor:
    """Scenes as the VAE takes them: float [B, 3, size, size] in [0, 1]."""
    images = [scenes.render_prompt(p, s, size) for p, s in zip(prompts, seeds)]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div(255.0)


def _normalise_sd3(pipe, raw: torch.Tensor) -> torch.Tensor:
    """SD3's normalisation: one shift and one scale over every latent element, stored in the VAE's config."""
    shift_factor, scaling_factor = raw.mean().item(), 1.0 / raw.std().item()
    pipe.vae.register_to_config(shift_factor=shift_factor, scaling_factor=scaling_factor)
    return (raw - shift_factor) * scaling_factor


def _sd3_predict(pipe, xt: torch.Tensor, sigma: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """The SD3 transformer's velocity for noisy latents xt at sigma, with gradients into the text encoders."""
    embeds, _, pooled, _ = pipe.encode_prompt(
        captions, None, None, do_classifier_free_guidance=False, max_sequence_length=pipe.tokenizer.model_max_length
    )
    return pipe.transformer(
        hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=embeds, pooled_projections=pooled
    ).sample


def _scene_pixels(size: int) -> Callable[[random.Random, int], torch.Tensor]:
    """The VAE stage's batches: n training scenes, each prompt's draw followed by its seed's (the order the
    shipped tiny SD3 was trained with)."""
    train = scenes.train_prompts()

    def sample(rng: random.Random, n: int) -> torch.Tensor:
        drawn = [(rng.choice(train), rng.randrange(2**31)) for _ in range(n)]
        return _render_scenes([p for p, _ in drawn], [seed for _, seed in drawn], size)

    return sample


def evaluate_snapshot(folder: Path, cfg: PretrainConfig) -> dict:
    """Score a saved pipeline folder on the held-out eval prompts, exactly as ``flowgrpo eval`` does."""
    from flowgrpo.evaluate import evaluate_toy

    return evaluate_toy(snapshot_model(folder, "sd3", cfg), scenes.eval_prompts(), seed=cfg.seed)


def pretrain_toy(cfg: PretrainConfig) -> dict:
    """Run (or resume) every stage on the toy images and write the tiny SD3 pipeline to ``cfg.output_dir``."""
    corpus = [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]
    pipe = build_tiny_sd3_pipeline(build_clip_tokenizer(corpus, max_length=TEXT_TOKENS), cfg.sizes, seed=cfg.seed)
    size = cfg.sizes.image_size
    return pretrain(cfg, ToyWorld(
        pipe=pipe, train_prompts=scenes.train_prompts(), render=lambda prompts, seeds: _render_scenes(prompts, seeds, size),
        sample_pixels=_scene_pixels(size), normalise=_normalise_sd3, predict=_sd3_predict, evaluate=evaluate_snapshot,
        modules={"transformer": pipe.transformer, "text_encoder": pipe.text_encoder,
                 "text_encoder_2": pipe.text_encoder_2, "text_encoder_3": pipe.text_encoder_3},
    ))
