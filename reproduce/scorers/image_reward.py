"""ImageReward: the official scorers of DiffusionNFT, Flow-GRPO / AWM / DGPO and MixGRPO on the THUDM ImageReward
package's own BLIP (checkout of THUDM/ImageReward in ``IMAGEREWARD_PATH``), beside flowgrpo's ``imagereward``.

The official side runs ``ImageReward.load`` (ImageReward/utils.py: torch.load of the checkpoint, the ``ImageReward``
module built from ``med_config.json``, ``load_state_dict(strict=False)``) with its hub download answered by local
files, and the scorer's ``inference_rank`` as each code base calls it. The model is ImageReward's own class at tiny
size: ``BLIP_Pretrain(image_size=224, vit='large')`` with ``create_vit`` answering the package's own
``VisionTransformer`` at width 32, depth 2 (patch 16, 224 px: the real input), the BERT of a tiny ``med_config.json``
(hidden size 768, which ImageReward's ``MLP(768)`` requires, one layer, a small vocabulary) and ``rewards.tiny``'s
WordPiece tokenizer for ``bert-base-uncased``. Its weights: redrawn by ``lively`` (the module's own init gives every
image the same score to 8 digits); the checkpoint it loads is that state dict. flowgrpo's ``imagereward`` loads the same checkpoint through its key conversion
(``rewards.image_reward.convert_original_state_dict``).

Shims for today's libraries (the official code's lines run unchanged): transformers 5 moved
``apply_chunking_to_forward`` / ``prune_linear_layer`` to ``pytorch_utils`` and dropped
``find_pruneable_heads_and_indices`` and ``PreTrainedModel.get_head_mask``, which BLIP's med.py imports or calls
(provided for the duration of the run, as 4.x had them: a head mask of None is a list of None;
``invert_attention_mask``: 0 where attended, the dtype's minimum elsewhere), its
``init_weights()`` called before ``post_init`` (4.x: apply the model's ``_init_weights``), and a tokenizer's
``additional_special_tokens_ids`` (BLIP's init_tokenizer reads the [ENC] id there); fairscale (imported by
vit.py for gradient checkpointing, not used in eval) is a stub; the package's ``__init__`` (its ReFL trainers and the
CLIP/BLIP/Aesthetic baselines, which import openai's ``clip``) is not executed.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import types
from pathlib import Path
from unittest import mock

import torch

from scorers import PROMPTS, ScorerReport, checkout, floats, images, lively, load, packages, tolerance, uint8_images

VIT = {"embed_dim": 32, "depth": 2, "num_heads": 2}  # the official VisionTransformer's kwargs, cut
# the tolerance: the official code's own two call patterns on one model (DiffusionNFT's all-pairs batch and
# Flow-GRPO's one pair a call) differ by 16 float32 ulps of the largest score among themselves (measured; the row
# notes give the run's number): batch shapes change the rounding of BLIP's attention and matmuls
ULPS = 64


def tiny_med(tokenizer) -> dict:
    """ImageReward's med_config.json (a BertConfig) at tiny size; hidden 768 because ImageReward's head is MLP(768)."""
    from rewards.tiny import TINY_MED_CONFIG

    return {**TINY_MED_CONFIG, "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 1,
            "intermediate_size": 64, "vocab_size": len(tokenizer) + 2,  # BLIP's init_tokenizer adds [DEC] and [ENC]
            "encoder_width": VIT["embed_dim"], "max_position_embeddings": 64}


@contextlib.contextmanager
def transformers_4_api():
    """The transformers 4.x names BLIP's med.py imports or calls, for the duration (removed again after)."""
    import transformers.modeling_utils as mu
    import transformers.pytorch_utils as pu

    def find_pruneable_heads_and_indices(*args, **kwargs):
        raise NotImplementedError("head pruning is not used by ImageReward's scoring")

    def get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
        if head_mask is not None:
            raise NotImplementedError("the scorers pass no head mask")
        return [None] * num_hidden_layers

    added = {"apply_chunking_to_forward": pu.apply_chunking_to_forward, "prune_linear_layer": pu.prune_linear_layer,
             "find_pruneable_heads_and_indices": find_pruneable_heads_and_indices}
    missing = {k: v for k, v in added.items() if not hasattr(mu, k)}
    for k, v in missing.items():
        setattr(mu, k, v)
    def init_weights(self):  # 4.x: apply the model's own _init_weights to every module (5 needs post_init first)
        self.apply(self._init_weights)

    def invert_attention_mask(self, mask):  # 4.x ModuleUtilsMixin: 1 = attend -> 0, 0 -> the dtype's minimum
        mask = mask[:, None, :, :] if mask.dim() == 3 else mask[:, None, None, :]
        mask = mask.to(dtype=self.dtype)
        return (1.0 - mask) * torch.finfo(self.dtype).min

    patches = [mock.patch.object(mu.PreTrainedModel, "init_weights", init_weights)]
    for name, fn in (("get_head_mask", get_head_mask), ("invert_attention_mask", invert_attention_mask)):
        if not hasattr(mu.PreTrainedModel, name):
            patches.append(mock.patch.object(mu.PreTrainedModel, name, fn, create=True))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        try:
            yield
        finally:
            for k in missing:
                delattr(mu, k)


