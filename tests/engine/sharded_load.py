"""Run under torchrun by tests/engine/test_sharded.py: resume a run folder's newest checkpoint at this launch's
process count (sharded with FSDP2 when the launch says so) and check that the policy now holds exactly the saved
weights, copies and optimizer state. Prints "resumed equal: <n> tensors" on success.

    python -m torch.distributed.run --nproc_per_node N tests/engine/sharded_load.py <config.yaml of the run> [KEY=VALUE...]

(overrides, e.g. train.context_parallel=2: resumed with another context degree)
"""

import sys

import torch

from flowgrpo.config import load_config
from flowgrpo.engine.sharding import full
from flowgrpo.engine.trainer import Trainer
from flowgrpo.run.checkpoint import checkpoint_contents, checkpoint_dirs, load_checkpoint


def main(config_file: str, overrides: list[str]) -> None:
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
    if trainer.acc.is_main_process:
        print(f"resumed equal: {len(whole)} tensors ({sharded} sharded) at {trainer.world} processes "
              f"(context groups of {trainer.policy.layout.context_size})", flush=True)
    trainer.acc.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
