"""Every model family's tiny random pipeline (the real diffusers classes) trained by a transition and a
forward-process preset: two iterations end to end with samples and a checkpoint, the learner's contract at inner
epoch 0 (ratio == 1, or DiffusionNFT's v⁺ = v_old), and the saved LoRA loads with the family's own pipeline
(``load_lora_weights``) and changes its output; a resumed run continues bit-identically. Every preset runs on the
tiny SD3 (test_train_presets.py) and Wan2.1 (test_train_video.py); this file covers the other families through one
table."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowgrpo.config import load_config
from flowgrpo.engine.trainer import Trainer
from train_fixtures import PLUGIN_REWARD, TINY_PRESETS as PRESETS, VIDEO_PLUGIN_REWARD, overrides, train_and_check
from worlds.toy import scenes

VIDEO = {"prompts": "toy-video-train", "eval.prompts": "toy-video-eval", "eval.reward": "toy_video", "eval.limit": 2,
         "model.num_frames": 5, "log.samples_per_prompt": 1}


@dataclass(frozen=True)
class Family:
    saver: str  # "module:function" writing the tiny pipeline into a folder: f(folder, corpus), or f(folder)
    settings: dict = field(default_factory=dict)  # model.* and run overrides for this family
    video: bool = False
    corpus: bool = True  # the saver takes the toy world's prompts for its tokenizer

    def config(self, preset: str, folder: str, out: Path, **extra):
        settings = {**PRESETS[preset], **(VIDEO if self.video else {}), **self.settings, **extra}
        return load_config(preset, None, overrides(folder, out, **settings),
                           base=VIDEO_PLUGIN_REWARD if self.video else PLUGIN_REWARD,
                           default="default_t2v" if self.video else "default")


FAMILIES = {
    "flux2": Family("flowgrpo.tiny.flux2:save_tiny_flux2", {"model.family": "flux2", "model.guidance_scale": 4.0,
                                                            "model.max_sequence_length": 48}),  # its system message
    "qwen_image": Family("flowgrpo.tiny.qwen_image:save_tiny_qwen_image", {"model.family": "qwen_image",
                                                                          "model.guidance_scale": 4.0}),  # true CFG
    "z_image": Family("flowgrpo.tiny.z_image:save_tiny_z_image", {"model.family": "z_image", "model.guidance_scale": 3.0}),
    "z_image_turbo": Family("flowgrpo.tiny.z_image:save_tiny_z_image", {"model.family": "z_image",
                                                                        "model.guidance_scale": 0.0}),  # CFG-free
    "flux2_klein": Family("flowgrpo.tiny.flux2:save_tiny_flux2_klein", {"model.family": "flux2_klein",
                                                                        "model.guidance_scale": 4.0}),  # base: CFG
    # an editing family: each prompt an instruction with its source image (the toy editing world's rows), the
    # held-out evaluation scored by a reward that sees the source
    "flux_kontext": Family("flowgrpo.tiny.builders:save_tiny_kontext", {
        "model.family": "flux_kontext", "model.guidance_scale": 2.0, "prompts": "toy-edit-train",
        "eval.prompts": "toy-edit-eval", "eval.reward": "toy_edit"}),
    # Wan2.2 A14B's layout: the 4-step plan's σ 1, 0.9 go to the high-noise expert, 0.75, 0.5 to the low-noise one
    "wan2_2": Family("train_fixtures:save_tiny_wan22", {"model.family": "wan", "model.guidance_scale": 4.0,
                                                         "model.guidance_scale_2": 3.0}, video=True, corpus=False),
    # the same with only the low-noise expert trained (the high-noise one runs as it is, without a LoRA)
    "wan2_2_low_noise": Family("train_fixtures:save_tiny_wan22", {
        "model.family": "wan", "model.guidance_scale": 4.0, "model.guidance_scale_2": 3.0,
        "model.trained_experts": "[transformer_2]"}, video=True, corpus=False),
}
FAST = "flow_grpo"  # the transition learner's preset: its run also checks the saved LoRA in the family's pipeline
# the family-specific code is the adapter's velocity and its LoRA save/load: one transition and one forward-process
# preset per family exercise both learners' calls of it; every preset runs once on the tiny SD3 (test_train_presets.py)
FAMILY_PRESETS = (FAST, "diffusion_nft")


def cases():
    for family in sorted(FAMILIES):
        for preset in FAMILY_PRESETS:
            yield pytest.param(family, preset, id=f"{family}-{preset}")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def folder(family: str) -> str:
        if family not in made:
            spec = FAMILIES[family]
            module, function = spec.saver.split(":")
            save = getattr(importlib.import_module(module), function)
            corpus = [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]
            made[family] = save(tmp_path_factory.mktemp(family), *([corpus] if spec.corpus else []))
        return made[family]

    return folder


def pipeline_output(model, folder: str, lora: Path | None) -> torch.Tensor:
    """One denoising step of the family's own pipeline from fixed noise, with the run's saved LoRA loaded (every
    trained expert's file) or without it."""
    pipe = model.pipeline_class.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        for expert in model.trained_experts:
            name = model._saved_file(expert)
            pipe.load_lora_weights(str(lora), **({"weight_name": name, "load_into_transformer_2": True} if name else {}))
    cond = model.encode_prompts(["a red circle"])
    x = torch.randn(1, *model.latent_shape(), generator=torch.Generator().manual_seed(0)).to(model.dtype)
    # the pipeline's own networks through the adapter's call convention (its parity with the pipeline's loop is
    # tests/models/test_<family>.py's; here what matters is what load_lora_weights put into them), at a high and a
    # low noise level: each expert of a two-expert model is called
    outputs = []
    with torch.no_grad():
        for sigma in (torch.tensor([0.95]), torch.tensor([0.3])):
            network = getattr(pipe, model._routes(sigma)[0][1])
            outputs.append(model._transformer_velocity(network, x, sigma, cond, model.config.guidance_scale).float())
    return torch.cat(outputs)


@pytest.mark.parametrize("family, preset", list(cases()))
def test_preset_trains_on_family(family, preset, folders, tmp_path):
    folder = folders(family)
    cfg = FAMILIES[family].config(preset, folder, tmp_path)
    trainer, run, rows = train_and_check(cfg)
    assert cfg.model.family == trainer.model.config.family
    manifest = [json.loads(line) for line in (run / "samples" / "step_2" / "manifest.jsonl").read_text().splitlines()]
    assert manifest and all((run / "samples" / "step_2" / m["file"]).is_file() for m in manifest)
    assert rows[-1]["eval/num_images"] >= 2
    saved = run / "checkpoints" / "step_2"
    assert (saved / "tensors.safetensors").is_file() and (saved / "model").is_dir()
    if preset == FAST:  # the saved LoRA is the family's own format: its pipeline loads it and it changes the output
        plan = trainer.schedule.plan(0)  # the grid of the plan's own step count (FLUX.2's shift depends on it)
        assert plan.shift == trainer.model.shift_for(plan.sigmas.numel() - 1)
        for expert in trainer.model.experts:  # every step is trained: each trained expert's LoRA moved from B = 0
            # (not every B: a last block's text-stream output is discarded in the MM-DiTs, so its LoRA never moves)
            moved = [p.abs().sum() > 0 for n, p in trainer.model.experts[expert].named_parameters() if "lora_B" in n]
            assert any(moved) if expert in trainer.model.trained_experts else not moved, expert
        base, tuned = (pipeline_output(trainer.model, folder, lora) for lora in (None, saved / "model"))
        assert (tuned - base).abs().max() > 0, "the saved LoRA did not change the pipeline's output"


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_resumes_bit_identically(family, folders, tmp_path):
    folder = folders(family)
    spec = FAMILIES[family]
    straight = spec.config("flow_grpo", folder, tmp_path / "a", **{"train.iterations": 4, "log.samples_every": 0})
    Trainer(straight).train()
    first = spec.config("flow_grpo", folder, tmp_path / "b", **{"train.iterations": 2, "log.samples_every": 0})
    Trainer(first).train()
    first.train.iterations = 4
    Trainer(first).train()  # resumes from checkpoints/step_2
    a, b = ([json.loads(line) for line in (Path(c.run_dir) / "metrics.jsonl").read_text().splitlines()]
            for c in (straight, first))
    for key in ("loss", "grad_norm", "max_abs_ratio_minus_1_epoch0"):
        assert [r.get(key) for r in a if "loss" in r] == [r.get(key) for r in b if "loss" in r], key
    wa, wb = (load_file(Path(c.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors") for c in (straight, first))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
