"""What tests/engine/test_context_parallel.py compares, recorded during a training: per iteration, each rollout batch's
prompt slots, leaves, stored transitions and their log-probs; every optimizer step's gradient (summed over processes,
whole); and the weights at the end (whole). The shared launches (tests/engine/distributed_scenarios.py) record a
scenario with ``record`` before it trains and ``save_record`` after; alone under torchrun:

    python -m torch.distributed.run --nproc_per_node N tests/engine/context_parallel_run.py OUT DEFAULT PRESET KEY=VALUE...

trains the config of the training scripts' layers (``DEFAULT``: default or default_t2v; ``PRESET``: a preset's name, or
"none"; then key=value overrides). ``OUT/rank<r>.pt`` is written by every process that leads its context group, and
``OUT/layout.json``: the launch's layout.
"""

import json
import sys
from pathlib import Path

import torch

from flowgrpo.config import load_config
from flowgrpo.engine.sharding import full
from flowgrpo.engine.trainer import Trainer


def record(trainer) -> dict:
    """Start recording ``trainer``'s rollouts and optimizer steps (before ``trainer.train()``)."""
    policy = trainer.policy
    recording = {"rollouts": [], "grads": [], "weights": None}
    sample = trainer.sample

    def recording_sample(iteration, plan):
        batches = sample(iteration, plan)
        for b in batches:
            r = b.record
            recording["rollouts"].append({"iteration": iteration, "slots": list(b.slots),
                                          "leaves": r.leaf_state.float().cpu(), "states": r.next_state.float().cpu(),
                                          "log_probs": r.log_prob.cpu()})
        return batches

    trainer.sample = recording_sample
    step = policy.optimizer.step

    def recording_step(*a, **k):
        recording["grads"].append([full(p.grad).detach().float().cpu().clone() for p in policy.params if p.grad is not None])
        return step(*a, **k)

    policy.optimizer.step = recording_step
    return recording


def save_record(trainer, recording: dict, out) -> None:
    """After the training: the final weights, then ``out``/rank<data rank>.pt and layout.json (every process calls it)."""
    policy, layout = trainer.policy, trainer.policy.layout
    recording["weights"] = [full(p).detach().float().cpu() for p in policy.params]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if layout.leader:
        torch.save(recording, folder / f"rank{layout.data_rank}.pt")
    if trainer.acc.is_main_process:
        (folder / "layout.json").write_text(json.dumps({
            "data_world": layout.data_world, "context_size": layout.context_size, "run": str(trainer.cfg.run_dir),
            "sharded": policy.sharding is not None}))
    trainer.acc.wait_for_everyone()


def main(out: str, default: str, preset: str, overrides: list[str]) -> None:
    cfg = load_config(None if preset == "none" else preset, None, overrides, default=default)
    trainer = Trainer(cfg)
    recording = record(trainer)
    trainer.train()
    save_record(trainer, recording, out)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
