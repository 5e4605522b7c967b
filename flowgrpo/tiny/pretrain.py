"""Pretrain the embedded tiny SD3 model on the toy world: ``flowgrpo pretrain-toy``.

Stages (each resumable from ``--work-dir``; rerunning the same command continues where it stopped):
  1. VAE      an ``AutoencoderKL`` learns to reconstruct rendered scenes (32x32; L1 + tiny KL).
  2. DATA     a fixed set of scenes is rendered from the train prompts (task-balanced) and encoded
              once; the latent mean/std set the VAE's ``shift_factor``/``scaling_factor`` as SD3 does.
  3. FLOW     rectified-flow matching of the ``SD3Transformer2DModel`` and the three text encoders,
              v ≈ noise − data at σ drawn on the sampling grid's density, captions dropped 10% of the
              time so classifier-free guidance works; EMA weights are what ships.
  4. SHIP     every ``eval_every`` steps the EMA pipeline is saved and scored on the held-out eval
              prompts with the toy scorer (ODE sampling, the model config's default steps); training
              stops at the first evaluation whose mean score reaches ``target_score``: the model is
              meant to be competent but imperfect, leaving headroom that reinforcement learning shows.

Every random draw is a pure function of (seed, stage, step), so a resumed run repeats the
uninterrupted one. The result is a ``StableDiffusion3Pipeline`` folder written with
``save_pretrained`` (≈ 15 MB) that loads with ``StableDiffusion3Pipeline.from_pretrained``.
``flowgrpo/tiny/pretrain_video.py`` runs the same stages (``train_vae``, ``train_flow``) for the tiny Wan.
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

from flowgrpo.run.checkpoint import write_folder_atomically
from flowgrpo.run.errors import UserError
from flowgrpo.tiny import TinySD3Sizes, build_clip_tokenizer, build_tiny_sd3_pipeline
from worlds.toy import scenes

TEXT_TOKENS = 16  # padded prompt length of every text encoder (toy prompts have <= 12 words)


@dataclass
class PretrainConfig:
    output_dir: str = "flowgrpo/tiny/assets/tiny-sd3"  # where the finished pipeline is saved
    work_dir: str = "runs/pretrain-toy"  # checkpoints, cached data and evaluation snapshots
    seed: int = 0
    threads: int = 0  # torch CPU threads; 0 = all cores
    # stage 1: VAE
    vae_steps: int = 1200
    vae_batch: int = 32
    vae_lr: float = 1e-3
    vae_kl_weight: float = 1e-6  # times the KL summed over latent elements
    # stage 2: data
    dataset_size: int = 24000  # rendered (prompt, image) pairs, task-balanced over train prompts
    # stage 3: flow matching
    flow_steps: int = 3000  # the shipped model is the EMA at this step (held-out 0.32)
    flow_batch: int = 64
    flow_lr: float = 3e-4
    flow_warmup: int = 200
    caption_dropout: float = 0.1  # fraction of captions replaced by "" (for CFG)
    ema_decay: float = 0.999
    checkpoint_every: int = 250
    # stage 4: evaluation and stopping
    eval_every: int = 500
    eval_steps: int = 20  # ODE steps (the shipped model config's default)
    eval_guidance: float = 3.0  # best of {1.5, 3, 4.5, 7} on a step-2000 snapshot (0.30 vs 0.24 at 4.5)
    target_score: float = 0.40  # stop early once the held-out toy score reaches this (band 0.3-0.7)
    sizes: TinySD3Sizes = field(default_factory=TinySD3Sizes)


def _generator(seed: int, stage: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + stage * 10_007 + step) % (2**63))


class _State:
    """Checkpoint of one stage: module weights (safetensors), optimizer, EMA, step counter."""

    def __init__(self, folder: Path):
        self.folder = folder

    def exists(self) -> bool:
        return (self.folder / "meta.json").is_file()

    def save(self, modules: dict, optimizer, ema: dict | None, meta: dict) -> None:
        from safetensors.torch import save_file, save_model

        def build(tmp: Path) -> None:
            for name, module in modules.items():
                save_model(module, str(tmp / f"{name}.safetensors"))  # handles T5's tied embeddings
            if ema is not None:
                save_file({k: v.contiguous() for k, v in ema.items()}, tmp / "ema.safetensors")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "meta.json").write_text(json.dumps(meta))

        write_folder_atomically(self.folder, build)

    def load(self, modules: dict, optimizer, ema: dict | None) -> dict:
        from safetensors.torch import load_file, load_model

        for name, module in modules.items():
            load_model(module, str(self.folder / f"{name}.safetensors"))
        if ema is not None:
            ema.update(load_file(self.folder / "ema.safetensors"))
        optimizer.load_state_dict(torch.load(self.folder / "optimizer.pt", weights_only=True))
        return json.loads((self.folder / "meta.json").read_text())


def _balanced_prompts(n: int, seed: int) -> list[scenes.ToyPrompt]:
    """n train prompts, tasks drawn uniformly, prompts uniformly within a task."""
    by_task: dict[str, list[scenes.ToyPrompt]] = {}
    for p in scenes.train_prompts():
        by_task.setdefault(p.task, []).append(p)
    rng = random.Random(seed)
    tasks = sorted(by_task)
    return [rng.choice(by_task[rng.choice(tasks)]) for _ in range(n)]


def _images_to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div(255.0)


def toy_images(size: int) -> Callable[[random.Random, int], torch.Tensor]:
    """``sample(rng, n)``: n rendered train scenes, float [n, 3, size, size] in [0, 1]."""
    train = scenes.train_prompts()

    def sample(rng: random.Random, n: int) -> torch.Tensor:
        return _images_to_tensor([scenes.render_prompt(rng.choice(train), rng.randrange(2**31), size) for _ in range(n)])

    return sample


def train_vae(pipe, cfg, work: Path, sample_pixels: Callable[[random.Random, int], torch.Tensor] | None = None) -> None:
    """Stage 1: the VAE learns to reconstruct ``sample_pixels(rng, vae_batch)`` (floats in [0, 1];
    images [B, 3, H, W] or, for a video VAE, clips [B, 3, F, H, W]) with L1 + a tiny KL."""
    sample_pixels = sample_pixels or toy_images(cfg.sizes.image_size)
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
def encode_dataset(vae, prompts: list, render, seed: int, work: Path, batch: int) -> torch.Tensor:
    """VAE means of ``render(prompts, seeds)`` for every prompt (sample j of chunk i is seeded with
    seed·1000003 + i + j), encoded once and cached in ``work/data.safetensors``."""
    from safetensors.torch import load_file, save_file

    cache = work / "data.safetensors"
    if cache.is_file():
        return load_file(cache)["latents"]
    latents = []
    for i in tqdm(range(0, len(prompts), batch), desc="2/3 data"):
        chunk = prompts[i : i + batch]
        pixels = render(chunk, [seed * 1_000_003 + i + j for j in range(len(chunk))])
        latents.append(vae.encode(pixels * 2 - 1).latent_dist.mean)
    raw = torch.cat(latents)
    save_file({"latents": raw.contiguous()}, cache)
    return raw


def build_dataset(pipe, cfg: PretrainConfig, work: Path) -> tuple[torch.Tensor, list[str]]:
    """Render and encode the flow-matching scenes once; cached in the work dir."""
    prompts = _balanced_prompts(cfg.dataset_size, cfg.seed)

    def render(chunk, seeds):
        return _images_to_tensor([scenes.render_prompt(p, s, cfg.sizes.image_size) for p, s in zip(chunk, seeds)])

    return encode_dataset(pipe.vae, prompts, render, cfg.seed, work, batch=256), [p.text for p in prompts]


def _shifted_sigmas(u: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * u / (1 + (shift - 1) * u)


def _text_encoders(pipe) -> dict[str, torch.nn.Module]:
    return {"text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2, "text_encoder_3": pipe.text_encoder_3}


def _flow_modules(pipe) -> dict[str, torch.nn.Module]:
    return {"transformer": pipe.transformer, **_text_encoders(pipe)}


def _ema_init(modules: dict) -> dict[str, torch.Tensor]:
    return {f"{n}.{k}": v.detach().clone() for n, m in modules.items() for k, v in m.state_dict().items()}


@torch.no_grad()
def _ema_update(ema: dict, modules: dict, decay: float) -> None:
    for n, m in modules.items():
        for k, v in m.state_dict().items():
            e = ema[f"{n}.{k}"]
            if v.dtype.is_floating_point:
                e.lerp_(v, 1 - decay)
            else:
                e.copy_(v)


def _swap_in_ema(modules: dict, ema: dict) -> dict:
    """Load EMA weights into the modules; returns the training weights to restore later."""
    saved = _ema_init(modules)
    for n, m in modules.items():
        m.load_state_dict({k[len(n) + 1 :]: v for k, v in ema.items() if k.startswith(n + ".")})
    return saved


def save_pipeline(pipe, folder: Path) -> None:
    write_folder_atomically(folder, lambda tmp: pipe.save_pretrained(tmp))


def evaluate_snapshot(folder: Path, cfg: PretrainConfig) -> dict:
    """Score a saved pipeline folder on the held-out eval prompts, exactly as ``flowgrpo eval`` does."""
    from flowgrpo.evaluate import evaluate_toy
    from flowgrpo.models import load_model

    model = load_model(
        {
            "family": "sd3",
            "pretrained": str(folder),
            "device": "cpu",
            "resolution": cfg.sizes.image_size,
            "guidance_scale": cfg.eval_guidance,
            "sample_steps": cfg.eval_steps,
            "max_sequence_length": TEXT_TOKENS,
            "finetune": "full",
            "reference": "none",
        }
    )
    return evaluate_toy(model, scenes.eval_prompts(), seed=cfg.seed)


def _sd3_predict(pipe, xt: torch.Tensor, sigma: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """The SD3 transformer's velocity for noisy latents xt at sigma, with gradients into the text encoders."""
    embeds, _, pooled, _ = pipe.encode_prompt(
        captions, None, None, do_classifier_free_guidance=False, max_sequence_length=pipe.tokenizer.model_max_length
    )
    return pipe.transformer(
        hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=embeds, pooled_projections=pooled
    ).sample


