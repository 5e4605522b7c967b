"""The two models GenEval's rules read (rewards/geneval.py): an instance-segmentation detector over the 80
COCO classes and a CLIP zero-shot colour classifier for the detected objects.

Detector: a callable ``detector(images uint8 [B, 3, H, W]) -> [{class name: [Detection, ...]}, ...]`` giving,
per image, every instance the model proposes (unfiltered, no threshold: the rules threshold, sort and limit).
Two implementations (``load_detector(kind)``):

    "transformers"   TransformersMask2Former: transformers' Mask2FormerForUniversalSegmentation
                     (facebook/mask2former-swin-small-coco-instance), decoded here as mmdetection decodes
                     Mask2Former's instance output (``mask2former_instances``).
    "mmdet"          MMDetMask2Former: mmdetection's init_detector / inference_detector on the official
                     evaluator's model (mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco); both the mmdet 2.x
                     result tuple and the 3.x DetDataSample are read (``detections_from_mmdet``).

mmdetection's Mask2Former instance decoding (MaskFormerFusionHead.instance_postprocess), reproduced: the
mask logits (1/4 of the padded input) are resized bilinearly to the padded input, the padding is cut off,
they are resized bilinearly to the original image; class probabilities are the softmax without the
no-object column; the top ``max_per_image`` (100) of queries x classes are kept (a query may appear under
several classes); mask = logit > 0; score = class probability x mean sigmoid mask probability inside the
mask (sum / (area + 1e-6): an empty mask scores 0); box = the mask's tight box [x1, y1, x2 + 1, y2 + 1] in
pixels (mmdet's mask2bbox; an empty mask gives [0, 0, 0, 0]).

Colour classifier (ColourClassifier), as the official evaluate_images.py: open_clip ViT-L-14 / openai with its
val transform; per class name a zero-shot classifier over COLOURS from the three COLOUR_TEMPLATES (each
template's text embedding L2-normalised, averaged, renormalised: clip_benchmark's zero_shot_classifier),
cached per class name; each object is composited onto a plain "#999" image through its mask (the image
as is without a mask), cropped to its box by PIL (which rounds float coordinates), preprocessed; its
L2-normalised image features times the classifier give the colour (argmax).

Deviations: the official runs CLIP under CUDA fp16 autocast; here it runs in ``dtype`` (default float32).
transformers' Mask2Former checkpoint is the original (Detectron2) Mask2Former Swin-S COCO instance model, not
mmdetection's: other weights, so the detections (and GenEval scores) are close to, not equal to, the
official ones; use kind "mmdet" for the official detector. Its input is resized by transformers' processor
(torchvision bilinear) where mmdetection uses cv2's bilinear resize: the same sizes, slightly different
pixels. transformers' own post_process_instance_segmentation is not used: it resizes the mask logits to a
fixed 384 x 384, keeps the padding, binarises before resizing to the image (nearest), drops empty masks and
thresholds the scores (0.5 by default), none of which mmdetection does.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rewards.common import first_line, l2_normalize, load_exact, not_downloaded, require, resolve_file, torch_load_weights

# GenEval's evaluation/object_names.txt: index i of the detector's labels is name i (COCO's 80 thing classes,
# in COCO order, under GenEval's names: "computer mouse" for COCO's "mouse", and so on)
COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOUR_TEMPLATES = ("a photo of a {colour} {classname}", "a photo of a {colour}-colored {classname}",
                    "a photo of a {colour} object")
BACKGROUND = "#999"

DEFAULT_DETECTOR = "facebook/mask2former-swin-small-coco-instance"
MMDET_CONFIG = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"  # mmdet 2.x name (GenEval's)
MMDET_CONFIG_3X = "mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco"  # the same model's config in mmdet 3.x
MMDET_CHECKPOINT = ("https://download.openmmlab.com/mmdetection/v2.0/mask2former/"
                    "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco/"
                    "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth")
MMDET_INSTALL = "pip install -U openmim && mim install mmengine 'mmcv>=2' mmdet"
# mmdetection's test resize for this model (Resize scale=(1333, 800), keep_ratio; padding to a multiple of 32)
MMDET_TEST_RESIZE = {"shortest_edge": 800, "longest_edge": 1333}
MMDET_SIZE_DIVISOR = 32


@dataclass
class Detection:
    """One detected instance: box [x1, y1, x2, y2] in pixels, confidence, boolean mask [H, W] (or None)."""

    box: tuple[float, float, float, float]
    score: float
    mask: np.ndarray | None = None


Detector = Callable[[torch.Tensor], "list[dict[str, list[Detection]]]"]


# ----------------------------------------------------------------------------- decoding


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """Tight boxes [N, 4] (x1, y1, x2 + 1, y2 + 1: mmdet's mask2bbox) of boolean masks [N, H, W]; an empty
    mask gives [0, 0, 0, 0]."""
    n, height, width = masks.shape
    boxes = torch.zeros(n, 4, dtype=torch.float32, device=masks.device)
    if n == 0:
        return boxes
    cols, rows = masks.any(dim=1), masks.any(dim=2)  # [N, W], [N, H]
    present = cols.any(dim=1)
    xs = torch.arange(width, device=masks.device)
    ys = torch.arange(height, device=masks.device)
    big = max(height, width)
    x1 = torch.where(cols, xs, big).amin(dim=1)
    x2 = torch.where(cols, xs, -1).amax(dim=1) + 1
    y1 = torch.where(rows, ys, big).amin(dim=1)
    y2 = torch.where(rows, ys, -1).amax(dim=1) + 1
    found = torch.stack([x1, y1, x2, y2], dim=1).float()
    return torch.where(present[:, None], found, boxes)


def _decode_one(class_logits: torch.Tensor, mask_logits: torch.Tensor, max_per_image: int,
                classes: tuple[str, ...]) -> dict[str, list[Detection]]:
    """class_logits [Q, C + 1] (last: no object), mask_logits [Q, H, W] at the original image size."""
    num_classes = class_logits.shape[1] - 1
    if num_classes != len(classes):
        raise ValueError(f"the detector predicts {num_classes} classes but {len(classes)} class names were given")
    probs = class_logits.float().softmax(dim=-1)[:, :-1]  # [Q, C]
    k = min(max_per_image, probs.numel())
    top_probs, top = probs.flatten().topk(k, sorted=False)
    query, label = top // num_classes, top % num_classes
    # per query (the same for every class a query is kept under): binary mask, mean probability inside, box
    mask_logits = mask_logits.float()
    binary = mask_logits > 0
    inside = binary.flatten(1).float()
    mask_score = (mask_logits.sigmoid().flatten(1) * inside).sum(1) / (inside.sum(1) + 1e-6)
    boxes = mask_boxes(binary)
    scores = top_probs * mask_score[query]
    order = torch.argsort(scores, descending=True, stable=True)  # most confident first (any order is allowed)
    binary_np = binary.cpu().numpy()
    binary_np.setflags(write=False)  # a query kept under several classes shares one mask array
    boxes_l, scores_l = boxes.cpu().tolist(), scores.cpu().tolist()
    query_l, label_l = query.cpu().tolist(), label.cpu().tolist()
    found: dict[str, list[Detection]] = {}
    for j in order.cpu().tolist():
        q = query_l[j]
        found.setdefault(classes[label_l[j]], []).append(
            Detection(box=tuple(boxes_l[q]), score=float(scores_l[j]), mask=binary_np[q]))
    return found


def mask2former_instances(outputs, target_sizes: list[tuple[int, int]], *, padded_size: tuple[int, int] | None = None,
                          valid_sizes: list[tuple[int, int]] | None = None, max_per_image: int = 100,
                          classes: tuple[str, ...] = COCO_CLASSES) -> list[dict[str, list[Detection]]]:
    """Decode Mask2Former outputs (``class_queries_logits`` [B, Q, C + 1], ``masks_queries_logits`` [B, Q, h, w])
    into instances as mmdetection does (module docstring). target_sizes: each image's original (H, W);
    padded_size: the (H, W) of the model's input batch (the mask logits are first resized to it; None: skip that
    step); valid_sizes: each image's resized size inside the padded input (the rest is padding, cut off)."""
    class_logits, mask_logits = outputs.class_queries_logits, outputs.masks_queries_logits
    results = []
    for i, (height, width) in enumerate(target_sizes):
        masks = mask_logits[i : i + 1].float()
        if padded_size is not None:
            masks = torch.nn.functional.interpolate(masks, size=tuple(padded_size), mode="bilinear",
                                                    align_corners=False)
        if valid_sizes is not None:
            masks = masks[..., : valid_sizes[i][0], : valid_sizes[i][1]]
        if tuple(masks.shape[-2:]) != (height, width):
            masks = torch.nn.functional.interpolate(masks, size=(height, width), mode="bilinear", align_corners=False)
        results.append(_decode_one(class_logits[i], masks[0], max_per_image, classes))
    return results


