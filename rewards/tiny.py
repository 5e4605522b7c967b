"""Tiny random-weight versions of the reward models, built from configs (no downloads), and savers
that write them in each original's file format. For tests, the benchmark and smoke runs.

    tiny_clip_folder(path)        a PickScore/CLIP-style folder: CLIPModel (save_pretrained), tokenizer,
                                  preprocessor_config.json
    tiny_aesthetic_pth(path, d)   an aesthetic MLP state dict (layers.0.weight ...) as a .pth
    tiny_hps_checkpoint(path)     {'state_dict': open_clip CLIP} as HPS_v2.1_compressed.pt; TINY_HPS_ARCH
    tiny_imagereward_parts()      ImageRewardModel + BERT tokenizer + configs (tests save the original format)
    tiny_mask2former_folder(path) GenEval's detector: a Mask2FormerForUniversalSegmentation (80 COCO labels, Swin
                                  backbone) + Mask2FormerImageProcessor, as save_pretrained writes them
    tiny_colour_clip_checkpoint(path)  GenEval's colour classifier: an open_clip CLIP state dict; TINY_COLOUR_CLIP

Every builder seeds torch itself, so the same call gives the same weights.

    python -m rewards.tiny geneval OUT_DIR    writes OUT_DIR/detector/, OUT_DIR/colour_clip.{pt,json} and prints
                                              the GenEval reward options that load them
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rewards.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, LinearMLP

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
TINY_MLP_HIDDEN = (32, 16, 8, 4)
TINY_HPS_ARCH = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    # open_clip's tokenizer is the real CLIP BPE (49408 tokens, 77 positions)
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
TINY_BLIP_VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                    "image_size": 32, "patch_size": 8, "layer_norm_eps": 1e-6, "hidden_act": "gelu",
                    "initializer_range": 0.2}  # BLIP's default 1e-10 makes a random ViT blind
TINY_MED_CONFIG = {  # the format of ImageReward's med_config.json (a BertConfig), at tiny size
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.2, "intermediate_size": 64,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "model_type": "bert", "num_attention_heads": 2,
    "num_hidden_layers": 2, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 0,  # set to the tokenizer's
    "encoder_width": 32, "add_cross_attention": True,
}
WORDS = ["a", "an", "the", "photo", "of", "cat", "dog", "red", "blue", "green", "circle", "square", "triangle",
         "on", "left", "right", "above", "below", "and", "two", "three", "sign", "says", "hello", "world"]


def byte_clip_tokenizer(max_length: int = 77):
    """A CLIP-format tokenizer with the byte-level alphabet (with and without the end-of-word mark) and
    no merges: any text tokenizes (character by character). EOS has the highest id, as in CLIP."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for c in alphabet:
        vocab[c + "</w>"] = len(vocab)
    vocab[BOS] = len(vocab)
    vocab[EOS] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def tiny_clip_model(tokenizer, *, seed: int = 0, image_size: int = 32, patch_size: int = 8, hidden: int = 32,
                    layers: int = 2, projection_dim: int = 16, hidden_act: str = "gelu"):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    common = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
              "num_attention_heads": 2, "hidden_act": hidden_act, "projection_dim": projection_dim}
    config = CLIPConfig(
        text_config={**common, "vocab_size": len(tokenizer), "max_position_embeddings": 77,
                     "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
        vision_config={**common, "image_size": image_size, "patch_size": patch_size},
        projection_dim=projection_dim,
    )
    return CLIPModel(config).eval()


def write_preprocessor_config(path: str | Path, size: int, crop: int | None = None) -> None:
    """preprocessor_config.json in the format of laion/CLIP-ViT-H-14's (transformers CLIPImageProcessor)."""
    crop = crop or size
    cfg = {"crop_size": {"height": crop, "width": crop}, "do_center_crop": True, "do_convert_rgb": True,
           "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": list(OPENAI_CLIP_MEAN),
           "image_processor_type": "CLIPImageProcessor", "image_std": list(OPENAI_CLIP_STD), "resample": 3,
           "rescale_factor": 1 / 255, "size": {"shortest_edge": size}}
    Path(path, "preprocessor_config.json").write_text(json.dumps(cfg, indent=2))


def tiny_clip_folder(path: str | Path, *, seed: int = 0, image_size: int = 32, **model_kwargs) -> Path:
    """Save a tiny CLIPModel + tokenizer + preprocessor config (the layout of PickScore_v1 / openai CLIP)."""
    path = Path(path)
    tokenizer = byte_clip_tokenizer()
    model = tiny_clip_model(tokenizer, seed=seed, image_size=image_size, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    write_preprocessor_config(path, image_size)
    return path


def tiny_aesthetic_mlp(in_dim: int, *, seed: int = 0, hidden: tuple[int, ...] = TINY_MLP_HIDDEN) -> LinearMLP:
    torch.manual_seed(seed)
    return LinearMLP((in_dim, *hidden, 1)).eval()


def tiny_aesthetic_pth(path: str | Path, in_dim: int, *, seed: int = 0) -> Path:
    """Save an MLP state dict exactly as the original .pth (keys layers.0.weight ... layers.7.bias)."""
    torch.save(tiny_aesthetic_mlp(in_dim, seed=seed).state_dict(), path)
    return Path(path)


def tiny_hps_model(*, seed: int = 0):
    import open_clip

    torch.manual_seed(seed)
    return open_clip.CLIP(**json.loads(json.dumps(TINY_HPS_ARCH))).eval()


def tiny_hps_checkpoint(path: str | Path, *, seed: int = 0) -> Path:
    """Save {'state_dict': ...} as the HPS training script does."""
    torch.save({"state_dict": tiny_hps_model(seed=seed).state_dict()}, path)
    return Path(path)


def tiny_bert_tokenizer():
    """A lower-casing WordPiece tokenizer (bert-base-uncased format) over WORDS plus single letters."""
    from transformers import BertTokenizer

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + list(".,!?'\"")
    tokens = special + WORDS + [c for c in letters if c not in WORDS] + ["##" + c for c in letters]
    return BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)


def tiny_imagereward_parts(*, seed: int = 0):
    """(model, tokenizer, vision_config, med_config) of a tiny ImageReward."""
    from rewards.image_reward import ImageRewardModel, text_config_from_med

    tokenizer = tiny_bert_tokenizer()
    med = {**TINY_MED_CONFIG, "vocab_size": len(tokenizer), "encoder_width": TINY_BLIP_VISION["hidden_size"]}
    torch.manual_seed(seed)
    model = ImageRewardModel(TINY_BLIP_VISION, text_config_from_med(med), (32, *TINY_MLP_HIDDEN, 1)).eval()
    return model, tokenizer, dict(TINY_BLIP_VISION), med


# GenEval's detector at tiny size: a Swin backbone with one block per stage, 32-channel pixel decoder and
# transformer decoder (GroupNorm(32, ...) needs multiples of 32), 10 queries, the 80 COCO labels
TINY_SWIN = {"image_size": 64, "patch_size": 4, "embed_dim": 8, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1],
             "window_size": 4, "out_features": ["stage1", "stage2", "stage3", "stage4"]}
