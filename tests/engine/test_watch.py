"""The reward-hacking watch (flowgrpo/engine/watch.py): its statistics on hand-made pictures, its decision on
synthetic evaluation sequences, its baseline across a resume, and a run that it stops."""

import math
from types import SimpleNamespace

import pytest
import torch

from flowgrpo.engine.watch import (Change, Watch, brightness, decide, diversity, flicker, high_frequency,
                                   paired_change, saturation)
from rewards.base import Reward, RewardOutput
from tolerance import assert_close_ulps


def close(value, expected):
    assert_close_ulps(torch.as_tensor(value, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32),
                      ulps=16, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------ statistics
def test_a_grey_picture_is_its_grey_with_no_saturation_and_no_high_frequency():
    grey = torch.full((2, 3, 8, 8), 0.5)
    close(brightness(grey), [0.5, 0.5])
    close(saturation(grey), [0.0, 0.0])
    close(high_frequency(grey), [0.0, 0.0])


def test_pure_red_has_full_saturation_and_the_red_luma_weight():
    red = torch.zeros(1, 3, 4, 4)
    red[:, 0] = 1.0
    close(saturation(red), [1.0])
    close(brightness(red), [0.299])


def test_a_pixel_checkerboard_has_a_laplacian_of_four_everywhere():
    """Every interior pixel p has four neighbours 1 − p: 4p − 4(1 − p) = ±4, squared 16."""
    i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    board = ((i + j) % 2).float().expand(1, 3, 8, 8)
    close(high_frequency(board), [16.0])
    halves = torch.zeros(1, 3, 8, 8)
    halves[..., 4:] = 1.0  # one edge: only the two columns beside it, 1 each (of 6 interior columns)
    close(high_frequency(halves), [2 / 6])


def test_a_uniform_batch_has_zero_diversity_and_a_constant_offset_is_its_distance():
    same = torch.full((3, 3, 32, 32), 0.25)
    close(diversity(same, ["a"] * 3), [0.0] * 3)
    pair = torch.stack([torch.full((3, 32, 32), 0.25), torch.full((3, 32, 32), 0.75)])
    close(diversity(pair, ["b", "b"]), [0.5, 0.5])
    alone = diversity(pair, ["b", "c"])
    assert bool(alone.isnan().all())  # one sample per prompt: no diversity to measure


def test_flicker_is_the_mean_change_between_frames():
    video = torch.zeros(1, 4, 3, 8, 8)
    video[:, 1::2] = 1.0
    close(flicker(video), [1.0])
    close(flicker(torch.full((1, 4, 3, 8, 8), 0.3)), [0.0])
    close(brightness(video), [0.5])  # videos: the mean over frames


def test_paired_change_and_its_standard_error_by_hand():
    c = paired_change(torch.tensor([1.0, 2.0, 3.0, math.nan]), torch.tensor([2.0, 2.0, 5.0, 9.0]))
    # differences 1, 0, 2: mean 1, sample std 1, se 1/sqrt(3); spread of the start [1, 2, 3]: 1
    close([c.before, c.after, c.change, c.se, c.spread], [2.0, 3.0, 1.0, 1 / math.sqrt(3), 1.0])


# ------------------------------------------------------------------------------------------------ the decision
def _c(change, se=0.01, spread=0.1):
    return Change(0.5, 0.5 + change, change, se, spread)


@pytest.mark.parametrize("guard, change, rise, fires", [
    ("toy", -0.05, 0.1, True),  # a reward guard fell by 5 SE and half its spread while training rose
    ("toy", -0.05, 0.0, False),  # the training reward did not rise
    ("toy", -0.05, -0.1, False),
    ("toy", -0.02, 0.1, False),  # within 4 SE
    ("toy", +0.05, 0.1, False),  # a reward guard that rose is good news
    ("brightness", +0.05, 0.1, True),  # two-sided: either way
    ("brightness", -0.05, 0.1, True),
    ("high_frequency", +0.05, 0.1, True),  # artifacts up
    ("high_frequency", -0.05, 0.1, False),
    ("diversity", -0.05, 0.1, True),  # collapse
])
def test_the_watch_fires_on_a_guard_moving_against_its_direction_while_training_rises(guard, change, rise, fires):
    directions = {"brightness": 0, "high_frequency": -1, "diversity": 1, "toy": 1}
    alarms = decide({guard: _c(change)}, directions, rise, threshold=4.0, min_effect=0.25)
    assert [a.guard for a in alarms] == ([guard] if fires else [])


def test_a_significant_but_tiny_drift_does_not_fire():
    """Paired pixel statistics have tiny standard errors: 10 SE but 5% of the spread is not an alarm."""
    assert decide({"brightness": _c(0.005, se=0.0005, spread=0.1)}, {"brightness": 0}, 0.1, 4.0, 0.25) == []
    assert len(decide({"brightness": _c(0.005, se=0.0005, spread=0.1)}, {"brightness": 0}, 0.1, 4.0, 0.0)) == 1


# ------------------------------------------------------------------------------------------------ the Watch
def _cfg(guards, threshold=4.0, effect=0.25):
    return SimpleNamespace(eval=SimpleNamespace(guards=guards, hacking_threshold=threshold, hacking_min_effect=effect))


def test_the_watch_pairs_with_the_first_evaluation_and_keeps_it_across_a_resume(tmp_path):
    torch.manual_seed(0)
    start = torch.rand(16, 3, 16, 16) * 0.5
    prompts = [f"p{i // 4}" for i in range(16)]
    watch = Watch(_cfg(["brightness", "diversity"]), tmp_path, "image")
    metrics, alarms = watch.observe(0, watch.score(start, prompts, None), None, write=True)
    assert alarms == [] and set(metrics) == {"guard/brightness", "guard/diversity"}
    brighter = (start + 0.4).clamp(max=1.0)  # the brightness hack
    metrics, alarms = watch.observe(10, watch.score(brighter, prompts, None), (0.2, 0.6), write=True)
    assert [a.guard for a in alarms] == ["brightness"] and metrics["watch/alarms"] == 1
    assert metrics["guard/brightness_change"] > 0.3
    again = Watch(_cfg(["brightness", "diversity"]), tmp_path, "image")  # a resumed run: the same start
    _, alarms = again.observe(20, again.score(brighter, prompts, None), (0.2, 0.6), write=True)
    assert [a.guard for a in alarms] == ["brightness"]
    same = Watch(_cfg(["brightness"]), tmp_path / "other", "image")
    same.observe(0, same.score(start, prompts, None), None, write=True)
    assert same.observe(10, same.score(start, prompts, None), (0.2, 0.6), write=True)[1] == []  # negative control


def test_the_default_guard_is_the_held_out_reward_itself(tmp_path):
    """eval.guards' default, held_out: the evaluation's own scores (no rescoring); it falls while training rises."""
    from flowgrpo.config import load_config

    assert load_config(None, None, []).eval.guards == ["held_out"]
    watch = Watch(_cfg(["held_out"], threshold=3.0, effect=0.1), tmp_path, "vector")  # any modality
    scores = torch.linspace(0, 1, 64)
    assert set(watch.score(None, [], None, held_out=scores)) == {"held_out"}
    watch.observe(0, watch.score(None, [], None, held_out=scores), None, write=False)
    _, alarms = watch.observe(5, watch.score(None, [], None, held_out=scores - 0.2), (0.1, 0.3), write=False)
    assert [a.guard for a in alarms] == ["held_out"]
    _, alarms = watch.observe(5, watch.score(None, [], None, held_out=scores + 0.2), (0.1, 0.3), write=False)
    assert alarms == []  # the held-out reward rose with the training reward: learning, not hacking


def test_image_statistics_are_refused_for_vector_models(tmp_path):
    from flowgrpo.config import ConfigError

    with pytest.raises(ConfigError, match="eval.guards: 'brightness' is an image statistic"):
        Watch(_cfg(["brightness"]), tmp_path, "vector")


# ------------------------------------------------------------------------------------------------ a run it stops
class Rising(Reward):
    """A training reward that rises every call (the training side of a hack)."""

    name, calls = "rising", 0

    def score_uint8(self, images, prompts, metadata):
        type(self).calls += 1
        return RewardOutput(torch.linspace(0, 1, images.shape[0]) + 0.1 * type(self).calls)


class Worsening(Reward):
    """A guard whose score falls at every evaluation after the first (what a hacked gold reward does)."""

    name, calls = "worsening", 0

    def score_uint8(self, images, prompts, metadata):
        type(self).calls += 1
        return RewardOutput(torch.linspace(0, 1, images.shape[0]) - 0.3 * (type(self).calls - 1))


def test_stop_on_hacking_stops_the_run_with_a_checkpoint(tiny_sd3_dir, tmp_path, capsys):
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from train_fixtures import overrides

    Rising.calls = Worsening.calls = 0
    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "log.samples_every": 0, "log.gallery": "false",
        "train.iterations": 6, "eval.every": 1, "eval.at_start": "true", "eval.limit": 4, "log.save_every": 0,
        "eval.guards": "[test_watch:Worsening]", "eval.stop_on_hacking": "true"}),
        base={"rewards": [{"name": "test_watch:Rising"}]})
    Trainer(cfg).train()
    err = capsys.readouterr().err
    assert "reward hacking? guard 'test_watch:Worsening' went" in err and "#view=compare" in err
    assert "stopping at iteration 2: eval.stop_on_hacking is set" in err
    saved = sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir())
    assert saved == ["step_2"]  # it stopped where the watch fired, with a checkpoint


