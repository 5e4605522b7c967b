"""The reward-hacking watch: guards scored on the held-out samples, their paired change against the start.

Every held-out evaluation already samples the same prompts from the same seeds. The watch scores those samples
again with the run's guards (``eval.guards``), no extra sampling:

- ``held_out``: the held-out reward's own scores (the default guard: a training reward that rises while the
  held-out reward falls is the signature of a hack);
- image statistics that need no model (rewards/stats.py), per sample (videos: the mean over frames):
  ``brightness`` mean luminance (Rec. 601 weights), ``saturation`` mean of (max − min)/max over the pixels'
  RGB, ``high_frequency`` the mean squared 4-neighbour Laplacian (grid and noise artifacts raise it), and
  for videos ``flicker``, the mean absolute change between consecutive frames;
- ``diversity``: a prompt's mean pairwise distance between its samples, given to each of its samples: in the
  image embedding of a guard reward built on CLIP when one is listed (``eval.guards=[diversity, pickscore]``),
  else RMS over the pixels of the samples downsampled to 16×16;
- any reward by name (registered or ``module:Class``), scored on the same samples.

Each guard has a good direction: up for rewards and diversity, down for high_frequency and flicker, none for
brightness and saturation (a drift either way is the hack: erased objects or a recoloured scene). After each
evaluation the watch pairs every sample's guard value with its value at the first evaluation and takes the mean
change and its standard error. An alarm is raised for a guard whose change goes against its direction (either
way for the two-sided ones) by more than ``eval.hacking_threshold`` standard errors and by at least
``eval.hacking_min_effect`` of the guard's spread over the samples at the start (a paired pixel statistic has a
tiny standard error: without the effect size any systematic drift would count), while the training reward has
risen since the start: one line naming the guard, its before and after, and the gallery's compare view;
``eval.stop_on_hacking`` then stops the run with a checkpoint. The baseline (the first evaluation's values and
the training reward at the start) is kept in the run folder (``guards.jsonl``), so a resumed run compares with
the same start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rewards.stats import brightness, diversity, flicker, high_frequency, saturation
from flowgrpo.conditions import reward_conditions

STATISTICS = ("brightness", "saturation", "high_frequency", "diversity", "flicker")
HELD_OUT = "held_out"  # the guard that is the held-out reward's scores themselves
DIRECTION = {"brightness": 0, "saturation": 0, "high_frequency": -1, "flicker": -1, "diversity": 1}  # rewards: +1
def statistic(name: str, media: torch.Tensor, prompts: list[str], embed=None) -> torch.Tensor:
    """``embed``: images [N, 3, H, W] in [0, 1] -> features [N, D] (a loaded reward model's), used by diversity."""
    if name == "diversity":
        return diversity(media, prompts, features=embed(media) if embed is not None and media.dim() == 4 else None)
    return {"brightness": brightness, "saturation": saturation, "high_frequency": high_frequency,
            "flicker": flicker}[name](media).cpu()


@dataclass
class Change:
    """A guard's paired change over the samples finite at both evaluations."""

    before: float  # mean at the start
    after: float  # mean now
    change: float  # mean of the paired differences
    se: float  # its standard error
    spread: float  # the standard deviation of the guard over the samples at the start

    @property
    def z(self) -> float:
        return self.change / self.se if self.se > 0 else math.copysign(math.inf, self.change)

    @property
    def effect(self) -> float:
        """|change| in units of the start's spread (inf when the start had none and it moved)."""
        return abs(self.change) / self.spread if self.spread > 0 else (math.inf if self.change else 0.0)


def paired_change(before: torch.Tensor, after: torch.Tensor) -> Change:
    before, after = before.double(), after.double()
    ok = torch.isfinite(before) & torch.isfinite(after)
    b, a = before[ok], after[ok]
    if b.numel() == 0:
        return Change(math.nan, math.nan, math.nan, math.nan, math.nan)
    d = a - b
    se = float(d.std(unbiased=True) / math.sqrt(d.numel())) if d.numel() > 1 else math.nan
    spread = float(b.std(unbiased=True)) if b.numel() > 1 else math.nan
    return Change(float(b.mean()), float(a.mean()), float(d.mean()), se, spread)


@dataclass
class Alarm:
    guard: str
    change: Change


def decide(changes: dict[str, Change], directions: dict[str, int], training_rise: float, threshold: float,
           min_effect: float) -> list[Alarm]:
    """The guards that moved against their direction (either way for direction 0) by more than ``threshold``
    standard errors and by at least ``min_effect`` of their spread at the start, while the training reward rose
    (``training_rise`` > 0). A zero standard error with a change counts as infinitely many."""
    if not training_rise > 0:
        return []
    alarms = []
    for name, c in changes.items():
        if not math.isfinite(c.change) or c.change == 0:
            continue
        direction = directions.get(name, 1)
        against = abs(c.z) > threshold if direction == 0 else direction * c.z < -threshold
        if against and c.effect >= min_effect:
            alarms.append(Alarm(name, c))
    return alarms


class Watch:
    """The guards of a run and their baseline (see the module docstring)."""

    def __init__(self, cfg, run_dir: Path, modality: str):
        from flowgrpo.run.errors import ConfigError, build_reward

        self.cfg, self.path = cfg, Path(run_dir) / "guards.jsonl"
        self.rewards, self.statistics = {}, []
        self.held_out = HELD_OUT in cfg.eval.guards
        for name in cfg.eval.guards:
            if name == HELD_OUT:
                continue
            if name in STATISTICS:
                if modality == "vector":
                    raise ConfigError(f"eval.guards: {name!r} is an image statistic and this model makes vectors; use "
                                      "reward guards (a reward name) or eval.guards=[]")
                self.statistics.append(name)
            else:
                self.rewards[name] = build_reward(name, {}, "eval.guards")
        self.baseline: dict | None = None
        if self.path.is_file():
            lines = self.path.read_text().splitlines()
            if lines:
                self.baseline = json.loads(lines[0])

    def embedder(self):
        """The image embedding of the first guard reward built on a CLIP backbone (``reward.clip.image_features``:
        PickScore, CLIPScore), for the diversity guard; None: diversity is measured on downsampled pixels."""
        for reward in self.rewards.values():
            backbone = getattr(reward, "clip", None)
            if callable(getattr(backbone, "image_features", None)):
                return lambda media, r=reward, b=backbone: b.image_features(r.to_uint8(media.float().cpu()))
        return None

    @property
    def active(self) -> bool:
        return bool(self.rewards or self.statistics or self.held_out)

    def score(self, media: torch.Tensor, prompts: list[str], metadata,
              held_out: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        values = {HELD_OUT: held_out.detach().double().cpu()} if self.held_out and held_out is not None else {}
        values |= {name: statistic(name, media, prompts, self.embedder()) for name in self.statistics}
        for name, reward in self.rewards.items():
            values[name] = reward(media.float().cpu(), prompts, metadata,
                                  reward_conditions(metadata, media.shape[-2:], [reward])).scores.cpu()
        return values

    def observe(self, iteration: int, values: dict[str, torch.Tensor], training: tuple[float, float] | None,
                write: bool) -> tuple[dict, list[Alarm]]:
        """Metrics of this evaluation (``guard/<name>`` and, after the first, its paired change) and the alarms;
        ``training``: the training reward at the run's first iteration and now (None before any training)."""
        metrics = {f"guard/{k}": float(torch.nanmean(v.double())) for k, v in values.items()}
        if self.baseline is None:
            self.baseline = {"iteration": iteration, "values": {
                k: [None if not math.isfinite(x) else x for x in v.tolist()] for k, v in values.items()}}
            if write:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(self.baseline) + "\n")
            return metrics, []
        changes = {}
        for name, now in values.items():
            before = self.baseline["values"].get(name)
            if before is None or len(before) != now.numel():
                continue
            before = torch.tensor([math.nan if x is None else x for x in before], dtype=torch.float64)
            changes[name] = c = paired_change(before, now)
            metrics[f"guard/{name}_change"], metrics[f"guard/{name}_se"] = c.change, c.se
        rise = training[1] - training[0] if training is not None else math.nan
        directions = {**DIRECTION, **{name: 1 for name in self.rewards}}
        alarms = decide(changes, directions, rise, self.cfg.eval.hacking_threshold, self.cfg.eval.hacking_min_effect)
        metrics["watch/alarms"] = len(alarms)
        return metrics, alarms


def alarm_line(alarm: Alarm, iteration: int, rise: tuple[float, float], site: str) -> str:
    c = alarm.change
    return (f"reward hacking? guard {alarm.guard!r} went {c.before:.4g} -> {c.after:.4g} ({c.change:+.4g} ± {c.se:.2g}: "
            f"{c.z:+.1f} standard errors, {c.effect:.2f} of its spread at the start) by iteration {iteration} while "
            f"the training reward rose {rise[0]:.4g} -> {rise[1]:.4g}; look at the samples: {site}#view=compare")


__all__ = ["Alarm", "Change", "DIRECTION", "HELD_OUT", "STATISTICS", "Watch", "alarm_line", "brightness", "decide", "diversity", "flicker",
           "high_frequency", "paired_change", "saturation"]
