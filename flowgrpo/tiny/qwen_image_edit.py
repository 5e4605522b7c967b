"""A tiny random ``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509 / 2511) of the real classes (tests; no downloads).

The tiny Qwen-Image's pieces (flowgrpo/tiny/qwen_image.py: ``AutoencoderKLQwenImage`` with 4x compression and
non-trivial latent statistics, ``Qwen2_5_VLForConditionalGeneration`` with a one-block vision tower, Qwen-Image's
published scheduler, which Qwen-Image-Edit publishes too) plus what the Plus pipeline adds:

- the tokenizer knows Qwen2.5-VL's vision tokens (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``,
  ``<|video_pad|>``) and its corpus holds the edit template, so the 64 tokens the pipeline drops
  (``prompt_template_encode_start_idx``) are exactly the template's system turn and ``user`` header, as with the
  real tokenizer; the text encoder's config names those tokens' ids (the VLM finds the image positions by them);
- a ``Qwen2VLProcessor`` built here from that tokenizer and a ``Qwen2VLImageProcessor`` with the published patch
  geometry (14 px patches, 2 x 2 merge, 2 frames) and a small pixel budget (``max_pixels`` 112 x 112: an image is at
  most 16 vision tokens instead of the published 12845056-pixel budget's hundreds);
- the transformer with ``zero_cond_t`` (Qwen-Image-Edit-2511's: the reference tokens are modulated with timestep 0);
  ``zero_cond_t=False`` gives 2509's.

At 32 px: latents [16, 8, 8] (unpacked), 16 latent tokens; each reference adds (its VAE size / 8)^2 tokens.
"""

from __future__ import annotations

# the Plus pipeline's prompt template (QwenImageEditPlusPipeline.prompt_template_encode), in the tokenizer's corpus
EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new image "
    "that meets the user's requirements while maintaining consistency with the original input where appropriate."
    "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                 "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
MAX_PIXELS = 112 * 112  # the tiny processor's pixel budget: at most 8 x 8 patches of 14 px, 16 vision tokens


def build_tiny_qwen_edit_tokenizer(corpus: list[str]):
    """The local Qwen tokenizer of ``corpus`` and the edit template ("Picture k: " for up to 3 images), with
    Qwen2.5-VL's vision tokens as special tokens; 1024 tokens long (the pipeline's ``tokenizer_max_length``)."""
    from flowgrpo.models.tokenizers import QWEN_SPECIAL, build_qwen_tokenizer

    pictures = "".join(f"Picture {k}: " for k in (1, 2, 3))
    tokenizer = build_qwen_tokenizer(list(corpus) + [EDIT_TEMPLATE.format(pictures)], max_length=1024)
    special = [t for t in QWEN_SPECIAL if t != "<|endoftext|>"] + list(VISION_TOKENS.values())
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    return tokenizer


def build_tiny_qwen_image_edit_pipeline(tokenizer, seed: int = 0, image_size: int = 32, zero_cond_t: bool = True):
    """A randomly initialised ``QwenImageEditPlusPipeline`` of the real classes (see the module docstring);
    ``tokenizer`` from :func:`build_tiny_qwen_edit_tokenizer`."""
    from diffusers import QwenImageEditPlusPipeline, QwenImageTransformer2DModel
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    from flowgrpo.tiny.qwen_image import build_tiny_qwen_image_pipeline

    base = build_tiny_qwen_image_pipeline(tokenizer, seed=seed, image_size=image_size)
    text_encoder = base.text_encoder
    for key, token in VISION_TOKENS.items():  # where the VLM finds the images' tokens (and their RoPE positions)
        setattr(text_encoder.config, key, tokenizer.convert_tokens_to_ids(token))
    transformer = base.transformer
    if zero_cond_t:  # the same weights: zero_cond_t changes how the blocks are modulated, not their parameters
        transformer = QwenImageTransformer2DModel.from_config(transformer.config, zero_cond_t=True)
        transformer.load_state_dict(base.transformer.state_dict())
        transformer.eval()
    image_processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2,
                                            temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=Qwen2VLVideoProcessor())
    return QwenImageEditPlusPipeline(scheduler=base.scheduler, vae=base.vae, text_encoder=text_encoder,
                                     tokenizer=tokenizer, processor=processor, transformer=transformer)


def save_tiny_qwen_image_edit(folder, corpus: list[str], zero_cond_t: bool = True) -> str:
    """Build the tiny Qwen-Image-Edit with a tokenizer of ``corpus`` and ``save_pretrained`` it to ``folder``."""
    tokenizer = build_tiny_qwen_edit_tokenizer(corpus)
    build_tiny_qwen_image_edit_pipeline(tokenizer, seed=0, zero_cond_t=zero_cond_t).save_pretrained(folder)
    return str(folder)


__all__ = ["EDIT_TEMPLATE", "build_tiny_qwen_edit_tokenizer", "build_tiny_qwen_image_edit_pipeline",
           "save_tiny_qwen_image_edit"]