def train_flow(
    pipe,
    cfg,
    work: Path,
    latents: torch.Tensor,
    texts: list[str],
    modules: dict[str, torch.nn.Module] | None = None,
    predict: Callable = _sd3_predict,
    evaluate: Callable[[Path, object], dict] | None = None,
) -> dict | None:
    """Stage 3: rectified flow matching of ``modules`` (default: SD3's transformer and text encoders)
    on normalised ``latents`` [N, ...] with captions ``texts``; ``predict(pipe, xt, sigma, captions)``
    is the model's velocity, ``evaluate(snapshot_folder, cfg)`` scores an EMA snapshot."""
    modules = modules if modules is not None else _flow_modules(pipe)
    evaluate = evaluate or evaluate_snapshot
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.flow_lr, weight_decay=0.0)
    ema = _ema_init(modules)
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
        pred = predict(pipe, xt, sigma, captions)
        loss = F.mse_loss(pred, noise - x0)
        for group in optimizer.param_groups:
            group["lr"] = cfg.flow_lr * min(1.0, (step + 1) / cfg.flow_warmup)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        _ema_update(ema, modules, min(cfg.ema_decay, (1 + step) / (10 + step)))
        bar.set_postfix(loss=f"{loss.item():.4f}")
        last = step + 1 == cfg.flow_steps
        if (step + 1) % cfg.eval_every == 0 or last:
            summary = _evaluate_ema(pipe, modules, ema, work, cfg, evaluate)
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


