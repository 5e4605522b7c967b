"""Reward plug-ins that fail, as a run meets them (flowgrpo/engine/scoring.py, rewards/runner.py): a constructor
that raises is one line before anything trains; wrong shapes or dtypes, NaN or infinite scores on every sample
and a scorer that hangs past ``rewards[i].timeout_s`` give no valid reward, and the dead-reward rule stops the run
with one line naming the reward and its error (exit 2). The analytic world, seconds each."""

import threading
import time

import pytest
import torch

from flowgrpo.cli.train import main
from flowgrpo.run.paths import configs_dir
from rewards.analytic import AnalyticHit
from rewards.base import Reward, RewardOutput
from rewards.runner import RewardRunner

ANALYTIC = str(configs_dir() / "analytic.yaml")
QUIET = ["log.progress=false", "log.samples_every=0", "log.gallery=false", "eval.every=0", "eval.at_start=false",
         "log.save_every=0", "train.max_iterations_without_reward=2"]


def _train(tmp_path, reward: str, iterations: int = 5) -> int:
    return main(["--config", ANALYTIC, f"output_dir={tmp_path}", f"train.iterations={iterations}", *QUIET,
                 f"rewards=[{reward}]"], prog="train_t2i.py", description="", default="default")


class Unbuildable(Reward):
    name, modality = "unbuildable", "vector"

    def __init__(self, path: str = "weights.safetensors"):
        raise FileNotFoundError(f"no such file: {path}")


class WrongShape(Reward):
    name, modality = "wrong_shape", "vector"

    def score_vectors(self, x, prompts, metadata):
        return RewardOutput(torch.zeros(x.shape[0], 2))


class WrongDtype(Reward):
    name, modality = "wrong_dtype", "vector"

    def score_vectors(self, x, prompts, metadata):
        return RewardOutput(torch.zeros(x.shape[0], dtype=torch.float64))


class Infinite(Reward):
    name, modality = "infinite", "vector"

    def score_vectors(self, x, prompts, metadata):
        return RewardOutput(torch.full((x.shape[0],), float("inf")))


class AllNaN(Reward):
    name, modality = "all_nan", "vector"

    def score_vectors(self, x, prompts, metadata):
        return RewardOutput(torch.full((x.shape[0],), float("nan")))


class Hangs(AnalyticHit):
    """Answers the first call, then sleeps far past any timeout (bounded, so the test's thread ends)."""

    name = "hangs"
    calls = 0

    def score_vectors(self, x, prompts, metadata):
        type(self).calls += 1
        if type(self).calls > 1:
            time.sleep(20)
        return super().score_vectors(x, prompts, metadata)


def test_a_reward_whose_constructor_raises_is_one_line(tmp_path, capsys):
    assert _train(tmp_path, "{name: 'test_reward_faults:Unbuildable', kwargs: {path: /nope/w.safetensors}}") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ("train_t2i.py: error: reward 'test_reward_faults:Unbuildable' (rewards[0]) could not be built: "
            "FileNotFoundError: no such file: /nope/w.safetensors; check its kwargs") in err
    assert not (tmp_path / "analytic" / "metrics.jsonl").exists()  # nothing trained


@pytest.mark.parametrize("plugin, says", [("WrongShape", "returned scores (8, 2) torch.float32, expected (8,) float32"),
                                          ("WrongDtype", "returned scores (8,) torch.float64, expected (8,) float32"),
                                          ("Infinite", "no sample had a finite score in every reward (infinite)"),
                                          ("AllNaN", "returned NaN (not applicable) for every sample")])
def test_a_reward_that_never_gives_a_valid_score_stops_the_run(tmp_path, capsys, plugin, says):
    """Malformed outputs are failures (retried, then NaN); infinite or NaN scores on every sample are no valid reward:
    after 2 such iterations the run stops with one line naming the reward and what it returned."""
    assert _train(tmp_path, f"{{name: 'test_reward_faults:{plugin}'}}") == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "error:" in x]
    assert "Traceback" not in err and len(line) == 1, err
    assert "no valid reward in 2 iterations in a row (iterations 1-2)" in line[0] and says in line[0], line[0]


def test_a_reward_that_hangs_times_out_and_the_run_stops(tmp_path, capsys):
    """timeout_s=0.5: the second call never answers in time, the third waits for the hung one no longer than the
    timeout; two rewardless iterations stop the run in seconds, not after the 20 s sleep."""
    Hangs.calls = 0
    started = time.perf_counter()
    assert _train(tmp_path, "{name: 'test_reward_faults:Hangs', timeout_s: 0.5}", iterations=6) == 2
    took = time.perf_counter() - started
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "error:" in x)
    assert "no valid reward in 2 iterations in a row (iterations 2-3)" in line and "timeout_s=0.5" in line, line
    assert took < 15, took


def test_the_runner_bounds_one_call_and_the_next_waits_no_longer():
    """RewardRunner's timeout on its own: a hung call is a RewardTimeout error for its batch (not retried), the
    reward's next call fails after the same timeout while the first still runs, and once it has returned the
    reward scores again."""
    release = threading.Event()

    class Blocks(AnalyticHit):
        name = "blocks"

        def score_vectors(self, x, prompts, metadata):
            if metadata and metadata[0].get("block"):
                release.wait(10)
            return super().score_vectors(x, prompts, metadata)

    runner = RewardRunner({"blocks": (Blocks(), 1.0)}, retries=2, backoff_s=0.0, timeouts={"blocks": 0.3})
    x, prompts = torch.zeros(2, 2), ["mode 0", "mode 1"]
    try:
        started = time.perf_counter()
        hung = runner.score(x, prompts, [{"block": True}, {}])
        assert hung.errors["blocks"].startswith("RewardTimeout: no answer within timeout_s=0.3 s")
        assert time.perf_counter() - started < 2  # one attempt, not three
        busy = runner.score(x, prompts, [{}, {}])
        assert "still busy" in busy.errors["blocks"] and bool(busy.total.isnan().all())
        release.set()
        time.sleep(0.2)
        fine = runner.score(x, prompts, [{}, {}])
        assert not fine.errors and bool(torch.isfinite(fine.total).all())
    finally:
        release.set()
        runner.close()
