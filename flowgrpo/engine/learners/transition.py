"""The transition learner: the denoising-MDP GRPO loss on stored SDE transitions (docs/math.md §3).

For every trained transition (sample i, step j) of the rollout, μ_θ is recomputed from the stored
state with the very kernel the rollout used (flowgrpo.likelihood: PyTorch reference or the fused op), the
ratio ρ = exp(lp_θ − lp_old) (plain, or GRPO-Guard's normalised one) is PPO-clipped against the
advantage of the transition's x' node, multiplied by the plan's weight (TempFlow) and the step weight
(GRPO-Guard 1/Δ, SAGE's equaliser), KL terms are added (reference: exact or Flow-GRPO's variant;
SAGE: a moving anchor and the rollout policy), normalised per group or tree, accumulated over
micro-batches and stepped. Flow-GRPO (Liu et al. 2025), DanceGRPO, MixGRPO, BranchGRPO, TempFlow-GRPO,
GRPO-Guard and SAGE-GRPO all train this way; they differ in their plans and these options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import samplers
from flowgrpo import likelihood
from flowgrpo.models.copies import refresh_every
from flowgrpo.engine.learners.base import Learner, Rollouts, Step, deal_samples, seeded_permutation
from flowgrpo.engine.learners.replay import ReplayBuffer
from flowgrpo.engine.loss import SageKLWeight, clipped_policy_loss, gaussian_kl, kl_masked_policy_loss, step_weights
from flowgrpo.engine.policy import REFERENCE
from samplers.grids import STREAM_UPDATE_ORDER


@dataclass(frozen=True)
class TransitionRow:
    """One trained transition of the iteration: where it is stored and what it trains with."""

    batch: int  # rollout batch index
    row: int  # transition index in the batch's record
    advantage: float  # the advantage of its x' node
    weight: float  # the plan's loss weight times the step weight (the policy term's)
    group: int  # global advantage group (prompt slot · groups per prompt + local group)
    slot: int  # the prompt slot of the iteration
    coef: float = 0.0  # its share of the iteration's loss (1 / (group's transitions · groups) or 1 / transitions)
    replayed: float = 0.0  # a replayed sample's importance weight (learner.replay; already in ``weight``), 0: fresh

    def with_coef(self, coef: float) -> "TransitionRow":
        """This row with its share of the loss (dataclasses.replace, without its per-call field lookup: an iteration
        has thousands of rows)."""
        return TransitionRow(self.batch, self.row, self.advantage, self.weight, self.group, self.slot, coef, self.replayed)


# a sharded process without a transition this iteration trains this zero-weight stand-in (its loss times 0)
STAND_IN = TransitionRow(0, 0, 0.0, 0.0, -1, -1)


@dataclass
class TransitionWork:
    """An iteration's trained transitions (``TransitionLearner.prepare``)."""

    iteration: int
    batches: list  # the rollout batches
    rows: list[TransitionRow]
    tied: set  # indices of rows of tied groups: in the normalisation, never computed
    group_ids: list[int]
    chains: list[tuple]  # per row: its sample (batch, prompt slot, root node)
    trained: int  # rows trained (not tied)


