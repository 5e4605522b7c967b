"""Scorer parity: each official RL code base's reward code, run beside flowgrpo's reward on the same weights.

The official RL repositories compute a reward inside their own scorer classes and ``rewards.py`` wrappers: what the
images are handed as (float [0, 1] tensors, uint8, PIL), the resize, crop and normalisation, the text template, and
the scale (``/ 26``, ``/ 100``, ``/ 30``, ``(x - 18) / 8``) are code, not config keys. For every reward an official
launch trains on, a module beside this one loads the official code from a checkout at run time (nothing of it is
copied into flowgrpo), builds ONE tiny random-weight model of the scorer's architecture from a config (no real weights
can be fetched), gives the same weights to the official scorer object (its ``from_pretrained`` / checkpoint loading
patched to return them; its ``__call__`` runs unchanged) and to flowgrpo's reward built with the reward spec that
reproduces the launch (``rewards: [{name, kwargs}]``), feeds both the same images and prompts, as the official
training script hands them to its reward function, and compares the per-sample scores that enter the advantage
(after the official ``rewards.py``'s own scaling).

    clip.py          PickScore, CLIPScore, the LAION aesthetic predictor (transformers CLIPModel)
    hps.py           HPSv2.1 (the HPSv2 package's open_clip, tgxs002/HPSv2)
    image_reward.py  ImageReward (THUDM/ImageReward's BLIP)
    rules.py         the rules around a network that cannot run here: OCR (PaddleOCR), GenEval (mmdetection),
                     UnifiedReward (a VLM server), JPEG size; the same recogniser / detector / reply is injected into
                     both sides and the networks themselves are not compared
    run.py           the runner: writes docs/results/scorer_parity.md and docs/results/scorer_parity/*.json

A row passes when max |score_ours − score_official| is within its tolerance: ``ULPS`` float32 ulps of the largest
|score| of the row for computations that are the same on both sides, or a stated larger one with its measured reason.
Where an environment of today lacks an API the official code was written against (transformers 4.40 → 5, whose
``get_image_features`` now returns an output object and whose slow PIL image processor is ``CLIPImageProcessorPil``),
the shim is named in the row's notes; the official code's own lines run unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "reproduce"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

ULPS = 16  # float32 ulps of a row's largest |score|: the tolerance where both sides compute the same thing
RESULTS = ROOT / "docs" / "results"

# the checkouts: (key, repository, environment variable). The RL code bases' variables are reproduce/official's; the
# two packages their scorers import (HPSv2's open_clip, ImageReward's BLIP) and Flow-GRPO's GenEval server have their own.
CHECKOUTS = {
    "diffusion_nft": ("NVlabs/DiffusionNFT", "DIFFUSION_NFT_PATH"),
    "flow_grpo": ("yifan123/flow_grpo", "FLOW_GRPO_PATH"),
    "awm": ("scxue/advantage_weighted_matching", "AWM_PATH"),
    "dgpo": ("Luo-Yihong/DGPO", "DGPO_PATH"),
    "dancegrpo": ("XueZeyue/DanceGRPO", "DANCEGRPO_PATH"),
    "mixgrpo": ("Tencent-Hunyuan/MixGRPO", "MIXGRPO_PATH"),
    "hpsv2": ("tgxs002/HPSv2", "HPSV2_PATH"),
    "imagereward": ("THUDM/ImageReward", "IMAGEREWARD_PATH"),
    # the GenEval server Flow-GRPO posts its images to (tests/rewards/test_geneval_official.py's variable)
    "reward_server": ("yifan123/reward-server", "REWARD_SERVER_CHECKOUT"),
}


class MissingCheckout(RuntimeError):
    """A comparison whose checkout variable is not set (the runner lists it as skipped, naming the variable)."""


def checkout(key: str):
    """The checkout of ``key`` (CHECKOUTS) as reproduce/official's ``Checkout``, at whatever commit it is (the scorer
    files are compared at the commit the checkout has; the report names it)."""
    from official import Checkout

    repository, env = CHECKOUTS[key]
    if not os.environ.get(env):
        raise MissingCheckout(f"set {env} to a checkout of {repository}")
    return Checkout.from_env(repository, env, any_commit=True)


# ------------------------------------------------------------------------------------------------------ reports
@dataclass
class ScorerReport:
    """One compared (official code base, reward): both sides' per-sample scores and the largest difference."""

    reward: str  # flowgrpo's reward name
    code: str  # the official code base (CHECKOUTS key)
    repository: str
    commit: str
    official: str  # the official code run: file:line of the scorer / wrapper
    launches: list[str]  # the official launches that train on this computation
    spec: dict  # flowgrpo's reward spec that reproduces it: {"name": ..., "kwargs": {...}}
    compared: str  # "model": the scorer network and its pre/post-processing; "rule": the rule on injected outputs
    ours: list[float]
    theirs: list[float]
    tolerance: float
    tolerance_reason: str = f"{ULPS} float32 ulps of the largest |score|"
    notes: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)  # each difference found, and what was done

    @property
    def max_diff(self) -> float:
        pairs = [(a, b) for a, b in zip(self.ours, self.theirs)]
        if len(self.ours) != len(self.theirs):
            return math.inf
        diffs = [0.0 if (math.isnan(a) and math.isnan(b)) else abs(a - b) for a, b in pairs]
        return max((d if not math.isnan(d) else math.inf for d in diffs), default=0.0)

    @property
    def ok(self) -> bool:
        return bool(self.ours) and self.max_diff <= self.tolerance

    def line(self) -> str:
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.reward:12s} {self.code:14s} max|Δ| {self.max_diff:.3g} "
                f"(tol {self.tolerance:.3g}) n={len(self.ours)} range [{min(self.theirs):.4g}, {max(self.theirs):.4g}]")

    def as_dict(self) -> dict:
        return {**asdict(self), "max_diff": self.max_diff, "ok": self.ok}


