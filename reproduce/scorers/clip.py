"""PickScore, CLIPScore and the LAION aesthetic predictor: the official scorers on one tiny transformers CLIPModel.

The tiny model: ``rewards.tiny``'s byte-level CLIP tokenizer and a CLIPModel at image size 224, patch 14 (the
ViT-H-14 / ViT-L-14 patch and input size the real checkpoints have), two layers of width 32, every weight moved off
its init (``perturb``) so scores differ by image and prompt. Its logit scale stays at the config's init, exp = 14.29,
not 100: a scorer that multiplies by the model's ``exp(logit_scale)`` and one that multiplies by 100 differ here, as
they would on any checkpoint whose scale is not exactly ln 100. The processor: laion/CLIP-ViT-H-14's (and openai
CLIP's) preprocessor settings, shortest side 224, centre crop 224, CLIP mean/std, as transformers 4.40's slow
``CLIPImageProcessor`` (PIL bicubic) ran them for the official code; in transformers 5 that class is
``CLIPImageProcessorPil``.

The official side is the official ``rewards.py`` function of the launch's reward (``pickscore_score(device)`` ...), run
as the training script runs it on the sampler's float images, with ``AutoModel`` / ``CLIPModel`` /
``AutoProcessor`` / ``CLIPProcessor.from_pretrained`` returning the tiny model and processor. transformers 5's
``get_image_features`` / ``get_text_features`` return an output object where 4.40 returned the projected tensor the
official code divides by its norm: the model handed to the official code returns the tensor (``legacy_api``).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from pathlib import Path
from unittest import mock

import torch

from scorers import (PROMPTS, ScorerReport, checkout, floats, images, load, packages, perturb, tolerance,
                     uint8_images)

IMAGE_SIZE, PATCH = 224, 14
SHIMS = ("transformers 4.40 → 5 (the official setup.py pins 4.40.0): its slow CLIPImageProcessor is "
         "CLIPImageProcessorPil here, and the model's get_image_features / get_text_features return the projected "
         "tensor as 4.x did (legacy_api)")


def tiny_clip(seed: int = 0, projection_dim: int = 16):
    """(model, tokenizer, processor folder): the tiny CLIP and a folder with its preprocessor_config.json."""
    from rewards.tiny import byte_clip_tokenizer, tiny_clip_model, write_preprocessor_config

    tokenizer = byte_clip_tokenizer()
    model = perturb(tiny_clip_model(tokenizer, seed=seed, image_size=IMAGE_SIZE, patch_size=PATCH,
                                    projection_dim=projection_dim), seed + 1)
    folder = Path(tempfile.mkdtemp(prefix="scorer_parity_clip_"))
    write_preprocessor_config(folder, IMAGE_SIZE)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer, folder


def legacy_api(model):
    """A copy of ``model`` whose get_image_features / get_text_features return the projected embeddings tensor, as
    transformers 4.x did (the official scorers were written against 4.40: setup.py pins transformers==4.40.0)."""
    base = type(model)

    def tensor(out):
        if isinstance(out, torch.Tensor):
            return out
        embeds = out.pooler_output
        embeds.pooler_output = embeds  # transformers 5's own forward reads .pooler_output of what these return
        return embeds

    class LegacyCLIPModel(base):
        def get_image_features(self, *args, **kwargs):
            return tensor(base.get_image_features(self, *args, **kwargs))

        def get_text_features(self, *args, **kwargs):
            return tensor(base.get_text_features(self, *args, **kwargs))

    twin = copy.deepcopy(model)
    twin.__class__ = LegacyCLIPModel
    return twin


@contextlib.contextmanager
def tiny_from_pretrained(model, tokenizer, folder):
    """Inside, every CLIP ``from_pretrained`` the official scorers call returns the tiny model / processor; the ids
    asked for are recorded in the yielded list."""
    import transformers
    from transformers import CLIPImageProcessorPil, CLIPProcessor

    asked: list[str] = []

    def processor(name, *args, **kwargs):
        asked.append(f"processor {name}")
        return CLIPProcessor(image_processor=CLIPImageProcessorPil.from_pretrained(folder), tokenizer=tokenizer)

    def weights(name, *args, **kwargs):
        asked.append(f"model {name}")
        return legacy_api(model)

    with contextlib.ExitStack() as stack:
        for cls in (transformers.AutoProcessor, transformers.CLIPProcessor):
            stack.enter_context(mock.patch.object(cls, "from_pretrained", side_effect=processor))
        for cls in (transformers.AutoModel, transformers.CLIPModel):
            stack.enter_context(mock.patch.object(cls, "from_pretrained", side_effect=weights))
        yield asked


def flowgrpo_reward(name: str, model, tokenizer, folder, **kwargs):
    """flowgrpo's reward ``name`` on the same weights (the tiny model and the processor folder's settings)."""
    from rewards import load_reward

    if name == "aesthetic":
        return load_reward(name, clip_model=model, **kwargs)
    return load_reward(name, model=model, tokenizer=tokenizer, processor=str(folder), **kwargs)


# ------------------------------------------------------------------------------------------------ the rows
def _official_fn(flow_grpo: Path, function: str, *model_parts, extra_modules: dict | None = None, **call):
    """The official rewards.py ``function`` (e.g. pickscore_score), built on the tiny model, as a callable
    (images, prompts, metadata) -> (scores, info)."""
    with packages({"flow_grpo": flow_grpo}, extra_modules), tiny_from_pretrained(*model_parts) as asked:
        rewards = load("flow_grpo.rewards")
        fn = getattr(rewards, function)
        built = fn(**call)
    return built, asked


def pickscore_rows() -> list[ScorerReport]:
    """PickScoreScorer (flow_grpo/pickscore_scorer.py) in DiffusionNFT, Flow-GRPO, AWM and DGPO, and MixGRPO's
    PickScoreRewardModel (fastvideo/models/reward_model/pick_score.py)."""
    from scorers import CHECKOUTS, MissingCheckout

    model, tokenizer, folder = tiny_clip()
    x = images()
    prompts = list(PROMPTS)
    rows = []
    for code, inner, launches in (("diffusion_nft", "", ["pickscore_sd3 (config/nft.py)", "sd3_multi_reward"]),
                                  ("flow_grpo", "", ["pickscore_sd3, pickscore_flux (config/grpo.py)"]),
                                  ("awm", "advantage_weighted_matching/", ["pickscore launches of config/dgx_awm.py"]),
                                  ("dgpo", "", ["pickscore launch of config/dgpo.py"])):
        try:
            co = checkout(code)
        except MissingCheckout as exc:
            rows.append(exc)
            continue
        fn, asked = _official_fn(co.path / inner / "flow_grpo", "pickscore_score", model, tokenizer, folder,
                                 device="cpu")
        theirs = floats(torch.as_tensor(fn(x, prompts, [{}] * len(prompts))[0]))
        ours = flowgrpo_reward("pickscore", model, tokenizer, folder, divide_by=26)(x, prompts).scores
        rel = f"{inner}flow_grpo/pickscore_scorer.py"
        rows.append(ScorerReport(
            "pickscore", code, co.repository, co.commit_of(rel), f"{rel} (PickScoreScorer.__call__) via "
            f"{inner}flow_grpo/rewards.py pickscore_score", launches,
            {"name": "pickscore", "kwargs": {"divide_by": 26}}, "model", floats(ours), theirs, tolerance(theirs),
            notes=[f"official from_pretrained calls: {', '.join(asked)}", SHIMS, SHIMS,
                   "handed: (x·255).round().clamp(0, 255) uint8 → PIL (rewards.py), as flowgrpo's Reward rounds"],
            differences=["scale: PickScoreScorer divides exp(logit_scale)·cos by 26 (`scores / 26`); flowgrpo's "
                         "pickscore is raw unless divide_by=26 (an option already: the preset must set it)"]))
    try:
        co = checkout("mixgrpo")
    except MissingCheckout as exc:
        rows.append(exc)
    else:
        rel = "fastvideo/models/reward_model/pick_score.py"
        with packages({"fastvideo": co.path / "fastvideo"}), tiny_from_pretrained(model, tokenizer, folder) as asked:
            module = load("fastvideo.models.reward_model.pick_score")
            scorer = module.PickScoreRewardModel(device="cpu")
        pil = [_pil(u) for u in uint8_images(x)]
        theirs = floats(scorer(pil, prompts))
        ours = flowgrpo_reward("pickscore", model, tokenizer, folder, offset=18.0, divide_by=8.0)(x, prompts).scores
        rows.append(ScorerReport(
            "pickscore", "mixgrpo", co.repository, co.commit_of(rel), f"{rel} (PickScoreRewardModel.__call__)",
            ["finetune_flux_grpo_MixGRPO*.sh (reward_model=multi_reward)"],
            {"name": "pickscore", "kwargs": {"offset": 18.0, "divide_by": 8.0}}, "model", floats(ours), theirs,
            tolerance(theirs),
            notes=[f"official from_pretrained calls: {', '.join(asked)}", SHIMS, SHIMS,
                   "handed: one PIL image (VaeImageProcessor.postprocess: (x·255).round() uint8) and its prompt per "
                   "call, as train_grpo_flux.py scores one sample at a time"],
            differences=["scale: (exp(logit_scale)·cos − 18) / 8 (PickScoreRewardModel's mean=18, std=8 defaults, "
                         "which train_grpo_flux.py leaves): added the pickscore option offset (default 0), so the "
                         "spec is {offset: 18, divide_by: 8}. Under MixGRPO's advantage_aggr (each reward z-scored "
                         "in its group: flowgrpo multi_reward=zsum) the affine map cancels up to the 1e-8 of its std"]))
    return rows


def clipscore_rows() -> list[ScorerReport]:
    """ClipScorer (flow_grpo/clip_scorer.py) in DiffusionNFT and DGPO."""
    from scorers import MissingCheckout

    model, tokenizer, folder = tiny_clip()
    x = images()
    prompts = list(PROMPTS)
    rows = []
    for code, divide, launches in (("diffusion_nft", 100.0, ["sd3_multi_reward (config/nft.py)"]),
                                   ("dgpo", 30.0, ["none of config/dgpo.py's launches (its rewards.py offers it)"])):
        try:
            co = checkout(code)
        except MissingCheckout as exc:
            rows.append(exc)
            continue
        fn, asked = _official_fn(co.path / "flow_grpo", "clip_score", model, tokenizer, folder, device="cpu")
        theirs = floats(torch.as_tensor(fn(x, prompts, [{}] * len(prompts))[0]))
        kwargs = {"quantize": False, "preprocess": "tensor", "logit_scale": True, "clamp": False, "divide_by": divide}
        ours = flowgrpo_reward("clipscore", model, tokenizer, folder, **kwargs)(x, prompts).scores
        default = flowgrpo_reward("clipscore", model, tokenizer, folder, divide_by=divide)(x, prompts).scores
        rel = "flow_grpo/clip_scorer.py"
        gap = max(abs(a - b) for a, b in zip(floats(default), theirs))
        rows.append(ScorerReport(
            "clipscore", code, co.repository, co.commit_of(rel), f"{rel} (ClipScorer.__call__) via "
            "flow_grpo/rewards.py clip_score", launches, {"name": "clipscore", "kwargs": kwargs}, "model",
            floats(ours), theirs, tolerance(theirs),
            notes=[f"official from_pretrained calls: {', '.join(asked)}", SHIMS, SHIMS,
                   "handed: the sampler's float [0, 1] images unrounded (rewards.py passes a tensor through)",
                   f"flowgrpo's clipscore with only divide_by={divide:g} (its other defaults) differs from the official "
                   f"by up to {gap:.3g} on these images"],
            differences=[
                "input: the float images, not rounded to uint8 → added the option quantize (default true; false scores "
                "the float images: rewards/base.py)",
                "preprocessing: torchvision Resize(224) (bilinear, antialiased) + CenterCrop(224) + Normalize on the "
                "float tensor (clip_scorer.get_image_transform), not the CLIP processor's PIL bicubic on uint8 → "
                "added the option preprocess (default 'pil'; 'tensor' is this)",
                "scale: exp(logit_scale)·cos (CLIPModel's logits_per_image), not 100·cos → added the option "
                "logit_scale (default false: 100)",
                "no clamp at 0: added the option clamp (default true: max(cos, 0))",
                f"divides by {divide:g} (`logits_per_image.diagonal() / {divide:g}`): divide_by={divide:g}",
                "text: padding='max_length' (77) where flowgrpo pads to the batch's longest; CLIP reads the text at "
                "its end token under a causal mask, so the padding changes no score beyond rounding (measured here)"]))
    return rows


def aesthetic_rows() -> list[ScorerReport]:
    """AestheticScorer (flow_grpo/aesthetic_scorer.py) in DiffusionNFT: CLIP ViT-L/14 image embedding, unit norm,
    the sac+logos+ava1 MLP (768 inputs: the tiny CLIP projects to 768 here)."""
    from scorers import MissingCheckout

    try:
        co = checkout("diffusion_nft")
    except MissingCheckout as exc:
        return [exc]
    from rewards.common import LinearMLP

    model, tokenizer, folder = tiny_clip(projection_dim=768)
    torch.manual_seed(3)
    mlp = perturb(LinearMLP((768, 1024, 128, 64, 16, 1)), 4).eval()
    ckpt = Path(tempfile.mkdtemp(prefix="scorer_parity_aesthetic_"))
    torch.save(mlp.state_dict(), ckpt / "sac+logos+ava1-l14-linearMSE.pth")
    import types

    stub = types.ModuleType("flow_grpo.reward_ckpt_path")
    stub.CKPT_PATH = str(ckpt)
    x = images()
    prompts = list(PROMPTS)
    fn, asked = _official_fn(co.path / "flow_grpo", "aesthetic_score", model, tokenizer, folder,
                             extra_modules={"flow_grpo.reward_ckpt_path": stub}, device="cpu")
    theirs = floats(torch.as_tensor(fn(x, prompts, [{}] * len(prompts))[0]))
    from rewards import load_reward

    ours = load_reward("aesthetic", clip_model=model, mlp=mlp)(x, prompts).scores
    rel = "flow_grpo/aesthetic_scorer.py"
    return [ScorerReport(
        "aesthetic", "diffusion_nft", co.repository, co.commit_of(rel), f"{rel} (AestheticScorer.__call__) via "
        "flow_grpo/rewards.py aesthetic_score", ["none (rewards.py offers it; no launch trains on it)"],
        {"name": "aesthetic", "kwargs": {}}, "model", floats(ours), theirs, tolerance(theirs),
        notes=[f"official from_pretrained calls: {', '.join(asked)}", SHIMS,
               "handed: (x·255).round().clamp(0, 255) uint8 NCHW tensor → the CLIP processor (PIL bicubic)",
               "crop: the processor's floor margins where flowgrpo's aesthetic uses torchvision's rounded ones "
               "(openai/clip's); equal on square images, the only ones the launches make"])]


def _pil(image_uint8: torch.Tensor):
    from PIL import Image

    return Image.fromarray(image_uint8.permute(1, 2, 0).numpy())


def rows() -> list:
    return [*pickscore_rows(), *clipscore_rows(), *aesthetic_rows()]
