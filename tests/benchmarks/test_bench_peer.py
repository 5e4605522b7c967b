"""benchmarks/bench_peer.py: its pure helpers always; the comparison with a yifan123/flow_grpo checkout only
when FLOW_GRPO_PATH names one (the benchmark imports that code at run time; the project ships none of it)."""

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import samplers
from flowgrpo.config import preset_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_peer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
PEER = os.environ.get("FLOW_GRPO_PATH")
needs_peer = pytest.mark.skipif(not PEER, reason="set FLOW_GRPO_PATH to a checkout of yifan123/flow_grpo")
EPS32 = float(torch.finfo(torch.float32).eps)


def test_tolerance_is_ulps_of_the_largest_magnitude():
    values = torch.tensor([4.0, -2.0, 0.5])
    assert bench_peer.tolerance(values) == pytest.approx(bench_peer.TOLERANCE_ULPS * EPS32 * 4.0, rel=1e-12)
    assert bench_peer.tolerance(values * 1000) == pytest.approx(1000 * bench_peer.tolerance(values), rel=1e-12)


def test_compare_passes_inside_the_tolerance_and_fails_outside():
    ours = 3.0 * torch.randn(50, generator=torch.Generator().manual_seed(0))
    tol = bench_peer.tolerance(ours)
    assert bench_peer.compare("x", ours, ours + 0.5 * tol)["ok"]
    bad = ours.clone()
    bad[7] += 2 * tol
    result = bench_peer.compare("x", ours, bad)
    assert not result["ok"] and result["max_abs_diff"] == pytest.approx(2 * tol, rel=1e-3)
    with pytest.raises(ValueError, match="shapes differ"):
        bench_peer.compare("x", ours, ours[:3])


def test_median_ratio_is_theirs_over_ours():
    assert bench_peer.median_ratio([1.0, 2.0, 30.0], [2.0, 4.0, 6.0]) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("steps", [4, 10, 16])
def test_trained_steps_match_flowgrpos_flow_grpo_plan(steps):
    plan = samplers.build_schedule({**preset_plan("flow_grpo")[0], "num_steps": steps, "group_size": 2}).plan(0)
    counts = plan.counts()
    assert counts["trained"] // counts["leaves"] == bench_peer.trained_steps(steps)


def test_per_sample_steps_puts_each_transition_at_its_sample_and_step():
    plan = samplers.build_schedule({**preset_plan("flow_grpo")[0], "num_steps": 4, "group_size": 3}).plan(0)
    rec = samplers.rollout(lambda x, s, c: 0.1 * x + c.view(-1, 1, 1, 1).float(), plan, prompt_ids=[5, 9],
                           latent_shape=(2, 4, 4), seed=0)
    steps = bench_peer.per_sample_steps(rec, rec.step.double(), 3)
    assert steps.shape == (6, 3) and bool((steps == torch.tensor([0.0, 1.0, 2.0])).all())
    first = bench_peer.per_sample_steps(rec, rec.state.flatten(1)[:, 0].double(), 3)[:, 0]
    assert torch.equal(first, rec.root_state.flatten(1)[:, 0].double())  # step 0 starts at the sample's own x_T
    # x' of step j is x of step j + 1, sample by sample
    nxt = bench_peer.per_sample_steps(rec, rec.next_state.flatten(1)[:, 3].double(), 3)
    cur = bench_peer.per_sample_steps(rec, rec.state.flatten(1)[:, 3].double(), 3)
    assert torch.equal(nxt[:, :2], cur[:, 1:])


def test_fed_noise_hands_out_the_draws_in_order_and_restores():
    original = object()
    module = SimpleNamespace(randn_tensor=original)
    a, b = torch.ones(2, 3), 2 * torch.ones(2, 3)
    with bench_peer.fed_noise(module, [a, b]):
        assert torch.equal(module.randn_tensor((2, 3), generator=None, device="cpu", dtype=torch.float32), a)
        assert torch.equal(module.randn_tensor((2, 3), device="cpu", dtype=torch.float32), b)
    assert module.randn_tensor is original
    with bench_peer.fed_noise(module, [a]), pytest.raises(RuntimeError, match="shape"):
        module.randn_tensor((3, 2), device="cpu", dtype=torch.float32)
    assert module.randn_tensor is original