class TransitionLearner(Learner):
    name = "transition"
    needs_transitions = True
    contract = ("ratio_dev", "max_abs_ratio_minus_1_epoch0")
    trained_metric = "trained_transitions"

    def __init__(self, cfg, policy):
        super().__init__(cfg, policy)
        loss = cfg.loss
        # SAGE's moving anchor: a copy of the policy refreshed every loss.anchor_refresh optimizer steps
        self.anchor = policy.copy("anchor", refresh_every(loss.anchor_refresh)) if loss.anchor_kl_coef > 0 else None
        # SAGE's adaptive weight of its two KL terms (loss.anchor_kl_schedule=sage), one report per trained transition
        self.kl_weight = SageKLWeight(loss.anchor_kl_coef, loss.anchor_kl_min) if loss.anchor_kl_schedule == "sage" else None
        # OP-GRPO's off-policy replay of the best samples of earlier iterations (learners/replay.py)
        self.replay = None
        if cfg.learner.replay.per_group > 0:
            if policy.sharding is not None:
                from flowgrpo.run.errors import ConfigError

                raise ConfigError("learner.replay keeps its samples whole in the checkpoint, which a sharded (FSDP2) "
                                  "run does not write yet: set learner.replay.per_group=0 or launch unsharded")
            self.replay = ReplayBuffer(cfg.learner.replay, policy.rank, policy.world)

    def state_dict(self) -> dict:
        return {"kl_weight": self.kl_weight.state_dict()} if self.kl_weight is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.kl_weight is not None and "kl_weight" in state:
            self.kl_weight.load_state_dict(state["kl_weight"])

    def checkpoint(self) -> tuple[dict, dict]:
        state, tensors = self.state_dict(), {}
        if self.replay is not None:  # every process's kept samples (a collective: every process calls it)
            meta, tensors = self.replay.state()
            state["replay"] = {"entries": meta, "world": self.policy.world}
        return state, tensors

    def restore(self, state: dict, tensors: dict) -> None:
        super().restore(state, tensors)
        if self.replay is not None and "replay" in state:
            self.replay.load(state["replay"]["entries"], tensors, state["replay"]["world"])

    @property
    def store_mean(self) -> bool:
        loss = self.cfg.loss
        return loss.ratio == "guard" or loss.rollout_kl_coef > 0 or loss.policy_loss == "kl_mask"

    def describe(self, leaves_per_prompt: int, trained_per_prompt: int) -> str:
        t = self.cfg.train
        transitions = t.prompts_per_iteration * trained_per_prompt
        return (f"trained transitions per prompt: {trained_per_prompt}; per iteration: {transitions}\n"
                f"optimizer steps per iteration: {t.inner_epochs} epochs x {t.updates_per_epoch} updates = "
                f"{t.inner_epochs * t.updates_per_epoch}; ~{transitions // t.updates_per_epoch} transitions per update "
                f"in micro-batches of {t.micro_batch} per process")

    # ---------------------------------------------------------------- the data
    def prepare(self, rollouts: Rollouts) -> "TransitionWork":
        policy, cfg = self.policy, self.cfg
        batches = rollouts.batches
        rows: list[TransitionRow] = []
        chains = []  # per row: the sample (chain) it belongs to, (batch, prompt slot, root node)
        tied = set()  # rows of tied groups (advantage.tied_groups=skip): normalised as trained, never computed
        masks = rollouts.advantages.tied_transitions
        for bi, (b, adv) in enumerate(zip(batches, rollouts.advantages.transitions)):
            rec = b.record
            weights = rec.loss_weight * step_weights(cfg.loss.step_weight, rec.kernel_names(), rec.sigma, rec.sigma_next, rec.eta)
            slots = torch.tensor(b.slots)[rec.prompt.cpu()]
            groups = (slots * rec.groups_per_prompt + rec.group.cpu() % rec.groups_per_prompt).tolist()
            slots = slots.tolist()
            roots = self._root_nodes(rec.node_parent.tolist())
            nodes = rec.node.tolist()
            # Python numbers read once per batch (tolist gives each element's exact value, as float(adv[r]) would)
            values, step_weight = adv.tolist(), weights.tolist()
            tied_here = masks[bi].tolist() if masks is not None else None
            for r in range(rec.num_transitions):
                if not math.isnan(values[r]):
                    if tied_here is not None and tied_here[r]:
                        tied.add(len(rows))
                    rows.append(TransitionRow(bi, r, values[r], step_weight[r], groups[r], slots[r]))
                    chains.append((bi, slots[r], roots[nodes[r]]))
        if self.replay is not None:  # earlier iterations' kept samples join, then this iteration's best are kept
            fresh = len(rows)
            batches = self._replayed(batches, rows, chains)
            self.replay.keep(rollouts.iteration, batches, rows[:fresh], chains[:fresh], rollouts.plan.num_steps)
        # normalisation: each group (or tree) weighs the same, whatever its number of transitions
        counts: dict[int, int] = {}
        for row in rows:
            counts[row.group] = counts.get(row.group, 0) + 1
        total_groups = int(policy.gather(torch.tensor([len(counts)])).sum())
        total_rows = int(policy.gather(torch.tensor([len(rows)])).sum())
        rows = [row.with_coef(1.0 / (counts[row.group] * max(1, total_groups)) if cfg.loss.normalize == "group"
                              else 1.0 / max(1, total_rows)) for row in rows]
        return TransitionWork(rollouts.iteration, batches, rows, tied, sorted(counts), chains, len(rows) - len(tied))

    def _replayed(self, batches: list, rows: list, chains: list) -> list:
        """The replay buffer's samples as rows of one more batch: their log-probs under the current weights (θ_old)
        stand in for the stored ones, and each sample's policy term is weighed by its sequence-level importance weight;
        each trains in a group of its own origin. Returns the batches with it (the rollout's when it is empty)."""
        rb, spans = self.replay.record(self.policy.model, self.policy.device)
        if rb is None:
            return batches
        rec = rb.record
        rec.log_prob, rec.mean = self._score(rb)
        weights = rec.loss_weight * step_weights(self.cfg.loss.step_weight, rec.kernel_names(), rec.sigma,
                                                 rec.sigma_next, rec.eta)
        bi = len(batches)
        for k, (entry, span, w) in enumerate(zip(self.replay.entries, spans, self.replay.weights(rec.log_prob, spans))):
            group = -1 - (entry.origin * 2**32 + entry.group)  # never a fresh group's id (those are ≥ 0)
            for r in span:
                rows.append(TransitionRow(bi, r, entry.advantage, float(weights[r]) * w, group, -1 - k, replayed=w))
                chains.append((bi, -1 - k, 0))
        return [*batches, rb]

    def _score(self, b) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, μ when the loss needs μ_old) of every transition of ``b`` under the current weights, without
        gradient, in micro-batches, by the path the loss computes them."""
        rec, size = b.record, self.cfg.train.micro_batch
        lps, means = [], []
        with torch.no_grad():
            for start in range(0, rec.num_transitions, size):
                r = torch.arange(start, min(rec.num_transitions, start + size))
                x, sigma, cond, a, bv, std = self._inputs(b, r)
                with self.policy.model.integer_timesteps(self.cfg.sampling.integer_timesteps):
                    v = self.policy.velocity(x, sigma, cond, self.cfg.sampling.guidance_scale)
                terms = likelihood.transition_terms(
                    x, v, rec.latents("next_state", r), a, bv, std, reduce=self.cfg.sampling.reduce,
                    return_mean=self.store_mean, backend=self.cfg.loss.likelihood_backend, form=self.cfg.sampling.log_prob)
                lps.append(terms.log_prob.detach())
                means.append(terms.mean.detach() if self.store_mean else None)
        return torch.cat(lps), (torch.cat(means) if self.store_mean else None)

    def _inputs(self, b, r):
        """(x, σ, conditioning, a, b, std) of transitions ``r`` of batch ``b``: the stored states as the rollout computed
        them (Trajectory.latents: bfloat16 or host storage read back) and the rollout's kernel coefficients, std rounded
        as the rollout rounded it, so that lp_θ − lp_old is exactly 0 at the rollout policy (reference backend)."""
        rec = b.record
        x, sigma, cond = rec.latents("state", r), rec.sigma[r], b.cond.select(rec.cond_index[r])
        a, bv, std = likelihood.transition_coefficients(rec.kernel[r], sigma, rec.sigma_next[r], rec.eta[r])
        return x, sigma, cond, a, bv, std.to(samplers.compute_dtype(x.dtype))

    def steps(self, work: "TransitionWork", epoch: int) -> list[Step]:
        return [Step(selected, len({work.rows[i].slot for i in selected}))
                for selected in self._updates(work.rows, work.tied, work.group_ids, work.iteration, epoch, work.chains)]

    def micro_batches(self, work: "TransitionWork", step: Step, probe: bool) -> list[list[TransitionRow]]:
        parts = self._micro_batches(step.units, work.rows, self.cfg.train.micro_batch, probe)
        return [[work.rows[i] for i in part] for part in parts]

    def filler(self, work: "TransitionWork") -> list[TransitionRow]:
        return [work.rows[0] if work.rows else STAND_IN]

    def micro_loss(self, work: "TransitionWork", part: list[TransitionRow], epoch: int, first: bool, real: bool):
        U = self.cfg.train.updates_per_epoch  # each step's rows carry 1/U of the iteration's normalisation
        return self._micro_step(part, [row.coef * U if real else 0.0 for row in part], work.batches, report=real)

    def report(self, diagnostics: dict) -> dict:
        def mean(key: str) -> float:
            return float(diagnostics[key].mean()) if key in diagnostics and diagnostics[key].numel() else 0.0

        metrics = {"clip_frac_high": mean("clipped_high"), "clip_frac_low": mean("clipped_low"),
                   "approx_kl": mean("approx_kl"), "kl_ref": mean("kl")}
        if self.kl_weight is not None:
            metrics["kl_weight"] = self.kl_weight.weight
        if self.replay is not None:  # this process's replayed transitions this iteration and their importance weights
            w = diagnostics.get("replayed", torch.zeros(0))
            w = w[w > 0]
            metrics["replay/transitions"] = int(w.numel())
            metrics["replay/weight_mean"] = float(w.mean()) if w.numel() else float("nan")
        steps = diagnostics.get("step", torch.zeros(0))
        for s in steps.unique().tolist() if steps.numel() else []:
            lr = diagnostics["log_ratio"][steps == s]
            metrics[f"log_ratio_step{s}/mean"] = float(lr.mean())
            metrics[f"log_ratio_step{s}/std"] = float(lr.std()) if lr.numel() > 1 else 0.0
        return metrics

    @staticmethod
    def _root_nodes(parents: list[int]) -> list[int]:
        """The root node of every node of a prompt's tree (children have larger ids than their parents)."""
        roots = list(range(len(parents)))
        for node, parent in enumerate(parents):
            if parent >= 0:
                roots[node] = roots[parent]
        return roots

    def _updates(self, rows: list[TransitionRow], tied: set, group_ids: list[int], iteration: int, epoch: int,
                 chains: list[tuple] | None = None) -> list[list[int]]:
        """The trained rows of each of the pass's train.updates_per_epoch optimizer steps: whole groups (or trees) dealt
        out in a seeded order, (update_split=transitions) every trained transition in a seeded shuffle, dealt out, or
        (update_split=samples) every group's chains dealt out (``deal_samples``), each with all its transitions."""
        t = self.cfg.train
        U = t.updates_per_epoch
        if t.update_split == "samples":
            by_group: dict[int, dict[tuple, list[int]]] = {}
            for i, row in enumerate(rows):
                if i not in tied:
                    by_group.setdefault(row.group, {}).setdefault(chains[i], []).append(i)
            dealt = deal_samples({g: sorted(c) for g, c in by_group.items()}, U, t.seed, STREAM_UPDATE_ORDER, iteration, epoch)
            return [sorted(i for g, keys in d.items() for key in keys for i in by_group[g][key]) for d in dealt]
        if t.update_split == "transitions":
            trained = [i for i in range(len(rows)) if i not in tied]
            order = seeded_permutation(len(trained), t.seed, STREAM_UPDATE_ORDER, iteration, epoch).tolist()
            return [[trained[k] for k in order[u::U]] for u in range(U)]
        order = seeded_permutation(len(group_ids), t.seed, STREAM_UPDATE_ORDER, iteration, epoch).tolist()
        chunks = [set(group_ids[i] for i in order[u::U]) for u in range(U)]
        return [[i for i, row in enumerate(rows) if row.group in chunk and i not in tied] for chunk in chunks]

    @staticmethod
    def _micro_batches(selected: list[int], rows: list[TransitionRow], size: int, by_prompt: bool) -> list[list[int]]:
        """Row indices per micro-batch: ``size`` rows each; for a gradient-noise probe, whole prompts instead,
        in at least two (up to four) micro-batches, so each is a small-batch gradient over its prompts."""
        if not by_prompt:
            return [selected[i : i + size] for i in range(0, len(selected), size)]
        prompts: dict[int, list[int]] = {}
        for i in selected:
            prompts.setdefault(rows[i].slot, []).append(i)
        order = list(prompts)
        if not order:  # every group of the step tied (or masked): nothing to compute
            return []
        parts = max(1, min(4, len(order)))
        per = -(-len(order) // parts)
        return [[i for slot in order[k : k + per] for i in prompts[slot]] for k in range(0, len(order), per)]

    def _micro_step(self, rows, coefs, batches, report: bool = True):
        policy, cfg = self.policy, self.cfg
        device, guidance = policy.device, cfg.sampling.guidance_scale
        by_batch: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_batch.setdefault(row.batch, []).append(i)
        total = torch.zeros((), device=device)
        out = {k: [] for k in ("log_ratio", "ratio_dev", "clipped_high", "clipped_low", "approx_kl", "kl", "step",
                               "replayed")}
        for bi, members in by_batch.items():
            b, rec = batches[bi], batches[bi].record
            r = torch.tensor([rows[i].row for i in members])
            adv = torch.tensor([rows[i].advantage for i in members], device=device)
            c = torch.tensor([coefs[i] for i in members], device=device)
            w = torch.tensor([rows[i].weight for i in members], device=device)  # plan and step weight: the policy term's
            x, sigma, cond, a, bv, std = self._inputs(b, r)  # μ = a·x + b·v per row with the rollout's kernel
            # every no-gradient call first: a copy's weights are swapped into the parameters in place; the networks
            # are told the rollout's timesteps (integer ones with sampling.integer_timesteps)
            with policy.model.integer_timesteps(cfg.sampling.integer_timesteps):
                anchor_v = policy.velocity(x, sigma, cond, guidance, weights=self.anchor) if self.anchor is not None else None
                ref_v = policy.velocity(x, sigma, cond, guidance, weights=REFERENCE) if cfg.loss.kl_coef > 0 else None
                v = policy.velocity(x, sigma, cond, guidance)
            mean_old = rec.latents("mean", r)
            extra_kl = anchor_v is not None or cfg.loss.rollout_kl_coef > 0 or cfg.loss.policy_loss == "kl_mask"
            terms = likelihood.transition_terms(
                x, v, rec.latents("next_state", r), a, bv, std, mu_old=mean_old, v_ref=ref_v, reduce=cfg.sampling.reduce,
                return_mean=extra_kl, backend=cfg.loss.likelihood_backend, form=cfg.sampling.log_prob,
            )
            log_ratio_plain = terms.log_prob - rec.log_prob[r].to(terms.log_prob)
            if cfg.loss.ratio == "guard":
                if terms.guard is None:
                    raise ValueError("loss.ratio=guard needs μ_old stored in the rollout (the learner asks for it)")
                log_ratio = terms.guard
            else:
                log_ratio = log_ratio_plain
            if cfg.loss.policy_loss == "kl_mask":  # Flow-DPPO: the step's exact KL to the rollout policy decides
                step_kl = gaussian_kl(terms.mean, mean_old.to(terms.mean), std, cfg.sampling.reduce)
                loss, d = kl_masked_policy_loss(log_ratio, log_ratio_plain, adv, step_kl, cfg.loss.kl_mask_threshold)
            else:
                loss, d = clipped_policy_loss(log_ratio, log_ratio_plain, adv, cfg.loss.clip_range)
            kl = torch.zeros_like(loss)
            if ref_v is not None:
                kl_ref = terms.kl
                if cfg.loss.kl_form == "flow_grpo":
                    kl_ref = kl_ref * (rec.sigma_next[r] - sigma).abs().to(kl_ref)
                kl = kl + cfg.loss.kl_coef * kl_ref
            trust = torch.zeros_like(loss)  # SAGE's two trust-region terms at their coefficients
            if anchor_v is not None:
                anchor_mean = likelihood.kernel_mean(x, anchor_v, a, bv)
                trust = trust + cfg.loss.anchor_kl_coef * gaussian_kl(terms.mean, anchor_mean, std, cfg.sampling.reduce)
            if cfg.loss.rollout_kl_coef > 0:
                trust = trust + cfg.loss.rollout_kl_coef * gaussian_kl(terms.mean, mean_old.to(terms.mean), std, cfg.sampling.reduce)
            if self.kl_weight is not None:  # the adaptive weight replaces anchor_kl_coef; the terms keep their ratio
                reports = (trust / cfg.loss.anchor_kl_coef).detach().tolist()  # KL_anchor + (coef_r/coef_a)·KL_rollout
                used = [self.kl_weight.next(k) if report else self.kl_weight.weight for k in reports]
                trust = trust * torch.tensor(used, dtype=trust.dtype, device=trust.device) / cfg.loss.anchor_kl_coef
            kl = kl + trust
            # coefficients are normalised over all processes, so summing gradients over them is exact
            # the plan and step weights scale the policy term alone, as SAGE's code applies its equaliser
            total = total + (c * (w * loss + kl)).sum()
            for key in ("log_ratio", "ratio_dev", "clipped_high", "clipped_low", "approx_kl"):
                out[key].append(d[key].float().cpu())
            out["kl"].append(kl.detach().float().cpu())
            out["step"].append(rec.step[r].cpu())
            out["replayed"].append(torch.tensor([rows[i].replayed for i in members]))
        return total, {k: torch.cat(v) for k, v in out.items()}
