"""HPSv2.1: DiffusionNFT's HPSv2Scorer and MixGRPO's HPSClipRewardModel on one tiny open_clip CLIP of the HPS
architecture, beside flowgrpo's ``hpsv2``.

Both official scorers build their model with the HPSv2 package's own open_clip (``hpsv2.src.open_clip`` of
tgxs002/HPSv2, checkout in ``HPSV2_PATH``; MixGRPO imports it as ``HPSv2.hpsv2.src.open_clip``) from the ViT-H-14
config, then load ``HPS_v2.1_compressed.pt``'s state dict. Here the model name they ask for is built from a tiny
config of the same architecture (ViT-H-14's, every option kept, the widths and depths cut: image size 224 and patch 14
as the real one, the real CLIP BPE vocabulary and 77 positions), through the package's own ``create_model``; the
checkpoint they load is that model's perturbed state dict, written where they look for it. flowgrpo's ``hpsv2`` loads
the same state dict into the installed open_clip's CLIP of the same config.

DiffusionNFT's rewards.py hands the sampler's float images to the scorer unrounded (its tensor resize runs on them);
MixGRPO's training script hands the VAE's PIL output (rounded to uint8), one image per call, under CUDA autocast (off
on the CPU: float32 here, as flowgrpo runs).
"""

from __future__ import annotations

import copy
import json
import tempfile
import types
from pathlib import Path
from unittest import mock

import torch

from scorers import PROMPTS, ScorerReport, checkout, floats, images, load, packages, perturb, tolerance, uint8_images

TINY_NAME = "scorer-parity-tiny-ViT-H-14"


def tiny_config(hpsv2_root: Path) -> dict:
    """The HPS package's ViT-H-14 config at tiny size: every key kept, widths and depths cut."""
    cfg = json.loads((hpsv2_root / "hpsv2/src/open_clip/model_configs/ViT-H-14.json").read_text())
    cfg["embed_dim"] = 16
    cfg["vision_cfg"].update(layers=2, width=32, head_width=16)
    cfg["text_cfg"].update(width=32, heads=2, layers=2)
    return cfg


def _register(open_clip_module, cfg: dict) -> None:
    factory = importlib_module(open_clip_module.__name__ + ".factory")
    factory._MODEL_CONFIGS[TINY_NAME] = copy.deepcopy(cfg)


def importlib_module(name: str):
    import importlib

    return importlib.import_module(name)


def tiny_state(cfg: dict, seed: int = 0) -> dict:
    """The tiny model's weights (the installed open_clip's CLIP of ``cfg``, perturbed off its init)."""
    import open_clip

    torch.manual_seed(seed)
    model = open_clip.CLIP(**copy.deepcopy(cfg))
    return perturb(model, seed + 1).state_dict()


def flowgrpo_hps(cfg: dict, state: dict, **kwargs):
    import open_clip

    from rewards import load_reward

    model = open_clip.CLIP(**copy.deepcopy(cfg))
    model.load_state_dict(state)
    return load_reward("hpsv2", arch=copy.deepcopy(cfg), model=model.eval(), **kwargs)


