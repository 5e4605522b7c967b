"""The learner interface: how an iteration's rollouts and advantages become optimizer steps.

Two families train on the same rollouts (any plan: chains, windows, trees, ODE or SDE kernels):

- the **transition learner** (``transition.py``, docs/math.md §3): the denoising-MDP GRPO loss on the
  stored SDE transitions and their per-step log-probs (Flow-GRPO, DanceGRPO, MixGRPO, BranchGRPO,
  TempFlow, GRPO-Guard, SAGE: every preset whose method is a rollout plan);
- the **forward-process learners** (``forward.py`` and one module per paper, docs/math.md §5): they take
  only the clean samples x0 a rollout produced, noise them again with the forward process and
  regress the velocity, weighted or contrasted by advantage (DiffusionNFT, AWM, DGPO).

A learner is chosen by ``learner.name`` (a preset sets it) and built with the run's config and the
``Policy`` (flowgrpo/engine/policy.py): the model, every copy of its weights and the services a learner
uses (velocity calls, backward, optimizer step, gather). A learner asks the policy for the copies it needs
(SAGE's anchor, NFT's sampling policy θ_old, AWM's EMA, DGPO's ema_ref) and names the one the rollout
samples with (``sampling_copy``); the policy keeps, follows and checkpoints them. Each iteration the loop
hands the learner a ``Rollouts`` record and logs the metrics ``update`` returns. ``update`` is written once,
here: a learner supplies its training units and the loss of a micro-batch of them (``Learner``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import samplers
from flowgrpo.engine.credit import Advantages


@dataclass
class Rollouts:
    """What one iteration hands the learner."""

    iteration: int
    plan: object  # samplers.Plan of the iteration: its grid (plan.sigmas) and time shift (plan.shift)
    batches: list  # flowgrpo.engine.rollout.Batch per rollout batch of this process
    advantages: Advantages  # per batch: [M_b] per stored transition, [L_b] per leaf (NaN = masked)


def seeded_permutation(n: int, *parts: int) -> torch.Tensor:
    """A permutation of range(n) drawn from the stream ``parts`` (samplers.make_generator)."""
    return torch.randperm(n, generator=samplers.make_generator(*parts))


def deal_samples(by_group: dict, updates: int, *parts: int) -> list[dict]:
    """train.update_split=samples: each group's samples in a seeded order (``parts`` and the group id), dealt out
    round-robin to the ``updates`` optimizer steps of a pass, so every step trains about 1/updates of every group (as
    the reference codes step every few samples of each process's batch). {group: [sample, ...]} -> one such mapping
    per update, groups and their samples in the order dealt."""
    out: list[dict] = [{} for _ in range(updates)]
    for g in sorted(by_group):
        members = by_group[g]
        for k, i in enumerate(seeded_permutation(len(members), *parts, g).tolist()):
            out[k % updates].setdefault(g, []).append(members[i])
    return out


@dataclass
class Step:
    """One optimizer step of an update: the units it trains (of the learner's kind), how many prompt slots they come
    from (the gradient-noise probe's batch size), and the number its micro-batches' summed losses are divided by."""

    units: object
    prompts: int
    normaliser: float = 1.0


class Learner:
    """Base class: the one update loop (``update``). A learner supplies its iteration's training data (``prepare``),
    its optimizer steps (``steps``), their micro-batches (``micro_batches``, each a list of units with a ``slot``),
    a filler for a sharded process without one (``filler``), the summed loss of a micro-batch (``micro_loss``) and
    the metrics of its diagnostics (``report``)."""

    name = ""
    needs_transitions = True  # the rollout stores per-step transitions (states, log-probs)
    sampling_copy = None  # the WeightCopy the rollout samples with (None: the current weights)
    # (per-row diagnostic of micro_loss, metric): that diagnostic's largest value over the first optimizer step of
    # inner epoch 0 is logged as the metric (the ratio == 1 or v⁺ = v_old contract); None: no contract metric
    contract: tuple[str, str] | None = None
    trained_metric = "trained"  # the metric counting the units trained this iteration (over all processes)

    def __init__(self, cfg, policy):
        self.cfg, self.policy = cfg, policy

    @property
    def store_mean(self) -> bool:
        """Whether the rollout stores μ_old per trained transition."""
        return False

    # ---------------------------------------------------------------- what a learner supplies
    def prepare(self, rollouts: Rollouts):
        """The iteration's training data (any object; handed back to every method below). Its ``trained`` is the
        number of units this process trains (tied groups' excluded)."""
        raise NotImplementedError

    def steps(self, work, epoch: int):
        """The optimizer steps of one inner epoch, each a ``Step`` (a generator may compute each as it is reached)."""
        raise NotImplementedError

    def micro_batches(self, work, step: Step, probe: bool) -> list[list]:
        """The step's micro-batches; for a gradient-noise probe (``probe``), whole prompts in two to four of them."""
        raise NotImplementedError

    def filler(self, work) -> list:
        """A micro-batch a sharded process without one computes with its loss times 0 (the same model calls)."""
        raise NotImplementedError

    def micro_loss(self, work, part: list, epoch: int, first: bool, real: bool) -> tuple[torch.Tensor, dict]:
        """The loss of a micro-batch summed over its rows (``update`` divides it by the step's normaliser) and per-row
        diagnostics {name: tensor}. ``first``: the first optimizer step of inner epoch 0; ``real``: False for a
        filler."""
        raise NotImplementedError

    def report(self, diagnostics: dict) -> dict:
        """The metrics of the iteration's diagnostics (each concatenated over its micro-batches)."""
        return {}

    # ---------------------------------------------------------------- the loop
    def update(self, rollouts: Rollouts) -> dict:
        """Optimizer steps on this iteration's rollouts: for every inner epoch and step, zero the gradients, run the
        micro-batches (a sharded process pads with fillers so every process makes the same calls), backward, step;
        returns the metrics to log."""
        policy, t = self.policy, self.cfg.train
        work = self.prepare(rollouts)
        diag: dict[str, list] = {"loss": [], "grad_norm": []}
        contract: list[float] = []
        skipped_before, probed = policy.skipped_steps, {}
        for epoch in range(t.inner_epochs):
            for u, step in enumerate(self.steps(work, epoch)):
                first = epoch == 0 and u == 0
                policy.zero_grad()
                for part, real in policy.matched(self.micro_batches(work, step, policy.probe.active),
                                                 lambda: self.filler(work)):
                    loss, d = self.micro_loss(work, part, epoch, first, real)
                    loss = loss / step.normaliser  # the step's loss is a mean over its rows on every process
                    if not real:  # the same model calls as the other processes, no gradient, no diagnostics
                        policy.backward(loss * 0.0)
                        continue
                    policy.backward(loss, len({unit.slot for unit in part}))
                    diag["loss"].append(loss.detach().reshape(1))
                    for key, value in d.items():
                        value = value.detach().reshape(-1).cpu()
                        diag.setdefault(key, []).append(value.float() if value.is_floating_point() else value)
                    if first and self.contract:
                        contract.append(float(d[self.contract[0]].max()))
                norm, probed = policy.step(step.prompts)
                diag["grad_norm"].append(torch.tensor([norm]))
        cat = {k: torch.cat(v) for k, v in diag.items() if v}
        # the loss summed over processes (each process's share is normalised globally), the contract's worst row
        local = torch.tensor([float(cat["loss"].sum()) if "loss" in cat else 0.0, max(contract) if contract else 0.0],
                             dtype=torch.float64)
        every = policy.gather(local.view(1, 2))
        metrics = {
            "loss": float(every[:, 0].sum()) / max(1, t.inner_epochs),
            "grad_norm": float(cat["grad_norm"].mean()) if "grad_norm" in cat else 0.0,
            self.trained_metric: int(policy.gather(torch.tensor([work.trained])).sum()),
            "skipped_steps": policy.skipped_steps - skipped_before,  # optimizer steps without gradient, not taken
        }
        metrics.update(self.report({k: v for k, v in cat.items() if k not in ("loss", "grad_norm")}))
        if self.contract:
            metrics[self.contract[1]] = float(every[:, 1].max())
        metrics.update(probed)  # the last probed step's fit (log.grad_noise_every)
        return metrics

    # ---------------------------------------------------------------- state and description
    def state_dict(self) -> dict:
        """What the learner carries across iterations besides the policy's tensors (saved in a checkpoint's state)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Put back what ``state_dict`` gave."""

    def checkpoint(self) -> tuple[dict, dict]:
        """(state for the checkpoint's state.json, tensors for its tensor files): ``state_dict`` and no tensors, but for
        a learner that carries samples across iterations (the transition learner's replay buffer). Every process calls
        it."""
        return self.state_dict(), {}

    def restore(self, state: dict, tensors: dict) -> None:
        """Put back what ``checkpoint`` gave (``tensors``: the checkpoint's, by name)."""
        self.load_state_dict(state)

    def describe(self, leaves_per_prompt: int, trained_per_prompt: int) -> str:
        """The start-up line that says what this learner trains per sample and per iteration."""
        raise NotImplementedError
