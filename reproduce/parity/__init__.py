"""Trajectory parity with the official samplers: the pieces every code base's comparison shares.

Each module beside this one (``parity/<code>.py``) runs one official repository's sampler (loaded from the checkout
its environment variable names, reproduce/official's ``Checkout``) and flowgrpo's plan of the matching preset, as the
preset's recipe resolves it on the real model config, on one tiny model of that family: the same weights, text
embeddings, x_T and per-step noise on both sides (the official code's draws are fed flowgrpo's, in order). It returns
``MethodReport``s: per step the σ each side steps from and to, which steps each side makes stochastic and trains,
the largest |x'_ours − x'_theirs| and |log p_ours − log p_theirs|, each against its tolerance (``TOLERANCE_ULPS``
float32 ulps of the values' largest magnitude). ``reproduce/parity_run.py`` runs them all and writes
docs/results/peer_parity.json; tests/reproduce/test_peer_parity_*.py run each where its variable is set.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import sys
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE_ULPS = 512  # float32 ulps of the compared values' largest magnitude (bench_peer's)


def tolerance(values: torch.Tensor, ulps: int = TOLERANCE_ULPS) -> float:
    """``ulps`` float32 ulps at max |values|."""
    scale = float(values.detach().abs().max()) if values.numel() else 0.0
    return ulps * float(torch.finfo(torch.float32).eps) * max(scale, float(torch.finfo(torch.float32).tiny))


def max_diff(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> float:
    if tuple(ours.shape) != tuple(theirs.shape):
        raise ValueError(f"{what}: shapes differ, ours {tuple(ours.shape)} vs theirs {tuple(theirs.shape)}")
    return float((ours.double() - theirs.double()).abs().max()) if ours.numel() else 0.0


@dataclass
class StepRow:
    """One step of one method: both sides' σ → σ', whether each side draws noise there and trains it, and the
    largest differences of x' and of the log-prob (None where a side has no log-prob) with their tolerances."""

    step: int
    sigma: tuple[float, float]  # (ours, theirs): the σ the step starts from
    sigma_next: tuple[float, float]
    stochastic: tuple[bool, bool]
    trained: tuple[bool, bool]
    dx: float
    tol_x: float
    dlogp: float | None = None
    tol_logp: float | None = None

    @property
    def ok(self) -> bool:
        grid = all(math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE_ULPS * 2**-24 * max(abs(a), abs(b), 1e-30))
                   for a, b in (self.sigma, self.sigma_next))
        logp = self.dlogp is None or self.dlogp <= self.tol_logp
        return grid and self.stochastic[0] == self.stochastic[1] and self.trained[0] == self.trained[1] \
            and self.dx <= self.tol_x and logp


@dataclass
class MethodReport:
    """One compared setting (a preset, and where it matters the family, reward, window position)."""

    code: str
    method: str
    repository: str
    commit: str
    official: str  # the official function(s) run, file:line
    steps: list[StepRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    def worst(self) -> dict:
        sig = max(max(abs(a - b) for a, b in (s.sigma, s.sigma_next)) for s in self.steps)
        logps = [s.dlogp for s in self.steps if s.dlogp is not None]
        return {"sigma": sig, "x": max(s.dx for s in self.steps), "log_prob": max(logps) if logps else None}

    def line(self) -> str:
        w = self.worst()
        lp = "—" if w["log_prob"] is None else f"{w['log_prob']:.3g}"
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.method:40s} steps {len(self.steps):3d}  max|Δσ| {w['sigma']:.3g}"
                f"  max|Δx'| {w['x']:.3g}  max|Δlog p| {lp}")