@contextlib.contextmanager
def official_imagereward(root: Path, med: dict, tokenizer, state_file_holder: dict, mapping_extra=None):
    """Inside: the ``ImageReward`` package of the checkout importable (its ``load`` on the package as its __init__ would
    put it), downloads answered by local files, the tiny ViT and tokenizer. ``state_file_holder['path']``: the
    checkpoint ``load`` reads (written on the first build: the official module's own init, perturbed)."""
    import copy

    from transformers import BertTokenizer

    folder = Path(tempfile.mkdtemp(prefix="scorer_parity_imagereward_"))
    (folder / "med_config.json").write_text(json.dumps(med))
    stubs = {}
    for name in ("CLIPScore", "BLIPScore", "AestheticScore"):  # the baselines utils.py imports (openai clip)
        stub = types.ModuleType(f"ImageReward.models.{name}")
        setattr(stub, name, None)
        stubs[stub.__name__] = stub
    fairscale = {n: types.ModuleType(n) for n in ("fairscale", "fairscale.nn", "fairscale.nn.checkpoint",
                                                   "fairscale.nn.checkpoint.checkpoint_activations")}
    fairscale["fairscale.nn.checkpoint.checkpoint_activations"].checkpoint_wrapper = lambda module, **_: module
    stubs.update(fairscale)
    mapping = {"ImageReward": root / "ImageReward", "ImageReward.models": root / "ImageReward/models",
               "ImageReward.models.BLIP": root / "ImageReward/models/BLIP", **(mapping_extra or {})}
    asked = []
    class Tokenizer4(type(tokenizer)):  # transformers 4's name for the ids of the added special tokens
        @property
        def additional_special_tokens_ids(self):
            return self.convert_tokens_to_ids(list(self.extra_special_tokens))

    def bert_tokenizer(*args, **kwargs):
        twin = copy.deepcopy(tokenizer)
        twin.__class__ = Tokenizer4
        return twin

    with packages(mapping, stubs), transformers_4_api(), \
            mock.patch.object(BertTokenizer, "from_pretrained", side_effect=bert_tokenizer):
        blip = load("ImageReward.models.BLIP.blip")
        pretrain = load("ImageReward.models.BLIP.blip_pretrain")
        utils = load("ImageReward.utils")
        package = load("ImageReward")
        package.load = utils.load
        package.ImageReward = load("ImageReward.ImageReward").ImageReward

        def create_vit(vit, image_size, use_grad_checkpointing=False, ckpt_layer=0, drop_path_rate=0):
            asked.append(f"create_vit({vit!r}, {image_size})")
            return blip.VisionTransformer(img_size=image_size, patch_size=16, **VIT,
                                          use_grad_checkpointing=use_grad_checkpointing, ckpt_layer=ckpt_layer,
                                          drop_path_rate=0.1 if vit == "large" else drop_path_rate), VIT["embed_dim"]

        def download(url, root_dir):
            asked.append(f"download {Path(url).name}")
            if url.endswith("med_config.json"):
                return str(folder / "med_config.json")
            if "path" not in state_file_holder:
                torch.manual_seed(5)  # the module's own init (biases lively moves but does not redraw): seeded
                model = package.ImageReward(med_config=str(folder / "med_config.json"), device="cpu")
                state_file_holder["path"] = str(folder / "ImageReward.pt")
                torch.save(lively(model, 6).state_dict(), state_file_holder["path"])
            return state_file_holder["path"]

        with mock.patch.object(pretrain, "create_vit", create_vit), \
                mock.patch.object(utils, "ImageReward_download", download):
            yield package, asked, folder


