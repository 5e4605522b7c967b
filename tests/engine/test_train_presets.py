"""Every method preset trains end to end on a tiny SD3: finite losses, the learner's contract at inner
epoch 0 (ratio == 1; DiffusionNFT's v⁺ = v_old), trainable parameters change, samples / metrics /
checkpoints written per the run-directory contract; and every file in configs/presets/ is covered."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from flowgrpo.config import METHOD_SECTIONS, load_config
from flowgrpo.engine.trainer import Trainer
from train_fixtures import PLUGIN_REWARD, TINY_PRESETS as PRESETS, overrides, train_and_check

def test_every_preset_file_is_tested_here():
    from flowgrpo.run.paths import configs_dir

    assert sorted(PRESETS) == sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_states_its_method_whatever_the_default_under_it(preset):
    """A preset is its paper's method on any base: the image default (DiffusionNFT, global advantage
    std, 6-step plan, 2 shared draws) and the video default (Flow-GRPO) must not leak into what the
    preset trains: every method section is the same under both."""
    def method(default: str) -> dict:
        cfg = OmegaConf.structured(load_config(preset, None, [], default=default))
        return {k: OmegaConf.to_container(cfg[k]) for k in METHOD_SECTIONS}

    assert method("default") == method("default_t2v")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_trains_end_to_end(preset, tiny_sd3_dir, tmp_path):
    cfg = load_config(preset, None, overrides(tiny_sd3_dir, tmp_path, **PRESETS[preset]), base=PLUGIN_REWARD)
    _, run, rows = train_and_check(cfg, gallery=preset == "flow_grpo")  # the review site: once is enough
    assert rows[-1]["eval/num_images"] == 4
    manifest = [json.loads(line) for line in (run / "samples" / "step_2" / "manifest.jsonl").read_text().splitlines()]
    assert manifest and all((run / "samples" / "step_2" / m["file"]).is_file() for m in manifest)
    assert {"prompt", "seed", "group", "node", "parent", "rewards", "advantage", "file"} <= set(manifest[0])
    ckpt = load_file(run / "checkpoints" / "step_2" / "tensors.safetensors")
    assert any(k.startswith("optim.") for k in ckpt) and any(k.startswith("weights.") for k in ckpt)
    assert (run / "config.yaml").is_file()
    assert (run / "gallery" / "index.html").is_file() == (preset == "flow_grpo")  # built at the end of the run
    held_out = [json.loads(line) for line in (run / "samples" / "eval_2" / "manifest.jsonl").read_text().splitlines()]
    assert len(held_out) == 4 and all((run / "samples" / "eval_2" / m["file"]).is_file() for m in held_out)
    assert sum(m["rewards"]["toy"] for m in held_out) / 4 == pytest.approx(rows[-1]["eval/mean_score"], abs=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_trains_end_to_end_on_cuda(preset, tiny_sd3_dir, tmp_path):
    """The same contract with the model on the GPU: rollout records live there, rewards and advantages on
    the host (samplers.Trajectory.bookkeeping_on_cpu); before that view every method failed in its
    first advantage step."""
    extra = {**PRESETS[preset], "train.cpu": False, "model.device": "cuda"}
    cfg = load_config(preset, None, overrides(tiny_sd3_dir, tmp_path, **extra), base=PLUGIN_REWARD)
    trainer, run, _ = train_and_check(cfg)
    assert trainer.policy.params[0].device.type == "cuda"
    assert (run / "samples" / "step_2" / "manifest.jsonl").is_file()


def test_bf16_mixed_precision_runs_the_transformer_in_bf16(tiny_sd3_dir, tmp_path):
    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **PRESETS["flow_grpo"], **{
        "train.mixed_precision": "bf16", "train.iterations": 1, "log.samples_every": 0, "log.save_every": 0}),
        base=PLUGIN_REWARD)
    trainer = Trainer(cfg)
    dtypes = set()
    linear = next(m for m in trainer.model.transformer.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
    before = [p.detach().clone() for p in trainer.policy.params]
    metrics = trainer.train()
    assert dtypes == {torch.bfloat16}, dtypes  # rollout and training forwards under accelerate's autocast
    assert all(p.dtype == torch.float32 for p in trainer.policy.params)  # master weights stay fp32
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.params))
    assert math.isfinite(metrics["loss"])