def markdown_table(reports: list[MethodReport]) -> str:
    """One row per compared method: the official code and commit, the steps compared, and the largest |Δσ|, |Δx'| and
    |Δlog p| over its steps with the largest share of its tolerance any step used."""
    lines = ["| code | method | commit | steps | stochastic / trained steps equal | max \\|Δσ\\| | max \\|Δx'\\| "
             "(worst share of tol.) | max \\|Δlog p\\| (worst share of tol.) | equal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        w = r.worst()
        flags = all(s.stochastic[0] == s.stochastic[1] and s.trained[0] == s.trained[1] for s in r.steps)
        x_share = max((s.dx / s.tol_x for s in r.steps if s.tol_x), default=0.0)
        logps = [s.dlogp / s.tol_logp for s in r.steps if s.dlogp is not None and s.tol_logp]
        lp = "—" if w["log_prob"] is None else f"{w['log_prob']:.2g} ({max(logps):.3f})"
        lines.append(f"| {r.code} | {r.method} | `{r.commit[:7]}` | {len(r.steps)} | {'yes' if flags else 'NO'} | "
                     f"{w['sigma']:.2g} | {w['x']:.2g} ({x_share:.3f}) | {lp} | {'yes' if r.ok else 'NO'} |")
    return "\n".join(lines) + "\n"


def read_reports(path: Path) -> list[MethodReport]:
    """The reports ``write_reports`` wrote (to tabulate a run again)."""
    out = []
    for item in json.loads(Path(path).read_text()):
        steps = [StepRow(**{**s, **{k: tuple(s[k]) for k in ("sigma", "sigma_next", "stochastic", "trained")}})
                 for s in item["steps"]]
        out.append(MethodReport(item["code"], item["method"], item["repository"], item["commit"], item["official"],
                                steps, item["notes"]))
    return out


def write_reports(reports: list[MethodReport], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{**asdict(r), "ok": r.ok, "worst": r.worst()} for r in reports]
    path.write_text(json.dumps(data, indent=1) + "\n")


@contextlib.contextmanager
def fed_draws(owner, attribute: str, draws: list[torch.Tensor]):
    """Inside, ``owner.attribute`` (a ``randn_tensor`` / ``torch.randn``-like function the official code calls for its
    noise) returns ``draws`` in order, each checked against the shape asked for; every draw must be used."""
    original, queue = getattr(owner, attribute), list(draws)

    def next_draw(*shape_args, generator=None, device=None, dtype=None, layout=None, **_):
        shape = shape_args[0] if len(shape_args) == 1 and isinstance(shape_args[0], (tuple, list, torch.Size)) \
            else shape_args
        if not queue:
            raise RuntimeError(f"the official code asked for more noise than flowgrpo drew (shape {tuple(shape)})")
        eps = queue.pop(0)
        if tuple(eps.shape) != tuple(shape):
            raise RuntimeError(f"the official code asked for noise of shape {tuple(shape)}, flowgrpo drew "
                               f"{tuple(eps.shape)}")
        return eps.to(device=device or eps.device, dtype=dtype or eps.dtype)

    setattr(owner, attribute, next_draw)
    try:
        yield queue
    finally:
        setattr(owner, attribute, original)
    if queue:
        raise RuntimeError(f"the official code used {len(draws) - len(queue)} of flowgrpo's {len(draws)} draws")


# the shipped tiny SD3 in place of a real SD3 model config's weights, float32 on the CPU, with a small LoRA
TINY_SD3 = ["model.pretrained=tiny-sd3", "model.dtype=float32", "model.device=cpu", "model.resolution=32",
            "model.max_sequence_length=16", "model.lora_rank=4", "model.lora_alpha=8", "model.gradient_checkpointing=false"]


def tiny_sd3_recipe(preset: str, rewards: list[str], extra: tuple[str, ...] = ()):
    """(resolved config, tiny SD3 with a perturbed LoRA, the plan of iteration 0): ``preset``'s recipe as it resolves on
    sd3_5_medium for ``rewards``, the tiny weights swapped in (TINY_SD3; ``extra``: further overrides, e.g. a group
    size or a negative control's). The LoRA is seeded and moved off zero, so the policy is not the base model."""
    from flowgrpo.config import resolve
    from flowgrpo.engine.rollout import plan_schedule
    from flowgrpo.models import load_model

    names = ", ".join(f"{{name: {r}}}" for r in rewards)
    cfg = resolve(preset, "sd3_5_medium", [f"rewards=[{names}]", *TINY_SD3, *extra]).config
    with torch.random.fork_rng():  # the LoRA's gaussian init draws from the global generator: the same model each run
        torch.manual_seed(0)
        model = load_model(cfg.model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return cfg, model, plan_schedule(cfg, model).plan(0)


def import_folder(folder: Path, prefix: str, *modules: str) -> list:
    """The modules ``modules`` of the checkout folder ``folder`` (a package with relative imports: diffusers_patch),
    imported as a private package ``_<prefix>_official_<n>`` so two checkouts never share a module name."""
    folder = Path(folder).resolve()
    name = f"_{prefix}_official_{abs(hash(str(folder)))}"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return [importlib.import_module(f"{name}.{module}") for module in modules]


def nested(flat: dict) -> SimpleNamespace:
    """{dotted key: value} as nested namespaces, as an official script reads its config (config.sample.num_steps)."""
    root: dict = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def space(d):
        return SimpleNamespace(**{k: space(v) if isinstance(v, dict) else v for k, v in d.items()})

    return space(root)


@contextlib.contextmanager
def recorded_step_noise():
    """Inside, flowgrpo's executor keeps every per-step ε it draws (in the order drawn) in the yielded list."""
    import samplers.executor as executor

    original, draws = executor._Run.step_noise, []

    def step_noise(self, *args, **kwargs):
        eps = original(self, *args, **kwargs)
        draws.append(eps.detach().clone())
        return eps

    executor._Run.step_noise = step_noise
    try:
        yield draws
    finally:
        executor._Run.step_noise = original
