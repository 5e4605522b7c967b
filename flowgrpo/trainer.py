"""The GRPO training loop for flow-matching models: ``accelerate launch train_t2i.py`` (``train_t2v.py``).

Each iteration reads top to bottom in five phases:
  SAMPLE     the iteration's plan (samplers.method_schedule) is run by the tree executor for this
             process's prompts (whole groups per process), with the weights the learner samples with;
             leaves are decoded to images [L, 3, H, W], videos [L, F, 3, H, W] or, for the analytic
             world, vectors [L, d] (nothing below the decoder looks at the latent's shape).
  SCORE      rewards run in a worker thread while the next rollout batch samples.
  ADVANTAGE  rewards of the whole iteration (gathered over processes) become advantages: group
             z-scores, GDPO for several rewards, BranchGRPO depth-wise tree values; each trained
             transition takes the advantage of its x' node, each leaf its own.
  UPDATE     the learner (learner.name, flowgrpo/learners/) takes its optimizer steps: the transition
             learner on the stored SDE transitions (PPO-clipped per-step ratios, KL terms), or a
             forward-process learner (DiffusionNFT, AWM, DGPO) on the clean leaves noised again.
  LOG/SAVE   metrics.jsonl (+ TensorBoard), samples (PNGs; videos: MP4s + poster PNGs; vectors: scatter
             plots) with their manifest, held-out evaluation, atomic checkpoints (also on SIGINT/SIGTERM).
Every random draw is a pure function of (seed, iteration, prompt slot, node), so 1 and N processes
with the same global batch, and a resumed and an uninterrupted run, compute the same thing.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

import samplers
from flowgrpo import advantages as adv_lib
from flowgrpo.checkpoint import (
    checkpoint_dirs, load_checkpoint, optimizer_from_flat, optimizer_to_flat, prune_checkpoints, save_checkpoint,
)
from flowgrpo.config import Config, ConfigError, describe_batches, learning_rate_at, plan_arguments, processes_check, to_yaml
from flowgrpo.data import draw_prompt, read_prompts, strata
from flowgrpo.errors import UserError
from flowgrpo.interrupts import Interrupted, StopSignals, denoisers
from flowgrpo.learners import Advantages, build_learner
from flowgrpo.noise_scale import GradientProbe, noise_message, noise_reading, worth_repeating
from flowgrpo.run_dir import RunWriter, check_run_config, require_video_writer
from flowgrpo.threads import startup_line
from rewards import REGISTRY, load_reward
from rewards.common import import_object
from rewards.runner import RewardRunner


@dataclass
class Batch:
    """One rollout batch of this process: its record, conditioning and prompts."""

    record: samplers.Trajectory
    cond: object  # Conditioning rows of this batch's prompts (record.cond_index points into it)
    slots: list[int]  # global prompt slot of each prompt row in the iteration
    texts: list[str]
    metadata: list[dict]
    images: torch.Tensor  # [L, 3, H, W] leaves decoded, in [0, 1] ([L, F, 3, H, W] for video models)
    rewards: list = None  # Futures of RewardResult, one per decoded chunk of leaves, in leaf order


class NoValidRewardError(UserError, RuntimeError):
    """No sample got a valid reward for train.max_iterations_without_reward iterations in a row: the entry
    points print the message (the reward, its last error, the fix) as one line, exit status 2."""


class Trainer:
    def __init__(self, cfg: Config, accelerator=None):
        from accelerate import Accelerator

        from flowgrpo.models import load_model

        self.cfg = cfg
        self.acc = accelerator or Accelerator(cpu=cfg.train.cpu, mixed_precision=cfg.train.mixed_precision)
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        processes_check(cfg, self.world)
        # one experiment per run folder: a rerun with another config is refused before anything loads
        check_run_config(cfg.run_dir, to_yaml(cfg), cfg.allow_config_change)
        self.rewards = [load_reward(spec.name, **spec.kwargs) for spec in cfg.rewards]  # fail fast, before the model
        self.modality = _model_modality(cfg.model.family)
        _check_reward_modalities(self.rewards, [spec.name for spec in cfg.rewards], cfg.eval.reward, self.modality)
        if self.modality == "video" and (cfg.log.samples_every or cfg.log.eval_samples):  # rollouts' and held-out clips
            require_video_writer()
        if cfg.model.device == "auto":
            device = self.acc.device
            cfg.model.device = "cpu" if device.type == "cpu" else str(device)
        torch.manual_seed(cfg.train.seed)  # LoRA initialisation draws from the global generator
        self.model = load_model(cfg.model)
        self.params = self.model.trainable_parameters()
        self.names = [f"p{i}" for i in range(len(self.params))]
        t = cfg.train
        self.optimizer = torch.optim.AdamW(self.params, lr=t.learning_rate, weight_decay=t.weight_decay, betas=tuple(t.adam_betas))
        self.reward_weights = torch.tensor([spec.weight for spec in cfg.rewards], dtype=torch.float32)
        plan_kwargs = plan_arguments(cfg)
        plan_kwargs.setdefault("shift", cfg.sampling.shift or self.model.shift)
        self.schedule = samplers.method_schedule(
            cfg.sampling.method, plan={**cfg.sampling.plan, "shift": plan_kwargs["shift"]},
            window=dict(cfg.sampling.window) or None, seed=t.seed,
        )
        self.prompts, self.metadata = read_prompts(cfg.prompts)
        self.strata = strata(self.metadata, t.balance_by, cfg.prompts) if t.balance_by else None
        self.ema = [p.detach().clone() for p in self.params] if t.ema_decay > 0 else None
        self.nfe = samplers.NFECounter()
        self.iteration, self.optimizer_steps, self.skipped_steps = 0, 0, 0
        self.learner = build_learner(self)  # the update rule (learner.name): flowgrpo/learners/
        self.probe = GradientProbe(self.params)  # the gradient noise scale (log.grad_noise_every)
        self._noise_said: float | None = None  # the last noise reading printed to the console (estimate or bound)
        self.writer = RunWriter(cfg.run_dir, enabled=self.acc.is_main_process, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb)
        if t.balance_by:
            self.writer.info(
                f"training prompts: {len(self.prompts)}, drawn uniformly (none carries metadata {t.balance_by!r})"
                if self.strata is None else f"training prompts: {len(self.prompts)} in {len(self.strata)} groups of "
                f"{t.balance_by!r} ({', '.join(f'{v} {len(g)}' for v, g in self.strata.items())}), each group drawn equally often")
        # rewards of batch b run in a worker thread while batch b+1 samples; a failing reward is
        # retried, then gives NaN for that batch (masked out of the loss) and a warning (advantages() reports it,
        # once per distinct error); train.max_iterations_without_reward rewardless iterations in a row stop the run
        keys = [f"{r.name}" if [x.name for x in self.rewards].count(r.name) == 1 else f"{r.name}_{i}"
                for i, r in enumerate(self.rewards)]
        self.runner = RewardRunner({k: (r, spec.weight) for k, r, spec in zip(keys, self.rewards, cfg.rewards)},
                                   retries=2, backoff_s=0.1, max_workers=1, report_failures=False)
        self._reward_errors: dict[str, str] = {}  # reward key -> its last error after retries
        self._rewardless = 0  # consecutive iterations in which no sample got a valid reward
        self._stop = False

    # ---------------------------------------------------------------- helpers
    def _velocity(self, cond):
        f = self.model.velocity_fn(cond, self.cfg.sampling.guidance_scale)

        def under_autocast(x, sigma, cond_index):  # mixed precision (train.mixed_precision) through accelerate
            with self.acc.autocast():
                return f(x, sigma, cond_index)

        return under_autocast

    def _iteration_slots(self, iteration: int) -> list[list[int]]:
        """Global prompt slots of each rollout batch for this process (whole prompts per rank)."""
        P, B = self.cfg.train.prompts_per_iteration, self.cfg.sampling.batches_per_iteration
        per = P // B
        return [list(range(b * per, (b + 1) * per))[self.rank :: self.world] for b in range(B)]

    def _dataset_index(self, iteration: int, slot: int) -> int:
        """Which prompt fills a slot (data.draw_prompt: uniform passes, or balanced over train.balance_by)."""
        position = iteration * self.cfg.train.prompts_per_iteration + slot
        return draw_prompt(position, len(self.prompts), self.cfg.train.seed, self.strata and list(self.strata.values()))

    # ---------------------------------------------------------------- SAMPLE + SCORE
    @torch.no_grad()
    def sample(self, iteration: int) -> list[Batch]:
        plan = self.schedule.plan(iteration)
        batches = []
        for slots in self._iteration_slots(iteration):
            idx = [self._dataset_index(iteration, s) for s in slots]
            texts, metadata = [self.prompts[i] for i in idx], [self.metadata[i] for i in idx]
            cond = self.model.encode_prompts(texts)
            with self.learner.sampling_weights():
                record = samplers.rollout(
                    self._velocity(cond), plan, prompt_ids=slots, latent_shape=self.model.latent_shape(),
                    seed=self.cfg.train.seed, iteration=iteration, dtype=self.model.dtype, device=self.model.device,
                    max_batch=self.cfg.sampling.max_batch, store_mean=self.learner.store_mean,
                    reduce=self.cfg.sampling.reduce, nfe=self.nfe, transitions=self.learner.needs_transitions,
                )
            if not bool(torch.isfinite(record.leaf_state).all()):
                raise RuntimeError(
                    f"the policy's samples are NaN or inf at iteration {iteration}: training diverged; lower "
                    f"train.learning_rate (now {self.cfg.train.learning_rate:g}) or keep train.grad_clip on, and restart "
                    f"from a checkpoint of {self.cfg.run_dir / 'checkpoints'} (or with resume=false)"
                )
            chunk = 64 if self.modality == "image" else 8  # a decoded video weighs F images
            leaf_texts = [texts[p] for p in record.leaf_prompt.tolist()]
            leaf_meta = [metadata[p] for p in record.leaf_prompt.tolist()]
            # each decoded chunk goes to the rewards (a worker thread) at once, so scoring overlaps the next
            # chunk's decode (measured on 2 cores: the reward wait of TempFlow's 400-odd leaves and of the video
            # default's 64 clips falls from 0.2-0.3 s to one chunk's scoring, benchmarks/bench_overhead.py)
            media, scores = [], []
            for i in range(0, record.num_leaves, chunk):
                media.append(self.model.decode(record.leaf_state[i : i + chunk]).cpu())
                scores.append(self.runner.submit(media[-1], leaf_texts[i : i + chunk], leaf_meta[i : i + chunk]))
            batch = Batch(record, cond, slots, texts, metadata, torch.cat(media), scores)
            batches.append(batch)
        return batches

    # ---------------------------------------------------------------- ADVANTAGE
    def advantages(self, batches: list[Batch]) -> tuple[Advantages, dict]:
        """Per-transition [M_b] and per-leaf [L_b] advantages of each batch (NaN = masked), and stats."""
        cfg = self.cfg.advantage
        results = [part.result() for b in batches for part in b.rewards]
        for result in results:
            for key, error in result.errors.items():
                self._reward_errors[key] = error
                self.writer.warn(f"reward {key!r} failed on a batch after retries (scores set to NaN): {error}")
        local_r = torch.cat([result.matrix().float() for result in results])
        records = [b.record.bookkeeping_on_cpu() for b in batches]  # rewards and advantages live on the CPU
        gpp = records[0].groups_per_prompt
        local_g = torch.cat([torch.tensor(b.slots)[rec.leaf_prompt] * gpp + rec.leaf_group % gpp for b, rec in zip(batches, records)])
        all_r, all_g = self.gather(local_r), self.gather(local_g)
        signal_all = adv_lib.combine_rewards(all_r, self.reward_weights, all_g, cfg.multi_reward, cfg.eps)
        leaf_adv_all, stats = adv_lib.group_zscore(signal_all, all_g, cfg.std, cfg.eps)
        stats["valid_reward_fraction"] = float(torch.isfinite(signal_all).float().mean())  # over every process's leaves
        if all_r.shape[1] > 1 and cfg.multi_reward == "gdpo":
            leaf_adv_all = signal_all.float()  # GDPO's batch z-score of the summed group z-scores is the advantage
        start = self.rank * local_r.shape[0]
        leaf_adv = leaf_adv_all[start : start + local_r.shape[0]]
        signal = signal_all[start : start + local_r.shape[0]]
        stats.update({f"reward/{r.name}_mean": float(torch.nanmean(all_r[:, k])) for k, r in enumerate(self.rewards)})
        for k, r in enumerate(self.rewards):
            valid = all_r[:, k][~all_r[:, k].isnan()]
            stats[f"reward/{r.name}_std"] = float(valid.std(unbiased=False)) if valid.numel() else float("nan")
        out, leaves, offset = [], [], 0
        tree = bool(plan_arguments(self.cfg).get("splits"))
        for rec in records:
            n = rec.num_leaves
            if tree:  # BranchGRPO: depth-wise advantages of node values
                if cfg.tree_value == "path_weighted":
                    values = adv_lib.path_weighted_values(rec, signal[offset : offset + n], cfg.tree_beta)
                else:
                    values = rec.node_values(signal[offset : offset + n])
                node_adv = adv_lib.tree_advantages(values, rec.node_depth, cfg.eps)
                t_adv, l_adv = node_adv[rec.prompt, rec.node], node_adv[rec.leaf_prompt, rec.leaf_node]
            else:  # chains and TempFlow siblings: the advantage of the leaf below x'
                t_adv, l_adv = rec.transition_values(leaf_adv[offset : offset + n]), leaf_adv[offset : offset + n]
            if cfg.best_of_n:
                keep = adv_lib.best_of_n_mask(leaf_adv[offset : offset + n], rec.leaf_group, cfg.best_of_n)
                t_adv = torch.where(rec.transition_values(keep.float()) > 0.5, t_adv, torch.full_like(t_adv, float("nan")))
                l_adv = torch.where(keep, l_adv, torch.full_like(l_adv, float("nan")))
            out.append(t_adv.clamp(-cfg.clip, cfg.clip))
            leaves.append(l_adv.clamp(-cfg.clip, cfg.clip))
            offset += n
        # statistics over every process's leaves (identical on 1 or N processes)
        stats.update({"advantage/mean": float(torch.nanmean(leaf_adv_all)),
                      "advantage/abs_mean": float(torch.nanmean(leaf_adv_all.abs())),
                      "leaf_rewards": local_r, "leaf_advantages": leaf_adv})
        return Advantages(out, leaves), stats

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return tensor
        return self.acc.gather(tensor.to(self.acc.device)).cpu()

    # ---------------------------------------------------------------- helpers for learners
    def train_velocity(self, x, sigma, cond):
        with self.acc.autocast():
            return self.model.velocity(x, sigma, cond, self.cfg.sampling.guidance_scale)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` through accelerate; the network's share of it is timed (``model.call_timer``)."""
        with self.model.call_timer.backward():
            self.acc.backward(loss)

    def optimizer_step(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.world > 1:
            for g in grads:
                torch.distributed.all_reduce(g)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.train.grad_clip) if self.cfg.train.grad_clip > 0 else \
            torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) if grads else torch.tensor(0.0)
        if float(norm) == 0.0:
            # no signal (e.g. every group's rewards tied): skip the step, or Adam would move the weights
            # on its momentum alone (measured on the analytic world: a converged policy drifted off its
            # target after a few such steps and collapsed)
            self.skipped_steps += 1
            return 0.0
        self.optimizer.step()
        self.optimizer_steps += 1
        if self.ema is not None:
            with torch.no_grad():
                for e, p in zip(self.ema, self.params):
                    e.lerp_(p.detach(), 1 - self.cfg.train.ema_decay)
        self.learner.after_optimizer_step()
        return float(norm)

    class _Swap:
        def __init__(self, params, values):
            self.params, self.values = params, values

        def __enter__(self):
            self.saved = [p.detach().clone() for p in self.params]
            with torch.no_grad():
                for p, v in zip(self.params, self.values):
                    p.copy_(v)

        def __exit__(self, *exc):
            with torch.no_grad():
                for p, v in zip(self.params, self.saved):
                    p.copy_(v)

    def swapped(self, values):
        return self._Swap(self.params, values)

    # ---------------------------------------------------------------- EVAL, SAVE, RESUME
    def evaluate(self) -> dict:
        from flowgrpo.evaluate import evaluate

        e = self.cfg.eval
        prompts, metadata = read_prompts(e.prompts, e.limit)
        context = self.swapped(self.ema) if self.ema is not None else nullcontext()
        seed = self.cfg.train.seed + 12345
        with context, self.acc.autocast():  # a labelled bar: the base model's evaluation takes a while before iteration 1
            summary, media, scores = evaluate(self.model, prompts, e.reward, metadata, seed=seed, steps=e.steps,
                                              batch_size=e.batch_size, progress=self.cfg.log.progress,
                                              desc=f"held-out eval (iteration {self.iteration})")
        strict = f"; strict accuracy {summary['strict_accuracy']:.3f}" if "strict_accuracy" in summary else ""
        self.writer.info(f"held-out {e.reward} at iteration {self.iteration}: {summary['mean_score']:.3f} "
                         f"({summary['num_images']} samples{strict})")
        self.writer.write_eval_scores(self.iteration, scores, [m.get("task", "all") for m in metadata] if metadata else None)
        n = self.cfg.log.eval_samples
        if n:  # the same first n held-out prompts and seeds every time: the gallery compares steps
            first: dict[str, int] = {}  # samples of the same prompt form a group in the preview
            same_prompt = torch.tensor([first.setdefault(p, len(first)) for p in prompts])
            shown = self.model.preview(media, same_prompt, prompts)[:n]
            self.writer.write_eval_samples(self.iteration, shown, prompts[:n], metadata[:n] if metadata else None,
                                           scores[:n], e.reward, seed, fps=self.cfg.log.video_fps)
        return {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))} | {
            f"eval/per_task/{k}": v for k, v in summary.get("per_task", {}).items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"weights.{n}": p for n, p in zip(self.names, self.params)}
        optim_tensors, _ = optimizer_to_flat(self.optimizer)
        tensors.update(optim_tensors)
        if self.ema is not None:
            tensors.update({f"ema.{n}": v for n, v in zip(self.names, self.ema)})
        tensors.update(self.learner.state_tensors())
        return tensors

    def save(self) -> None:
        if not self.acc.is_main_process:
            self.acc.wait_for_everyone()
            return
        _, optim_meta = optimizer_to_flat(self.optimizer)
        state = {"iteration": self.iteration, "optimizer_steps": self.optimizer_steps, "optimizer": optim_meta,
                 "schedule": self.schedule.state_dict(), "nfe": self.nfe.state_dict(), "config": to_yaml(self.cfg),
                 "learner": self.learner.state_dict()}
        def evaluation_weights(tmp):  # model/: LoRA (diffusers format) or full weights, EMA if kept
            with self.swapped(self.ema) if self.ema is not None else nullcontext():
                self.model.save_trainable(tmp / "model")

        save_checkpoint(self.cfg.run_dir / "checkpoints" / f"step_{self.iteration}", self.state_tensors(), state,
                        extra=evaluation_weights)
        prune_checkpoints(self.cfg.run_dir, self.cfg.log.keep_checkpoints)
        self.acc.wait_for_everyone()

    def resume(self) -> bool:
        found = checkpoint_dirs(self.cfg.run_dir)
        if not (self.cfg.resume and found):
            return False
        tensors, state = load_checkpoint(found[-1])
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p.copy_(tensors[f"weights.{n}"])
            for n, v in zip(self.names, self.ema or []):
                v.copy_(tensors[f"ema.{n}"])
        self.learner.load_state_tensors(tensors)
        self.learner.load_state_dict(state.get("learner", {}))
        optimizer_from_flat(self.optimizer, tensors, state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.nfe.load_state_dict(state["nfe"])
        self.iteration, self.optimizer_steps = state["iteration"], state["optimizer_steps"]
        self.writer.info(f"resumed from {found[-1]} (iteration {self.iteration})")
        return True

    def _noise_report(self) -> dict:
        """The running gradient noise scale, in prompts per optimizer step, and one line when the batch is below it."""
        per_step = self.cfg.train.prompts_per_iteration // self.cfg.train.updates_per_epoch
        noise = self.probe.scale.value
        out = {"grad_noise/batch_prompts": per_step}
        if noise is not None:
            out["grad_noise/B_noise_prompts"] = noise
        if len(self.probe.scale.points) >= 3 and (noise is None or noise > per_step):
            bound = self.probe.scale.lower_bound
            reading = noise_reading(noise, bound)
            news = worth_repeating(self._noise_said, reading)
            if news:
                self._noise_said = reading
            self.writer.info(noise_message(noise, per_step, bound, forward_learner=not self.learner.needs_transitions),
                             console=news)
        elif noise is not None:
            self._noise_said = None  # the batch is above the noise scale: the next reading below it is news
        return out

    def request_stop(self, reason: str) -> None:
        """Stop after the iteration under way, saving a checkpoint of it (SIGINT/SIGTERM stop sooner: _on_signal)."""
        self.writer.warn(f"{reason}: saving a checkpoint after this iteration, then stopping")
        self._stop = True

    def _on_signal(self, signum: int) -> None:
        """SIGINT/SIGTERM (flowgrpo/interrupts.py): one process stops at its next model call, in a state a
        checkpoint can hold; several stop together after the iteration under way (collectives must match)."""
        self._stop = True

    def _checkpointable(self) -> bool:
        """Whether the live state is a finished iteration's (no optimizer step taken since), so a signal may stop here."""
        return self.world == 1 and self.optimizer_steps + self.skipped_steps == self._steps_at_checkpointable

    def _no_reward_message(self, iteration: int, local_rewards: torch.Tensor) -> str:
        """Which reward gave nothing (local_rewards [L, K]) and its last error, and the two ways on."""
        n = self.cfg.train.max_iterations_without_reward
        parts = []
        for k, (key, spec) in enumerate(zip(self.runner.rewards, self.cfg.rewards)):
            if not bool(local_rewards[:, k].isnan().all()):
                continue
            who = f"reward {key!r}" + (f" ({spec.name})" if spec.name != key else "")
            error = self._reward_errors.get(key)
            parts.append(f"{who} failed on every call; its last error: {error}" if error else
                         f"{who} returned NaN (not applicable) for every sample")
        if not parts:
            parts = [f"no sample had a finite score in every reward ({', '.join(self.runner.rewards)})"]
        saved = checkpoint_dirs(self.cfg.run_dir)
        where = f"the newest checkpoint is {saved[-1]}" if saved else "no checkpoint was saved"
        return (f"no valid reward in {n} iterations in a row (iterations {iteration - n + 2}-{iteration + 1}): "
                + "; ".join(parts) + f". The run stopped without a checkpoint of these iterations ({where}); fix the "
                "reward and rerun the same command (it resumes from the newest checkpoint), or raise "
                "train.max_iterations_without_reward (0 = never stop)")

    # ---------------------------------------------------------------- the loop
    def step(self, iteration: int) -> dict:
        """One iteration: SAMPLE -> SCORE -> ADVANTAGE -> UPDATE -> LOG (evaluation when due)."""
        cfg = self.cfg
        self.iteration = iteration
        self._steps_at_checkpointable = self.optimizer_steps + self.skipped_steps  # a signal stops at the next model call
        for group in self.optimizer.param_groups:  # a function of the iteration alone: a resumed run continues it
            group["lr"] = learning_rate_at(cfg.train, iteration)
        timer = self.model.call_timer  # time inside the network's calls, per phase (the rest is overhead)
        times, started, model_start = {}, time.time(), timer.totals()
        batches = self.sample(iteration)
        times["time/sample"] = time.time() - started
        model_sampled = timer.totals()
        t0 = time.time()
        advantages, stats = self.advantages(batches)
        times["time/score_wait_and_advantage"] = time.time() - t0
        self._rewardless = self._rewardless + 1 if stats["valid_reward_fraction"] == 0 else 0
        limit = cfg.train.max_iterations_without_reward
        if limit and self._rewardless >= limit:  # a dead reward: stop before training on nothing again
            raise NoValidRewardError(self._no_reward_message(iteration, stats["leaf_rewards"]))
        t0 = time.time()
        every = cfg.log.grad_noise_every
        self.probe.active = bool(every) and iteration % every == every - 1
        metrics = self.learner.update(batches, advantages)
        self.learner.after_iteration()
        if self.probe.active:
            metrics.update(self._noise_report())
        times["time/update"] = time.time() - t0
        sampling, updating = timer.delta(model_sampled, model_start), timer.delta(timer.totals(), model_sampled)
        times["time/model_sample"] = sampling["total"]
        times["time/model_update_forward"] = updating["forward"]
        times["time/model_update_backward"] = updating["backward"]
        self.iteration = iteration + 1
        self._steps_at_checkpointable = self.optimizer_steps + self.skipped_steps  # the update is done: checkpointable again
        leaf_rewards, leaf_adv = stats.pop("leaf_rewards"), stats.pop("leaf_advantages")
        metrics.update(stats)
        metrics.update(times)
        metrics.update({f"nfe/{k}": v for k, v in self.nfe.as_dict().items()})
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        if cfg.log.samples_every and self.iteration % cfg.log.samples_every == 0:
            self.writer.write_samples(self.iteration, batches, leaf_rewards, leaf_adv, [r.name for r in self.rewards],
                                      cfg.log.samples_per_prompt, cfg.train.seed, cfg.log.video_fps, self.model.preview,
                                      sampled_iteration=iteration,
                                      shared_noise=plan_arguments(cfg).get("initial_noise", "shared") == "shared")
        final = self.iteration == cfg.train.iterations
        if (cfg.eval.every and self.iteration % cfg.eval.every == 0) or final:
            if self.acc.is_main_process:
                try:
                    metrics.update(self.evaluate())
                except Interrupted:  # this iteration's training is done: logged and saved without its evaluation
                    pass
            self.acc.wait_for_everyone()
        metrics["time/iteration"] = time.time() - started
        self.writer.log(self.iteration, metrics)
        return metrics

    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.resume()
        plan0 = self.schedule.plan(self.iteration)
        counts = plan0.counts() if hasattr(plan0, "counts") else {}
        self.writer.info(describe_batches(cfg, self.world, counts.get("leaves", 0), counts.get("trained", 0)))
        self.writer.info(startup_line())  # torch's CPU threads and why (flowgrpo/threads.py)
        self.writer.write_config(to_yaml(cfg), self.iteration)  # a changed config goes to config_history.jsonl
        # SIGINT/SIGTERM: stop at the next model call, save, and tell the entry point (flowgrpo/interrupts.py)
        self._steps_at_checkpointable = self.optimizer_steps + self.skipped_steps
        signals = StopSignals(denoisers(self.model), ready=self._checkpointable, on_signal=self._on_signal).install()
        last = {}
        if cfg.eval.at_start and not resumed and self.acc.is_main_process:
            try:
                last = self.evaluate()
            except BaseException as stop:
                signals.remove()
                if not isinstance(stop, Interrupted):
                    raise
                self.runner.close()  # stopped in the first evaluation: nothing trained, nothing to save
                self.writer.close()
                saved = checkpoint_dirs(cfg.run_dir)
                raise Interrupted(stop.signum, self.iteration, cfg.train.iterations, None,
                                  saved[-1] if saved else None) from None
            self.writer.log(0, last)
        # counted by hand after each finished iteration, so the count is true when the loop stops early
        bar = tqdm(desc="grpo", initial=self.iteration, total=cfg.train.iterations,
                   disable=not (cfg.log.progress and self.acc.is_main_process))
        recent: list[float] = []  # training reward of the last 5 iterations (the bar's running mean)
        held_out = last.get("eval/mean_score")
        try:
            for iteration in range(self.iteration, cfg.train.iterations):
                nfe = self.nfe.state_dict()
                try:
                    last = self.step(iteration)
                except Interrupted:  # before the iteration's first optimizer step: the state is the last finished one's
                    self.nfe.load_state_dict(nfe)  # (the plan schedule and every draw are pure functions of the iteration)
                    self.iteration = iteration
                    if last.get("valid_reward_fraction") != 0:
                        self.save()
                    break
                bar.update(1)
                recent = (recent + [last.get("reward/" + self.rewards[0].name + "_mean", float("nan"))])[-5:]
                held_out = last.get("eval/mean_score", held_out)
                postfix = {"reward": f"{sum(recent) / len(recent):.3f}"}
                if held_out is not None:
                    postfix["held-out"] = f"{held_out:.3f}"
                bar.set_postfix(postfix)
                final = self.iteration == cfg.train.iterations
                if final or self._stop or (cfg.log.save_every and self.iteration % cfg.log.save_every == 0):
                    if last["valid_reward_fraction"] == 0:  # its weights are the last checkpoint's; never save it
                        self.writer.warn("an iteration in which no sample got a valid reward trained on nothing: "
                                         "no checkpoint is saved for it")
                    else:
                        self.save()
                if self._stop:
                    break
        finally:  # also when a dead reward stops the run: the bar ends at the iterations done, repeats are counted
            signals.remove()
            bar.close()
            self.runner.close()
            self.writer.close()
        if signals.signum is not None and self.iteration < cfg.train.iterations:  # the entry point prints where it stopped
            saved = checkpoint_dirs(cfg.run_dir)
            newest = saved[-1] if saved else None
            raise Interrupted(signals.signum, self.iteration, cfg.train.iterations,
                              newest if newest is not None and newest.name == f"step_{self.iteration}" else None, newest)
        if self.acc.is_main_process:
            self._summary()
        if cfg.log.gallery and self.acc.is_main_process and (self.writer.dir / "samples").is_dir():
            from gallery.build import build_site

            try:
                site = build_site(self.writer.dir)
                self.writer.info(f"gallery: {site} (serve it with: python -m gallery {self.writer.dir} --serve)")
                self.writer.info(f"compare the base model with the last step: open {site}#view=compare (or, served, "
                                 "http://127.0.0.1:8000/#view=compare)")
            except Exception as err:  # a finished run never fails because of its review site
                self.writer.warn(f"the gallery could not be built ({err!r}); run: python -m gallery {self.writer.dir}")
        return last

    def _summary(self) -> None:
        """The end-of-run before/after lines: the first and last held-out evaluation of this run folder."""
        from flowgrpo.evaluate import before_after, before_after_lines, second_half_level

        evaluations = self.writer.read_eval_scores()
        if len(evaluations) < 2 or evaluations[0]["scores"].shape != evaluations[-1]["scores"].shape:
            return
        first, final = evaluations[0], evaluations[-1]
        stats = before_after(first["scores"], final["scores"], first.get("tasks"))
        for line in before_after_lines(stats, self.cfg.eval.reward, first["iteration"], final["iteration"]):
            self.writer.info(line)
        same = [e for e in evaluations if e["scores"].shape == first["scores"].shape]
        level = second_half_level(same)
        if level["evaluations"] > 1:  # one evaluation of a step-function score scatters; their mean holds still
            (m, _), (c, c_se), (a, b) = level["end"], level["change"], level["iterations"]
            self.writer.info(f"  over the second half (iterations {a}-{b}, {level['evaluations']} evaluations averaged per "
                             f"sample): {m:.3f} (change {c:+.3f} ± {c_se:.3f})")


def _model_modality(family: str) -> str:
    from flowgrpo.models.config import _family_class

    return _family_class(family).modality


_EXAMPLE_REWARD = {"image": "toy", "video": "toy_video", "vector": "analytic_hit"}


def _takes(reward_modality: str, modality: str) -> bool:
    """Whether a reward of ``reward_modality`` scores what a model of ``modality`` makes ("both" = pictures)."""
    return reward_modality == modality or (reward_modality == "both" and modality in ("image", "video"))


def _check_reward_modalities(rewards, names: list[str], eval_reward: str, modality: str) -> None:
    """A reward must take what the model makes (images, videos or vectors): fail at start-up, naming the fix."""
    for reward, name in zip(rewards, names):
        theirs = getattr(reward, "modality", "both")
        if not _takes(theirs, modality):
            fix = (f"rewards=[{{name: per_frame, kwargs: {{reward: {name}}}}}] scores it frame by frame, or use a "
                   "video reward such as toy_video" if modality == "video" and theirs == "image" else
                   f"use a {modality} reward such as {_EXAMPLE_REWARD[modality]}")
            raise ConfigError(f"reward {name!r} scores {theirs if theirs != 'both' else 'picture'}s but the model "
                              f"makes {modality}s; {fix}")
    try:
        eval_modality = getattr(import_object(REGISTRY.get(eval_reward, eval_reward)), "modality", "both")
    except (ValueError, ImportError):
        return  # a bad name fails with load_reward's own message when evaluation runs
    if not _takes(eval_modality, modality):
        raise ConfigError(f"eval.reward={eval_reward!r} scores {eval_modality}s but the model makes {modality}s; "
                          f"set eval.reward to a {modality} reward such as {_EXAMPLE_REWARD[modality]} (and "
                          "eval.prompts to match)")


def train(cfg: Config) -> dict:
    return Trainer(cfg).train()
