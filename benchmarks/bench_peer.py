"""flowgrpo against the reference Flow-GRPO code (yifan123/flow_grpo), side by side, on the same work.

    python benchmarks/bench_peer.py --flow-grpo PATH [--prompts 8] [--group 8] [--steps 10] [--eta 0.7]
                                    [--micro-batch 64] [--repeats 3] [--threads 1] [key=value ...]
    python benchmarks/bench_peer.py --flow-grpo PATH --model sd3_5_medium --random-weights --threads 0 \
                                    train.mixed_precision=bf16             (real size, on a GPU)

PATH is a checkout of https://github.com/yifan123/flow_grpo that you supply; nothing of it is part of
this project. Its published functions are loaded from PATH at run time: ``pipeline_with_logprob``
(flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py) and ``sde_step_with_logprob`` are imported;
``compute_log_prob`` lives in its training script scripts/train_sd3.py, whose module-level imports (wandb,
absl, ml_collections, its reward models) it does not need, so its definition alone is read from the file
and executed with the names it uses. Its ``compute_text_embeddings`` cannot run on the tiny SD3: it
tokenizes CLIP prompts to 77 tokens and the tiny CLIP encoders have 16 positions; the peer side encodes
every sample's prompt with the pipeline's own ``encode_prompt`` instead (what that function does on SD3).

Both sides run on one tiny SD3 pipeline (the image default's, configs/default.yaml, read at run time,
with its LoRA), the same prompts, group size, step count and grid, noise level η, CFG scale and trained
steps (the first ⌊0.99·T⌋, Flow-GRPO's timestep_fraction), the same advantages, and take one AdamW step
with gradient clipping per iteration:

- sampling with log-probs. flowgrpo: ``Trainer.sample`` (prompt encoding once per prompt, the tree
  executor, VAE decode). Peer: prompt encoding for every sample's prompt (as its loop does),
  ``pipeline_with_logprob`` (denoising loop with ``sde_step_with_logprob``, VAE decode) and the
  stacking of latents and log-probs its loop does. Rewards are left out on both sides.
- the training pass over the trained steps. flowgrpo: the transition learner's ``update`` (micro-batches
  of ``train.micro_batch`` transitions, ``--micro-batch``). Peer: its loop's structure, written here
  around its ``compute_log_prob``: shuffle, then for each training batch of ``--micro-batch`` samples and
  each trained step j one CFG forward of the batch at step j, the clipped loss and a backward
  (gradients accumulated over the iteration, as its accelerate accumulation does), then the step.
  The model-call sizes are then equal: ``--micro-batch`` latents (twice that with CFG) per call.

Before timing, the equality check: flowgrpo samples first; the peer then samples from the same x_T and
the same per-step ε (its ``randn_tensor`` is fed flowgrpo's draws), on the same σ grid (flowgrpo's
float32 grid handed to the scheduler with its shift set to 1 for the run, so it is used as it is). Every
trained step's log-prob must agree within TOLERANCE_ULPS float32 ulps of max |log p|, and x' within the
same number of ulps of max |x'|; otherwise the benchmark stops. When the transformer runs in bf16 (a GPU
run), the ulps are bf16's (LOW_PRECISION_ULPS of them): the reference pipeline rounds its latents to the
transformer's dtype after every step while flowgrpo keeps them in float32, and a bf16 text encoder's
output depends on the batch it runs in (the peer encodes every sample's prompt, flowgrpo each prompt
once): measured on an H200, x' differed by 2 bf16 ulps and the embeddings by 5. Then ``--repeats`` rounds alternate the
two (ABBA order), and the medians per phase and their ratio (peer / flowgrpo) are printed, with the
checkout's commit id. flowgrpo's speed levers (``model.compile=true sampling.merge_lora=true`` as overrides) apply
to flowgrpo's side alone: the peer runs its code as published, eagerly (``Peer.as_published``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "reproduce"))  # parity: the per-step noise recorder

from parity import recorded_step_noise  # noqa: E402  (the executor's per-step ε, kept in order)

TOLERANCE_ULPS = 512  # float32 ulps of the compared values' largest magnitude
LOW_PRECISION_ULPS = 16  # ulps of a bf16/fp16 transformer's dtype, when it runs in one
TRAIN_FRACTION = 0.99  # Flow-GRPO's timestep_fraction, as configs/presets/flow_grpo.yaml trains


def tolerance(values: torch.Tensor, ulps: int = TOLERANCE_ULPS, dtype: torch.dtype = torch.float32) -> float:
    """``ulps`` ulps of ``dtype`` at max |values| (the spacing of such numbers at that magnitude)."""
    scale = float(values.detach().abs().max()) if values.numel() else 0.0
    return ulps * float(torch.finfo(dtype).eps) * max(scale, float(torch.finfo(torch.float32).tiny))


def check_precision(dtype: torch.dtype) -> tuple[int, torch.dtype]:
    """(ulps, dtype) of the equality check for a transformer computing in ``dtype``."""
    return (TOLERANCE_ULPS, torch.float32) if dtype == torch.float32 else (LOW_PRECISION_ULPS, dtype)


def compare(name: str, ours: torch.Tensor, theirs: torch.Tensor, ulps: int = TOLERANCE_ULPS,
            dtype: torch.dtype = torch.float32) -> dict:
    """Max |ours − theirs| against ``ulps`` ulps of ``dtype`` at max |ours|: {name, max_abs_diff, tolerance, ok}."""
    if ours.shape != theirs.shape:
        raise ValueError(f"{name}: shapes differ, {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    diff = float((ours.double() - theirs.double()).abs().max()) if ours.numel() else 0.0
    tol = tolerance(ours, ulps, dtype)
    return {"name": name, "max_abs_diff": diff, "tolerance": tol, "ok": diff <= tol, "ulps": ulps,
            "dtype": str(dtype).removeprefix("torch.")}


def median_ratio(ours: list[float], theirs: list[float]) -> float:
    """median(theirs) / median(ours): how many times faster flowgrpo is (> 1 = faster)."""
    return statistics.median(theirs) / statistics.median(ours)


def trained_steps(num_steps: int, fraction: float = TRAIN_FRACTION) -> int:
    return int(num_steps * fraction)


# ---------------------------------------------------------------------------------------------------- the peer
def load_peer(path: Path) -> SimpleNamespace:
    """The checkout's functions: two imported modules, and compute_log_prob's definition read from scripts/train_sd3.py."""
    path = Path(path).resolve()
    script = path / "scripts" / "train_sd3.py"
    if not (path / "flow_grpo" / "diffusers_patch" / "sd3_pipeline_with_logprob.py").is_file() or not script.is_file():
        raise SystemExit(f"{path} is not a checkout of yifan123/flow_grpo (no flow_grpo/diffusers_patch/"
                         "sd3_pipeline_with_logprob.py or scripts/train_sd3.py); git clone https://github.com/yifan123/flow_grpo")
    sys.path.insert(0, str(path))
    pipeline_mod = importlib.import_module("flow_grpo.diffusers_patch.sd3_pipeline_with_logprob")
    sde_mod = importlib.import_module("flow_grpo.diffusers_patch.sd3_sde_with_logprob")
    tree = ast.parse(script.read_text(), str(script))
    wanted = {"compute_log_prob"}
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    if {d.name for d in defs} != wanted:
        raise SystemExit(f"{script} no longer defines {sorted(wanted)}; this benchmark reads it from there")
    namespace = {"torch": torch, "sde_step_with_logprob": sde_mod.sde_step_with_logprob}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(script), "exec"), namespace)
    commit = "unknown"  # a git checkout of its own, or a copy with the commit id written to PATH/COMMIT
    if (path / ".git").exists():
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
    elif (path / "COMMIT").is_file():
        commit = (path / "COMMIT").read_text().strip()
    return SimpleNamespace(pipeline_with_logprob=pipeline_mod.pipeline_with_logprob, sde_module=sde_mod,
                           compute_log_prob=namespace["compute_log_prob"], commit=commit, path=str(path))


@contextlib.contextmanager
def fed_noise(sde_module, draws: list[torch.Tensor] | None):
    """Inside, the peer's ``randn_tensor`` returns ``draws`` in order (None: leave it alone)."""
    if draws is None:
        yield
        return
    original, queue = sde_module.randn_tensor, list(draws)

    def next_draw(shape, generator=None, device=None, dtype=None, **_):
        eps = queue.pop(0)
        if tuple(eps.shape) != tuple(shape):
            raise RuntimeError(f"the peer asked for noise of shape {tuple(shape)}, flowgrpo drew {tuple(eps.shape)}")
        return eps.to(device=device, dtype=dtype)

    sde_module.randn_tensor = next_draw
    try:
        yield
    finally:
        sde_module.randn_tensor = original


