"""Real architectures with random weights: a model config's whole pipeline built from its published configuration
numbers (``model.random_weights: true``), no download.

The components come from the architecture folder of the model config (configs/models/architectures/<name>/:
``transformer.json``, ``text_encoder*.json``, ``vae.json``, ``scheduler.json``; flowgrpo/models/architectures.py finds
it by the config's name or hub id), each built with its own class (``from_config`` for diffusers models, the
config class for transformers models) directly on the device in the model dtype (the VAE in float32), so a
12B transformer never exists as a float32 copy on the CPU. Weights are the classes' own random initialisation,
seeded. Tokenizers are built locally (flowgrpo/models/tokenizers.py: CLIP-format BPE, T5-format Unigram) from a
small word list, padded to the pipeline's lengths (CLIP 77, T5 the config's max_sequence_length); their ids stay
below every real vocabulary size.

``model.depth: k`` keeps the first k blocks of the transformer (each kind: FLUX's double and single blocks) and k
layers of each text encoder at their real width and head count, and cuts the text encoders' vocabularies to the
local tokenizer's: the CPU check of the real-size code path (tests/models/test_real_size.py) trains one
iteration of every real architecture this way.

Uses: measuring speed and memory at real size on a GPU (benchmarks/bench_memory.py, issue-sized checks), and that
CPU check. A random model's samples are noise: never a training run's starting point.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# the pipeline's component names and the tokenizer each text encoder reads
TOKENIZER_OF = {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2", "text_encoder_3": "tokenizer_3"}
WORDS = ("a photo of red green blue yellow circle square triangle cat dog on the left right above below "
         "two three small large moving up down in front behind and with").split()
CLIP_LENGTH = 77  # the CLIP encoders' padded length in the SD3 and FLUX pipelines
# the system prompts the Qwen-encoder pipelines wrap a prompt in: in the tokenizer's corpus, each word is one token,
# so the pipelines' fixed number of template tokens to drop is right (Qwen-Image: 34)
PROMPT_TEMPLATES = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n",
)


def _layer_keys(config: dict) -> list[str]:
    """The depth keys of a component configuration."""
    return [k for k in ("num_layers", "num_single_layers", "num_hidden_layers", "n_layers", "n_refiner_layers")
            if k in config]  # n_layers, n_refiner_layers: Z-Image's transformer


def _reduced(config: dict, depth: int | None, vocab: int | None = None) -> dict:
    """``config`` with at most ``depth`` blocks of each kind (and SD3's dual-attention list cut to them), and the
    vocabulary cut to ``vocab``."""
    config = dict(config)
    if depth is not None:
        for key in _layer_keys(config):
            config[key] = min(int(config[key]), depth)
        if config.get("num_decoder_layers") is not None:
            config["num_decoder_layers"] = min(int(config["num_decoder_layers"]), depth)
        if "dual_attention_layers" in config:
            config["dual_attention_layers"] = [i for i in config["dual_attention_layers"] if i < config["num_layers"]]
        if vocab is not None and "vocab_size" in config:
            config["vocab_size"] = min(int(config["vocab_size"]), vocab)
        # multimodal text encoders nest their language model and vision tower (Mistral-Small-3: text_config and
        # a Pixtral vision_config; Qwen2.5-VL: vision_config's `depth`): cut those too
        if isinstance(config.get("text_config"), dict):
            config["text_config"] = _reduced(config["text_config"], depth, vocab)
        if isinstance(config.get("vision_config"), dict):
            vision = _reduced(config["vision_config"], depth)
            if "depth" in vision:
                vision["depth"] = min(int(vision["depth"]), depth)
            if vision.get("fullatt_block_indexes") is not None:
                vision["fullatt_block_indexes"] = [i for i in vision["fullatt_block_indexes"] if i < vision.get("depth", i + 1)]
            config["vision_config"] = vision
    return config


def _on_device(build, device: torch.device, dtype: torch.dtype):
    """``build()`` with tensors created on ``device`` in ``dtype`` (parameters initialised there)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return build()
    finally:
        torch.set_default_dtype(default)


def diffusers_model(config: dict, device, dtype):
    """A diffusers model from its configuration, random weights, initialised on ``device`` in ``dtype``."""
    import diffusers

    cls = getattr(diffusers, config["_class_name"])
    return _on_device(lambda: cls.from_config(config), device, dtype).to(device=device, dtype=dtype)


def _transformers_model(config: dict, device, dtype):
    import transformers

    config_class = transformers.CONFIG_MAPPING[config["model_type"]]
    cls = getattr(transformers, config["architectures"][0])
    settings = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype", "transformers_version")}
    return _on_device(lambda: cls(config_class.from_dict(settings)), device, dtype).to(device=device, dtype=dtype)


def _tokenizer(encoder_config: dict, max_sequence_length: int):
    from flowgrpo.models.tokenizers import build_clip_tokenizer, build_qwen_tokenizer, build_t5_tokenizer

    corpus = [" ".join(WORDS)]
    model_type = encoder_config.get("model_type", "")
    if model_type.startswith("clip"):
        return build_clip_tokenizer(corpus, max_length=CLIP_LENGTH)
    if model_type.startswith("qwen"):  # Qwen2.5-VL (Qwen-Image), Qwen3 (Z-Image, FLUX.2 klein)
        return build_qwen_tokenizer(corpus + list(PROMPT_TEMPLATES), max_length=max_sequence_length)
    if model_type == "mistral3":  # FLUX.2-dev's Mistral-Small-3 reads a Pixtral processor with a chat template
        from flowgrpo.models.tokenizers import build_mistral_processor

        return build_mistral_processor(corpus, max_length=max_sequence_length)
    return build_t5_tokenizer(corpus, max_length=max_sequence_length)


def random_pipeline(pipeline_class, folder: Path, *, device: torch.device, dtype: torch.dtype,
                    max_sequence_length: int, depth: int | None = None, seed: int = 0):
    """``pipeline_class`` with every component built from the configurations in ``folder`` (see the module docstring)."""
    import diffusers

    folder = Path(folder)
    configs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    missing = [c for c in ("transformer", "vae", "scheduler") if c not in configs]
    if missing:
        from flowgrpo.run.errors import UserError

        raise UserError(f"{folder} has no {', '.join(m + '.json' for m in missing)}: model.random_weights builds the "
                        f"pipeline from the published configuration of every component (docs/memory.md)")
    torch.manual_seed(seed)
    parts = {name: diffusers_model(_reduced(configs[name], depth), device, dtype)
             for name in ("transformer", "transformer_2") if name in configs}  # Wan2.2 A14B: two experts
    parts["vae"] = diffusers_model(configs["vae"], device, torch.float32)
    scheduler = configs["scheduler"]
    parts["scheduler"] = getattr(diffusers, scheduler["_class_name"]).from_config(scheduler)
    for name, tokenizer_name in TOKENIZER_OF.items():
        if name in configs:
            tokenizer = _tokenizer(configs[name], max_sequence_length)
            words = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
            encoder = _reduced(configs[name], depth, vocab=len(words) if depth is not None else None)
            # the pooled CLIP output is read at the end-of-text token: the local tokenizer's ids
            encoder.update({k: getattr(tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                            if k in encoder and getattr(tokenizer, k, None) is not None})
            parts[name] = _transformers_model(encoder, device, dtype)
            parts[tokenizer_name] = tokenizer
    expected, settings = pipeline_class._get_signature_keys(pipeline_class)
    # the pipeline's own settings from its model_index.json (Wan2.2: boundary_ratio, expand_timesteps)
    parts.update({k: v for k, v in configs.get("model_index", {}).items() if k in settings})
    return pipeline_class(**{k: v for k, v in parts.items() if k in expected or k in settings},
                          **{k: None for k in set(expected) - set(parts) if k in _optional(pipeline_class)})


def _optional(pipeline_class) -> set[str]:
    return set(getattr(pipeline_class, "_optional_components", []))


__all__ = ["diffusers_model", "random_pipeline"]