def flowgrpo_imagereward(state_path: str, med: dict, tokenizer):
    from rewards.common import LinearMLP, torch_load_weights
    from rewards.image_reward import ImageReward, ImageRewardModel, convert_original_state_dict, text_config_from_med

    state, dropped = convert_original_state_dict(torch_load_weights(state_path))
    vision = {"hidden_size": VIT["embed_dim"], "num_hidden_layers": VIT["depth"], "num_attention_heads": VIT["num_heads"],
              "intermediate_size": 4 * VIT["embed_dim"], "image_size": 224, "patch_size": 16, "layer_norm_eps": 1e-6,
              "hidden_act": "gelu"}
    model = ImageRewardModel(vision, text_config_from_med(med), LinearMLP.sizes_from_state_dict(state, "mlp.layers."))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"flowgrpo's ImageRewardModel does not fit the official state dict: {result}")
    return ImageReward(model=model, tokenizer_obj=tokenizer), dropped


def rows() -> list:
    from rewards.tiny import tiny_bert_tokenizer

    from scorers import MissingCheckout

    try:
        ir = checkout("imagereward")
    except MissingCheckout as exc:
        return [exc]
    tokenizer = tiny_bert_tokenizer()
    med = tiny_med(tokenizer)
    holder: dict = {}
    x = images()
    prompts = list(PROMPTS)
    from PIL import Image

    pil = [Image.fromarray(u.permute(1, 2, 0).numpy()) for u in uint8_images(x)]
    out, theirs_by = [], {}
    specs = [("diffusion_nft", "", "flow_grpo", "flow_grpo/imagereward_scorer.py",
              ["none of config/nft.py's launches (rewards.py offers it)"], "all prompts at once: inference_rank("
              "prompts, images) scores every (prompt, image) pair, the diagonal kept"),
             ("flow_grpo", "", "flow_grpo", "flow_grpo/imagereward_scorer.py",
              ["none of the recipe's launches (rewards.py offers it)"], "one pair per call: inference_rank(prompt, "
              "[image])"),
             ("mixgrpo", "", "fastvideo", "fastvideo/models/reward_model/image_reward.py",
              ["finetune_flux_grpo_MixGRPO*.sh (reward_model=multi_reward)"], "one pair per call: "
              "inference_rank(text, [image])")]
    for code, inner, top, rel, launches, how in specs:
        try:
            co = checkout(code)
        except MissingCheckout as exc:
            out.append(exc)
            continue
        with official_imagereward(ir.path, med, tokenizer, holder, {top: co.path / inner / top}) as (pkg, asked, _):
            if code == "mixgrpo":
                module = load("fastvideo.models.reward_model.image_reward")
                scorer = module.ImageRewardModel(model_name="ImageReward-v1.0", device="cpu")
                theirs = floats(scorer(pil, prompts))
            else:
                fn = load("flow_grpo.rewards").imagereward_score("cpu")
                theirs = floats(torch.as_tensor(fn(x, prompts, [{}] * len(prompts))[0]))
        reward, dropped = flowgrpo_imagereward(holder["path"], med, tokenizer)
        ours = floats(reward(x, prompts).scores)
        theirs_by[code] = theirs
        out.append(ScorerReport(
            "imagereward", code, co.repository, co.commit_of(rel), f"{rel} (ImageRewardScorer / ImageRewardModel "
            "__call__) → ImageReward/ImageReward.py inference_rank", launches, {"name": "imagereward", "kwargs": {}},
            "model", ours, theirs, tolerance(theirs, ULPS),
            f"{ULPS} float32 ulps of the largest |score|: the official's own call patterns differ by ~16 (notes)",
            notes=[f"the ImageReward package: {ir.repository}@{ir.commit_of('ImageReward/ImageReward.py')[:7]}; "
                   f"official load: {', '.join(dict.fromkeys(asked))}",
                   f"handed: PIL images of (x·255).round() uint8; {how}",
                   f"flowgrpo's key conversion dropped {len(dropped)} tensors the score does not use "
                   f"({', '.join(sorted({k.rsplit('.', 1)[0] for k in dropped}))})"],
            differences=["none: (MLP(text [CLS] | image) − 0.16717) / 1.03334 on BLIP's pixels (PIL bicubic 224, "
                         "centre crop, CLIP mean/std) and 35 BERT tokens, as flowgrpo's imagereward computes"]))
    if len(theirs_by) > 1:
        codes = sorted(theirs_by)
        spread = max(abs(a - b) for c in codes for d in codes for a, b in zip(theirs_by[c], theirs_by[d]))
        for r in out:
            if isinstance(r, ScorerReport):
                r.notes.append(f"the official code bases among themselves on this model ({', '.join(codes)}): "
                               f"max |Δ| {spread:.3g}")
    return out