@contextlib.contextmanager
def scheduler_grid(scheduler):
    """Inside, the scheduler takes the sigmas it is given as they are (shift 1), so both sides use one grid."""
    shift = scheduler.shift
    scheduler.set_shift(1.0)
    try:
        yield
    finally:
        scheduler.set_shift(shift)


@contextlib.contextmanager
def timed_calls(module: torch.nn.Module, timer):
    """Inside, every call of ``module`` is timed by ``timer`` (a flowgrpo ``CallTimer``) as the adapter times its
    own calls: for code that calls the network directly (the peer's), so both sides' model time is measured
    the same way. Rows are the call's batch rows (a CFG call's two halves both count)."""
    open_calls = []

    def before(mod, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        block = timer.forward(int(x.shape[0]), cfg=False)
        open_calls.append((block, block.__enter__()))

    def after(mod, args, kwargs, output):
        block, watch = open_calls.pop()
        watch(output[0] if isinstance(output, (tuple, list)) else output)
        block.__exit__(None, None, None)

    handles = [module.register_forward_pre_hook(before, with_kwargs=True),
               module.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def inputs_in_weight_dtype(module: torch.nn.Module):
    """Inside, the latents ``module`` is called with (``hidden_states``) are cast to its weights' dtype. The
    official run calls its transformer through accelerate's ``prepare``, whose autocast takes the float32
    latents its pipeline hands over (``prepare_latents(...).float()``); here the shared transformer holds the
    bench's dtype, and the latents are cast as flowgrpo's adapter casts its own (the timestep stays float32 on
    both sides), so both compute the same products."""
    dtype = next(module.parameters()).dtype
    if dtype == torch.float32:
        yield
        return

    def before(mod, args, kwargs):
        if "hidden_states" in kwargs:
            return args, kwargs | {"hidden_states": kwargs["hidden_states"].to(dtype)}
        return (args[0].to(dtype),) + tuple(args[1:]), kwargs

    handle = module.register_forward_pre_hook(before, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class Peer:
    """One Flow-GRPO iteration with the checkout's functions on flowgrpo's pipeline (see the module docstring)."""

    def __init__(self, peer: SimpleNamespace, trainer, args):
        self.fn, self.tr, self.args = peer, trainer, args
        self.pipeline = trainer.model.pipeline
        self.transformer = trainer.model.transformer
        self.params = trainer.model.trainable_parameters()
        t = trainer.cfg.train
        self.optimizer = torch.optim.AdamW(self.params, lr=t.learning_rate, weight_decay=t.weight_decay,
                                           betas=tuple(t.adam_betas))
        self.guidance = float(trainer.cfg.sampling.guidance_scale or trainer.model.config.guidance_scale)
        self.config = SimpleNamespace(train=SimpleNamespace(cfg=True), sample=SimpleNamespace(
            guidance_scale=self.guidance, noise_level=args.eta))
        self.max_len = trainer.model.config.max_sequence_length
        self.neg = self.encode([""])
        from flowgrpo.run.timing import CallTimer

        self.timer = CallTimer(trainer.model.device)  # the peer's model calls, timed as flowgrpo's are

    def as_published(self):
        """The peer runs its code as published: eagerly, also where flowgrpo's side compiled the shared transformer's
        blocks in place (model.compile); flowgrpo's merged-LoRA rollouts (sampling.merge_lora) never reach it."""
        return torch.compiler.set_stance("force_eager") if self.tr.cfg.model.compile else contextlib.nullcontext()

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_embeds, pooled) of every prompt, by the pipeline's encode_prompt (CLIP-L, CLIP-G, T5)."""
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.tr.model.device, do_classifier_free_guidance=False,
            max_sequence_length=self.max_len)
        return embeds, pooled

    def sample(self, prompts: list[str], sigmas: list[float], latents: torch.Tensor,
               draws: list[torch.Tensor] | None = None, embeds=None) -> dict:
        """Sampling with log-probs for len(prompts) samples (each prompt once per sample, as its loop does)."""
        n = len(prompts)
        if embeds is None:
            embeds = self.encode(prompts)
        prompt_embeds, pooled = embeds
        neg, neg_pooled = self.neg[0].repeat(n, 1, 1), self.neg[1].repeat(n, 1)
        self.transformer.eval()
        with torch.no_grad(), fed_noise(self.fn.sde_module, draws), scheduler_grid(self.pipeline.scheduler), \
                timed_calls(self.transformer, self.timer), inputs_in_weight_dtype(self.transformer), self.as_published():
            images, all_latents, log_probs = self.fn.pipeline_with_logprob(
                self.pipeline, prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled,
                negative_prompt_embeds=neg, negative_pooled_prompt_embeds=neg_pooled,
                num_inference_steps=len(sigmas), sigmas=sigmas, guidance_scale=self.guidance, output_type="pt",
                height=self.tr.cfg.model.resolution, width=self.tr.cfg.model.width or self.tr.cfg.model.resolution,
                noise_level=self.args.eta, latents=latents, max_sequence_length=self.max_len,
            )
            all_latents = torch.stack(all_latents, dim=1)  # [N, T + 1, *latent]
            log_probs = torch.stack(log_probs, dim=1)  # [N, T]
            timesteps = self.pipeline.scheduler.timesteps.repeat(n, 1)
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled, "timesteps": timesteps,
                "latents": all_latents[:, :-1], "next_latents": all_latents[:, 1:], "log_probs": log_probs,
                "images": images}

    def train(self, samples: dict, advantages: torch.Tensor, num_train: int) -> dict:
        """The training pass: shuffle, batches of --micro-batch samples x trained steps, one optimizer step."""
        keys = ("prompt_embeds", "pooled_prompt_embeds", "timesteps", "latents", "next_latents", "log_probs")
        n, b, clip = advantages.shape[0], self.args.micro_batch, self.tr.cfg.loss.clip_range
        data = {k: samples[k] for k in keys} | {"advantages": advantages.to(samples["log_probs"].device).unsqueeze(1)
                                                 .repeat(1, num_train)}
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        data = {k: v[perm] for k, v in data.items()}
        batches = [{k: v[s : s + b] for k, v in data.items()} for s in range(0, n, b)]
        accumulation = len(batches) * num_train
        self.transformer.train()
        self.optimizer.zero_grad(set_to_none=True)
        info: dict[str, list] = {"approx_kl": [], "clipfrac": [], "loss": []}
        with timed_calls(self.transformer, self.timer), inputs_in_weight_dtype(self.transformer), self.as_published():
            for sample in batches:
                self._train_batch(sample, num_train, clip, accumulation, info)
        torch.nn.utils.clip_grad_norm_(self.params, self.tr.cfg.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.transformer.eval()
        return {k: float(torch.stack(v).detach().mean()) for k, v in info.items()}

    def _train_batch(self, sample: dict, num_train: int, clip: float, accumulation: int, info: dict) -> None:
        """Every trained step of one training batch: forward, loss, backward (its loop's inner body)."""
        rows = sample["latents"].shape[0]
        embeds = torch.cat([self.neg[0].repeat(rows, 1, 1), sample["prompt_embeds"]])
        pooled = torch.cat([self.neg[1].repeat(rows, 1), sample["pooled_prompt_embeds"]])
        for j in range(num_train):
            _, log_prob, _, _ = self.fn.compute_log_prob(self.transformer, self.pipeline, sample, j, embeds, pooled,
                                                         self.config)
            adv = sample["advantages"][:, j].clamp(-5.0, 5.0)
            ratio = torch.exp(log_prob - sample["log_probs"][:, j])
            loss = torch.mean(torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)))
            info["approx_kl"].append(0.5 * torch.mean((log_prob - sample["log_probs"][:, j]) ** 2))
            info["clipfrac"].append(torch.mean(((ratio - 1.0).abs() > clip).float()))
            info["loss"].append(loss.detach())
            with self.timer.backward():  # accelerate's accumulation divides the loss the same way
                (loss / accumulation).backward()