def rows() -> list:
    from scorers import MissingCheckout

    try:
        hps = checkout("hpsv2")
    except MissingCheckout as exc:
        return [exc]
    cfg = tiny_config(hps.path)
    state = tiny_state(cfg)
    folder = Path(tempfile.mkdtemp(prefix="scorer_parity_hps_"))
    torch.save({"state_dict": state}, folder / "HPS_v2.1_compressed.pt")
    x = images()
    prompts = list(PROMPTS)
    out = []
    notes = [f"the HPS package: {hps.repository}@{hps.commit_of('hpsv2/src/open_clip/factory.py')[:7]}"]

    try:
        co = checkout("diffusion_nft")
    except MissingCheckout as exc:
        out.append(exc)
    else:
        stub = types.ModuleType("flow_grpo.reward_ckpt_path")
        stub.CKPT_PATH = str(folder)
        mapping = {"flow_grpo": co.path / "flow_grpo", "hpsv2": hps.path / "hpsv2", "hpsv2.src": hps.path / "hpsv2/src"}
        asked = []
        with packages(mapping, {"flow_grpo.reward_ckpt_path": stub}):
            open_clip_pkg = load("hpsv2.src.open_clip")
            _register(open_clip_pkg, cfg)
            scorer_module = load("flow_grpo.hpsv2_scorer")

            def create_model(name, pretrained=None, **kwargs):
                asked.append(f"create_model({name!r}, {Path(str(pretrained)).name!r}, precision={kwargs.get('precision')!r})")
                return open_clip_pkg.create_model(TINY_NAME, None, **kwargs)

            with mock.patch.object(scorer_module, "create_model", create_model):
                fn = load("flow_grpo.rewards").hpsv2_score("cpu")
        theirs = floats(torch.as_tensor(fn(x, prompts, [{}] * len(prompts))[0]))
        ours = flowgrpo_hps(cfg, state, quantize=False)(x, prompts).scores
        rounded = flowgrpo_hps(cfg, state)(x, prompts).scores
        gap = max(abs(a - b) for a, b in zip(floats(rounded), theirs))
        rel = "flow_grpo/hpsv2_scorer.py"
        out.append(ScorerReport(
            "hpsv2", "diffusion_nft", co.repository, co.commit_of(rel), f"{rel} (HPSv2Scorer.__call__) via "
            "flow_grpo/rewards.py hpsv2_score", ["hpsv2_sd3 (config/nft.py)", "sd3_multi_reward"],
            {"name": "hpsv2", "kwargs": {"quantize": False}}, "model", floats(ours), theirs, tolerance(theirs),
            notes=[*notes, f"official model built: {'; '.join(asked)}; checkpoint HPS_v2.1_compressed.pt loaded "
                   "by its own torch.load / load_state_dict",
                   "handed: the sampler's float [0, 1] images unrounded (rewards.py passes a tensor through)",
                   f"flowgrpo's hpsv2 with its default quantize=true differs by up to {gap:.3g} here (the uint8 "
                   "rounding)"],
            differences=["input: the float images, not rounded to uint8 → added the option quantize (default true)",
                         "scale: cos(image, text) of unit features, no scale: equal (flowgrpo's hpsv2 returns the "
                         "same)"]))

    try:
        co = checkout("mixgrpo")
    except MissingCheckout as exc:
        out.append(exc)
    else:
        ckpt = folder / "HPS_v2.1_compressed.pt"
        mapping = {"fastvideo": co.path / "fastvideo", "HPSv2": hps.path, "HPSv2.hpsv2": hps.path / "hpsv2",
                   "HPSv2.hpsv2.src": hps.path / "hpsv2/src"}
        asked = []
        with packages(mapping):
            open_clip_pkg = load("HPSv2.hpsv2.src.open_clip")
            _register(open_clip_pkg, cfg)
            module = load("fastvideo.models.reward_model.hps_score")

            def create_model_and_transforms(name, pretrained=None, **kwargs):
                asked.append(f"create_model_and_transforms({name!r}, {Path(str(pretrained)).name!r}, "
                             f"light_augmentation={kwargs.get('light_augmentation')!r})")
                return open_clip_pkg.create_model_and_transforms(TINY_NAME, None, **kwargs)

            with mock.patch.object(module, "create_model_and_transforms", create_model_and_transforms):
                scorer = module.HPSClipRewardModel(device="cpu", clip_ckpt_path="open_clip_pytorch_model.bin",
                                                   hps_ckpt_path=str(ckpt))
            from PIL import Image

            pil = [Image.fromarray(u.permute(1, 2, 0).numpy()) for u in uint8_images(x)]
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.amp.autocast('cuda') on a machine without CUDA: off
                theirs = floats(scorer(pil, prompts))
        ours = flowgrpo_hps(cfg, state)(x, prompts).scores
        rel = "fastvideo/models/reward_model/hps_score.py"
        out.append(ScorerReport(
            "hpsv2", "mixgrpo", co.repository, co.commit_of(rel), f"{rel} (HPSClipRewardModel.__call__)",
            ["finetune_flux_grpo_MixGRPO*.sh (reward_model=multi_reward)"], {"name": "hpsv2", "kwargs": {}}, "model",
            floats(ours), theirs, tolerance(theirs),
            notes=[*notes, f"official model built: {'; '.join(asked)}; its val transform (PIL → ToTensor → "
                   "ResizeMaxSize on the tensor → Normalize)",
                   "handed: one PIL image (VaeImageProcessor.postprocess: (x·255).round() uint8) and its prompt per "
                   "call; the official runs under torch.amp.autocast('cuda') (fp16 on a GPU), float32 here and in "
                   "flowgrpo",
                   "DanceGRPO's train_grpo_flux.py scores HPSv2 inline the same way (create_model_and_transforms("
                   "'ViT-H-14', light_augmentation=True), preprocess_val on the PIL image, cos of output_dict "
                   "features under autocast): read, not run (the code sits inside its training loop)"],
            differences=["none: flowgrpo's default hpsv2 (uint8 rounding, tensor bicubic resize of the longest side, "
                         "zero pad, CLIP mean/std, cos) is this computation"]))
    return out
