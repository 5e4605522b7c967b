"""The speed levers at real size (issue: speed) give the plain path's results on the CPU:

- ``sampling.merge_lora``: rollouts with the adapter merged into the weights give the unmerged velocity within
  float32 rounding, and every base weight comes back bit for bit (also when the block inside raises);
- ``model.compile``: regional compilation of the blocks trains like the eager model, and compiles nothing after the
  first iteration (the CPU runs torch.compile's ``aot_eager`` backend: the same tracing as inductor, without the
  minutes of C++ code generation; the GPU script measures inductor);
- ``log.mfu``: the perf/ metrics' arithmetic by hand, and the FLOP count's forward leaves the call timer's sums and
  the random streams alone.
"""

import json
from pathlib import Path

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.engine.throughput import Throughput, flops_per_pass
from flowgrpo.engine.trainer import Trainer
from flowgrpo.models.base import load_model
from tolerance import assert_close_ulps
from train_fixtures import PLUGIN_REWARD, overrides


@pytest.fixture(scope="module")
def trained_like(tiny_sd3_dir):
    """The tiny SD3 with a LoRA moved away from the identity (B ≠ 0), as after some training."""
    torch.manual_seed(0)
    model = load_model({"family": "sd3", "pretrained": tiny_sd3_dir, "lora_rank": 4, "lora_alpha": 4.0,
                        "resolution": 32})
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_merged_adapters_sample_the_same_velocity_and_restore_every_weight(trained_like):
    model = trained_like
    cond = model.encode_prompts(["a red cube", "two cats"])
    x, sigma = torch.randn(2, *model.latent_shape()), torch.tensor([0.7, 0.3])
    weights = {n: p.detach().clone() for n, p in model.transformer.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.transformer.named_parameters()}
    with torch.no_grad():
        plain = model.velocity(x, sigma, cond, 4.5)
        with model.merged_adapters():
            merged = model.velocity(x, sigma, cond, 4.5)
            changed = [n for n, p in model.transformer.named_parameters() if not torch.equal(p, weights[n])]
    assert changed and all("lora" not in n for n in changed)  # the base weights took the adapter, not the adapter
    assert not torch.equal(merged, plain)  # the merged weights really ran
    assert_close_ulps(merged, plain, ulps=64)
    with pytest.raises(RuntimeError, match="inside"), model.merged_adapters():
        raise RuntimeError("a failure inside the rollout")
    for n, p in model.transformer.named_parameters():
        assert torch.equal(p, weights[n]), n
        assert p.requires_grad == flags[n], n
    with torch.no_grad():
        assert torch.equal(model.velocity(x, sigma, cond, 4.5), plain)  # the adapter runs unmerged again


def _train(model_dir, out_dir, **levers):
    cfg = load_config("flow_grpo", None, overrides(model_dir, out_dir, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "loss.kl_coef": 0.05, "train.iterations": 3,
        "log.samples_every": 0, "log.save_every": 0, **levers}), base=PLUGIN_REWARD)
    trainer = Trainer(cfg)
    start = [p.detach().clone() for p in trainer.policy.params]
    graphs = []
    for iteration in range(cfg.train.iterations):
        trainer.step(iteration)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], start, trainer.policy.params, graphs


def test_compiled_blocks_and_merged_rollouts_train_like_the_plain_path(tiny_sd3_dir, tmp_path):
    plain, start, plain_params, _ = _train(tiny_sd3_dir, tmp_path / "plain")
    fast, _, fast_params, graphs = _train(tiny_sd3_dir, tmp_path / "levers", **{
        "model.compile": True, "model.compile_backend": "aot_eager", "sampling.merge_lora": True})
    assert graphs[0] > 0 and graphs[-1] == graphs[0], graphs  # compiled in the first iteration, never again
    assert len(plain) == len(fast) == 3
    for a, b in zip(plain, fast):
        # merged rollouts' log-probs differ from the unmerged training pass by float32 rounding (0 in the first
        # iteration, where the adapter is still the identity)
        assert b["max_abs_ratio_minus_1_epoch0"] < 64 * torch.finfo(torch.float32).eps
        assert b["reward/brightness_mean"] == pytest.approx(a["reward/brightness_mean"], rel=1e-5, abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    for a0, a, b in zip(start, plain_params, fast_params):  # Adam's steps agree to 0.5% of their norm
        assert (b - a).norm() <= 5e-3 * (a - a0).norm() + 1e-9


def test_throughput_metrics_by_hand_and_the_flop_count_leaves_the_run_alone(trained_like):
    model = trained_like
    before, state = model.call_timer.totals(), torch.random.get_rng_state()
    flops = flops_per_pass(model)
    assert flops > 0 and flops == flops_per_pass(model)
    assert model.call_timer.totals() == before and torch.equal(torch.random.get_rng_state(), state)
    throughput = Throughput(model, "no")
    assert not throughput.mfu  # on the CPU: images per second only
    assert throughput.metrics(12, 3.0, {}, {}) == {"perf/images_per_s_per_gpu": 4.0}
    throughput.mfu, throughput.flops, throughput.peak = True, 2.0e12, 1.0e15
    sampling = {"rows_grad": 0.0, "rows_no_grad": 640.0, "total": 8.0}  # 640 passes of 2 TFLOP in 8 s: 160 TFLOP/s
    updating = {"rows_grad": 100.0, "rows_no_grad": 50.0, "total": 10.0}  # (50 + 3·100) passes in 10 s: 70 TFLOP/s
    out = throughput.metrics(32, 16.0, sampling, updating)
    assert out["perf/images_per_s_per_gpu"] == 2.0
    assert out["perf/mfu_sample"] == pytest.approx(0.16) and out["perf/mfu_train"] == pytest.approx(0.07)
