"""Text-to-video GRPO end to end on a tiny random Wan (5-D latents): a transition, a tree and a forward-process preset train with
ratio == 1 at inner epoch 0, samples are written as H.264 MP4s with a poster PNG per manifest line,
the held-out evaluation scores videos; train_t2v.py's default config loads, and a missing tiny-wan
asset names the command that builds it."""

import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from flowgrpo.config import ConfigError, load_config, preset_plan
from flowgrpo.engine.trainer import Trainer
from train_fixtures import PLUGIN_REWARD, VIDEO_PLUGIN_REWARD, overrides, train_and_check

# a transition and a forward-process preset on 5-D latents, and a tree (split noise of a video's shape); every preset
# runs on the tiny SD3 (test_train_presets.py): the engine path is the same, only the latents' rank differs
PRESETS = {  # the image tests' small structures (tests/engine/test_train_presets.py)
    "flow_grpo": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4},
    "branchgrpo": {"sampling.plan.num_steps": 8, "sampling.plan.splits": "[0,3]"},
    "diffusion_nft": {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "learner.train_times": 2},
}
VIDEO = {  # the video default's prompts and held-out reward, 5-frame clips (fast); samples and checkpoint at the
    # last iteration only (each MP4 is an ffmpeg process); the gallery is built in the flow_grpo case only
    "prompts": "toy-video-train", "eval.prompts": "toy-video-eval", "eval.reward": "toy_video", "eval.limit": 2,
    "model.num_frames": 5, "log.samples_every": 2, "log.samples_per_prompt": 1, "log.save_every": 2, "log.gallery": False,
}


def video_config(preset, model_dir, out_dir, base=VIDEO_PLUGIN_REWARD, **extra):
    """configs/default_t2v.yaml <- base <- preset <- configs/models/tiny_wan.yaml <- small overrides."""
    return load_config(preset, "tiny_wan", overrides(model_dir, out_dir, **{**PRESETS.get(preset, {}), **VIDEO, **extra}),
                       base=base, default="default_t2v")


