"""The policy: the trainable model, every copy of its weights, and the services a learner needs.

A learner (flowgrpo/engine/learners/) sees the training run only through this object:

    policy.velocity(x, sigma, cond, guidance)                   v with the current weights (with gradient)
    policy.velocity(..., weights=copy) / weights=REFERENCE      v of a copy / of the reference policy (no gradient)
    policy.copy(name, keep, follows)                            a new copy of the weights (flowgrpo/models/copies.py)
    policy.zero_grad(); policy.backward(loss, prompts); policy.step(prompts)
    policy.gather(tensor)                                       a tensor from every process, concatenated
    policy.matched(parts, spare)                                micro-batches padded so every process makes as many
    policy.probe.active                                         whether this step measures the gradient noise
    policy.optimizer_steps, policy.skipped_steps, policy.latent_shape, policy.device

It owns the weights: the parameters and optimizer, every ``WeightCopy`` (the evaluation EMA, NFT's sampling
policy, AWM's EMA and rollout weights, DGPO's ema_ref, SAGE's anchor), the reference policy (the model's
adapter disabled, or its frozen copy), and so their checkpoint tensors. Every model call a learner makes
through it is counted (``nfe``: train_forward per row, and train_backward for the calls with gradient), and
the copies that follow the weights are updated here, after each optimizer step or iteration, never by
the learners. The training loop (flowgrpo/engine/trainer.py) builds it and calls ``end_iteration``.

Launched with FSDP2 (configs/accelerate/fsdp2.yaml) it shards its networks first (flowgrpo/engine/sharding.py):
the parameters, gradients, optimizer state and every copy are then DTensors, 1/N of each on each process,
and the same calls work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack, nullcontext

import torch

import samplers
from flowgrpo.models.copies import WeightCopy
from flowgrpo.engine.context import Layout, enable as enable_context_parallel
from flowgrpo.engine.noise_scale import GradientProbe
from flowgrpo.engine.optim import build_optimizer
from flowgrpo.engine.sharding import Sharding, fsdp_plugin, full

REFERENCE = "reference"  # weights=REFERENCE: the reference policy (the base model)


class Policy:
    """The trainable model and every copy of its weights (see the module docstring)."""

    def __init__(self, model, accelerator, *, learning_rate: float, weight_decay: float, adam_betas: Sequence[float],
                 grad_clip: float, optimizer: str = "adamw", merge_lora: bool = False, context_parallel: int = 1,
                 context_parallel_ring: int = 1, activation_offload: bool = False):
        self.model, self.acc = model, accelerator
        self.activation_offload = activation_offload  # train.activation_offload: saved activations in host memory
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        # data-parallel ranks x context groups (flowgrpo/engine/context.py): a group's processes share their samples
        self.layout = Layout.of_launch(accelerator, context_parallel, context_parallel_ring)
        plugin = fsdp_plugin(accelerator)
        self.sharding = Sharding(plugin, accelerator) if plugin is not None else None
        if self.sharding is not None:  # before the optimizer: it holds the sharded parameters
            if getattr(plugin, "activation_checkpointing", False) and not model.config.gradient_checkpointing:
                for name in model.trained_experts:
                    model.experts[name].enable_gradient_checkpointing()
            for network in model.networks():
                self.sharding.shard(network, model.dtype)
            model.take_reference()  # full fine-tuning's frozen reference, now of the sharded parameters
            model.call_every_expert = len(model.experts) > 1  # the same collectives on every process (Wan2.2)
        enable_context_parallel(model, self.layout)  # after sharding, as model.compile
        if merge_lora and self.sharding is not None:
            from flowgrpo.run.errors import ConfigError

            raise ConfigError("sampling.merge_lora merges the adapter into whole weights, and FSDP2 shards them: set "
                              "sampling.merge_lora=false for a sharded run")
        self.merge_lora = merge_lora and model.config.finetune == "lora"
        if model.config.compile:  # after sharding: each block's FSDP2 hooks stay outside its compiled code
            model.compile_blocks()
        self.params = model.trainable_parameters()
        self.names = [f"p{i}" for i in range(len(self.params))]
        self.optimizer = build_optimizer(optimizer, self.params, learning_rate=learning_rate, weight_decay=weight_decay,
                                         betas=adam_betas)
        self.grad_clip = grad_clip
        self.copies: dict[str, WeightCopy] = {}
        self.nfe = samplers.NFECounter()
        # the gradient noise scale (log.grad_noise_every); sharded, each backward's gradient is summed over processes
        self.probe = GradientProbe(self.params, total=self.sharding.total if self.sharding else None,
                                   context=self.layout.context_size,
                                   context_sum=self.layout.context_sum if self.layout.context_size > 1 and
                                   self.sharding is None else None)
        self.optimizer_steps, self.skipped_steps = 0, 0
        self.untrained_backwards = 0  # micro-batches whose rows all fell on frozen experts (nothing to train)

    # ---------------------------------------------------------------- what the model is
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.model.latent_shape())

    # ---------------------------------------------------------------- copies of the weights
    def copy(self, name: str, keep: Callable[[int], float] | float = 0.0, follows: str = "step",
             saved: bool = True) -> WeightCopy:
        """A new copy of the current weights, followed by this policy (``follows``: "step", "iteration",
        "never"); its checkpoint tensors are ``<name>.p0`` ... when ``saved``."""
        if name in self.copies or name in ("weights", "optim"):
            raise ValueError(f"a copy of the weights called {name!r} exists already")
        self.copies[name] = WeightCopy(name, self.params, keep, follows, saved)
        return self.copies[name]

    def using(self, copy: WeightCopy | None):
        """A context in which the parameters hold ``copy``'s values (None: the current weights)."""
        return nullcontext() if copy is None else copy.swapped_into(self.params)

    def sampling_with(self, copy: WeightCopy | None):
        """The context a rollout or an evaluation samples in: ``using(copy)``, and with sampling.merge_lora the
        adapter merged into the weights (``model.merged_adapters``: no adapter products; restored exactly after)."""
        if not self.merge_lora:
            return self.using(copy)
        stack = ExitStack()
        stack.enter_context(self.using(copy))
        stack.enter_context(self.model.merged_adapters())
        return stack

    def _follow(self, when: str) -> None:
        for copy in self.copies.values():
            if copy.follows == when:
                copy.follow(self.params, self.optimizer_steps)

    def end_iteration(self) -> None:
        """The copies that follow once per iteration follow now (after the iteration's update)."""
        self._follow("iteration")

    # ---------------------------------------------------------------- model calls
    def autocast(self):
        """Mixed precision (train.mixed_precision) through accelerate."""
        return self.acc.autocast()

    def velocity_fn(self, cond, guidance_scale: float | None) -> Callable:
        """``velocity(x, sigma, cond_index)`` of the current weights for a rollout (samplers.rollout)."""
        f = self.model.velocity_fn(cond, guidance_scale)

        def under_autocast(x, sigma, cond_index):
            with self.acc.autocast():
                return f(x, sigma, cond_index)

        return under_autocast

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond, guidance_scale: float | None,
                 weights: WeightCopy | str | None = None) -> torch.Tensor:
        """v at (x [N, *latent], sigma [N]) for conditioning rows ``cond``: the current weights with gradient
        (``weights=None``), or without gradient a copy's weights or the reference policy (``REFERENCE``)."""
        rows = x.shape[0]
        if weights is None:
            with self.acc.autocast(), self.saved_activations():
                v = self.model.velocity(x, sigma, cond, guidance_scale)
            self.nfe.add("train_forward", rows)
            self.nfe.add("train_backward", rows)
            return v
        context = self.model.reference() if weights == REFERENCE else self.using(weights)
        with torch.no_grad(), context, self.acc.autocast():
            v = self.model.velocity(x, sigma, cond, guidance_scale)
        self.nfe.add("train_forward", rows)
        return v

    def saved_activations(self):
        """Where the forward with gradient keeps what its backward needs: with train.activation_offload in host
        memory (torch's save_on_cpu, pinned on CUDA: each saved tensor is copied out as the forward saves it and back
        as the backward unpacks it), else on the device. Only the forward needs the context."""
        if not self.activation_offload:
            return nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")

    # ---------------------------------------------------------------- gradients and steps
    def zero_grad(self) -> None:
        """Start an optimizer step (and, when probing, its per-micro-batch gradients)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.probe.begin_step()

    def backward(self, loss: torch.Tensor, prompts: int = 0) -> None:
        """``loss.backward()`` through accelerate (the network's share timed by ``model.call_timer``);
        ``prompts``: how many prompts this micro-batch covers (the gradient noise probe's unit)."""
        if not loss.requires_grad:  # every row on an expert that does not train (model.trained_experts): no gradient
            self.untrained_backwards += 1
            return
        with self.model.call_timer.backward():
            self.acc.backward(loss)
        self.probe.after_backward(prompts)

    def matched(self, parts: list, spare) -> list[tuple[object, bool]]:
        """This process's micro-batches of an optimizer step as ``(part, True)``, then, sharded, ``(filler, False)``
        until it has as many as the process with the most: every forward and backward of a sharded network is a
        collective, so each process must make the same calls. A filler (this process's first part, else
        ``spare()``) is computed with its loss times 0: the same calls, no gradient, no diagnostics."""
        marked = [(part, True) for part in parts]
        if self.sharding is None:
            return marked
        missing = self.sharding.most(len(parts)) - len(parts)
        return marked + [(parts[0] if parts else spare(), False)] * missing

    def step(self, prompts: int = 0) -> tuple[float, dict]:
        """Sum gradients over processes, clip, and take the optimizer step; then the copies that follow
        every step follow. Returns (gradient norm, the probe's metrics of this step). A step without
        gradient (every group's rewards tied) is skipped and counted: Adam would move the weights on its
        momentum alone (measured on the analytic world: a converged policy drifted off its target and
        collapsed after a few such steps)."""
        probed = self.probe.end_step(prompts)
        if self.world > 1 and self.sharding is None:  # sharded, the backward has summed them already
            # a parameter has a gradient where any process has one (a two-expert model's rows on one process may
            # never reach an expert): one small collective says which, so every process reduces the same tensors
            # and a parameter no process reached keeps grad None, as in one process
            reached = torch.tensor([float(p.grad is not None) for p in self.params], device=self.params[0].device)
            torch.distributed.all_reduce(reached, op=torch.distributed.ReduceOp.MAX)
            for p, any_grad in zip(self.params, reached.tolist()):
                if any_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    torch.distributed.all_reduce(p.grad)
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.grad_clip > 0:
            norm = full(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        elif self.sharding is not None:
            norm = torch.tensor(self.sharding.total(sum(float(g.to_local().double().square().sum()) for g in grads)) ** 0.5)
        else:
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) if grads else torch.tensor(0.0)
        if float(norm) == 0.0:
            self.skipped_steps += 1
            return 0.0, probed
        self.optimizer.step()
        self.optimizer_steps += 1
        self._follow("step")
        return float(norm), probed

    def export(self, folder, weights: WeightCopy | None = None) -> None:
        """Write ``weights`` (a copy, or None for the current ones) as diffusers writes them (``model.save_trainable``):
        sharded, every process calls it and the main one writes the whole tensors, gathered one at a time."""
        with self.using(weights):
            if self.sharding is None:
                if self.acc.is_main_process:
                    self.model.save_trainable(folder)
                return
            whole = {name: full(value).cpu() for name, value in self.model.trained_state().items()}
        if self.acc.is_main_process:
            self.model.save_trainable(folder, whole)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of every data-parallel rank, concatenated in rank order (itself on one); on the CPU. With context
        parallelism a context group's processes hold the same samples: each group's tensor counts once."""
        return self.layout.gather(tensor, self.acc.device)

    # ---------------------------------------------------------------- checkpoints
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the weights: ``weights.*``, the optimizer's ``optim.*``, each saved copy's ``<name>.*``."""
        from flowgrpo.run.checkpoint import optimizer_to_flat

        tensors = {f"weights.{n}": p for n, p in zip(self.names, self.params)}
        tensors.update(optimizer_to_flat(self.optimizer)[0])
        for copy in self.copies.values():
            if copy.saved:
                tensors.update(copy.named(self.names))
        return tensors

    def state_dict(self) -> dict:
        from flowgrpo.run.checkpoint import optimizer_to_flat

        return {"optimizer": optimizer_to_flat(self.optimizer)[1], "optimizer_steps": self.optimizer_steps}

    def load_targets(self, saved: dict[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
        """Empty tensors to load a checkpoint's tensors into (``saved``: name -> (whole shape, dtype)), laid out as this
        run holds them: a parameter's, its copies' and its Adam moments' rows of this process (DTensors when
        sharded, so a checkpoint of any number of processes loads), everything else whole."""
        by_name = dict(zip(self.names, self.params))
        targets = {}
        for key, (shape, dtype) in saved.items():
            owner = key.split(".")[-1] if not key.startswith("optim.") else f"p{key.split('.')[1]}"
            param = by_name.get(owner)
            if param is not None and tuple(param.shape) == tuple(shape):
                targets[key] = torch.empty_like(param, dtype=dtype, requires_grad=False)
            else:
                targets[key] = torch.empty(shape, dtype=dtype)
        return targets

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict) -> None:
        """Restore what ``state_tensors`` and ``state_dict`` saved (the copies and parameters in place)."""
        from flowgrpo.run.checkpoint import optimizer_from_flat

        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p.copy_(tensors[f"weights.{n}"])
        for copy in self.copies.values():
            if copy.saved:
                copy.load_named(tensors, self.names)
        optimizer_from_flat(self.optimizer, tensors, state["optimizer"])
        self.optimizer_steps = state["optimizer_steps"]


__all__ = ["Policy", "REFERENCE"]
