"""OCR reward: how well the text rendered in the image matches the text the prompt asks for.

    target = metadata["ocr_text"] if given, else the first "double-quoted" span of the prompt
    read   = the OCR engine's text for the image
    both normalised: whitespace removed, lower-cased (as Flow-GRPO)
    score  = 1 - min(Levenshtein(target, read), len(target)) / len(target)      (docs/math.md §4)

No target (no quotes, no metadata) -> NaN (not applicable). `full_credit_if_contained=True` adds
Flow-GRPO's rule that a target found inside the read text scores 1.

The engine is pluggable: `reader` is a callable(image uint8 [H, W, 3] numpy) -> str, a dotted path
'module:factory' returning one, or "paddleocr" (the engine Flow-GRPO uses; optional dependency:
pip install 'flowgrpo[ocr]'). Run: OCRReward(reader=my_reader)(images, prompts).
"""

from __future__ import annotations

import re

import torch

from rewards.base import Reward, RewardOutput
from rewards.common import import_object, require

_QUOTED = re.compile(r'"([^"]+)"')


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def normalize_text(text: str) -> str:
    return "".join(text.split()).lower()


def ocr_score(target: str, read: str, full_credit_if_contained: bool = False) -> float:
    """1 - min(Lev(target, read), len(target)) / len(target) on normalised texts; NaN if target is empty."""
    target, read = normalize_text(target), normalize_text(read)
    if not target:
        return float("nan")
    if full_credit_if_contained and target in read:
        return 1.0
    return 1.0 - min(levenshtein(target, read), len(target)) / len(target)


def target_text(prompt: str, meta: dict | None) -> str | None:
    if meta and meta.get("ocr_text"):
        return str(meta["ocr_text"])
    match = _QUOTED.search(prompt)
    return match.group(1) if match else None


def paddleocr_reader(lang: str = "en", **kwargs):
    """A reader on PaddleOCR (2.x `.ocr` and 3.x `.predict` result formats); texts joined in reading order."""
    paddleocr = require("paddleocr", "ocr", "the OCR reward's default reader (or pass reader=callable)")
    engine = paddleocr.PaddleOCR(lang=lang, **kwargs)

    def read(image) -> str:
        if hasattr(engine, "predict"):
            results = engine.predict(image)
            return "".join(text for res in results for text in (res.get("rec_texts") or []))
        result = engine.ocr(image, cls=False)
        lines = result[0] if result and result[0] else []
        return "".join(line[1][0] for line in lines if line[1][1] > 0)

    return read


class OCRReward(Reward):
    name = "ocr"
    modality = "image"

    def __init__(self, reader="paddleocr", full_credit_if_contained: bool = False, **reader_kwargs):
        if reader == "paddleocr":
            reader = paddleocr_reader(**reader_kwargs)
        elif isinstance(reader, str):
            reader = import_object(reader)(**reader_kwargs)  # 'module:factory'
        if not callable(reader):
            raise TypeError(f"reader must be callable(image uint8 [H, W, 3]) -> str, got {type(reader).__name__}")
        self.reader = reader
        self.full_credit_if_contained = full_credit_if_contained

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        scores, targets, reads = [], [], []
        for i, (image, prompt) in enumerate(zip(images, prompts)):
            target = target_text(prompt, None if metadata is None else metadata[i])
            read = "" if target is None else str(self.reader(image.permute(1, 2, 0).cpu().numpy()))
            scores.append(float("nan") if target is None else ocr_score(target, read, self.full_credit_if_contained))
            targets.append(target)
            reads.append(read)
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), info={"target": targets, "read": reads})
