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
from flowgrpo.engine.trainer import Trainer
from rewards.base import Reward, RewardOutput
from train_fixtures import PLUGIN_REWARD, overrides

ROOT = Path(__file__).resolve().parents[2]
# the smallest run that trains: 2 prompts x group 2, 2 Flow-GRPO steps, 4 held-out prompts at 2 steps
FAST = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "log.samples_every": 0, "log.gallery": "false"}


def _config(tiny_sd3_dir, out, base=PLUGIN_REWARD, **extra):
    return load_config("flow_grpo", None, overrides(tiny_sd3_dir, out, **FAST, **extra), base=base)


# ---------------------------------------------------------------- item 2: a run folder holds one experiment
def test_config_differences_tell_experiment_keys_from_the_rest():
    from flowgrpo.run.run_dir import config_differences, experiment_keys

    old = load_config(None, None, [])
    new = load_config(None, None, ["train.iterations=500", "eval.every=3", "log.save_every=7", "output_dir=elsewhere",
                                   "model.device=cpu", "sampling.chunk=16", "train.micro_batch=8",
                                   "model.offload_text_encoders=true", "train.activation_offload=true"])
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
    assert "\n" not in message  # one line, as every user error
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


# ---------------------------------------------------------------- item 3: a reward that always fails stops the run
class AlwaysRaises(Reward):
    """A reward plug-in whose scorer is down: every call raises."""

    name = "always_raises"

    def score_uint8(self, images, prompts, metadata):
        raise ZeroDivisionError("scorer is down")


def test_a_reward_that_always_fails_stops_the_run(tiny_sd3_dir, tmp_path, capsys):
    from flowgrpo.engine.scoring import NoValidRewardError

    cfg = _config(tiny_sd3_dir, tmp_path, base={"rewards": [{"name": "test_fail_safe:AlwaysRaises"}]},
                  **{"train.iterations": 6, "train.max_iterations_without_reward": 3, "log.save_every": 1,
                     "log.progress": "true"})
    with pytest.raises(NoValidRewardError) as stopped:
        Trainer(cfg).train()
    message = str(stopped.value)
    assert "'always_raises' (test_fail_safe:AlwaysRaises)" in message and "ZeroDivisionError: scorer is down" in message
    assert "3 iterations in a row" in message and "train.max_iterations_without_reward" in message
    run = Path(cfg.run_dir)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())  # nothing saved
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]  # the third rewardless iteration stops before its update
    err = capsys.readouterr().err
    # 3 iterations x 3 attempts failed: one warning, then one line with the count of its repeats
    assert err.count("ZeroDivisionError: scorer is down") == 2, err
    assert "repeated 2 more times" in err


def test_a_dead_reward_ends_the_training_command_with_one_line(tiny_sd3_dir, tmp_path, capsys):
    from flowgrpo.cli.train import main

    args = overrides(tiny_sd3_dir, tmp_path, **FAST, **{"train.iterations": 5, "train.max_iterations_without_reward": 2})
    status = main([*args, "rewards=[{name: 'test_fail_safe:AlwaysRaises'}]"], prog="train_t2i.py",
                  description="", default="default")
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "train_t2i.py: error: no valid reward in 2 iterations in a row (iterations 1-2): reward 'always_raises'" in err


def test_a_reward_that_recovers_resets_the_count(tiny_sd3_dir, tmp_path):
    """Only consecutive rewardless iterations count: a reward down for one iteration in two never stops the run,
    and the iterations it had no score for are never saved as checkpoints."""
    cfg = _config(tiny_sd3_dir, tmp_path, base={"rewards": [{"name": "test_fail_safe:DownEveryOtherIteration"}]},
                  **{"train.iterations": 4, "train.max_iterations_without_reward": 2, "log.save_every": 1,
                     "log.keep_checkpoints": 10})
    DownEveryOtherIteration.calls = 0
    Trainer(cfg).train()
    saved = sorted(p.name for p in (Path(cfg.run_dir) / "checkpoints").iterdir())
    assert saved == ["step_2", "step_4"]  # iterations 1 and 3 trained on nothing