# ---------------------------------------------------------------------------------------------------- flowgrpo
class Ours:
    """One Flow-GRPO iteration with flowgrpo's trainer (its sample phase and its transition learner)."""

    def __init__(self, trainer):
        self.tr, self.iteration = trainer, 0
        trainer.scoring.submit = lambda *args, **kwargs: None  # rewards are not part of the compared work

    def sample(self, iteration: int):
        return self.tr.sample(iteration, self.tr.schedule.plan(iteration))

    def train(self, batches, leaf_advantages: torch.Tensor) -> dict:
        from flowgrpo.engine.credit import Advantages
        from flowgrpo.engine.learners import Rollouts

        rec = batches[0].record.bookkeeping_on_cpu()  # advantages live on the CPU, as the trainer's credit keeps them
        leaf_advantages = leaf_advantages.cpu()[rec.leaf_root]  # given per sample (root order), as the peer's rows
        advantages = Advantages([rec.transition_values(leaf_advantages)], [leaf_advantages])
        self.iteration += 1  # another shuffle each pass, as successive iterations
        return self.tr.learner.update(Rollouts(self.iteration, self.tr.schedule.plan(0), batches, advantages))


def per_sample_steps(rec, values: torch.Tensor, num_train: int) -> torch.Tensor:
    """Transition values [M] of a chain record as [samples (root order), trained steps]."""
    leaf = rec.transition_values(torch.arange(rec.num_leaves, dtype=torch.float64)).round().long()
    sample = rec.leaf_root[leaf]
    out = torch.full((rec.root_state.shape[0], num_train), float("nan"), dtype=values.dtype)
    out[sample, rec.step] = values
    return out


