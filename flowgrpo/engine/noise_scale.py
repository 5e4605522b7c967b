"""The gradient noise scale, measured during training (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A).

A gradient averaged over b independent units (here: prompts, with their whole group or tree) has
E|G_b|² = |G|² + tr(Σ)/b, with G the true gradient and Σ the per-unit covariance. An update already
computes its gradient over B units as a sum of micro-batches; each micro-batch alone is a small-batch
gradient over b_i units. A least-squares fit of |G_b|² against 1/b over those points gives |G|² and
tr(Σ) (with equal micro-batches it is McCandlish's two-batch estimator), and

    B_noise = tr(Σ) / |G|²

is the number of units one step needs for a signal-to-noise ratio of about 1: a batch far below it
follows noise. One step's estimates are noisy (|G|² may even come out negative), so, as the paper
advises, averages of |G|² and tr(Σ) over recent measured steps are divided, never per-step ratios,
and a value is given only when the averaged |G|² is at least two standard errors above 0 (otherwise
a lower bound). The units must be drawn independently per step: a prompt set that a step covers
whole (the analytic world's 8 prompts at 8 per step) turns the differences between prompts into a
bias of −σ²_between/(P − 1) on |G|² (measured there: significantly negative). With
``advantage.tied_groups=skip`` the units are the prompts a step trains: a tied prompt's gradient is exactly 0 and
is never computed, so B_noise counts informative prompts, and a step with a single one gives no reading (the
analytic world late in a run: 7 of 8 groups tie; ``tied_groups=train`` measures over every prompt).

``GradientProbe`` does the bookkeeping inside the policy (flowgrpo/engine/policy.py): ``after_backward(units)``
after every micro-batch backward of a probed step (the difference of the accumulated gradients is that
micro-batch's gradient) and ``end_step(units)`` before the optimizer step. ``NoiseReport`` turns the
running estimate into the metrics and the console line the loop logs. Tests on synthetic gradients with
a known answer: tests/engine/test_noise_scale.py.
"""

from __future__ import annotations

import math

import torch


def fit_noise(sq_norms: torch.Tensor, sizes: torch.Tensor) -> tuple[float, float]:
    """(|G|², tr(Σ)) from squared norms |G_b|² [n] of mean gradients over ``sizes`` b [n] units, by least
    squares of |G_b|² = |G|² + tr(Σ)·(1/b). Needs at least two distinct sizes."""
    x = 1.0 / sizes.double()
    y = sq_norms.double()
    if x.numel() < 2 or float(x.max() - x.min()) <= 0:
        raise ValueError("fit_noise needs gradients over at least two different batch sizes")
    xm, ym = x.mean(), y.mean()
    trace = float(((x - xm) * (y - ym)).sum() / (x - xm).square().sum())
    return float(ym - trace * xm), trace


class NoiseScale:
    """|G|² and tr(Σ) averaged over the last ``window`` measured steps. ``value`` is their ratio when the
    averaged |G|² is positive by at least ``z`` standard errors (a signal is detected), else None; then
    ``lower_bound`` is what the data still allow: B_noise > tr(Σ)/(|G|² + z·se), or None."""

    def __init__(self, window: int = 20, z: float = 2.0):
        self.window, self.z = int(window), float(z)
        self.points: list[tuple[float, float]] = []

    def add(self, signal: float, trace: float) -> None:
        self.points = (self.points + [(float(signal), float(trace))])[-self.window :]

    def _stats(self) -> tuple[float, float, float]:
        signals = torch.tensor([s for s, _ in self.points], dtype=torch.float64)
        traces = torch.tensor([t for _, t in self.points], dtype=torch.float64)
        se = float(signals.std() / len(self.points) ** 0.5) if len(self.points) > 1 else float("inf")
        return float(signals.mean()), se, float(traces.mean())

    @property
    def value(self) -> float | None:
        if len(self.points) < 3:
            return None
        signal, se, trace = self._stats()
        return trace / signal if signal > self.z * se and trace > 0 else None

    @property
    def lower_bound(self) -> float | None:
        if len(self.points) < 3:
            return None
        signal, se, trace = self._stats()
        top = signal + self.z * se
        return trace / top if top > 0 and trace > 0 else None

    def state_dict(self) -> dict:
        return {"points": [list(p) for p in self.points]}

    def load_state_dict(self, state: dict) -> None:
        self.points = [tuple(p) for p in state.get("points", [])]


