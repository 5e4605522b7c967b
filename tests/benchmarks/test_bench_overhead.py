"""benchmarks/bench_overhead.py and the time it reads: the adapter's CallTimer (calls, rows, CFG passes, the
backward's attribution), the ratio and amortisation helpers, and one real run of the benchmark on a tiny SD3."""

import sys
import time
from pathlib import Path

import pytest
import torch

from flowgrpo.run.timing import CallTimer
from model_helpers import latents, load_family

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_overhead  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each sleep: a stand-in with known costs."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


def test_forward_time_is_the_time_inside_the_block_and_counts_rows():
    timer = CallTimer("cpu")
    with torch.no_grad(), timer.forward(6, cfg=True):
        time.sleep(0.2)
    time.sleep(0.2)  # outside any block: not counted
    t = timer.totals()
    assert 0.2 <= t["forward_no_grad"] < 0.35
    assert t["forward_grad"] == 0.0 and t["total"] == t["forward"] == t["forward_no_grad"]
    assert (t["calls_no_grad"], t["rows_no_grad"], t["cfg_calls"], t["calls_grad"]) == (1, 6, 1, 0)


def test_backward_counts_from_the_network_output_down_not_the_loss_math_above_it():
    timer = CallTimer("cpu")
    w = torch.ones(3, requires_grad=True)
    with timer.forward(3, cfg=False) as watch:
        out = _Sleep.apply(w * 1.0, 0.0, 0.25)  # "the network": 0.25 s of backward
        watch(out)
    loss = _Sleep.apply(out, 0.0, 0.25).sum()  # the loss math above it: 0.25 s more, not the network's
    with timer.backward():
        loss.backward()
    t = timer.totals()
    assert t["calls_grad"] == 1 and t["backward_calls"] == 1
    assert 0.25 <= t["backward"] < 0.45  # ≥ 0.5 if the loss math above the output were counted
    assert w.grad is not None


def test_a_backward_outside_the_block_is_reported_unattributed():
    timer = CallTimer("cpu")
    w = torch.ones(2, requires_grad=True)
    with timer.forward(2, cfg=False) as watch:
        out = w * 2.0
        watch(out)
    out.sum().backward()
    t = timer.totals()
    assert t["unattributed_backwards"] == 1 and t["backward_calls"] == 0 and t["backward"] == 0.0


def test_delta_subtracts_running_sums():
    timer = CallTimer("cpu")
    before = timer.totals()
    with torch.no_grad(), timer.forward(4, cfg=False):
        pass
    d = CallTimer.delta(timer.totals(), before)
    assert d["calls_no_grad"] == 1 and d["rows_no_grad"] == 4 and d["cfg_calls"] == 0


def test_the_adapter_times_every_network_call_with_its_cfg_passes(tiny_sd3_dir):
    model = load_family("sd3", tiny_sd3_dir, 3.0)
    x = latents(model, 3)
    cond = model.encode_prompts(["a red circle"]).select(torch.zeros(3, dtype=torch.long))
    timer = model.call_timer
    start = timer.totals()
    with torch.no_grad():
        model.velocity(x, 0.5, cond)  # CFG 3.0: one call of 2 x 3 rows
        model.velocity(x, 0.5, cond, guidance_scale=1.0)  # no CFG: 3 rows
    d = CallTimer.delta(timer.totals(), start)
    assert (d["calls_no_grad"], d["rows_no_grad"], d["cfg_calls"]) == (2, 9, 1)
    assert d["forward_no_grad"] > 0 and d["backward"] == 0
    v = model.velocity(x, 0.5, cond)  # with gradient: LoRA weights train
    began = time.perf_counter()
    with timer.backward():
        v.square().mean().backward()
    wall = time.perf_counter() - began
    d = CallTimer.delta(timer.totals(), start)
    assert (d["calls_grad"], d["rows_grad"], d["cfg_calls"], d["backward_calls"]) == (1, 6, 2, 1)
    assert 0 < d["backward"] <= wall


def test_ratio_and_amortisation():
    assert bench_overhead.ratio(11.0, 10.0) == pytest.approx(1.1, rel=1e-12)
    assert bench_overhead.ratio(1.0, 0.0) == float("inf")
    # 10 s measured with 2 s of sample writing (done every 10th iteration) and a 5 s checkpoint every 10th
    assert bench_overhead.amortised(10.0, 2.0, 10, 5.0, 10) == pytest.approx(8.7, rel=1e-12)
    assert bench_overhead.amortised(10.0, 2.0, 0, 5.0, 0) == pytest.approx(8.0, rel=1e-12)


