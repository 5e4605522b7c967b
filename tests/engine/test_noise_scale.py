"""The in-training gradient noise scale (flowgrpo/engine/noise_scale.py): its fit on exact expectations, the probe on
synthetic gradients with a known answer, and a check on the analytic world against a run known to learn and
one whose reward is pure noise."""

import pytest
import torch

from flowgrpo.engine.noise_scale import GradientProbe, NoiseScale, fit_noise, noise_message
from rewards.base import Reward, RewardOutput

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_fit_recovers_signal_and_trace_from_exact_expectations():
    sizes = torch.tensor([2.0, 2.0, 3.0, 8.0, 32.0], dtype=torch.float64)
    signal, trace = 0.7, 12.0
    got = fit_noise(signal + trace / sizes, sizes)
    assert got == pytest.approx((signal, trace), rel=1e-9)
    with pytest.raises(ValueError, match="two different batch sizes"):
        fit_noise(torch.ones(3), torch.full((3,), 4.0))


def test_averages_are_divided_and_a_value_needs_a_significant_signal():
    scale = NoiseScale(window=4, z=2.0)
    for signal, trace in ((0.1, 4.0), (0.12, 4.2), (0.08, 3.8)):
        scale.add(signal, trace)
    assert scale.value == pytest.approx(4.0 / 0.1)  # the ratio of the averages
    noisy = NoiseScale(window=4)
    for signal in (-0.1, 0.3, -0.05, 0.1):  # mean 0.0625, se 0.087: not significant
        noisy.add(signal, 4.0)
    assert noisy.value is None and noisy.lower_bound == pytest.approx(4.0 / (0.0625 + 2 * float(torch.tensor(
        [-0.1, 0.3, -0.05, 0.1], dtype=torch.float64).std() / 2)))
    assert "no signal detected" in noise_message(None, 8, 23.4) and "B_noise > 23 prompts" in noise_message(None, 8, 23.4)
    assert "5.0× the batch of 8" in noise_message(40.0, 8) and "use a forward-process learner" in noise_message(40.0, 8)
    assert "forward-process" not in noise_message(40.0, 8, forward_learner=True)  # it already is one


@pytest.mark.parametrize("dim, sigma, mean", [(200, 1.0, 2.0), (50, 0.3, 0.3), (50, 0.3, 0.0)])
def test_probe_measures_a_known_noise_scale_from_micro_batches(dim, sigma, mean):
    """Units draw gradients g_u = G + σ·ε (ε ~ N(0, I_D)); a step of B = 32 units in 4 micro-batches
    accumulates (1/B)·Σ g_u, as the learners' normalised losses do. The answer is B_noise = D·σ²/|G|²
    (50 units in both cases), and with G = 0 no signal is claimed. (The estimate's relative standard
    error is about (B_noise/b)·√(2/D)/√steps: 5% here; B_noise = 800 would need ~40× the steps.)"""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.zeros(dim))
    probe = GradientProbe([param], window=200)
    G = torch.full((dim,), mean / dim**0.5)  # |G|² = mean²
    B, parts = 32, [5, 11, 8, 8]
    for _ in range(200):
        probe.active = True
        probe.begin_step()
        param.grad = torch.zeros(dim)
        for b in parts:
            units = G + sigma * torch.randn(b, dim)
            param.grad += units.sum(0) / B
            probe.after_backward(b)
        probe.end_step(B)
    if mean == 0:
        assert probe.scale.value is None and probe.scale.lower_bound > 100  # about 280 expected
        return
    truth = dim * sigma**2 / mean**2
    assert probe.scale.value == pytest.approx(truth, rel=0.25), (probe.scale.value, truth)


class CoinFlip(Reward):
    """A vector reward that ignores the sample: its policy gradient is pure noise."""

    name = "coin_flip"
    modality = "vector"

    def score_vectors(self, x, prompts, metadata):
        return RewardOutput(torch.randint(0, 2, (x.shape[0],)).float())


