"""The tiny world's models: built from configs, pretrained here, shipped in ``assets/``.

    builders.py        tiny pipelines of the real diffusers classes (SD3, FLUX, Wan) and their tokenizers
    pretrain.py        one pretraining scaffold (VAE, data, flow matching with an EMA, evaluation and shipping)
                       and the image world's pretraining: ``flowgrpo pretrain-toy``
    pretrain_video.py  the video world's: ``flowgrpo pretrain-toy-video``
    assets/            the shipped pipelines: tiny-sd3 (images), tiny-wan (videos)
"""

from flowgrpo.tiny.builders import (
    TinySD3Sizes,
    TinyWanSizes,
    build_clip_tokenizer,
    build_t5_tokenizer,
    build_tiny_flux_pipeline,
    build_tiny_sd3_pipeline,
    build_tiny_wan_pipeline,
)

__all__ = [
    "TinySD3Sizes",
    "TinyWanSizes",
    "build_clip_tokenizer",
    "build_t5_tokenizer",
    "build_tiny_flux_pipeline",
    "build_tiny_sd3_pipeline",
    "build_tiny_wan_pipeline",
]