TINY_MASK2FORMER = {"feature_size": 32, "mask_feature_size": 32, "hidden_dim": 32, "encoder_feedforward_dim": 32,
                    "encoder_layers": 1, "decoder_layers": 2, "num_attention_heads": 2, "dim_feedforward": 32,
                    "num_queries": 10}
TINY_COLOUR_CLIP = json.loads(json.dumps(TINY_HPS_ARCH))  # open_clip CLIP config {"embed_dim", "vision_cfg", "text_cfg"}


def tiny_mask2former(*, seed: int = 0):
    """A random Mask2FormerForUniversalSegmentation over GenEval's 80 classes whose detections are worth judging.
    At the default init every class probability is ~1/81 and the masks follow the sine position embedding, so
    three weights are rescaled: the class head (std 2: peaked, image-dependent class probabilities, scores up
    to ~0.9), the mask projection (std 2: mask logits far from 0, so the mean mask probability nears 1) and the
    stride-4 lateral GroupNorm scale (x100: the masks follow the image content, so boxes differ by image)."""
    from transformers import Mask2FormerConfig, SwinConfig

    from rewards.geneval_models import COCO_CLASSES, build_mask2former

    torch.manual_seed(seed)
    config = Mask2FormerConfig(backbone_config=SwinConfig(**TINY_SWIN), num_labels=len(COCO_CLASSES),
                               id2label=dict(enumerate(COCO_CLASSES)),
                               label2id={name: i for i, name in enumerate(COCO_CLASSES)}, **TINY_MASK2FORMER)
    model = build_mask2former(config).eval()
    with torch.no_grad():
        model.class_predictor.weight.normal_(0.0, 2.0)
        decoder = model.model.pixel_level_module.decoder
        decoder.mask_projection.weight.normal_(0.0, 2.0)
        decoder.adapter_1[1].weight.mul_(100.0)
    return model


def tiny_mask2former_folder(path: str | Path, *, seed: int = 0, image_size: int = 64) -> Path:
    """Save a tiny Mask2Former + its image processor (resize to image_size) in the layout of
    facebook/mask2former-swin-small-coco-instance."""
    from transformers import Mask2FormerImageProcessor

    path = Path(path)
    tiny_mask2former(seed=seed).save_pretrained(path)
    size = {"shortest_edge": image_size, "longest_edge": image_size}
    Mask2FormerImageProcessor(size=size, size_divisor=32).save_pretrained(path)
    return path


def tiny_colour_clip(*, seed: int = 0):
    import open_clip

    torch.manual_seed(seed)
    return open_clip.CLIP(**json.loads(json.dumps(TINY_COLOUR_CLIP))).eval()


def tiny_colour_clip_checkpoint(path: str | Path, *, seed: int = 0) -> Path:
    """Save a tiny open_clip CLIP state dict (plain torch.save of state_dict())."""
    torch.save(tiny_colour_clip(seed=seed).state_dict(), path)
    return Path(path)


def write_tiny_geneval(out_dir: str | Path, *, seed: int = 0) -> dict[str, str]:
    """OUT_DIR/detector/ (tiny Mask2Former), OUT_DIR/colour_clip.pt and .json; returns the GenEval reward options."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tiny_mask2former_folder(out / "detector", seed=seed)
    tiny_colour_clip_checkpoint(out / "colour_clip.pt", seed=seed)
    (out / "colour_clip.json").write_text(json.dumps(TINY_COLOUR_CLIP, indent=2))
    return {"detector_path": str(out / "detector"), "colour_arch": str(out / "colour_clip.json"),
            "colour_pretrained": str(out / "colour_clip.pt")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rewards.tiny",
                                     description="Write tiny random-weight reward models (tests and smoke runs).")
    kinds = parser.add_subparsers(dest="kind", required=True)
    geneval = kinds.add_parser("geneval", help="GenEval's detector folder and colour CLIP; prints the flowgrpo eval "
                               "options that load them")
    geneval.add_argument("out_dir")
    geneval.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    options = write_tiny_geneval(args.out_dir, seed=args.seed)
    # the options of `flowgrpo eval --benchmark geneval $(python -m rewards.tiny geneval DIR)`
    print(" ".join(f"--reward-option {key}={value}" for key, value in options.items()))


if __name__ == "__main__":
    main()