def check_equal(ours: Ours, peer: Peer, prompts_per_sample: list[str], sigmas: list[float], num_train: int) -> list[dict]:
    """Same x_T and ε on both sides -> the same per-step log-probs and states (see the module docstring)."""
    ulps, dtype = check_precision(ours.tr.model.dtype)
    with recorded_step_noise() as draws:
        batches = ours.sample(0)
    rec = batches[0].record.bookkeeping_on_cpu()  # index arithmetic on the host; latents stay where they are
    latents = rec.root_state
    eps = [d.reshape((latents.shape[0],) + tuple(latents.shape[1:])) for d in draws]  # chains: one child per node
    cond = batches[0].cond
    index = rec.leaf_prompt[torch.argsort(rec.leaf_root)]  # the prompt row of every root
    embeds = (cond.prompt_embeds[index], cond.pooled_prompt_embeds[index])
    theirs = peer.sample(prompts_per_sample, sigmas, latents, draws=eps, embeds=embeds)
    ours_lp = per_sample_steps(rec, rec.log_prob, num_train)
    theirs_lp = theirs["log_probs"][:, :num_train].to(ours_lp)
    checks = [compare("log_prob (per sample and trained step)", ours_lp, theirs_lp, ulps, dtype)]
    flat = rec.next_state.flatten(1)
    next_ours = per_sample_steps(rec, torch.arange(rec.num_transitions, dtype=torch.float64), num_train).long()
    states = flat[next_ours.reshape(-1)].reshape(next_ours.shape + (flat.shape[1],))
    checks.append(compare("x' (per sample and trained step)", states,
                          theirs["next_latents"][:, :num_train].flatten(2).to(states), ulps, dtype))
    own = peer.encode(prompts_per_sample)  # what the timed peer runs encode, per sample
    checks.append(compare("text embeddings (per sample)", embeds[0], own[0], ulps, dtype))
    return checks