class DownEveryOtherIteration(Reward):
    """Brightness, but the scorer is down during odd iterations (every call of them, retries included)."""

    name = "down_every_other_iteration"
    calls = 0

    def score_uint8(self, images, prompts, metadata):
        DownEveryOtherIteration.calls += 1
        if DownEveryOtherIteration.calls <= 3 or 4 < DownEveryOtherIteration.calls <= 7:
            raise ConnectionError("reward server unreachable")
        return RewardOutput(images.float().mean(dim=(1, 2, 3)) / 255.0)


# ---------------------------------------------------------------- item 7: what the user sees
def _last_bar(err: str, label: str) -> str:
    found = re.findall(rf"{re.escape(label)}[^\r\n]*?(\d+/\d+)", err)
    assert found, err
    return found[-1]


def test_console_shows_the_evaluation_every_held_out_score_and_a_true_count(tiny_sd3_dir, tmp_path, capsys):
    cfg = _config(tiny_sd3_dir, tmp_path, **{"train.iterations": 2, "eval.every": 1, "eval.at_start": "true",
                                             "log.progress": "true"})
    Trainer(cfg).train()
    err = capsys.readouterr().err
    assert _last_bar(err, "held-out eval (iteration 0)") == "2/2"  # 4 prompts in one batch x 2 ODE steps
    scores = [json.loads(line) for line in (Path(cfg.run_dir) / "eval_scores.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in scores] == [0, 1, 2]
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    evaluated = [row for row in rows if "eval/mean_score" in row]
    assert [row["iteration"] for row in evaluated] == [0, 1, 2]
    for row in evaluated:
        assert f"held-out toy at iteration {row['iteration']}: {row['eval/mean_score']:.3f} (4 samples" in err, err
    assert _last_bar(err, "grpo:") == "2/2"


class StopsTheRun(Reward):
    """Brightness; its first call asks the trainer to stop, as SIGINT/SIGTERM during iteration 1 does."""

    name = "stops_the_run"
    request_stop = None  # the trainer's request_stop, set by the test

    def score_uint8(self, images, prompts, metadata):
        if StopsTheRun.request_stop is not None:
            StopsTheRun.request_stop("test: stop requested while iteration 1 scores")
            StopsTheRun.request_stop = None
        return RewardOutput(images.float().mean(dim=(1, 2, 3)) / 255.0)


def test_the_bar_counts_the_iterations_done_when_a_run_stops_early(tiny_sd3_dir, tmp_path, capsys):
    cfg = _config(tiny_sd3_dir, tmp_path, base={"rewards": [{"name": "test_fail_safe:StopsTheRun"}]},
                  **{"train.iterations": 3, "log.progress": "true", "log.save_every": 0})
    trainer = Trainer(cfg)
    StopsTheRun.request_stop = trainer.request_stop
    trainer.train()
    assert sorted(p.name for p in (Path(cfg.run_dir) / "checkpoints").iterdir()) == ["step_1"]
    assert _last_bar(capsys.readouterr().err, "grpo:") == "1/3"  # iteration 1 is done and saved


# ---------------------------------------------------------------- item 7: accelerate launch without its warning
@pytest.mark.parametrize("name", ["single", "multi_gpu"])
def test_shipped_accelerate_configs_load(name):
    from accelerate.commands.config import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    assert config.num_processes >= 1 and config.mixed_precision == "no"


def test_accelerate_launch_with_the_shipped_config_prints_no_defaults_warning(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('launched')\n")
    env = {k: v for k, v in __import__("os").environ.items()}
    env["HF_HOME"] = str(tmp_path / "hf")  # no machine-wide accelerate config to fall back on
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file",
                           str(ROOT / "configs" / "accelerate" / "single.yaml"), str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "launched" in done.stdout, done.stderr
    assert "were not passed to `accelerate launch`" not in done.stderr, done.stderr
    assert "--config_file configs/accelerate/single.yaml" in (ROOT / "README.md").read_text()
