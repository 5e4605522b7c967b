"""`flowgrpo pretrain-toy` and `pretrain-toy-video` on miniature models: they ship loadable pipelines and resume exactly."""

import json

import pytest
import torch
from diffusers import StableDiffusion3Pipeline, WanPipeline
from safetensors.torch import load_file

from flowgrpo.tiny.pretrain import PretrainConfig, pretrain_toy
from flowgrpo.tiny.pretrain_video import PretrainVideoConfig, pretrain_toy_video
from flowgrpo.tiny import TinySD3Sizes, TinyWanSizes

MINI = TinySD3Sizes(vae_channels=(16, 16, 16), text_width=32, text_layers=2, num_layers=1, num_heads=2, head_dim=16)


def _config(tmp_path, name: str, flow_steps: int) -> PretrainConfig:
    return PretrainConfig(
        output_dir=str(tmp_path / name / "model"),
        work_dir=str(tmp_path / name / "work"),
        vae_steps=2, vae_batch=4, dataset_size=32, flow_steps=flow_steps, flow_batch=4,
        flow_warmup=2, checkpoint_every=2, eval_every=2, eval_steps=2, target_score=2.0, sizes=MINI,
    )


@pytest.mark.slow
def test_pretrain_ships_a_pipeline_and_a_resumed_run_equals_a_straight_run(tmp_path):
    straight = pretrain_toy(_config(tmp_path, "straight", 4))
    pretrain_toy(_config(tmp_path, "resumed", 2))  # stops at step 2 (as if interrupted) ...
    resumed = pretrain_toy(_config(tmp_path, "resumed", 4))  # ... and continues to 4
    assert straight["eval"]["step"] == resumed["eval"]["step"] == 4
    # every random draw is a function of (seed, stage, step): the resumed run repeats the straight one
    # up to float rounding (measured: max |diff| 2e-6; the step after a reload rounds differently)
    for name in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3"):
        a = load_file(tmp_path / "straight" / "work" / "flow" / f"{name}.safetensors")
        b = load_file(tmp_path / "resumed" / "work" / "flow" / f"{name}.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=0)
    assert abs(straight["eval"]["mean_score"] - resumed["eval"]["mean_score"]) <= 0.02
    pipe = StableDiffusion3Pipeline.from_pretrained(straight["output_dir"])
    assert pipe.vae.config.shift_factor != 0.0 and pipe.vae.config.scaling_factor != 1.0
    evals = json.loads((tmp_path / "straight" / "work" / "flow" / "meta.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [2, 4]


MINI_WAN = TinyWanSizes(vae_base_dim=8, latent_channels=8, text_width=32, num_layers=1, num_heads=2, head_dim=12,
                        ffn_dim=32, freq_dim=32)


def _video_config(tmp_path, name: str, flow_steps: int) -> PretrainVideoConfig:
    return PretrainVideoConfig(
        output_dir=str(tmp_path / name / "model"),
        work_dir=str(tmp_path / name / "work"),
        vae_steps=2, vae_batch=2, dataset_size=16, flow_steps=flow_steps, flow_batch=4,
        flow_warmup=2, checkpoint_every=2, eval_every=2, eval_steps=2, target_score=2.0, sizes=MINI_WAN,
    )


@pytest.mark.slow
def test_pretrain_video_ships_a_wan_pipeline_and_resumes(tmp_path):
    straight = pretrain_toy_video(_video_config(tmp_path, "straight", 4))
    pretrain_toy_video(_video_config(tmp_path, "resumed", 2))
    resumed = pretrain_toy_video(_video_config(tmp_path, "resumed", 4))
    assert straight["eval"]["step"] == resumed["eval"]["step"] == 4
    for name in ("transformer", "text_encoder"):
        a = load_file(tmp_path / "straight" / "work" / "flow" / f"{name}.safetensors")
        b = load_file(tmp_path / "resumed" / "work" / "flow" / f"{name}.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=0)
    assert set(straight["eval"]["per_task"]) == {"direction", "color_direction", "two_directions", "speed"}
    pipe = WanPipeline.from_pretrained(straight["output_dir"])
    assert pipe.vae.config.latents_mean != [0.0] * 8 and pipe.vae.config.latents_std != [1.0] * 8
    frames = pipe("a video of a circle moving left", num_frames=9, height=32, width=32, num_inference_steps=2,
                  max_sequence_length=16, output_type="pt").frames
    assert frames.shape == (1, 9, 3, 32, 32)


def test_model_sizes_are_command_line_options():
    """`flowgrpo pretrain-toy --num-layers 8` builds a deeper model; sizes not given keep their defaults."""
    from flowgrpo.cli.tools import _pretrain_config, build_parser

    args = build_parser().parse_args(["pretrain-toy", "--num-layers", "8", "--head-dim", "16", "--flow-steps", "10"])
    cfg = _pretrain_config(PretrainConfig, args)
    assert cfg.flow_steps == 10 and cfg.sizes == TinySD3Sizes(num_layers=8, head_dim=16)
    assert _pretrain_config(PretrainConfig, build_parser().parse_args(["pretrain-toy"])).sizes == TinySD3Sizes()
    video = _pretrain_config(PretrainVideoConfig, build_parser().parse_args(["pretrain-toy-video", "--num-frames", "5"]))
    assert video.sizes == TinyWanSizes(num_frames=5)


def test_a_work_dir_of_other_sizes_is_refused_naming_the_fix(tmp_path):
    """Resuming with another --num-layers would fail deep in a checkpoint load: it is refused up front."""
    from flowgrpo.run.errors import UserError
    from flowgrpo.tiny.pretrain import open_work_dir

    open_work_dir(PretrainConfig(work_dir=str(tmp_path / "w")))
    open_work_dir(PretrainConfig(work_dir=str(tmp_path / "w"), flow_steps=10))  # other steps: a resume, allowed
    with pytest.raises(UserError, match=r"num_layers 4 -> 8.*new --work-dir"):
        open_work_dir(PretrainConfig(work_dir=str(tmp_path / "w"), sizes=TinySD3Sizes(num_layers=8)))
    video = PretrainVideoConfig(work_dir=str(tmp_path / "v"))
    open_work_dir(video)
    with pytest.raises(UserError, match="num_frames"):
        open_work_dir(PretrainVideoConfig(work_dir=str(tmp_path / "v"), sizes=TinyWanSizes(num_frames=5)))