def test_breakdown_columns_add_up_to_the_iteration():
    spans = {"encode": 0.1, "decode": 0.5, "rollout": 6.0, "apply": 0.3, "step_noise": 0.1, "records": 0.05,
             "advantages": 0.2, "micro": 3.2, "backward": 2.1, "optimizer": 0.1, "log": 0.01, "samples": 0.02,
             "checkpoint": 0.03}
    model_in = {"rollout": 5.5, "micro": 3.0, "backward": 2.0}
    model = {"total": 10.5, "forward": 8.5, "backward": 2.0, "forward_update": 3.0}
    rest = bench_overhead.breakdown(spans, model_in, {"sample": 6.7, "update": 5.6}, model, wall=12.0)
    assert set(rest) == {"model", *bench_overhead.REST}
    assert sum(rest.values()) == pytest.approx(12.0, rel=1e-12)
    assert rest["kernel_math"] == pytest.approx(0.2, rel=1e-9)  # apply − noise
    assert rest["rollout_loop"] == pytest.approx(0.15, rel=1e-9)  # 6.0 − 5.5 − 0.3 − 0.05
    assert rest["loss_math"] == pytest.approx(0.2, rel=1e-9) and rest["backward_other"] == pytest.approx(0.1, rel=1e-9)
    assert rest["learner_other"] == pytest.approx(0.2, rel=1e-9)  # 5.6 − 3.2 − 2.1 − 0.1


def test_configurations():
    assert bench_overhead.configurations(["a", "b"], "none") == [("sd3", "a"), ("sd3", "b")]
    assert bench_overhead.configurations(["a"], "default") == [("sd3", "a"), ("wan", None)]
    assert bench_overhead.configurations(["a"], "all", ["p", "q"]) == [("sd3", "a"), ("wan", None), ("wan", "p"), ("wan", "q")]
    assert bench_overhead.configurations([], "all")[1:] == [("wan", p) for p in bench_overhead.PRESETS]
    presets = sorted(p.stem for p in (Path(bench_overhead.ROOT) / "configs" / "presets").glob("*.yaml"))
    assert bench_overhead.PRESETS == presets and {"flow_grpo", "crd"} <= set(presets)
    assert bench_overhead.configurations([], "b,c") == [("wan", "b"), ("wan", "c")]


def test_short_table_names_the_three_largest_items_of_the_rest():
    row = {"model": "sd3", "preset": "x", "method": "ode", "learner": "awm", "wall_s": 2.0, "model_s": 1.5, "ratio": 4 / 3,
           "rest_s": {"decode": 0.2, "samples": 0.1, "encode": 0.05, "records": 0.01, "other": 0.9}}
    line = bench_overhead.short_table([row]).splitlines()[-1]
    assert line == "| sd3 | x | ode / awm | 2.00 | 1.50 | 1.333 | decode 0.20, samples 0.10, encode 0.05 |"


def test_one_preset_runs_and_its_model_time_is_inside_its_iteration(tiny_sd3_dir, tmp_path):
    overrides = [f"model.pretrained={tiny_sd3_dir}", f"output_dir={tmp_path}", "model.resolution=32", "model.lora_rank=4",
                 "model.lora_alpha=4.0", "train.prompts_per_iteration=2", "sampling.plan.group_size=2", "sampling.plan.num_steps=4",
                 "advantage.tied_groups=train"]  # a pair that ties would drop its rows from the count below
    row = bench_overhead.run("sd3", "flow_grpo", overrides, warmup=0, iterations=1)
    calls = row["calls"]
    # rollout: 4 steps of one CFG call over 2 prompts x 2 samples; training: 3 trained steps x 4 samples in one micro-batch
    assert calls["calls_no_grad"] == 4 and calls["rows_no_grad"] == 4 * 2 * 4
    assert calls["calls_grad"] == 1 and calls["rows_grad"] == 2 * 12 and calls["backward_calls"] == 1
    assert calls["cfg_calls"] == 5
    assert 0 < row["model_s"] < row["wall_s"] and row["ratio"] > 1
    assert row["model_s"] == pytest.approx(row["model_forward_s"] + row["model_backward_s"], rel=1e-9)
    assert row["model_s"] + sum(row["rest_s"].values()) == pytest.approx(row["wall_s"], rel=1e-9)
    assert row["rest_s"]["samples"] > 0 and row["rest_s"]["checkpoint"] > 0  # amortised over every 10
    assert (tmp_path / "bench-overhead-sd3-flow_grpo" / "checkpoints").is_dir()