def test_the_training_rise_is_of_the_weighted_objective_so_a_minimised_reward_rises_as_it_falls():
    from flowgrpo.config import load_config
    from flowgrpo.engine.scoring import Scoring

    cfg = load_config(None, None, ["rewards=[{name: 'rewards.stats:MeanBrightness', weight: -1.0}, "
                                   "{name: toy, weight: 0.5}]"])
    scoring = Scoring(cfg, "image")
    try:
        darker = scoring.objective({"reward/mean_brightness_mean": 0.6, "reward/toy_mean": 0.4})
        lighter = scoring.objective({"reward/mean_brightness_mean": 0.8, "reward/toy_mean": 0.4})
        assert darker == pytest.approx(-0.6 + 0.2) and lighter == pytest.approx(-0.8 + 0.2) and darker > lighter
        assert math.isnan(scoring.objective({"reward/toy_mean": 0.4}))
    finally:
        scoring.close()


class _Backbone:
    """image_features: uint8 images -> a 2-d embedding that sees only the mean of the red channel."""

    def image_features(self, images):
        red = images[:, 0].float().mean((1, 2)) / 255.0
        return torch.stack([red, torch.zeros_like(red)], 1)


class EmbeddingGuard(Reward):
    name = "embedding_guard"
    modality = "image"

    def __init__(self):
        self.clip = _Backbone()

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(torch.zeros(images.shape[0]))


def test_diversity_uses_a_loaded_clip_reward_embedding_and_pixels_otherwise(tmp_path):
    cfg = SimpleNamespace(eval=SimpleNamespace(guards=["diversity", "test_watch:EmbeddingGuard"]))
    watch = Watch(cfg, tmp_path, "image")
    images = torch.zeros(2, 3, 16, 16)
    images[0, 1], images[1, 2] = 1.0, 1.0  # green vs blue: far apart in pixels, equal red: 0 in the embedding
    assert float(watch.score(images, ["p", "p"], None)["diversity"][0]) == 0.0
    plain = Watch(SimpleNamespace(eval=SimpleNamespace(guards=["diversity"])), tmp_path, "image")
    assert plain.embedder() is None and float(plain.score(images, ["p", "p"], None)["diversity"][0]) > 0.5
    images[1, 0] = 1.0  # now the red means differ by 1: the embedding's distance is 1/sqrt(2) (RMS over 2 dims)
    close(watch.score(images, ["p", "p"], None)["diversity"], [2 ** -0.5] * 2)