def tolerance(scores, ulps: int = ULPS) -> float:
    """``ulps`` float32 ulps at the largest |score|."""
    values = [abs(float(s)) for s in scores if not math.isnan(float(s))]
    return ulps * float(torch.finfo(torch.float32).eps) * max(max(values, default=0.0), 2.0 ** -126)


def floats(values) -> list[float]:
    if isinstance(values, torch.Tensor):
        return [float(v) for v in values.detach().double().cpu().reshape(-1)]
    return [float(v) for v in values]


def float32s(values) -> list[float]:
    """Python / float64 scores as the training scripts take them into the advantage: ``torch.as_tensor(v).float()``."""
    return floats(torch.as_tensor([float(v) for v in values], dtype=torch.float64).float())


# --------------------------------------------------------------------------------------------- the inputs
PROMPTS = ("a photo of a cat", 'a sign that says "Hello World" on a wall', "a red cube left of a blue sphere",
           "two dogs playing in the snow on a sunny day, highly detailed")


def images(n: int = 4, size: int = 512, seed: int = 0) -> torch.Tensor:
    """float32 [n, 3, size, size] in [0, 1], as a VAE decode hands them (not on the uint8 grid): smooth colour fields
    with some texture and a saturated corner (so rounding, resampling and clamping all matter)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 8, 8, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    texture = 0.08 * torch.randn(n, 3, size, size, generator=g)
    out = (smooth + texture).clamp(0, 1)
    out[:, :, : size // 8, : size // 8] = 1.0
    return out.float()


def uint8_images(x: torch.Tensor) -> torch.Tensor:
    """The rounding every official rewards.py applies before a PIL / uint8 scorer: (x·255).round().clamp(0, 255)."""
    return (x * 255).round().clamp(0, 255).to(torch.uint8)


def perturb(module: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    """Every floating parameter moved by ``scale`` × its own std (or ``scale`` × 0.02) of seeded noise, so a random-init
    model's outputs differ by image and prompt (a vacuous comparison would pass anything)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.numel() > 1:
                std = float(p.std()) or 0.02
                p.add_(scale * std * torch.randn(p.shape, generator=g).to(p.dtype))
    return module


def lively(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight matrix redrawn N(0, 1/fan_in), every vector (bias, norm scale) moved by N(0, 0.1): a random
    network whose output varies with its input at every depth (BLIP's and ImageReward's inits, std 0.02 and
    1/769, give a near-constant score on random inputs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if not p.is_floating_point():
                continue
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return module


# ------------------------------------------------------------------------------------------------ importing
@contextlib.contextmanager
def packages(mapping: dict[str, Path], stubs: dict[str, types.ModuleType] | None = None):
    """Inside, each name of ``mapping`` (``flow_grpo``, ``hpsv2.src``...) is a bare package whose modules load from
    the given folder, its ``__init__.py`` not executed (the official packages' ``__init__`` files import training
    stacks this comparison does not need); ``stubs``: module objects to stand for names (an absent optional dependency
    the official module imports at its top). Every module of those names loaded before is put back on exit, and the
    ones loaded inside are removed, so two checkouts that both call their package ``flow_grpo`` never share one."""
    stubs = stubs or {}
    roots = {name.split(".")[0] for name in [*mapping, *stubs]}
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in roots}
    for k in saved:
        del sys.modules[k]
    try:
        for name, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
            package = types.ModuleType(name)
            package.__path__ = [str(Path(folder).resolve())]
            package.__package__ = name
            sys.modules[name] = package
            if "." in name:
                parent, child = name.rsplit(".", 1)
                setattr(sys.modules[parent], child, package)
        sys.modules.update(stubs)
        yield
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] in roots]:
            del sys.modules[k]
        sys.modules.update(saved)


def load(name: str):
    """importlib.import_module, inside ``packages``."""
    return importlib.import_module(name)


def write(reports: list[ScorerReport], folder: Path) -> None:
    """One JSON file per code base under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    by_code: dict[str, list] = {}
    for r in reports:
        by_code.setdefault(r.code, []).append(r.as_dict())
    for code, rows in by_code.items():
        (folder / f"{code}.json").write_text(json.dumps(rows, indent=1) + "\n")
