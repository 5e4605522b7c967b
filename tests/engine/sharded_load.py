"""Resume a run folder's newest checkpoint at this launch's process count (sharded with FSDP2 when the launch says so)
and check that the policy now holds exactly the saved weights, copies and optimizer state. Run by the shared launches
of tests/engine/distributed_scenarios.py (``resumed_equal``), or alone under torchrun, printing its line on success:

    python -m torch.distributed.run --nproc_per_node N tests/engine/sharded_load.py <config.yaml of the run> [KEY=VALUE...]

(overrides, e.g. train.context_parallel=2: resumed with another context degree)
"""

import sys

import torch

from flowgrpo.config import load_config
from flowgrpo.engine.sharding import full
from flowgrpo.engine.trainer import Trainer
from flowgrpo.run.checkpoint import checkpoint_contents, checkpoint_dirs, load_checkpoint


def resumed_equal(config_file: str, overrides: list[str]) -> str:
    """Every process calls it; returns "resumed equal: <n> tensors (<k> sharded) at <N> processes (context groups
    of <C>)", or raises naming the tensors that differ."""
    cfg = load_config(None, None, overrides, default=config_file)  # the run's own resolved config
    trainer = Trainer(cfg)
    assert trainer.resume(), "no checkpoint to resume"
    held = {k: full(v).cpu() for k, v in trainer.policy.state_tensors().items()}
    newest = checkpoint_dirs(cfg.run_dir)[-1]
    saved, _ = checkpoint_contents(newest)
    whole = load_checkpoint(newest, {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in saved.items()})
    assert held.keys() == whole.keys(), sorted(set(held) ^ set(whole))
    differ = [k for k in whole if not torch.equal(held[k], whole[k])]
    assert not differ, f"resumed tensors differ from the saved ones: {differ[:5]}"
    sharded = sum(hasattr(v, "to_local") for v in trainer.policy.state_tensors().values())
    trainer.acc.wait_for_everyone()
    return (f"resumed equal: {len(whole)} tensors ({sharded} sharded) at {trainer.world} processes "
            f"(context groups of {trainer.policy.layout.context_size})")


def main(config_file: str, overrides: list[str]) -> None:
    line = resumed_equal(config_file, overrides)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(line, flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