def detections_from_mmdet(result, classes: tuple[str, ...] = COCO_CLASSES) -> dict[str, list[Detection]]:
    """One image's mmdetection result -> {class name: [Detection]}. Reads the 2.x format (a tuple (bbox_results,
    segm_results): per class an array [n, 5] of x1, y1, x2, y2, score and a list of n masks [H, W]; or the
    bbox list alone, without masks) and the 3.x DetDataSample (pred_instances.bboxes [n, 4], .scores [n],
    .labels [n], .masks [n, H, W] when the model has them)."""
    def array(x) -> np.ndarray:
        return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    found: dict[str, list[Detection]] = {}
    instances = getattr(result, "pred_instances", None)
    if instances is not None:  # mmdet 3.x
        boxes, scores, labels = array(instances.bboxes), array(instances.scores), array(instances.labels)
        masks = getattr(instances, "masks", None)
        masks = None if masks is None else array(masks)
        for j in range(len(labels)):
            label = int(labels[j])
            found.setdefault(classes[label], []).append(Detection(
                box=tuple(float(v) for v in boxes[j][:4]), score=float(scores[j]),
                mask=None if masks is None else masks[j].astype(bool)))
        return found
    if isinstance(result, tuple):  # mmdet 2.x, with masks
        bbox_results = result[0]
        segm_results = result[1] if len(result) > 1 else None
    else:  # mmdet 2.x, boxes only
        bbox_results, segm_results = result, None
    if isinstance(segm_results, tuple):  # (masks, mask scores) of mask-scoring heads
        segm_results = segm_results[0]
    if len(bbox_results) != len(classes):
        raise ValueError(f"mmdetection returned results for {len(bbox_results)} classes, expected {len(classes)} "
                         "(a COCO instance-segmentation model)")
    for label, rows in enumerate(bbox_results):
        rows = np.asarray(rows).reshape(-1, 5)
        for j, row in enumerate(rows):
            mask = None if segm_results is None else np.asarray(segm_results[label][j]).astype(bool)
            found.setdefault(classes[label], []).append(
                Detection(box=tuple(float(v) for v in row[:4]), score=float(row[4]), mask=mask))
    return found


