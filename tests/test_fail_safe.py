"""Fail safe and speak clearly, as a new user meets it: a rerun with another configuration never
silently resumes (or overwrites) a run folder; a reward that fails on every call stops the run with
its error; the console shows the evaluation, every held-out score and a true iteration count."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowgrpo.config import ConfigError, load_config, to_yaml
from flowgrpo.trainer import Trainer
from rewards.base import Reward, RewardOutput
from train_fixtures import PLUGIN_REWARD, overrides

ROOT = Path(__file__).resolve().parents[1]
# the smallest run that trains: 2 prompts x group 2, 2 Flow-GRPO steps, 4 held-out prompts at 2 steps
FAST = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "log.samples_every": 0, "log.gallery": "false"}


def _config(tiny_sd3_dir, out, base=PLUGIN_REWARD, **extra):
    return load_config("flow_grpo", None, overrides(tiny_sd3_dir, out, **FAST, **extra), base=base)


# ---------------------------------------------------------------- item 2: a run folder holds one experiment
def test_config_differences_tell_experiment_keys_from_the_rest():
    from flowgrpo.run_dir import config_differences, experiment_keys

    old = load_config(None, None, [])
    new = load_config(None, None, ["train.iterations=500", "eval.every=3", "log.save_every=7", "output_dir=elsewhere",
                                   "model.device=cpu", "sampling.max_batch=16", "train.micro_batch=8"])
    changes = config_differences(to_yaml(old), to_yaml(new))
    assert changes["train.iterations"] == (old.train.iterations, 500) and "log.save_every" in changes
    assert experiment_keys(changes) == []  # longer, logged differently, elsewhere, other device or memory chunks
    new = load_config(None, None, ["train.learning_rate=0.5", "sampling.plan.group_size=4", "eval.reward=toy_dense"],
                      base={"rewards": [{"name": "toy"}]})
    changes = config_differences(to_yaml(old), to_yaml(new))
    assert experiment_keys(changes) == ["eval.reward", "rewards", "sampling.plan.group_size", "train.learning_rate"]
    assert changes["train.learning_rate"] == (old.train.learning_rate, 0.5)


def test_rerun_with_another_reward_is_refused_unless_allowed(tiny_sd3_dir, tmp_path, capsys):
    first = _config(tiny_sd3_dir, tmp_path, **{"train.iterations": 1})
    Trainer(first).train()
    run = Path(first.run_dir)
    original = (run / "config.yaml").read_text()
    assert "train_fixtures:Brightness" in original

    other = {"rewards": [{"name": "toy"}]}  # the same command with another reward
    with pytest.raises(ConfigError) as refused:
        Trainer(_config(tiny_sd3_dir, tmp_path, base=other, **{"train.iterations": 1}))
    message = str(refused.value)
    assert "rewards:" in message and "train_fixtures:Brightness" in message and "'toy'" in message.replace('"', "'")
    assert f"run_name={first.run_name}-2" in message and "allow_config_change=true" in message
    assert (run / "config.yaml").read_text() == original and not (run / "config_history.jsonl").exists()

    capsys.readouterr()
    Trainer(_config(tiny_sd3_dir, tmp_path, **{"train.iterations": 1})).train()  # the same command: resumes
    assert "resumed from" in capsys.readouterr().err and not (run / "config_history.jsonl").exists()

    allowed = _config(tiny_sd3_dir, tmp_path, base=other, **{"train.iterations": 2, "allow_config_change": "true"})
    Trainer(allowed).train()  # continues at iteration 1 with the new reward
    assert "resumed from" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == original  # the original is never overwritten
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["iteration"] == 1 and history[0]["time"]
    assert history[0]["experiment_changes"] == ["rewards"]
    assert history[0]["changes"]["train.iterations"] == [1, 2]
    assert "toy" in json.dumps(history[0]["changes"]["rewards"][1])
    assert (run / "checkpoints" / "step_2").is_dir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "reward/toy_mean" in rows[-1] and rows[-1]["iteration"] == 2

    # the run's configuration is now the recorded one: the same command again resumes without the flag
    Trainer(_config(tiny_sd3_dir, tmp_path, base=other, **{"train.iterations": 2}))
    with pytest.raises(ConfigError, match="allow_config_change=true"):  # and going back is a change again
        Trainer(_config(tiny_sd3_dir, tmp_path, **{"train.iterations": 2}))
