"""Resume continues bit-identically on CPU; bad configs fail with messages that name the fix."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowgrpo.config import ConfigError, load_config
from flowgrpo.engine.optim import learning_rate_at
from flowgrpo.engine.trainer import Trainer
from train_fixtures import PLUGIN_REWARD, overrides

SMALL = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4}
RESUME = {**SMALL, "sampling.plan.num_steps": 6, "sampling.window.interval": 1, "train.ema_decay": 0.9}
COMPARED = ("loss", "reward/brightness_mean", "grad_norm", "advantage/abs_mean", "max_abs_ratio_minus_1_epoch0")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_continues_bit_identically(tiny_sd3_dir, tmp_path):
    straight = load_config("mixgrpo", None, overrides(tiny_sd3_dir, tmp_path / "a", **RESUME, **{"train.iterations": 4}),
                           base=PLUGIN_REWARD)
    Trainer(straight).train()
    first = load_config("mixgrpo", None, overrides(tiny_sd3_dir, tmp_path / "b", **RESUME, **{"train.iterations": 2}),
                        base=PLUGIN_REWARD)
    Trainer(first).train()  # stops after 2 iterations, as if interrupted
    first.train.iterations = 4
    Trainer(first).train()  # resumes from checkpoints/step_2
    a, b = _metrics(Path(straight.run_dir)), _metrics(Path(first.run_dir))
    for key in COMPARED:
        assert [r[key] for r in a] == [r[key] for r in b], key
    wa = load_file(Path(straight.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    wb = load_file(Path(first.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])][:5]


def test_diffusion_nft_resumes_bit_identically(tiny_sd3_dir, tmp_path):
    """DiffusionNFT's state goes through the checkpoint: the sampling policy θ_old (old.* tensors; it
    moves after every iteration), the optimizer, and the forward-process draws (pure functions of the
    seed, iteration, epoch and sample)."""
    nft = {**SMALL, "learner.train_times": 3, "train.inner_epochs": 2, "learner.nft.old.rate": 0.2}
    straight = load_config("diffusion_nft", None, overrides(tiny_sd3_dir, tmp_path / "a", **nft, **{"train.iterations": 4}),
                           base=PLUGIN_REWARD)
    Trainer(straight).train()
    first = load_config("diffusion_nft", None, overrides(tiny_sd3_dir, tmp_path / "b", **nft, **{"train.iterations": 2}),
                        base=PLUGIN_REWARD)
    Trainer(first).train()
    first.train.iterations = 4
    Trainer(first).train()
    a, b = _metrics(Path(straight.run_dir)), _metrics(Path(first.run_dir))
    for key in ("loss", "reward/brightness_mean", "grad_norm", "max_abs_vplus_minus_vold_epoch0"):
        assert [r.get(key) for r in a] == [r.get(key) for r in b], key
    assert a[-1]["max_abs_vplus_minus_vold_epoch0"] > 0  # θ_old lags θ after the first iteration
    wa = load_file(Path(straight.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    wb = load_file(Path(first.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    assert wa.keys() == wb.keys() and any(k.startswith("old.") for k in wa)
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])][:5]


def test_learning_rate_schedules_by_hand():
    t = load_config(None, None, ["train.learning_rate=0.002", "train.iterations=5", "train.lr_final=0.25"]).train
    lr = {}
    for name in ("constant", "cosine", "linear"):
        t.lr_schedule = name
        lr[name] = [learning_rate_at(t, i) for i in range(6)]
    assert lr["constant"] == [0.002] * 6
    # progress i/4: the first iteration trains at learning_rate, the last (and any after it) at lr_final·learning_rate
    assert lr["linear"] == pytest.approx([0.002, 0.002 * (0.25 + 0.75 * 0.75), 0.002 * 0.625, 0.002 * (0.25 + 0.75 * 0.25),
                                          0.0005, 0.0005], rel=1e-12)
    half = 0.5 * (1 + 2 ** -0.5)  # (1 + cos(π/4)) / 2
    assert lr["cosine"] == pytest.approx([0.002, 0.002 * (0.25 + 0.75 * half), 0.002 * 0.625,
                                          0.002 * (0.25 + 0.75 * (1 - half)), 0.0005, 0.0005], rel=1e-12)


def test_the_trainer_follows_the_schedule(tiny_sd3_dir, tmp_path):
    cfg = load_config(None, None, overrides(tiny_sd3_dir, tmp_path, **SMALL, **{
        "train.iterations": 3, "train.learning_rate": 0.001, "train.lr_schedule": "linear", "train.lr_final": 0.1}),
        base=PLUGIN_REWARD)
    Trainer(cfg).train()
    assert [r["lr"] for r in _metrics(Path(cfg.run_dir))] == pytest.approx([0.001, 0.00055, 0.0001], rel=1e-12)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.iterationz=3"], "did you mean 'iterations'"),
        (["sampling.plan.group_size=1"], "group_size=1"),
        (["train.prompts_per_iteration=3", "sampling.batches_per_iteration=2"], "not divisible"),
        (["loss.ratio=magic"], "loss.ratio='magic' is not allowed"),
        (["model.pretrained=./does/not/exist"], None),  # checked at load time, below
        (["train.iterations"], "is not key=value"),
        (["learner.name=ppo"], "learner.name='ppo' is unknown"),
        (["learner.name=transition", "sampling.plan.kernel=ode"],
         "sampling.plan.kernel=ode rolls out with ODE steps only (no side_steps), which leaves the transition learner "
         "nothing to train"),
        (["rewards=[{name:toy}]"], "write each reward as {name: NAME, weight: W}"),
        (["learner.name=dgpo", "learner.share_draws=sample"], "set learner.share_draws=group"),
        (["learner.time_min=0.9", "learner.time_max=0.5"], "learner.time_min=0.9 < learner.time_max=0.5 is needed"),
        (["learner.time_sampler=beta"], "learner.time_sampler='beta' is not allowed"),
        (["train.lr_schedule=step"], "train.lr_schedule='step' is not allowed; use one of"),
        (["train.lr_schedule=cosine", "train.lr_final=2"], "train.lr_final=2.0 is not allowed; use a number in"),
    ],
)
def test_bad_configs_name_the_fix(args, message):
    if message is None:
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, None, args)


def test_the_retired_method_key_and_an_old_preset_name_name_the_fix():
    """sampling.method is gone (a preset's file is its whole method); an old method name as --preset names the new."""
    with pytest.raises(ConfigError, match=r"^sampling.method is gone: a preset's file is its whole method, .*--preset NAME"):
        load_config(None, None, ["sampling.method=flow_grpo"])
    with pytest.raises(ConfigError, match=r"^preset 'dance_grpo' is called 'dancegrpo' now \(--preset dancegrpo\)$"):
        load_config("dance_grpo", None, [])
    assert load_config("dancegrpo", None, []).sampling.plan["kernel"] == "dance_sde"


def test_missing_model_and_unknown_reward_fail_clearly(tiny_sd3_dir, tmp_path):
    cfg = load_config(None, None, [f"model.pretrained={tmp_path}/missing", f"output_dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trainer(cfg)
    cfg = load_config(None, None, [f"model.pretrained={tiny_sd3_dir}", f"output_dir={tmp_path}"],
                      base={"rewards": [{"name": "no_such_reward"}]})
    from flowgrpo.run.errors import UserError

    with pytest.raises(UserError, match="unknown reward 'no_such_reward' in rewards\\[0\\]"):  # one line at the CLI
        Trainer(cfg)


def test_groups_must_not_split_across_processes():
    from flowgrpo.config import processes_check

    cfg = load_config(None, None, ["train.prompts_per_iteration=3"])
    with pytest.raises(ConfigError, match="cannot be split evenly over 2 processes"):
        processes_check(cfg, 2)



def test_reward_failures_are_masked_and_logged(tiny_sd3_dir, tmp_path):
    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **SMALL, **{"train.iterations": 1}),
                      base={"rewards": [{"name": "train_fixtures:Brightness"}, {"name": "train_fixtures:BrokenShape"},
                                        {"name": "train_fixtures:AlwaysNaN"}]})
    Trainer(cfg).train()
    log = (Path(cfg.run_dir) / "train.log").read_text()
    assert "reward 'broken_shape' failed on a batch" in log and "expected (4,)" in log
    row = _metrics(Path(cfg.run_dir))[-1]
    assert row["reward/broken_shape_mean"] is None and row["reward/always_nan_mean"] is None
    assert row["nan_reward_fraction"] == 1.0 and row["trained_transitions"] == 0  # nothing trained on NaN