# ---------------------------------------------------------------------------------------------------- the run
def build(args):
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer

    overrides = ["run_name=bench-peer", "resume=false", "eval.every=0", "eval.at_start=false", "log.samples_every=0",
                 "log.save_every=0", "log.gallery=false", "log.progress=false", "log.tensorboard=false",
                 f"train.prompts_per_iteration={args.prompts}", f"sampling.plan.group_size={args.group}",
                 f"sampling.plan.num_steps={args.steps}", f"sampling.plan.eta={args.eta}",
                 f"train.micro_batch={args.micro_batch}", "train.updates_per_epoch=1", "loss.kl_coef=0.0",
                 *args.overrides]
    if args.random_weights:  # the real architecture, random weights, no download (flowgrpo/models/random_init.py)
        overrides.append("model.random_weights=true")
    cfg = load_config("flow_grpo", args.model, overrides)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    return Trainer(cfg)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flow-grpo", required=True, type=Path, help="a checkout of yifan123/flow_grpo")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eta", type=float, default=0.7)
    parser.add_argument("--micro-batch", type=int, default=64, help="samples per training forward on both sides")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = leave torch's choice)")
    parser.add_argument("--check-only", action="store_true", help="run the equality check and stop")
    parser.add_argument("--model", default=None, help="a model config of the SD3 family (configs/models/, e.g. "
                        "sd3_5_medium); default: the image default's tiny SD3")
    parser.add_argument("--random-weights", action="store_true", help="the model config's real architecture with "
                        "random weights (no download): the equal-work comparison at real size")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides of flowgrpo's side")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    fn = load_peer(args.flow_grpo)
    trainer = build(args)
    try:
        return run(fn, trainer, args)
    finally:
        trainer.scoring.close()
        trainer.writer.close()