# ----------------------------------------------------------------------------- detectors


def _unavailable(what: str, pretrained: str, command: str, option: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(not_downloaded(what, pretrained, exc, command, option))


def _require_scipy() -> None:
    """transformers' Mask2Former constructor builds its (unused here) Hungarian-matching loss, which imports scipy."""
    require("scipy", "geneval", "transformers' Mask2Former detector")


def build_mask2former(config):
    """Mask2FormerForUniversalSegmentation(config); its constructor builds the training loss, which needs scipy."""
    from transformers import Mask2FormerForUniversalSegmentation

    _require_scipy()
    return Mask2FormerForUniversalSegmentation(config)


class TransformersMask2Former:
    """transformers' Mask2Former instance segmentation as a GenEval detector (module docstring).

    pretrained: a hub id or a local folder (config.json, weights, preprocessor_config.json, as save_pretrained
    writes them). resize: the processor's resize, by default mmdetection's test resize for this model
    (shortest edge 800, longest 1333 keeping the aspect ratio, zero padding to a multiple of 32); None keeps
    the processor's own settings (transformers' size_divisor resizes to a multiple of 32 instead of padding).
    model / processor: ready objects (tests). batch_size: images per forward pass."""

    def __init__(self, pretrained: str = DEFAULT_DETECTOR, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 model=None, processor=None, resize: dict | None = MMDET_TEST_RESIZE, max_per_image: int = 100,
                 batch_size: int = 8):
        from transformers import Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor

        option = "detector_path=/local/folder (config.json, model.safetensors, preprocessor_config.json)"
        command = f"hf download {pretrained}"
        if model is None:
            try:
                _require_scipy()
                model = Mask2FormerForUniversalSegmentation.from_pretrained(pretrained)
                if processor is None:
                    processor = Mask2FormerImageProcessor.from_pretrained(pretrained)
            except OSError as exc:
                if os.path.isdir(os.path.expanduser(str(pretrained))):
                    raise RuntimeError(f"Mask2Former folder {pretrained!r} could not be loaded ({first_line(exc)}); it needs "
                                       "config.json, the weights and preprocessor_config.json, as save_pretrained "
                                       "writes them") from exc
                raise _unavailable("Mask2Former", pretrained, command, option, exc) from exc
        elif processor is None:  # a ready model: the processor's defaults (ImageNet mean/std, mmdet's resize)
            processor = Mask2FormerImageProcessor()
        num_labels = model.config.num_labels
        if num_labels != len(COCO_CLASSES):
            raise ValueError(f"Mask2Former {pretrained!r} predicts {num_labels} classes; GenEval needs a COCO instance "
                             f"model with the 80 COCO classes, e.g. {DEFAULT_DETECTOR}")
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.processor = processor
        self.resize = dict(resize) if resize is not None else None
        self.max_per_image, self.batch_size = int(max_per_image), int(batch_size)
        self.device, self.dtype = torch.device(device), dtype

    def _inputs(self, images: torch.Tensor):
        """(pixel_values [B, 3, Hp, Wp], pixel_mask [B, Hp, Wp], each image's resized (h, w) inside the padding)."""
        kwargs = {"return_tensors": "pt"}
        if self.resize is not None:
            # the processor's size_divisor stretches the image to a multiple of 32; mmdetection keeps the aspect
            # ratio and pads (with 0 after normalising) to a multiple of 32, as done here
            kwargs.update(size=self.resize, size_divisor=0)
        batch = self.processor(images=[image.cpu() for image in images], **kwargs)
        pixels, pixel_mask = batch["pixel_values"], batch["pixel_mask"]
        valid = [(int(m.any(dim=1).sum()), int(m.any(dim=0).sum())) for m in pixel_mask]
        if self.resize is not None:
            pad_h, pad_w = -pixels.shape[-2] % MMDET_SIZE_DIVISOR, -pixels.shape[-1] % MMDET_SIZE_DIVISOR
            if pad_h or pad_w:
                pixels = torch.nn.functional.pad(pixels, (0, pad_w, 0, pad_h))
                pixel_mask = torch.nn.functional.pad(pixel_mask, (0, pad_w, 0, pad_h))
        return pixels, pixel_mask, valid

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> list[dict[str, list[Detection]]]:
        """images: uint8 [B, 3, H, W] -> per image {class name: [Detection]}, all top-k instances, unfiltered."""
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"the detector takes uint8 images [B, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        results: list[dict[str, list[Detection]]] = []
        height, width = images.shape[-2:]
        for start in range(0, len(images), self.batch_size):
            chunk = images[start : start + self.batch_size]
            pixels, pixel_mask, valid = self._inputs(chunk)
            outputs = self.model(pixel_values=pixels.to(self.device, self.dtype), pixel_mask=pixel_mask.to(self.device))
            results += mask2former_instances(outputs, [(height, width)] * len(chunk), padded_size=tuple(pixels.shape[-2:]),
                                             valid_sizes=valid, max_per_image=self.max_per_image)
        return results


def _find_mmdet_config(mmdet) -> str:
    root = Path(mmdet.__file__).parent
    for folder in (root / ".mim" / "configs", root.parent / "configs"):
        for name in (MMDET_CONFIG_3X, MMDET_CONFIG):
            candidate = folder / "mask2former" / f"{name}.py"
            if candidate.is_file():
                return str(candidate)
    raise FileNotFoundError(f"mmdetection's config {MMDET_CONFIG_3X}.py (2.x: {MMDET_CONFIG}.py) is not in the "
                            f"installed mmdet; get it with `mim download mmdet --config {MMDET_CONFIG_3X} --dest .` "
                            "and pass detector_config=./" + MMDET_CONFIG_3X + ".py")


class MMDetMask2Former:
    """The official evaluator's detector: mmdetection's Mask2Former Swin-S COCO instance model.

    config: the model's config file (default: the one shipped with the installed mmdet); checkpoint: its .pth
    (a local file or the download.openmmlab.com URL, which mmengine caches)."""

    def __init__(self, config: str | None = None, checkpoint: str = MMDET_CHECKPOINT, *, device: str = "cpu"):
        try:
            mmdet = importlib.import_module("mmdet")
            apis = importlib.import_module("mmdet.apis")
        except ImportError as exc:
            raise ImportError(f"the mmdetection detector needs mmdet: {MMDET_INSTALL} (checkpoint: "
                              f"{MMDET_CHECKPOINT})") from exc
        self.config = config or _find_mmdet_config(mmdet)
        self.model = apis.init_detector(self.config, checkpoint, device=device)
        self._infer = apis.inference_detector

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> list[dict[str, list[Detection]]]:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"the detector takes uint8 images [B, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        # mmdetection reads arrays as cv2 would load a file: HWC, BGR
        arrays = [np.ascontiguousarray(image.permute(1, 2, 0).cpu().numpy()[..., ::-1]) for image in images]
        return [detections_from_mmdet(self._infer(self.model, array)) for array in arrays]


DETECTORS = ("transformers", "mmdet", "mmdetection")


def load_detector(kind: str = "transformers", path: str | None = None, *, config: str | None = None,
                  device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A GenEval detector. kind "transformers": path = hub id or folder (default DEFAULT_DETECTOR); kind "mmdet"
    (or "mmdetection"): path = the .pth checkpoint (default the official URL), config = its config file."""
    if kind == "transformers":
        if config is not None:
            raise ValueError("detector_config is read by the mmdet detector only; the transformers detector takes "
                             "a folder or hub id as detector_path")
        return TransformersMask2Former(path or DEFAULT_DETECTOR, device=device, dtype=dtype)
    if kind in ("mmdet", "mmdetection"):
        return MMDetMask2Former(config, path or MMDET_CHECKPOINT, device=device)
    raise ValueError(f"unknown detector {kind!r}; choose one of {', '.join(DETECTORS)}")


# ----------------------------------------------------------------------------- colour


def _arch_config(arch: str | dict) -> dict | None:
    """A config dict for a dict or a .json file path; None for an open_clip model name."""
    if isinstance(arch, dict):
        return copy.deepcopy(arch)
    if str(arch).endswith(".json") or os.path.isfile(os.path.expanduser(str(arch))):
        path = Path(os.path.expanduser(str(arch)))
        if not path.is_file():
            raise FileNotFoundError(f"colour classifier config {arch!r}: no such file")
        return json.loads(path.read_text())
    return None


class ColourClassifier:
    """GenEval's colour classifier (module docstring).

    arch: an open_clip model name (pretrained: an open_clip tag such as "openai", or a checkpoint file), or a
    config dict {"embed_dim", "vision_cfg", "text_cfg"} / a .json file holding one (pretrained: the state-dict
    file, a folder holding open_clip_pytorch_model.bin, or a hub 'owner/repo[/file]'). model / preprocess /
    tokenizer: ready objects (tests); a missing preprocess or tokenizer is derived from arch. A tag whose weights were
    trained with QuickGELU (the "openai" ones) builds the arch with QuickGELU, as the official evaluator's open_clip
    2.20 did; a local copy of the openai weights needs arch "ViT-L-14-quickgelu"."""

    def __init__(self, arch: str | dict = "ViT-L-14", pretrained: str = "openai", *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, model=None, preprocess=None, tokenizer=None,
                 background: str = BACKGROUND):
        open_clip = require("open_clip", "clip", "the GenEval colour classifier")
        cfg = _arch_config(arch)
        if cfg is None and open_clip.get_model_config(arch) is None:
            raise ValueError(f"open_clip has no model config {arch!r}; pass a name from open_clip.list_models(), "
                             "a config dict or a .json config file")
        if cfg is not None:
            if model is None:
                option = "colour_pretrained=/path/to/state_dict.pt"
                try:  # the weights first: a missing file is refused before the network is built
                    path = resolve_file(pretrained, "open_clip_pytorch_model.bin")
                except OSError as exc:
                    raise _unavailable("colour classifier weights", pretrained,
                                       f"hf download {'/'.join(str(pretrained).split('/')[:2])}",
                                       option, exc) from exc
                model = open_clip.CLIP(**cfg)
                load_exact(model, torch_load_weights(path), f"colour classifier checkpoint {path}")
            size = cfg.get("vision_cfg", {}).get("image_size", 224)
            preprocess = preprocess or open_clip.image_transform(size, is_train=False)
            tokenizer = tokenizer or open_clip.SimpleTokenizer(
                context_length=cfg.get("text_cfg", {}).get("context_length", 77))
        else:
            if model is None:
                model, preprocess_loaded = self._load_named(open_clip, arch, pretrained, device)
                preprocess = preprocess or preprocess_loaded
            if preprocess is None:
                visual = model.visual
                preprocess = open_clip.image_transform(visual.image_size, is_train=False,
                                                       mean=getattr(visual, "image_mean", None),
                                                       std=getattr(visual, "image_std", None))
            tokenizer = tokenizer or open_clip.get_tokenizer(arch)
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.preprocess, self.tokenizer = preprocess, tokenizer
        self.background = background
        self.device, self.dtype = torch.device(device), dtype
        self.classifiers: dict[str, torch.Tensor] = {}  # class name -> [D, len(COLOURS)], built on first use

    @staticmethod
    def _load_named(open_clip, arch: str, pretrained: str, device):
        command = (f"python -c \"import open_clip; open_clip.create_model_and_transforms('{arch}', "
                   f"pretrained='{pretrained}')\"")
        option = ("colour_pretrained=/path/to/checkpoint.pt (a local open_clip checkpoint of this arch; openai "
                  "weights with colour_arch=ViT-L-14-quickgelu)")
        local = os.path.isfile(os.path.expanduser(str(pretrained)))
        tag_cfg = {} if local else open_clip.get_pretrained_cfg(arch, pretrained)
        if not local:
            if not tag_cfg:
                tags = [t for a, t in open_clip.list_pretrained() if a == arch]
                raise ValueError(f"open_clip has no pretrained weights {pretrained!r} for {arch} (tags: {tags}) and no "
                                 f"such file; pass a tag or a checkpoint file")
            try:  # fetch (or find in the cache) the weights before building the model, so a miss fails fast
                from open_clip.pretrained import download_pretrained

                download_pretrained(tag_cfg)
            except Exception as exc:  # noqa: BLE001  (network, hub and cache errors have many types)
                raise _unavailable(f"open_clip {arch} weights", pretrained, command, option, exc) from exc
        try:
            # the openai weights were trained with QuickGELU: open_clip 2.20 (the official evaluator's) built them so
            # from the "openai" tag; open_clip 3 builds the arch's GELU unless told
            model, _, preprocess = open_clip.create_model_and_transforms(
                arch, pretrained=pretrained, device=device, force_quick_gelu=bool(tag_cfg.get("quick_gelu")))
        except (OSError, RuntimeError) as exc:
            raise _unavailable(f"open_clip {arch} weights", pretrained, command, option, exc) from exc
        return model, preprocess

    @torch.no_grad()
    def classifier(self, classname: str) -> torch.Tensor:
        """[D, len(COLOURS)]: per colour the renormalised mean of the normalised embeddings of the templates."""
        if classname not in self.classifiers:
            texts = [t.format(colour=colour, classname=classname) for colour in COLOURS for t in COLOUR_TEMPLATES]
            tokens = self.tokenizer(texts).to(self.device)
            features = self.model.encode_text(tokens).float()
            per_colour = l2_normalize(features).view(len(COLOURS), len(COLOUR_TEMPLATES), -1).mean(dim=1)
            self.classifiers[classname] = l2_normalize(per_colour).T.contiguous()
        return self.classifiers[classname]

    def crops(self, image: torch.Tensor, detections: list[Detection]) -> list:
        """The official ImageCrops: each object composited onto a plain background through its mask (the image
        as is without one), then cropped to its box by PIL. image: uint8 [3, H, W]. Returns PIL images."""
        from PIL import Image

        pil = Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).convert("RGB")
        blank = Image.new("RGB", pil.size, color=self.background)
        out = []
        for index, det in enumerate(detections):
            if det.mask is not None:
                mask = np.asarray(det.mask)
                if mask.shape != (pil.height, pil.width):
                    raise ValueError(f"detection {index}: mask {mask.shape} does not match the image "
                                     f"{(pil.height, pil.width)}")
                composed = Image.composite(pil, blank, Image.fromarray(mask.astype(bool)))
            else:
                composed = pil
            out.append(composed.crop(tuple(det.box[:4])))
        return out

    @torch.no_grad()
    def logits(self, image: torch.Tensor, detections: list[Detection], classname: str) -> torch.Tensor:
        """[N, len(COLOURS)]: each object's normalised image features times the class's colour classifier."""
        crops = self.crops(image, detections)
        if not crops:
            return torch.zeros(0, len(COLOURS))
        for index, crop in enumerate(crops):
            if crop.width == 0 or crop.height == 0:
                raise ValueError(f"detection {index} of {classname!r} has an empty box {tuple(detections[index].box)}: "
                                 "no pixels to classify (an empty mask's detection scores 0 and never passes the "
                                 "confidence threshold)")
        pixels = torch.stack([self.preprocess(crop) for crop in crops]).to(self.device, self.dtype)
        features = l2_normalize(self.model.encode_image(pixels).float())
        return features @ self.classifier(classname).to(features.device)

    def __call__(self, image: torch.Tensor, detections: list[Detection], classname: str) -> list[str]:
        """One colour (from COLOURS) per detection. image: uint8 [3, H, W]."""
        if not detections:
            return []
        return [COLOURS[i] for i in self.logits(image, detections, classname).argmax(dim=1).tolist()]


__all__ = ["BACKGROUND", "COCO_CLASSES", "COLOURS", "COLOUR_TEMPLATES", "ColourClassifier", "DEFAULT_DETECTOR",
           "DETECTORS", "Detection", "MMDET_CHECKPOINT", "MMDetMask2Former", "TransformersMask2Former",
           "build_mask2former", "detections_from_mmdet", "load_detector", "mask2former_instances", "mask_boxes"]