def test_scheduler_grid_uses_the_given_sigmas_as_they_are():
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    grid = [float(s) for s in samplers.time_grid(4, 3.0).to(torch.float32)[:-1]]
    with bench_peer.scheduler_grid(scheduler):
        scheduler.set_timesteps(sigmas=grid)
        assert scheduler.sigmas[:-1].tolist() == grid
        assert torch.equal(scheduler.timesteps, scheduler.sigmas[:-1] * 1000)
    assert scheduler.shift == 3.0


def test_timed_calls_times_a_network_called_directly_and_unhooks():
    from flowgrpo.run.timing import CallTimer

    net = torch.nn.Linear(3, 3)
    timer = CallTimer("cpu")
    with bench_peer.timed_calls(net, timer):
        with torch.no_grad():
            net(torch.ones(5, 3))
        out = net(torch.ones(2, 3))
        with timer.backward():
            out.sum().backward()
    net(torch.ones(4, 3))  # after the block: not counted
    t = timer.totals()
    assert (t["calls_no_grad"], t["rows_no_grad"], t["calls_grad"], t["rows_grad"], t["backward_calls"]) == (1, 5, 1, 2, 1)


@needs_peer
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_peer_computes_the_same_log_probs_from_the_same_noise(tiny_sd3_dir, tmp_path, dtype):
    """bfloat16: the reference pipeline hands its transformer float32 latents (accelerate autocasts them there);
    the shared bf16 transformer takes them cast, as flowgrpo's adapter casts its own."""
    result = bench_peer.main(["--flow-grpo", PEER, "--check-only", "--prompts", "2", "--group", "2", "--steps", "4",
                              "--micro-batch", "4", f"model.pretrained={tiny_sd3_dir}", f"output_dir={tmp_path}",
                              "model.resolution=32", "model.lora_rank=4", "model.lora_alpha=4.0", f"model.dtype={dtype}"])
    assert [c["ok"] for c in result["checks"]] == [True, True, True]
    assert result["trained"] == 3 and len(result["peer_commit"]) >= 7


@needs_peer
def test_the_peer_comparison_times_both_sides(tiny_sd3_dir, tmp_path):
    result = bench_peer.main(["--flow-grpo", PEER, "--repeats", "1", "--prompts", "2", "--group", "2", "--steps", "4",
                              "--micro-batch", "4", f"model.pretrained={tiny_sd3_dir}", f"output_dir={tmp_path}",
                              "model.resolution=32", "model.lora_rank=4", "model.lora_alpha=4.0"])
    for key in ("ours_sample", "ours_train", "peer_sample", "peer_train"):
        assert 0 < result["median_model_s"][key] < result["median_s"][key]
    assert result["ratio_iteration"] > 0


def test_a_bf16_run_is_checked_in_bf16_ulps():
    """A bf16 transformer's check allows LOW_PRECISION_ULPS bf16 ulps (2 ulps of x' were measured on an H200
    between the reference pipeline's bf16 latents and flowgrpo's float32 ones); float32 keeps float32 ulps."""
    assert bench_peer.check_precision(torch.float32) == (bench_peer.TOLERANCE_ULPS, torch.float32)
    ulps, dtype = bench_peer.check_precision(torch.bfloat16)
    ours = torch.tensor([5.2, -1.0])
    bf16_ulp = 2.0 ** -5  # bf16 numbers in [4, 8) are 2^-5 apart
    assert bench_peer.compare("x", ours, ours + torch.tensor([2 * bf16_ulp, 0.0]), ulps, dtype)["ok"]
    assert not bench_peer.compare("x", ours, ours + torch.tensor([2 * bf16_ulp, 0.0]))["ok"]  # float32 ulps: refused
    assert not bench_peer.compare("x", ours, ours + torch.tensor([ulps * 8 * bf16_ulp, 0.0]), ulps, dtype)["ok"]