def run(fn, trainer, args) -> dict:
    ours, peer = Ours(trainer), Peer(fn, trainer, args)
    plan = trainer.schedule.plan(0)
    counts = plan.counts()
    num_train = counts["trained"] // max(1, counts["leaves"])
    if num_train != trained_steps(args.steps):
        raise SystemExit(f"flowgrpo's plan trains {num_train} steps per sample, Flow-GRPO {trained_steps(args.steps)}")
    sigmas = [float(s) for s in plan.sigmas.to(torch.float32)[:-1]]
    slots = trainer.draws.iteration_slots(0)[0]
    texts = [trainer.draws.prompts[trainer.draws.dataset_index(0, s)] for s in slots]
    prompts_per_sample = [t for t in texts for _ in range(args.group)]
    print(f"peer: {fn.path} at commit {fn.commit}")
    print(f"work: {args.prompts} prompts x group {args.group} = {len(prompts_per_sample)} samples, {args.steps} flow_sde "
          f"steps (eta {args.eta}), {num_train} trained, CFG {peer.guidance}, {args.micro_batch} samples per training "
          f"forward, model {trainer.cfg.model.pretrained} at {trainer.cfg.model.resolution} px, latents "
          f"{tuple(trainer.model.latent_shape())}, torch threads {torch.get_num_threads()}", flush=True)
    checks = check_equal(ours, peer, prompts_per_sample, sigmas, num_train)
    for c in checks:
        print(f"check {c['name']}: max |diff| {c['max_abs_diff']:.3g} <= {c['tolerance']:.3g} "
              f"({c['ulps']} {c['dtype']} ulps of max |value|): {'ok' if c['ok'] else 'FAILED'}", flush=True)
    if not all(c["ok"] for c in checks):
        raise SystemExit("the two sides do not compute the same log-probs: not timing unequal work")
    result = {"peer_commit": fn.commit, "samples": len(prompts_per_sample), "steps": args.steps, "trained": num_train,
              "micro_batch": args.micro_batch, "threads": torch.get_num_threads(), "checks": checks}
    if args.check_only:
        return result
    advantages = torch.randn(len(prompts_per_sample), generator=torch.Generator().manual_seed(1)).clamp(-5, 5)
    phases = [f"{side}_{phase}" for side in ("ours", "peer") for phase in ("sample", "train")]
    times = {k: [] for k in phases}
    model = {k: [] for k in phases}  # seconds inside the transformer's calls (forwards and their backward)

    def timed(key, timer, fn, *fn_args):
        before, start = timer.totals()["total"], time.perf_counter()
        out = fn(*fn_args)
        times[key].append(time.perf_counter() - start)
        model[key].append(timer.totals()["total"] - before)
        return out

    def time_ours():
        batches = timed("ours_sample", trainer.model.call_timer, ours.sample, 0)
        timed("ours_train", trainer.model.call_timer, ours.train, batches, advantages)

    def time_peer():
        latents = torch.randn((len(prompts_per_sample),) + tuple(trainer.model.latent_shape()),
                              generator=torch.Generator().manual_seed(2))
        samples = timed("peer_sample", peer.timer, peer.sample, prompts_per_sample, sigmas, latents)
        timed("peer_train", peer.timer, peer.train, samples, advantages, num_train)

    time_ours(), time_peer()  # warm-up of both, untimed
    for k in phases:
        times[k].clear()
        model[k].clear()
    for r in range(args.repeats):
        for side in ((time_ours, time_peer) if r % 2 == 0 else (time_peer, time_ours)):
            side()
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s (model {model[k][-1]:.2f})" for k, v in times.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_model = {k: statistics.median(v) for k, v in model.items()}
    result.update({"times_s": times, "median_s": med, "model_s": model, "median_model_s": med_model,
                   "ratio_sample": median_ratio(times["ours_sample"], times["peer_sample"]),
                   "ratio_train": median_ratio(times["ours_train"], times["peer_train"]),
                   "ratio_iteration": (med["peer_sample"] + med["peer_train"]) / (med["ours_sample"] + med["ours_train"]),
                   # no removal of overhead can make flowgrpo faster than this at equal model calls
                   "bound_iteration": (med["peer_sample"] + med["peer_train"]) / (med_model["ours_sample"] + med_model["ours_train"])})
    print(json.dumps(result))
    print(f"\nmedian of {args.repeats} alternating rounds, seconds (peer {fn.commit[:12]})")
    print("| phase | flowgrpo s (model calls) | flow_grpo s (model calls) | flow_grpo / flowgrpo |")
    print("|---|---|---|---|")
    rows = [("sampling with log-probs", "sample", result["ratio_sample"]),
            (f"training pass ({num_train} steps)", "train", result["ratio_train"])]
    for name, phase, r in rows:
        print(f"| {name} | {med['ours_' + phase]:.2f} ({med_model['ours_' + phase]:.2f}) | {med['peer_' + phase]:.2f} "
              f"({med_model['peer_' + phase]:.2f}) | {r:.2f}x |")
    ours_total, peer_total = med["ours_sample"] + med["ours_train"], med["peer_sample"] + med["peer_train"]
    ours_model = med_model["ours_sample"] + med_model["ours_train"]
    peer_model = med_model["peer_sample"] + med_model["peer_train"]
    print(f"| iteration | {ours_total:.2f} ({ours_model:.2f}) | {peer_total:.2f} ({peer_model:.2f}) | "
          f"{result['ratio_iteration']:.2f}x |")
    print(f"\niteration / model-call time: flowgrpo {ours_total / ours_model:.3f}, flow_grpo {peer_total / peer_model:.3f}; "
          f"at equal model calls no overhead removal can make flowgrpo more than {result['bound_iteration']:.2f}x "
          "faster (the peer's iteration over flowgrpo's model-call time)")
    return result


if __name__ == "__main__":
    main()