class GradientProbe:
    """Per-micro-batch gradients of a probed optimizer step (see the module docstring)."""

    def __init__(self, params: list[torch.nn.Parameter], window: int = 20, total=None, context: int = 1,
                 context_sum=None):
        """``total``: a float summed over processes, when the parameters are sharded (each process sees its rows of
        a gradient that the backward has already summed over processes; the units are summed the same way).
        ``context``: the context-parallel group size (flowgrpo/engine/context.py): its processes hold the same prompts,
        each a share of their tokens' gradient; ``context_sum`` sums a list of tensors over the group (unsharded: the
        backward has not summed them)."""
        self.params = params
        self.total = total
        self.context, self.context_sum = context, context_sum
        self.scale = NoiseScale(window)
        self.active = False
        self._previous: list[torch.Tensor] | None = None
        self._points: list[tuple[float, float]] = []  # (|g_i|² of the micro-batch's gradient sum, its units)

    def begin_step(self) -> None:
        self._previous = None
        self._points = []

    def _flat(self) -> list[torch.Tensor]:
        """This process's gradient entries (its rows of sharded ones)."""
        def mine(t):
            return t.to_local() if hasattr(t, "to_local") else t

        flat = [mine(p.grad).detach().clone() if p.grad is not None else torch.zeros_like(mine(p)) for p in self.params]
        return flat if self.context_sum is None else self.context_sum(flat)  # the context group's whole gradient

    def _summed(self, value: float) -> float:
        return self.total(value) if self.total is not None else value

    def _units(self, units: int) -> float:
        """Prompts a micro-batch covers over the processes its gradient sums: summed over processes, a context
        group's prompts are counted once."""
        return self._summed(float(units)) / self.context if self.total is not None else float(units)

    def after_backward(self, units: int) -> None:
        if not self.active:
            return
        current = self._flat()
        previous = self._previous or [torch.zeros_like(c) for c in current]
        sq = self._summed(sum(float((c - p).double().square().sum()) for c, p in zip(current, previous)))
        units = self._units(units)
        if units > 0:  # a sharded process's zero-loss filler adds no prompts (Policy.matched)
            self._points.append((sq, units))
        self._previous = current

    def end_step(self, units: int) -> dict:
        """Fit this step (gradients summed over processes are not seen here: the fit is per process) and
        update the running averages; returns the step's metrics (empty when nothing was measured)."""
        if not self.active or len(self._points) < 2:
            return {}
        total = sum(b for _, b in self._points)
        full = self._summed(sum(float(g.double().square().sum()) for g in self._flat()))
        # a micro-batch's gradient is (b_i / B) × its own mean gradient: rescale to means
        sq = torch.tensor([s * (total / b) ** 2 for s, b in self._points] + [full])
        sizes = torch.tensor([b for _, b in self._points] + [total])
        signal, trace = fit_noise(sq, sizes)
        self.scale.add(signal, trace)
        return {"grad_noise/signal_sq": signal, "grad_noise/trace": trace}


def noise_reading(noise: float | None, lower_bound: float | None) -> float:
    """The number a reading stands for: the estimate, else the lower bound of "no signal", else infinity."""
    return noise if noise is not None else lower_bound if lower_bound is not None else math.inf


def worth_repeating(said: float | None, reading: float) -> bool:
    """Whether a reading (:func:`noise_reading`) is news against the last one printed (None before the
    first): it moved by 2x or more. "≈ 148 prompts" and "no signal, B_noise > 129" say the same about
    the batch, and a run's readings wander between such lines (a default image run: estimates 101-229,
    bounds 61-290), so printing each would fill the console with one verdict; train.log keeps them all."""
    if said is None:
        return True
    if reading == said:  # also two readings without a bound
        return False
    return max(reading / said, said / reading) >= 2.0


def noise_message(noise: float | None, units: int, lower_bound: float | None = None, unit_name: str = "prompts",
                  forward_learner: bool = False) -> str:
    """The one line printed when the batch is below the noise scale (or no signal is seen); a run that already
    trains a forward-process learner is not told to use one."""
    if noise is None:
        bound = f" (B_noise > {lower_bound:,.0f} {unit_name})" if lower_bound else ""
        return (f"gradient noise scale: no signal detected over {units} {unit_name} per step{bound}; the update "
                "may be following noise (docs/learner.md)")
    return (f"gradient noise scale ≈ {noise:,.0f} {unit_name} per step, {noise / max(units, 1):.1f}× the batch of {units}: "
            "each step is mostly noise; raise train.prompts_per_iteration" + (" or lower the learning rate" if forward_learner
            else ", lower the learning rate, or use a forward-process learner") + " (docs/learner.md)")


class NoiseReport:
    """What a probed iteration logs: the running B_noise in prompts per optimizer step, and one line when the
    batch is below it; the console gets the line again only when it is news (``worth_repeating``)."""

    def __init__(self, probe: GradientProbe, prompts_per_step: int, forward_learner: bool):
        self.probe, self.per_step, self.forward_learner = probe, prompts_per_step, forward_learner
        self.said: float | None = None  # the last reading printed to the console (estimate or bound)

    def report(self, writer) -> dict:
        noise = self.probe.scale.value
        out = {"grad_noise/batch_prompts": self.per_step}
        if noise is not None:
            out["grad_noise/B_noise_prompts"] = noise
        if len(self.probe.scale.points) >= 3 and (noise is None or noise > self.per_step):
            bound = self.probe.scale.lower_bound
            reading = noise_reading(noise, bound)
            news = worth_repeating(self.said, reading)
            if news:
                self.said = reading
            writer.info(noise_message(noise, self.per_step, bound, forward_learner=self.forward_learner), console=news)
        elif noise is not None:
            self.said = None  # the batch is above the noise scale: the next reading below it is news
        return out


__all__ = ["GradientProbe", "NoiseReport", "NoiseScale", "fit_noise", "noise_message", "noise_reading", "worth_repeating"]