def _evaluate_ema(pipe, modules: dict, ema: dict, work: Path, cfg, evaluate: Callable) -> dict:
    """Save the EMA weights as a pipeline snapshot and score it; training weights are restored."""
    saved = _swap_in_ema(modules, ema)
    save_pipeline(pipe, work / "snapshot")
    for n, m in modules.items():
        m.load_state_dict({k[len(n) + 1 :]: v for k, v in saved.items() if k.startswith(n + ".")})
    return evaluate(work / "snapshot", cfg)


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


def pretrain_toy(cfg: PretrainConfig) -> dict:
    """Run (or resume) all stages and write the pipeline to ``cfg.output_dir``."""
    started, work = time.time(), open_work_dir(cfg)
    corpus = [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]
    tokenizer = build_clip_tokenizer(corpus, max_length=TEXT_TOKENS)
    pipe = build_tiny_sd3_pipeline(tokenizer, cfg.sizes, seed=cfg.seed)
    train_vae(pipe, cfg, work)
    for p in pipe.vae.parameters():
        p.requires_grad_(False)
    raw, texts = build_dataset(pipe, cfg, work)
    shift_factor = raw.mean().item()
    scaling_factor = 1.0 / raw.std().item()
    pipe.vae.register_to_config(shift_factor=shift_factor, scaling_factor=scaling_factor)
    latents = (raw - shift_factor) * scaling_factor
    final = train_flow(pipe, cfg, work, latents, texts)
    save_pipeline_from_snapshot(work / "snapshot", Path(cfg.output_dir))
    report = {"eval": final, "minutes": round((time.time() - started) / 60, 1), "output_dir": cfg.output_dir}
    (work / "report.json").write_text(json.dumps(report, indent=2))
    return report


def save_pipeline_from_snapshot(snapshot: Path, output: Path) -> None:
    """The shipped model is the last evaluated EMA snapshot (the one whose score was reported)."""
    if not (snapshot / "model_index.json").is_file():
        raise FileNotFoundError(f"no evaluated snapshot in {snapshot}; run the flow stage to its first evaluation")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_folder_atomically(output, lambda tmp: shutil.copytree(snapshot, tmp, dirs_exist_ok=True))
