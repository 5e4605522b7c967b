"""Saving and resuming a training run: what a checkpoint holds and how it is put back.

A checkpoint (``checkpoints/step_<n>/``, written atomically by flowgrpo/run/checkpoint.py) holds
  tensors.safetensors   the policy's tensors: trainable weights ``weights.*``, optimizer state ``optim.*``,
                        every saved copy of the weights (``ema.*``, ``old.*``, ``awm_ema.*``, ``ema_ref.*``,
                        ``anchor.*``); a sharded run writes them as ``tensors/``, each process its rows
  state.json            the iteration, optimizer steps and hyper-parameters, the plan schedule's state (a
                        moving window's position), the NFE counters, the learner's state (SAGE's adaptive KL
                        weight; process 0's in a multi-process run) and the resolved config; the transition
                        learner's replay buffer (every process's samples) is in the tensors as ``replay.*``
  model/                the evaluation weights (the EMA when kept) as diffusers writes them: a LoRA file
                        (``pipe.load_lora_weights``) or the transformer folder
Every random draw is a pure function of (seed, iteration, prompt slot, node), and the learning rate a
function of the iteration, so a resumed run continues bit-identically
(tests/engine/test_train_resume_and_config.py), also sharded; a checkpoint of N processes resumes at M
(tests/engine/test_sharded.py). Every process calls both.
"""

from __future__ import annotations

from flowgrpo.run.checkpoint import (
    checkpoint_contents, load_checkpoint, prune_checkpoints, readable_checkpoint, save_checkpoint,
)


def save(cfg, policy, schedule, iteration: int, evaluation_copy, config_yaml: str, learner=None) -> None:
    """Write ``checkpoints/step_<iteration>`` of the run and keep the newest ``log.keep_checkpoints``."""
    learner_state, learner_tensors = learner.checkpoint() if learner is not None else ({}, {})
    state = {"iteration": iteration, **policy.state_dict(), "schedule": schedule.state_dict(),
             "nfe": policy.nfe.state_dict(), "config": config_yaml, "learner": learner_state}

    def evaluation_weights(tmp):  # model/: LoRA (diffusers format) or full weights, EMA if kept
        policy.export(tmp / "model", evaluation_copy)

    save_checkpoint(cfg.run_dir / "checkpoints" / f"step_{iteration}", {**policy.state_tensors(), **learner_tensors},
                    state, extra=evaluation_weights)
    if policy.rank == 0:
        prune_checkpoints(cfg.run_dir, cfg.log.keep_checkpoints)


def resume(cfg, policy, schedule, learner=None):
    """Load the newest checkpoint of the run folder into ``policy``, ``schedule`` and ``learner``; returns (its
    folder, the iteration to continue from), or None when there is none or ``resume=false``."""
    if not cfg.resume:
        return None
    newest = readable_checkpoint(cfg.run_dir)  # a damaged newest one: one line naming it and the last good one
    if newest is None:
        return None
    saved, state = checkpoint_contents(newest)
    tensors = load_checkpoint(newest, policy.load_targets(saved))
    policy.load_state(tensors, state)
    schedule.load_state_dict(state["schedule"])
    policy.nfe.load_state_dict(state["nfe"])
    if learner is not None:
        learner.restore(state.get("learner", {}), tensors)
    return newest, state["iteration"]


__all__ = ["resume", "save"]
