"""GenEval's two models (rewards/geneval_models.py) on hand-made data and tiny random models (no downloads):
the mmdetection result formats (2.x tuple, 3.x DetDataSample), Mask2Former's instance decoding (by hand and on
a tiny transformers model), the colour classifier's crops, zero-shot classifier and argmax, and the one-line
messages for what is missing (mmdet, uncached hub weights).

Run: .venv/bin/python -m pytest -q tests/rewards/test_geneval_models.py -p no:cacheprovider
"""

import json
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rewards.geneval_models import (
    COCO_CLASSES, COLOUR_TEMPLATES, COLOURS, MMDET_CHECKPOINT, ColourClassifier, Detection, MMDetMask2Former,
    TransformersMask2Former, detections_from_mmdet, load_detector, mask2former_instances,
)
from tolerance import assert_close_ulps

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The files `python -m rewards.tiny geneval OUT` writes, and the options it prints."""
    from rewards.tiny import write_tiny_geneval

    out = tmp_path_factory.mktemp("tiny_geneval")
    return out, write_tiny_geneval(out)


def _scenes(n=2, size=64, seed=0) -> torch.Tensor:
    """uint8 [n, 3, size, size]: grey background with two coloured squares each."""
    g = torch.Generator().manual_seed(seed)
    images = torch.full((n, 3, size, size), 200, dtype=torch.uint8)
    for i in range(n):
        for _ in range(2):
            x, y = torch.randint(0, size - 20, (2,), generator=g).tolist()
            images[i, :, y:y + 20, x:x + 20] = torch.randint(0, 255, (3, 1, 1), generator=g).to(torch.uint8)
    return images


def _tight_box(mask: np.ndarray) -> tuple:
    """[x1, y1, x2 + 1, y2 + 1] of a boolean mask, [0, 0, 0, 0] when empty (mmdet's mask2bbox)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return (0.0, 0.0, 0.0, 0.0)
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


def test_names():
    assert len(COCO_CLASSES) == 80 and len(set(COCO_CLASSES)) == 80
    assert COCO_CLASSES[:3] == ("person", "bicycle", "car") and COCO_CLASSES[-1] == "toothbrush"
    assert COCO_CLASSES[64:67] == ("computer mouse", "tv remote", "computer keyboard")  # GenEval's names
    assert COLOURS == ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")


# ----------------------------------------------------------------------------- mmdetection formats


def test_mmdet_2x_result_with_and_without_masks():
    masks_dog = [np.eye(4, dtype=bool), np.ones((4, 4), dtype=bool)]
    mask_cat = np.zeros((4, 4), dtype=bool)
    mask_cat[1:3, 2] = True
    bboxes = [np.zeros((0, 5), dtype=np.float32) for _ in COCO_CLASSES]
    segms = [[] for _ in COCO_CLASSES]
    dog, cat = COCO_CLASSES.index("dog"), COCO_CLASSES.index("cat")
    bboxes[dog] = np.array([[0, 0, 4, 4, 0.9], [1.5, 0.5, 3, 4, 0.25]], dtype=np.float32)
    segms[dog] = masks_dog
    bboxes[cat] = np.array([[2, 1, 3, 3, 0.5]], dtype=np.float32)
    segms[cat] = [mask_cat]

    found = detections_from_mmdet((bboxes, segms))
    assert set(found) == {"dog", "cat"}
    assert [d.box for d in found["dog"]] == [(0.0, 0.0, 4.0, 4.0), (1.5, 0.5, 3.0, 4.0)]
    assert [d.score for d in found["dog"]] == pytest.approx([0.9, 0.25], rel=1e-6)
    assert np.array_equal(found["dog"][0].mask, masks_dog[0]) and np.array_equal(found["dog"][1].mask, masks_dog[1])
    assert found["cat"][0].box == (2.0, 1.0, 3.0, 3.0) and found["cat"][0].score == pytest.approx(0.5)
    assert found["cat"][0].mask.dtype == bool and np.array_equal(found["cat"][0].mask, mask_cat)

    boxes_only = detections_from_mmdet(bboxes)  # a detector without masks: the bbox list alone
    assert [d.box for d in boxes_only["dog"]] == [(0.0, 0.0, 4.0, 4.0), (1.5, 0.5, 3.0, 4.0)]
    assert all(d.mask is None for ds in boxes_only.values() for d in ds)

    with pytest.raises(ValueError, match="3 classes, expected 80"):
        detections_from_mmdet((bboxes[:3], segms[:3]))


def test_mmdet_3x_det_data_sample():
    masks = torch.zeros(3, 5, 6, dtype=torch.bool)
    masks[0, 1:4, 2:5] = True
    masks[2, 0, 0] = True
    labels = torch.tensor([COCO_CLASSES.index("car"), COCO_CLASSES.index("tv remote"), COCO_CLASSES.index("car")])
    sample = SimpleNamespace(pred_instances=SimpleNamespace(
        bboxes=torch.tensor([[2.0, 1.0, 5.0, 4.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]),
        scores=torch.tensor([0.75, 0.125, 0.5]), labels=labels, masks=masks))
    found = detections_from_mmdet(sample)
    assert set(found) == {"car", "tv remote"}
    assert [d.box for d in found["car"]] == [(2.0, 1.0, 5.0, 4.0), (0.0, 0.0, 1.0, 1.0)]
    assert [d.score for d in found["car"]] == [0.75, 0.5]
    assert found["tv remote"][0].score == 0.125 and not found["tv remote"][0].mask.any()
    assert np.array_equal(found["car"][0].mask, masks[0].numpy()) and found["car"][0].mask.dtype == bool
    assert np.array_equal(found["car"][1].mask, masks[2].numpy())

    del sample.pred_instances.masks  # a box-only model's instances have no masks
    assert all(d.mask is None for ds in detections_from_mmdet(sample).values() for d in ds)


def test_missing_mmdet_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mmdet", None)  # import mmdet raises ImportError
    monkeypatch.setitem(sys.modules, "mmdet.apis", None)
    for build in (lambda: MMDetMask2Former(), lambda: load_detector("mmdet"), lambda: load_detector("mmdetection")):
        with pytest.raises(ImportError) as info:
            build()
        message = str(info.value)
        assert "\n" not in message
        assert "pip install -U openmim && mim install mmengine 'mmcv>=2' mmdet" in message
        assert MMDET_CHECKPOINT in message


def test_unknown_detector_kind():
    with pytest.raises(ValueError, match="unknown detector 'yolo'; choose one of transformers, mmdet, mmdetection"):
        load_detector("yolo")


# ----------------------------------------------------------------------------- Mask2Former decoding


def test_mask2former_decoding_by_hand():
    """Two queries, three classes (+ no object), probabilities chosen so that the top 4 of the 6 (query, class)
    pairs are known; query 0's mask is a rectangle of logit +2, query 1's mask is empty."""
    probs = torch.tensor([[0.6, 0.15, 0.05, 0.2], [0.3, 0.5, 0.1, 0.1]], dtype=torch.float64)
    height, width = 6, 7
    masks = torch.full((2, height, width), -3.0)
    masks[0, 1:3, 2:5] = 2.0  # rows 1-2, columns 2-4
    masks[1] = -1.0
    outputs = SimpleNamespace(class_queries_logits=probs.log().float()[None], masks_queries_logits=masks[None])
    found, = mask2former_instances(outputs, [(height, width)], max_per_image=4, classes=("a", "b", "c"))

    inside = 1 / (1 + math.exp(-2.0))  # mean sigmoid over the mask
    assert set(found) == {"a", "b"}  # class c's pairs (0.05, 0.1) are not in the top 4
    a, b = found["a"], found["b"]
    assert [d.score for d in a] == pytest.approx([0.6 * inside, 0.0], rel=1e-5, abs=1e-9)
    assert [d.score for d in b] == pytest.approx([0.15 * inside, 0.0], rel=1e-5, abs=1e-9)
    assert a[0].box == b[0].box == (2.0, 1.0, 5.0, 3.0)  # x1, y1, x2 + 1, y2 + 1
    assert a[1].box == b[1].box == (0.0, 0.0, 0.0, 0.0)  # empty mask: zero box, score 0
    expected_mask = np.zeros((height, width), dtype=bool)
    expected_mask[1:3, 2:5] = True
    assert np.array_equal(a[0].mask, expected_mask) and not a[1].mask.any()

    # padding: the logits cover a padded input of 8 x 9 whose valid part is the original 6 x 7; a positive
    # region in the padding must not reach the boxes
    padded = torch.full((2, 8, 9), -3.0)
    padded[:, :height, :width] = masks
    padded[0, 6:, :] = 5.0
    padded[0, :, 7:] = 5.0
    outputs = SimpleNamespace(class_queries_logits=probs.log().float()[None], masks_queries_logits=padded[None])
    cut, = mask2former_instances(outputs, [(height, width)], padded_size=(8, 9), valid_sizes=[(height, width)],
                                 max_per_image=4, classes=("a", "b", "c"))
    assert [d.box for d in cut["a"]] == [(2.0, 1.0, 5.0, 3.0), (0.0, 0.0, 0.0, 0.0)]
    assert [d.score for d in cut["a"]] == pytest.approx([0.6 * inside, 0.0], rel=1e-5, abs=1e-9)


def test_tiny_mask2former_detections(tiny_dir):
    """Loaded from the folder as the hub checkpoint would be; every detection's box is the tight box of its
    mask, scores are probabilities, names are GenEval's; top 100 of queries x classes per image."""
    options = tiny_dir[1]
    detector = TransformersMask2Former(options["detector_path"], resize=None)  # the folder's 64 x 64 resize
    images = _scenes(2)
    results = detector(images)
    assert len(results) == 2
    strong = 0
    for found in results:
        detections = [d for ds in found.values() for d in ds]
        assert len(detections) == 100
        assert set(found) <= set(COCO_CLASSES)
        for d in detections:
            assert d.mask.shape == (64, 64) and d.mask.dtype == bool
            assert d.box == _tight_box(d.mask)
            assert 0.0 <= d.score <= 1.0
        strong += sum(d.score > 0.3 and d.mask.any() for d in detections)
    assert strong > 0, "the tiny detector finds nothing above GenEval's threshold; end-to-end tests would be vacuous"
    boxes = [sorted((name, d.box) for name, ds in found.items() for d in ds if d.score > 0.3) for found in results]
    assert boxes[0] != boxes[1], "the two images got the same detections"

    # each image of a batch is decoded on its own (the model's batch vs single rounding is not this code's)
    pixels, _, valid = detector._inputs(images)
    with torch.no_grad():
        outputs = detector.model(pixel_values=pixels)
    together = mask2former_instances(outputs, [(64, 64)] * 2, padded_size=tuple(pixels.shape[-2:]), valid_sizes=valid)
    for i in range(2):
        alone, = mask2former_instances(
            SimpleNamespace(class_queries_logits=outputs.class_queries_logits[i:i + 1],
                            masks_queries_logits=outputs.masks_queries_logits[i:i + 1]),
            [(64, 64)], padded_size=tuple(pixels.shape[-2:]), valid_sizes=valid[i:i + 1])
        assert alone.keys() == together[i].keys() == results[i].keys()
        for name in alone:
            for a, b, c in zip(alone[name], together[i][name], results[i][name], strict=True):
                assert a.box == b.box == c.box and a.score == b.score == c.score
                assert np.array_equal(a.mask, b.mask) and np.array_equal(a.mask, c.mask)


def test_default_resize_is_mmdetections(tiny_dir):
    """By default the processor resizes as mmdetection's test pipeline (shortest edge 800, longest 1333, padding
    to a multiple of 32), whatever the folder's processor says; masks still come back at the image size."""
    detector = TransformersMask2Former(tiny_dir[1]["detector_path"])
    pixels, pixel_mask, valid = detector._inputs(_scenes(1, size=64))
    assert tuple(pixels.shape[-2:]) == (800, 800) and valid == [(800, 800)]
    wide = torch.zeros(1, 3, 40, 100, dtype=torch.uint8)  # 800 / 40 = 20 would make 2000 wide: 1333 bounds it
    pixels, _, valid = detector._inputs(wide)
    assert valid == [(533, 1333)] and tuple(pixels.shape[-2:]) == (544, 1344)
    found, = detector(wide)
    assert all(d.mask.shape == (40, 100) and d.box == _tight_box(d.mask) for ds in found.values() for d in ds)


def test_label_count_is_checked():
    from transformers import Mask2FormerConfig, SwinConfig

    from rewards.geneval_models import build_mask2former
    from rewards.tiny import TINY_MASK2FORMER, TINY_SWIN

    model = build_mask2former(Mask2FormerConfig(backbone_config=SwinConfig(**TINY_SWIN), num_labels=3, **TINY_MASK2FORMER))
    with pytest.raises(ValueError, match="predicts 3 classes; GenEval needs a COCO instance model"):
        TransformersMask2Former("my/model", model=model)


# ----------------------------------------------------------------------------- colour


@pytest.fixture(scope="module")
def colour(tiny_dir):
    options = tiny_dir[1]
    return ColourClassifier(options["colour_arch"], options["colour_pretrained"])


def test_colour_checkpoint_loads_from_json_and_pt(colour):
    from rewards.tiny import tiny_colour_clip

    reference = tiny_colour_clip(seed=0).state_dict()
    loaded = colour.model.state_dict()
    assert set(loaded) == set(reference)
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_crops_composite_on_grey_and_round_the_box(colour):
    image = torch.arange(3 * 8 * 8, dtype=torch.int64).reshape(3, 8, 8).to(torch.uint8)
    mask = np.zeros((8, 8), dtype=bool)
    mask[2:5, 1:4] = True
    mask[6, 6] = True
    box = (1.4, 2.5, 5.5, 6.6)  # PIL rounds: x 1..6, y 2..7 (round half to even: 2.5 -> 2, 5.5 -> 6)
    with_mask, plain = colour.crops(image, [Detection(box, 0.9, mask), Detection(box, 0.9, None)])

    hwc = image.permute(1, 2, 0).numpy()
    composed = np.where(mask[..., None], hwc, np.uint8(0x99))  # "#999" is (153, 153, 153)
    assert with_mask.size == (5, 5) and plain.size == (5, 5)
    assert np.array_equal(np.asarray(with_mask), composed[2:7, 1:6])
    assert np.array_equal(np.asarray(plain), hwc[2:7, 1:6])

    whole, = colour.crops(image, [Detection((0.0, 0.0, 8.0, 8.0), 0.5, mask)])
    assert np.array_equal(np.asarray(whole), composed)
    with pytest.raises(ValueError, match="does not match the image"):
        colour.crops(image, [Detection(box, 0.9, np.ones((4, 4), dtype=bool))])


def test_zero_shot_classifier_is_the_normalised_mean_of_normalised_templates(colour):
    seen = []
    tokenizer = colour.tokenizer

    def recording(texts):
        seen.append(list(texts))
        return tokenizer(texts)

    colour.tokenizer = recording
    try:
        colour.classifiers.pop("hot dog", None)
        matrix = colour.classifier("hot dog")
        assert colour.classifier("hot dog") is matrix and len(seen) == 1  # cached per class name
    finally:
        colour.tokenizer = tokenizer
    expected_texts = [f"a photo of a {c} hot dog" for c in COLOURS]
    assert seen[0][::3] == expected_texts
    assert seen[0][1::3] == [f"a photo of a {c}-colored hot dog" for c in COLOURS]
    assert seen[0][2::3] == [f"a photo of a {c} object" for c in COLOURS]
    assert len(COLOUR_TEMPLATES) == 3

    columns = []
    with torch.no_grad():
        for c in COLOURS:  # clip_benchmark's zero_shot_classifier, one colour at a time
            texts = [f"a photo of a {c} hot dog", f"a photo of a {c}-colored hot dog", f"a photo of a {c} object"]
            embeddings = torch.nn.functional.normalize(colour.model.encode_text(tokenizer(texts)), dim=-1)
            mean = embeddings.mean(dim=0)
            columns.append(mean / mean.norm())
    expected = torch.stack(columns, dim=1)
    assert matrix.shape == expected.shape == (colour.model.text_projection.shape[1], len(COLOURS))
    # rounding only: one batch of 30 texts vs 10 batches of 3; a template or colour mixed up moves entries by ~0.1
    assert_close_ulps(matrix, expected, ulps=64)


def test_colour_is_the_argmax_over_the_classifier(colour, monkeypatch):
    image = _scenes(1)[0]
    detections = [Detection((0.0, 0.0, 32.0, 32.0), 0.9, None), Detection((30.0, 20.0, 64.0, 60.0), 0.8, None),
                  Detection((10.0, 10.0, 40.0, 50.0), 0.7, np.ones((64, 64), dtype=bool))]
    with torch.no_grad():
        pixels = torch.stack([colour.preprocess(crop) for crop in colour.crops(image, detections)])
        features = torch.nn.functional.normalize(colour.model.encode_image(pixels), dim=-1)
    classifier = torch.zeros(features.shape[1], len(COLOURS))
    wanted = ["blue", "pink", "black"]  # colour i's column is object i's own feature: cos 1 beats every other
    for feature, name in zip(features, wanted):
        classifier[:, COLOURS.index(name)] = feature
    monkeypatch.setitem(colour.classifiers, "kite", classifier)
    assert colour(image, detections, "kite") == wanted
    assert colour(image, detections[::-1], "kite") == wanted[::-1]
    assert colour(image, [], "kite") == []
    with pytest.raises(ValueError, match="empty box"):
        colour(image, [Detection((0.0, 0.0, 0.0, 0.0), 0.0, None)], "kite")


# ----------------------------------------------------------------------------- messages and the CLI


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network and an empty hub cache, whatever this machine has cached."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


def test_uncached_detector_is_one_line_naming_the_download(offline):
    with pytest.raises(RuntimeError) as info:
        TransformersMask2Former("nonexistent-org/no-such-mask2former")
    message = str(info.value)
    assert "\n" not in message
    assert "`hf download nonexistent-org/no-such-mask2former`" in message
    assert "or pass detector_path=/local/folder" in message


def test_uncached_colour_clip_is_one_line_naming_the_download(offline, tiny_dir):
    with pytest.raises(RuntimeError) as info:
        ColourClassifier("ViT-L-14", "openai")  # fails before building ViT-L
    message = str(info.value)
    assert "\n" not in message
    assert ("`python -c \"import open_clip; open_clip.create_model_and_transforms('ViT-L-14', pretrained='openai')\"`"
            in message)
    assert "or pass colour_pretrained=" in message

    with pytest.raises(RuntimeError) as info:
        ColourClassifier(tiny_dir[1]["colour_arch"], "nonexistent-org/no-such-clip")
    assert "\n" not in str(info.value) and "`hf download nonexistent-org/no-such-clip`" in str(info.value)
    with pytest.raises(ValueError, match="no model config 'ViT-Q-99'"):
        ColourClassifier("ViT-Q-99")


def test_cli_writes_the_tiny_models_and_prints_the_options(tmp_path, capsys):
    from rewards.tiny import main

    main(["geneval", str(tmp_path / "out")])
    printed = capsys.readouterr().out.split()
    out = tmp_path / "out"
    assert printed == ["--reward-option", f"detector_path={out / 'detector'}", "--reward-option",
                       f"colour_arch={out / 'colour_clip.json'}", "--reward-option", f"colour_pretrained={out / 'colour_clip.pt'}"]
    assert (out / "detector" / "config.json").is_file() and (out / "detector" / "preprocessor_config.json").is_file()
    assert json.loads((out / "colour_clip.json").read_text())["embed_dim"] == 16


def test_the_openai_tag_builds_quickgelu_as_the_official_open_clip_did(monkeypatch):
    """open_clip 2.20 (GenEval's) built ViT-L-14/openai with QuickGELU, the activation those weights were trained with;
    open_clip 3 builds the arch's GELU unless told: the classifier tells it for every tag whose weights want it."""
    import open_clip
    import open_clip.pretrained

    from rewards.geneval_models import ColourClassifier
    from rewards.tiny import tiny_colour_clip

    calls = []

    def create(arch, pretrained=None, device="cpu", **kwargs):
        calls.append((arch, pretrained, kwargs))
        return tiny_colour_clip(), None, open_clip.image_transform(32, is_train=False)

    monkeypatch.setattr(open_clip.pretrained, "download_pretrained", lambda cfg, **kwargs: "/dev/null")
    monkeypatch.setattr(open_clip, "create_model_and_transforms", create)
    ColourClassifier("ViT-L-14", "openai")
    ColourClassifier("ViT-L-14", "datacomp_xl_s13b_b90k")  # a GELU tag
    assert calls == [("ViT-L-14", "openai", {"force_quick_gelu": True}),
                     ("ViT-L-14", "datacomp_xl_s13b_b90k", {"force_quick_gelu": False})]
