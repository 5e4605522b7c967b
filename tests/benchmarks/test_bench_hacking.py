"""benchmarks/bench_hacking.py: every hack and defence composes into the config it claims; the table's statistics."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_hacking  # noqa: E402


@pytest.mark.parametrize("defence", list(bench_hacking.DEFENCES))
@pytest.mark.parametrize("hack", ["brightness", "darkness"])
def test_every_defence_composes_with_the_hacked_reward(hack, defence, tmp_path):
    cfg = bench_hacking.config_for(1, hack, defence, 40, 5, [f"output_dir={tmp_path}"])
    weight = 1.0 if hack == "brightness" else -1.0
    names = [(r.name, r.weight) for r in cfg.rewards]
    if defence == "mix":
        assert names == [("rewards.stats:MeanBrightness", 0.5 * weight), ("toy", 0.5)]
    else:
        assert names == [("rewards.stats:MeanBrightness", weight)]
    assert cfg.eval.reward == "toy" and cfg.eval.guards == ["held_out"] and cfg.train.seed == 1
    assert cfg.learner.kl_coef == {"kl1": 1.0, "kl10": 10.0}.get(defence, cfg.learner.kl_coef)
    assert cfg.eval.stop_on_hacking == (defence == "stop") and cfg.advantage.diversity == (defence == "gardo")
    assert (cfg.loss.ratio == "guard") == (defence == "grpo_guard")
    assert cfg.run_dir == tmp_path / (f"bench-hacking-{hack}-s1" if defence == "none" else f"bench-hacking-{hack}-{defence}-s1")


def test_the_defences_table_takes_means_and_standard_errors_over_seeds():
    runs = [{"defence": "kl1", "training_first": 0.5, "training_last5": 0.5 + rise, "alarms": alarms, "iterations": 40,
             "seconds": 100.0, "evaluations": [{"change": change}]}
            for rise, change, alarms in ((0.1, -0.2, 2), (0.2, -0.1, 0), (0.3, 0.0, 1))]
    row = bench_hacking.defences_table(runs)[2]
    # rises 0.1, 0.2, 0.3: mean 0.2, SE = 0.1/sqrt(3); changes -0.2, -0.1, 0: mean -0.1, the same SE
    assert row == "| kl1 | +0.200 ± 0.058 | -0.100 ± 0.058 | 2/3 | 40, 40, 40 | 100 |"
