"""benchmarks/bench_train_default.py on a tiny random SD3: one seed's run records its evaluations and
training rewards, and ``--control`` (the sign-flip negative control) trains on the negated reward."""

import sys
from pathlib import Path

import pytest

from train_fixtures import overrides

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_train_default as bench  # noqa: E402


@pytest.mark.parametrize("control", [False, True], ids=["run", "control"])
def test_one_seed_runs_and_the_control_negates_the_reward(control, tiny_sd3_dir, tmp_path):
    extra = overrides(tiny_sd3_dir, tmp_path, **{"rewards": "[{name: toy_dense, weight: 1.0}]", "train.iterations": 2, "eval.every": 1,
                                                  "log.samples_every": 0, "log.save_every": 0, "log.gallery": False})
    result = bench.run_seed((0, "image", 5.0, 1, extra, 1, None, "-test" + ("-control" if control else ""), control))
    assert [e["iteration"] for e in result["evaluations"]] == [0, 1, 2]  # an evaluation every iteration
    assert len(result["rewards"]) == 2 and all(0 <= r["reward"] <= 1 for r in result["rewards"])
    assert result["reward_weights"] == [-1.0 if control else 1.0]  # the weights the trainer combined rewards with
    assert result["run_dir"].endswith("-control-s0") == control
