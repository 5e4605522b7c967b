"""The training loop for flow-matching models: ``accelerate launch train_t2i.py`` (``train_t2v.py``).

Each iteration is a recipe of five phases, each a call into the module that owns it:
  SAMPLE     the iteration's plan (samplers.build_schedule) is run by the tree executor for this
             process's prompts (whole groups per process), with the weights the learner samples with;
             leaves are decoded and sent to the rewards at once (rollout.py)
  SCORE      rewards run in a worker thread while the next chunk decodes and the next batch samples;
             failures become NaN and a warning, a dead reward stops the run (scoring.py)
  ADVANTAGE  the rewards of the whole iteration (gathered over processes) become advantages: group
             z-scores, GDPO, BranchGRPO's tree values, best-of-N, clipping (credit.py)
  UPDATE     the learner (learner.name, learners/) takes its optimizer steps through the policy: the
             trainable model and every copy of its weights (policy.py)
  LOG/SAVE   metrics.jsonl (+ TensorBoard), samples with their manifest, held-out evaluation
             (evaluation.py), atomic checkpoints (checkpointing.py), also on SIGINT/SIGTERM
Every random draw is a pure function of (seed, iteration, prompt slot, node), so 1 and N processes
with the same global batch, and a resumed and an uninterrupted run, compute the same thing.
"""

from __future__ import annotations

import math
import time

import torch
from tqdm.auto import tqdm

from flowgrpo.config import Config, processes_check, schema_defaults, to_yaml
from flowgrpo.data import read_prompts, report_training_prompts, strata
from flowgrpo.engine import checkpointing, credit, rollout
from flowgrpo.models.copies import warmed_decay
from flowgrpo.engine.evaluation import HeldOut
from flowgrpo.engine.learners import Rollouts, build_learner
from flowgrpo.engine.noise_scale import NoiseReport
from flowgrpo.engine.optim import learning_rate_at
from flowgrpo.engine.rollout import describe_batches, plan_schedule
from flowgrpo.engine.policy import Policy
from flowgrpo.engine.scoring import Scoring
from flowgrpo.engine.throughput import Throughput
from flowgrpo.memory import check_before_rollout
from flowgrpo.run.checkpoint import checkpoint_dirs
from flowgrpo.run.launch import check_launch, launched_without_accelerator
from flowgrpo.run.interrupts import Interrupted, StopSignals, denoisers
from flowgrpo.run.run_dir import RunWriter, check_run_config, require_video_writer
from flowgrpo.run.threads import startup_line