def test_a_missing_mp4_writer_is_named_before_the_model_loads(tiny_wan_dir, tmp_path, monkeypatch):
    """Held-out clips are MP4s too: with log.samples_every=0 the run used to start and then fail at its
    first evaluation (seen on a GPU machine without imageio-ffmpeg)."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails as if not installed
    for extra in ({}, {"log.samples_every": 0}):
        cfg = video_config("flow_grpo", tiny_wan_dir, tmp_path / str(len(extra)), **extra)
        with pytest.raises(ImportError, match=r"flowgrpo\[video\].*log.samples_every=0 log.eval_samples=0"):
            Trainer(cfg)
    cfg = video_config("flow_grpo", tiny_wan_dir, tmp_path / "none", **{"log.samples_every": 0, "log.eval_samples": 0})
    assert Trainer(cfg).modality == "video"  # writing no clip needs no writer


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_video_preset_trains_end_to_end(preset, tiny_wan_dir, tmp_path):
    cfg = video_config(preset, tiny_wan_dir, tmp_path, **{"log.gallery": preset == "flow_grpo"})
    assert cfg.model.family == "wan" and cfg.model.num_frames == 5
    trainer, run, rows = train_and_check(cfg, gallery=preset == "flow_grpo")
    assert trainer.model.latent_shape() == (8, 2, 8, 8)  # 5-D latents [N, 8, 2, 8, 8]
    assert all(0 < r["reward/video_brightness_mean"] < 1 for r in rows if "loss" in r)
    assert rows[-1]["eval/num_images"] == 2 and 0 <= rows[-1]["eval/mean_score"] <= 1  # 2 clips scored by toy_video

    step = run / "samples" / "step_2"
    manifest = [json.loads(line) for line in (step / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 2  # 2 prompts x samples_per_prompt 1
    assert not (run / "samples" / "step_1").exists()
    for m in manifest:
        assert {"prompt", "metadata", "seed", "iteration", "prompt_slot", "group", "node", "parent", "rewards",
                "advantage", "file", "poster"} <= set(m)
        assert m["file"].endswith(".mp4") and m["poster"] == m["file"].removesuffix(".mp4") + ".png"
        assert (step / m["file"]).stat().st_size > 0
        assert Image.open(step / m["poster"]).size == (32, 32)
        assert set(m["rewards"]) == {"video_brightness"} and m["prompt"].startswith("a video of ")
    assert sorted(p.name for p in step.iterdir()) == sorted(["manifest.jsonl"] + [m[k] for m in manifest for k in ("file", "poster")])
    if preset == "flow_grpo":  # the MP4 itself, once: H.264 yuv420p (plays in browsers), every frame, at log.video_fps
        import imageio.v2 as imageio

        with imageio.get_reader(step / manifest[0]["file"]) as reader:
            meta, frames = reader.get_meta_data(), [f for f in reader]
        assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p") and meta["fps"] == 8
        assert len(frames) == 5 and frames[0].shape == (32, 32, 3)
    assert (run / "checkpoints" / "step_2" / "tensors.safetensors").is_file()
    assert (run / "checkpoints" / "step_2" / "model" / "pytorch_lora_weights.safetensors").is_file()
    assert (run / "config.yaml").is_file()
    if preset == "flow_grpo":
        assert (run / "gallery" / "index.html").is_file()


def test_default_t2v_config_loads_and_composes():
    cfg = load_config(None, None, None, default="default_t2v")
    assert (cfg.model.family, cfg.model.pretrained, cfg.model.num_frames, cfg.model.finetune) == ("wan", "tiny-wan", 9, "lora")
    assert cfg.prompts == "toy-video-train" and [r.name for r in cfg.rewards] == ["toy_video"]
    assert (cfg.eval.prompts, cfg.eval.reward) == ("toy-video-eval", "toy_video")
    # DiffusionNFT's preset (its DPM-Solver++(2M) ODE plan) with the default's 6 steps and groups of 8
    assert dict(cfg.sampling.plan) == {**preset_plan("diffusion_nft")[0], "num_steps": 6, "group_size": 8}
    assert cfg.learner.name == "diffusion_nft" and not cfg.sampling.window
    assert cfg.run_name == "tiny-wan-toy-video"
    # presets, model configs and overrides compose on top, as for images
    cfg = load_config("mixgrpo", "wan2_1_t2v_1_3b", ["train.iterations=3"], default="default_t2v")
    plan, window = preset_plan("mixgrpo")  # MixGRPO's plan and moving window, under its recipe's additions
    assert plan.items() <= dict(cfg.sampling.plan).items() and window.items() <= dict(cfg.sampling.window).items()
    assert cfg.model.num_frames == 81 and cfg.train.iterations == 3
    assert cfg.rewards[0].name == "toy_video"
    assert load_config(None, None, None).model.family == "sd3"  # the image default is unchanged
    with pytest.raises(ConfigError, match="configs/"):
        load_config(None, None, None, default="no_such_default")


def test_train_t2v_without_the_tiny_wan_names_the_fix(monkeypatch, tmp_path, capsys):
    import importlib.util

    import flowgrpo.run.paths

    spec = importlib.util.spec_from_file_location("train_t2v", Path(__file__).resolve().parents[2] / "train_t2v.py")
    train_t2v = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_t2v)
    monkeypatch.setattr(flowgrpo.run.paths, "ASSETS_DIR", tmp_path / "assets")  # as if tiny-wan were not built
    assert train_t2v.main([f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "'tiny-wan'" in err and "flowgrpo pretrain-toy-video" in err
    assert not (tmp_path / "tiny-wan-toy-video").exists()  # nothing started


def test_rewards_must_take_what_the_model_makes(tiny_wan_dir, tmp_path):
    cfg = video_config("flow_grpo", tiny_wan_dir, tmp_path, base=PLUGIN_REWARD)  # an image reward on videos
    with pytest.raises(ConfigError, match="'train_fixtures:Brightness' scores images but the model makes videos.*per_frame"):
        Trainer(cfg)
    per_frame = {"rewards": [{"name": "per_frame", "kwargs": {"reward": "train_fixtures:Brightness"}}]}  # the named fix
    assert Trainer(video_config("flow_grpo", tiny_wan_dir, tmp_path, base=per_frame)).scoring.rewards[0].modality == "video"
    cfg = video_config("flow_grpo", tiny_wan_dir, tmp_path, **{"eval.reward": "toy"})
    with pytest.raises(ConfigError, match="eval.reward='toy' scores images.*toy_video"):
        Trainer(cfg)
