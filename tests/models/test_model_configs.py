"""Model configs: every shipped YAML validates; unknown keys and bad values fail naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from flowgrpo.models import DEFAULT_LORA_TARGETS, ModelConfig, validate_model_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


def test_the_model_configs_ship():
    assert {"tiny_sd3.yaml", "sd3_5_medium.yaml", "flux_dev.yaml", "tiny_wan.yaml", "wan2_1_t2v_1_3b.yaml",
            "wan2_1_t2v_14b.yaml"} <= {p.name for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_each_shipped_yaml_validates(path):
    config = validate_model_config(OmegaConf.load(path))
    assert isinstance(config, ModelConfig)


def test_shipped_values():
    sd35 = validate_model_config(OmegaConf.load(CONFIG_DIR / "sd3_5_medium.yaml"))
    assert (sd35.family, sd35.pretrained, sd35.dtype) == ("sd3", "stabilityai/stable-diffusion-3.5-medium", "bfloat16")
    assert (sd35.lora_rank, sd35.lora_alpha, sd35.max_sequence_length, sd35.guidance_scale) == (32, 64.0, 256, 4.5)
    flux = validate_model_config(OmegaConf.load(CONFIG_DIR / "flux_dev.yaml"))
    assert (flux.family, flux.pretrained, flux.guidance_scale) == ("flux", "black-forest-labs/FLUX.1-dev", 3.5)
    assert flux.max_sequence_length == 512 and flux.resolution % 16 == 0
    tiny = validate_model_config(OmegaConf.load(CONFIG_DIR / "tiny_sd3.yaml"))
    assert (tiny.family, tiny.pretrained, tiny.dtype, tiny.resolution) == ("sd3", "tiny-sd3", "float32", 32)
    wan = validate_model_config(OmegaConf.load(CONFIG_DIR / "wan2_1_t2v_1_3b.yaml"))
    assert (wan.family, wan.pretrained, wan.dtype) == ("wan", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "bfloat16")
    assert (wan.resolution, wan.width, wan.num_frames, wan.guidance_scale, wan.shift) == (480, 832, 81, 5.0, 3.0)
    large = validate_model_config(OmegaConf.load(CONFIG_DIR / "sd3_5_large.yaml"))  # the SD3 adapter, its own config
    assert (large.family, large.pretrained, large.guidance_scale, large.sample_steps) == (
        "sd3", "stabilityai/stable-diffusion-3.5-large", 3.5, 28)
    wan14 = validate_model_config(OmegaConf.load(CONFIG_DIR / "wan2_1_t2v_14b.yaml"))
    assert (wan14.pretrained, wan14.resolution, wan14.width, wan14.shift) == ("Wan-AI/Wan2.1-T2V-14B-Diffusers", 720, 1280, 5.0)
    for cfg in (wan, wan14):  # 8x VAE x 2x2 patches; 4x in time
        assert cfg.resolution % 16 == 0 and cfg.width % 16 == 0 and (cfg.num_frames - 1) % 4 == 0
        assert cfg.lora_target_modules == ["to_q", "to_k", "to_v", "to_out.0"]
    tiny_wan = validate_model_config(OmegaConf.load(CONFIG_DIR / "tiny_wan.yaml"))
    assert (tiny_wan.family, tiny_wan.pretrained, tiny_wan.resolution, tiny_wan.num_frames) == ("wan", "tiny-wan", 32, 9)


def test_defaults_and_input_kinds():
    assert validate_model_config({}) == ModelConfig()
    assert validate_model_config(None) == ModelConfig()
    assert tuple(ModelConfig().lora_target_modules) == DEFAULT_LORA_TARGETS
    config = validate_model_config(OmegaConf.create({"family": "flux", "resolution": 512}))
    assert (config.family, config.resolution) == ("flux", 512)
    assert validate_model_config(config) == config


def test_unknown_key_names_the_key_and_a_fix():
    with pytest.raises(ValueError, match=r"unknown model config key 'lora_ranks'.*did you mean 'lora_rank'"):
        validate_model_config({"lora_ranks": 8})
    with pytest.raises(ValueError, match=r"'torch_dtype'.*remove it or use one of: family, pretrained"):
        validate_model_config({"torch_dtype": "bfloat16"})


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"family": "hunyuan"}, r"'family' is 'hunyuan'; allowed: analytic, flux, flux2, flux2_klein, flux_kontext, qwen_image, qwen_image_edit, sd3, wan, z_image"),
        ({"guidance_scale_2": -1.0}, r"'guidance_scale_2' is -1.0; allowed: null"),
        ({"trained_experts": ["transformer_3"]}, r"'trained_experts'.*transformer, transformer_2"),
        ({"family": "wan", "num_frames": 80}, r"'num_frames' is 80; allowed: 4k \+ 1 for 'wan'.*77 or 81"),
        ({"num_frames": 9}, r"'num_frames' is 9; allowed: 1 for the image family 'sd3'"),
        ({"width": 0}, r"'width' is 0"),
        ({"dtype": "fp8"}, r"'dtype' is 'fp8'; allowed: float32, bfloat16, float16"),
        ({"device": "gpu"}, r"'device' is 'gpu'; allowed: auto, cpu, cuda"),
        ({"finetune": "dora"}, r"'finetune' is 'dora'; allowed: lora, full"),
        ({"reference": "ema"}, r"'reference' is 'ema'; allowed: auto, adapter_disabled"),
        ({"finetune": "full", "reference": "adapter_disabled"}, r"needs finetune='lora'.*frozen_copy"),
        ({"resolution": 0}, r"'resolution' is 0; allowed: an integer >= 1"),
        ({"resolution": "large"}, r"bad model config value for 'resolution'"),
        ({"shift": -1.0}, r"'shift' is -1.0"),
        ({"lora_target_modules": []}, r"'lora_target_modules'.*non-empty"),
        ({"attention_backend": "flashy"}, r"'attention_backend' is 'flashy'; use 'native'.*xformers"),
        ({"compile_backend": "tvm"}, r"'compile_backend' is 'tvm'; allowed: inductor, aot_eager, cudagraphs"),
        ({"compile_mode": "fast"}, r"'compile_mode' is 'fast'; allowed: default, reduce-overhead"),
        ({"compile": "sometimes"}, r"bad model config value for 'compile'"),
        ({"compile_backend": "aot_eager", "compile_mode": "reduce-overhead"}, r"'compile_mode'.*a mode is inductor's"),
    ],
)
def test_bad_values_raise_naming_the_allowed_values(bad, message):
    with pytest.raises(ValueError, match=message):
        validate_model_config(bad)


def test_real_backend_names_are_accepted():
    for name in ("native", "xformers", "flash"):
        assert validate_model_config({"attention_backend": name}).attention_backend == name