class Trainer:
    def __init__(self, cfg: Config, accelerator=None):
        from accelerate import Accelerator

        from flowgrpo.models import load_model
        from flowgrpo.models.families import FAMILIES

        self.cfg, t = cfg, cfg.train
        self.acc = accelerator or Accelerator(cpu=t.cpu or launched_without_accelerator(),
                                              mixed_precision=t.mixed_precision)
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        check_launch(self.acc, cfg)
        processes_check(cfg, self.world)
        # one experiment per run folder: a rerun with another config is refused before anything loads
        check_run_config(cfg.run_dir, to_yaml(cfg), cfg.allow_config_change, schema_defaults())
        self.modality = FAMILIES[cfg.model.family].modality
        self.scoring = Scoring(cfg, self.modality)  # every reward loads (and fails) before the model
        if self.modality == "video" and (cfg.log.samples_every or cfg.log.eval_samples):  # rollouts' and held-out clips
            require_video_writer()
        if cfg.model.device == "auto":
            device = self.acc.device
            cfg.model.device = "cpu" if device.type == "cpu" else str(device)
        torch.manual_seed(t.seed)  # LoRA initialisation draws from the global generator
        self.model = load_model(cfg.model)
        # log.mfu: one pass's FLOPs counted (before model.compile, which the policy applies) and the device's peak
        self.throughput = Throughput(self.model, t.mixed_precision) if cfg.log.mfu else None
        self.policy = Policy(self.model, self.acc, learning_rate=t.learning_rate, weight_decay=t.weight_decay,
                             adam_betas=t.adam_betas, grad_clip=t.grad_clip, optimizer=t.optimizer,
                             merge_lora=cfg.sampling.merge_lora, context_parallel=t.context_parallel,
                             context_parallel_ring=t.context_parallel_ring, activation_offload=t.activation_offload)
        cfg.sampling.chunk = rollout.chunk_of(cfg, self.model, self.world, self.policy.sharding is not None)
        # the held-out evaluation's weights: an EMA of the trained ones, updated after every optimizer step
        self.ema = self.policy.copy("ema", warmed_decay(t.ema_decay)) if t.ema_decay > 0 else None
        self.schedule = plan_schedule(cfg, self.model)
        prompts, metadata = read_prompts(cfg.prompts)
        groups = strata(metadata, t.balance_by, cfg.prompts) if t.balance_by else None
        self.draws = rollout.PromptDraws(prompts, metadata, groups, t, cfg.sampling.batches_per_iteration,
                                         self.policy.layout.data_rank, self.policy.layout.data_world)
        self.learner = build_learner(cfg, self.policy)  # the update rule (learner.name): flowgrpo/engine/learners/
        self.writer = RunWriter(cfg.run_dir, enabled=self.acc.is_main_process, tensorboard=cfg.log.tensorboard,
                                wandb=cfg.log.wandb)
        self.scoring.writer = self.writer
        self.held_out = HeldOut(cfg, self.writer, self.modality)
        self.noise = NoiseReport(self.policy.probe, t.prompts_per_iteration // t.updates_per_epoch,
                                 forward_learner=not self.learner.needs_transitions)
        report_training_prompts(self.writer, cfg, len(prompts), groups, self.model)
        self.iteration, self._stop = 0, False
        self._rewards: list[float] = []  # the training reward of each iteration this process ran (the watch's rise)

    # ---------------------------------------------------------------- one iteration
    def sample(self, iteration: int, plan) -> list[rollout.Batch]:
        """SAMPLE: this process's rollout batches of ``iteration`` under ``plan``, their rewards on their way."""
        return rollout.sample(iteration, plan, self.draws, self.policy, self.learner, self.scoring, self.cfg, self.modality)

    def assign_credit(self, batches: list[rollout.Batch], plan) -> tuple[credit.Advantages, dict]:
        """SCORE's results and ADVANTAGE: the iteration's rewards, advantages and their statistics."""
        layout = self.policy.layout  # a context group's first process decoded and scored; the others get its results
        local_rewards, features = layout.from_leader(lambda: (self.scoring.collect([p for b in batches for p in b.rewards]),
                                                              credit.leaf_features([b.images for b in batches])
                                                              if self.cfg.advantage.diversity else None))
        records = [b.record.bookkeeping_on_cpu() for b in batches]  # rewards and advantages live on the CPU
        advantages, stats = credit.assign(records, [b.keys for b in batches], local_rewards, self.scoring.weights,
                                          self.cfg.advantage, plan.branches, self.policy.gather, layout.data_rank, features)
        stats.update(self.scoring.statistics(stats.pop("all_rewards")))
        return advantages, stats

    def step(self, iteration: int) -> dict:
        """One iteration: SAMPLE -> SCORE -> ADVANTAGE -> UPDATE -> LOG (evaluation when due)."""
        cfg, policy, timer = self.cfg, self.policy, self.model.call_timer
        self.iteration = iteration
        self._steps_at_checkpointable = policy.optimizer_steps + policy.skipped_steps  # a signal stops at the next model call
        for group in policy.optimizer.param_groups:  # a function of the iteration alone: a resumed run continues it
            group["lr"] = learning_rate_at(cfg.train, iteration)
        times, started, model_start = {}, time.time(), timer.totals()  # model time per phase (the rest is overhead)
        plan = self.schedule.plan(iteration)
        batches = self.sample(iteration, plan)
        times["time/sample"], model_sampled = time.time() - started, timer.totals()
        t0 = time.time()
        advantages, stats = self.assign_credit(batches, plan)
        times["time/score_wait_and_advantage"] = time.time() - t0
        self.scoring.check_alive(iteration, stats["valid_reward_fraction"], stats["leaf_rewards"])
        t0 = time.time()
        every = cfg.log.grad_noise_every
        policy.probe.active = bool(every) and iteration % every == every - 1
        metrics = self.learner.update(Rollouts(iteration, plan, batches, advantages))
        policy.end_iteration()  # the copies that follow once per iteration (NFT's θ_old, AWM's EMA)
        if policy.probe.active:
            metrics.update(self.noise.report(self.writer))
        times["time/update"] = time.time() - t0
        sampling, updating = timer.delta(model_sampled, model_start), timer.delta(timer.totals(), model_sampled)
        times.update({"time/model_sample": sampling["total"], "time/model_update_forward": updating["forward"],
                      "time/model_update_backward": updating["backward"]})
        images = sum(b.record.num_leaves for b in batches)
        self.iteration = iteration + 1
        self._steps_at_checkpointable = policy.optimizer_steps + policy.skipped_steps  # the update is done
        leaf_rewards, leaf_adv = stats.pop("leaf_rewards"), stats.pop("leaf_advantages")
        metrics.update(stats)
        metrics.update(times)
        metrics.update({f"nfe/{k}": v for k, v in policy.nfe.as_dict().items()})
        metrics["lr"] = policy.optimizer.param_groups[0]["lr"]
        if cfg.log.samples_every and self.iteration % cfg.log.samples_every == 0:
            self.writer.write_samples(self.iteration, batches, leaf_rewards, leaf_adv, self.scoring.names,
                                      cfg.log.samples_per_prompt, cfg.train.seed, cfg.log.video_fps, self.model.preview,
                                      sampled_iteration=iteration, shared_noise=plan.initial_noise == "shared")
        self._rewards.append(self.scoring.objective(metrics))
        if (cfg.eval.every and self.iteration % cfg.eval.every == 0) or self.iteration == cfg.train.iterations:
            try:  # every process evaluates its share of the held-out prompts
                metrics.update(self.evaluate())
            except Interrupted:  # this iteration's training is done: logged and saved without its evaluation
                pass
            self.acc.wait_for_everyone()
        metrics["time/iteration"] = time.time() - started
        if self.throughput is not None:
            metrics.update(self.throughput.metrics(images, metrics["time/iteration"], sampling, updating))
        self.writer.log(self.iteration, metrics)
        return metrics

    # ---------------------------------------------------------------- evaluation, checkpoints, stopping
    def evaluate(self) -> dict:
        """The held-out evaluation now, with the evaluation weights (the EMA when kept); its watch alarms stop the
        run (with a checkpoint) when eval.stop_on_hacking is set."""
        metrics = self.held_out.evaluate(self.policy, self.ema, self.iteration, self._training_rise())
        if self.held_out.alarms and self.cfg.eval.stop_on_hacking:
            self.writer.warn(f"stopping at iteration {self.iteration}: eval.stop_on_hacking is set and the watch raised "
                             f"{len(self.held_out.alarms)} alarm(s); the run resumes with the same command (set "
                             "eval.stop_on_hacking=false to go on)")
            self._stop = True
        return metrics

    def _training_rise(self) -> tuple[float, float] | None:
        """The training reward (the first reward's mean, the same on every process) at this process's first iteration
        and over the last five: every process makes the same stop decision. A resumed run counts from its resume."""
        values = [v for v in self._rewards if math.isfinite(v)]
        if len(values) < 2:
            return None
        recent = values[-5:]
        return values[0], sum(recent) / len(recent)

    def save(self) -> None:
        """A checkpoint of the iteration done: every process calls it (sharded, each writes its rows)."""
        checkpointing.save(self.cfg, self.policy, self.schedule, self.iteration, self.ema, to_yaml(self.cfg), self.learner)
        self.acc.wait_for_everyone()

    def resume(self) -> bool:
        found = checkpointing.resume(self.cfg, self.policy, self.schedule, self.learner)
        if found is None:
            return False
        folder, self.iteration = found
        self.writer.info(f"resumed from {folder} (iteration {self.iteration})")
        return True

    def request_stop(self, reason: str) -> None:
        """Stop after the iteration under way, saving a checkpoint of it (SIGINT/SIGTERM stop sooner: _on_signal)."""
        self.writer.warn(f"{reason}: saving a checkpoint after this iteration, then stopping")
        self._stop = True

    def _on_signal(self, signum: int) -> None:
        """SIGINT/SIGTERM (flowgrpo/run/interrupts.py): one process stops at its next model call, in a state a
        checkpoint can hold; several stop together after the iteration under way (collectives must match)."""
        self._stop = True

    def _checkpointable(self) -> bool:
        """Whether the live state is a finished iteration's (no optimizer step taken since), so a signal may stop here."""
        return self.world == 1 and self.policy.optimizer_steps + self.policy.skipped_steps == self._steps_at_checkpointable

    def _interrupted(self, signum: int) -> Interrupted:
        saved = checkpoint_dirs(self.cfg.run_dir)
        newest = saved[-1] if saved else None
        here = newest if newest is not None and newest.name == f"step_{self.iteration}" else None
        return Interrupted(signum, self.iteration, self.cfg.train.iterations, here, newest)

    # ---------------------------------------------------------------- the run
    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.resume()
        first = self.schedule.plan(self.iteration)
        counts = first.counts()
        # before the first rollout: a run that cannot fit the device is refused with the numbers (flowgrpo/memory/check.py)
        check_before_rollout(cfg, self.model, self.world, self.policy.sharding is not None, counts["leaves"],
                             first.num_steps, self.writer.warn)
        self.writer.info(describe_batches(cfg, self.world, counts["leaves"],
                                          self.learner.describe(counts["leaves"], counts["trained"])))
        self.writer.info(startup_line())  # torch's CPU threads and why (flowgrpo/run/threads.py)
        self.writer.write_config(to_yaml(cfg), self.iteration, schema_defaults())  # changes: config_history.jsonl
        # SIGINT/SIGTERM: stop at the next model call, save, and tell the entry point (flowgrpo/run/interrupts.py)
        self._steps_at_checkpointable = self.policy.optimizer_steps + self.policy.skipped_steps
        signals = StopSignals(denoisers(self.model), ready=self._checkpointable, on_signal=self._on_signal).install()
        last = {}
        if cfg.eval.at_start and not resumed:  # every process: its share of the prompts
            try:
                last = self.evaluate()
            except BaseException as stop:
                signals.remove()
                self.scoring.close()  # stopped in the first evaluation: nothing trained, nothing to save
                self.writer.close()
                if not isinstance(stop, Interrupted):
                    raise
                saved = checkpoint_dirs(cfg.run_dir)
                raise Interrupted(stop.signum, self.iteration, cfg.train.iterations, None,
                                  saved[-1] if saved else None) from None
            self.writer.log(0, last)
        # counted by hand after each finished iteration, so the count is true when the loop stops early
        bar = tqdm(desc="grpo", initial=self.iteration, total=cfg.train.iterations,
                   disable=not (cfg.log.progress and self.acc.is_main_process))
        recent: list[float] = []  # training reward of the last 5 iterations (the bar's running mean)
        tied: list[float] = []  # fraction of groups with equal rewards in the last 5 iterations
        held_out = last.get("eval/mean_score")
        try:
            for iteration in range(self.iteration, cfg.train.iterations):
                nfe = self.policy.nfe.state_dict()
                try:
                    last = self.step(iteration)
                except Interrupted:  # before the iteration's first optimizer step: the state is the last finished one's
                    self.policy.nfe.load_state_dict(nfe)  # (the plan schedule and every draw are functions of the iteration)
                    self.iteration = iteration
                    if last.get("valid_reward_fraction") != 0:
                        self.save()
                    break
                bar.update(1)
                recent = (recent + [last.get(f"reward/{self.scoring.names[0]}_mean", float("nan"))])[-5:]
                held_out = last.get("eval/mean_score", held_out)
                tied = (tied + [last.get("zero_std_group_fraction", 0.0)])[-5:]
                bar.set_postfix({"reward": f"{sum(recent) / len(recent):.3f}"} |
                                ({"held-out": f"{held_out:.3f}"} if held_out is not None else {}) |
                                ({"tied": f"{tied[-1]:.0%}"} if tied[-1] > 0 else {}))
                self.scoring.report_ties(self.iteration, tied)
                if self.iteration == cfg.train.iterations or self._stop or (
                        cfg.log.save_every and self.iteration % cfg.log.save_every == 0):
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
            self.scoring.close()
            self.writer.close()
        if signals.signum is not None and self.iteration < cfg.train.iterations:  # the entry point prints where it stopped
            raise self._interrupted(signals.signum)
        if self.acc.is_main_process:
            for line in self.held_out.summary_lines():
                self.writer.info(line)
        return last


def train(cfg: Config) -> dict:
    return Trainer(cfg).train()