@pytest.mark.parametrize("reward, expect_signal", [("analytic_hit", True), ("test_noise_scale:CoinFlip", False)])
def test_the_diagnostic_sees_the_signal_of_a_run_that_learns_and_none_in_noise(reward, expect_signal, tmp_path, capfd):
    """On the analytic world (d = 2, Flow-GRPO, 8 prompts per step drawn from 64 lines: the 8 prompts × 8,
    so a step's prompts are close to independent draws), probing every iteration for 60 iterations: with
    analytic_hit (which this run learns) a signal is detected and B_noise is a few batches (measured
    21 prompts); with a reward that ignores the sample, none is detected. Tied groups train at A = 0: late in the run
    7 of 8 groups tie, and skipped they would leave one trained prompt a step, which no probe can split."""
    from flowgrpo.config import load_config
    from flowgrpo.run.paths import configs_dir
    from flowgrpo.engine.trainer import Trainer
    from worlds import analytic

    torch.manual_seed(0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(p.text for _ in range(8) for p in analytic.train_prompts()) + "\n")
    cfg = load_config("flow_grpo", None, [f"output_dir={tmp_path}", "log.progress=false", "log.gallery=false",
                                          "train.iterations=60", "log.grad_noise_every=1", "eval.every=0",
                                          "log.samples_every=0", f"rewards=[{{name: '{reward}'}}]", f"prompts={prompts}",
                                          "sampling.plan.group_size=8", "advantage.tied_groups=train"],
                    base=str(configs_dir() / "analytic.yaml"))
    trainer = Trainer(cfg)
    trainer.policy.probe.scale.window = 60
    trainer.train()
    noise = trainer.policy.probe.scale.value
    if expect_signal:
        assert noise is not None and noise < 10 * 8, noise
    else:
        assert noise is None, noise
    # every reading below the batch's noise scale is in train.log; the console repeats only the news
    logged = [line.split(" ", 2)[2] for line in (trainer.cfg.run_dir / "train.log").read_text().splitlines()
              if "gradient noise scale" in line]
    shown = [line for line in capfd.readouterr().err.splitlines() if line.startswith("gradient noise scale")]
    assert logged and 1 <= len(shown) <= len(logged) and set(shown) <= set(logged), (len(shown), len(logged))


def test_a_reading_is_printed_again_only_when_it_is_news():
    """The console gets a noise reading again only when it moved 2x from the last one printed; the
    readings of a run that wander between "≈ N" and "no signal, > M" lines of one size print once."""
    import math

    from flowgrpo.engine.noise_scale import noise_reading, worth_repeating

    assert noise_reading(40.0, 12.0) == 40.0 and noise_reading(None, 12.0) == 12.0 and noise_reading(None, None) == math.inf
    assert worth_repeating(None, 129.0)
    assert not worth_repeating(100.0, 129.0) and not worth_repeating(100.0, 51.0)
    assert worth_repeating(100.0, 200.0) and worth_repeating(100.0, 50.0)
    assert worth_repeating(100.0, math.inf) and worth_repeating(math.inf, 100.0)  # a bound appears or is lost
    assert not worth_repeating(math.inf, math.inf)  # no bound twice: the same line
    # a default image run's 50 readings in order (estimate, or None and the lower bound), from its train.log
    readings = [(None, 129), (None, 95), (None, 66), (148, None), (156, None), (None, 88), (None, 101), (188, None),
                (196, None), (None, 115), (229, None), (198, None), (None, 111), (None, 124), (None, 148), (None, 177),
                (None, 156), (None, 132), (None, 129), (None, 153), (None, 115), (None, 140), (None, 140), (None, 157),
                (None, 184), (None, 188), (None, 245), (None, 290), (None, 107), (None, 116), (None, 107), (None, 103),
                (None, 91), (None, 98), (None, 94), (None, 94), (None, 105), (None, 96), (None, 88), (None, 80),
                (None, 89), (None, 81), (None, 63), (None, 62), (None, 61), (None, 61), (109, None), (101, None),
                (108, None), (102, None)]
    said, printed = None, []
    for noise, bound in readings:
        value = noise_reading(noise, bound)
        if worth_repeating(said, value):
            said = value
            printed.append(value)
    assert printed == [129, 290, 107], printed  # 290 is 2.2x the first, 107 is 2.7x below it
