"""Plan schedules: the plan for iteration n, with the state that moves SDE windows (docs/math.md §2).

``WindowSchedule`` gives the start l of an SDE window W(l) = {l, …, l + w − 1} for every iteration:
- ``progressive``: start at ``start``; after holding a position τ iterations, l ← min(l + s, T − w);
  with ``roll_back`` the window returns to 0 once it has held the last position T − w.
  τ is constant (``interval``, MixGRPO default 25) — or, as a function of the position l:
- ``linear_decay``: τ(l) = round(τ_max − (τ_max − τ_min)·l/(T − w)), τ_max = 10 → τ_min = 1;
- ``exp_decay``: τ(l) = ⌈τ_0·exp(−0.1·max(0, l − 13))⌉ with τ_0 = ``interval``;
- ``random``: a new l every iteration, uniform in [low, high], a pure function of (seed, iteration)
  (Flow-GRPO-Fast draws it per rollout batch in [0, ⌊T/2⌋ − w]; ``high_fraction`` = 0.5);
- ``geometric``: a new l every iteration in [low, high], P(l) ∝ ``ratio``^(l − low) (TreeGRPO's truncated geometric
  draw, r = 0.5: early, noisy positions favoured), a pure function of (seed, iteration);
- ``frozen``: l ≡ ``start`` (MixGRPO-Flash*).
Iteration n = 0 is the first; ``start_at`` only moves forward, and ``state_dict`` /
``load_state_dict`` checkpoint the position so a resumed run continues identically.

``PlanSchedule`` pairs ``compose_plan`` arguments with an optional window schedule; ``build_schedule(plan,
window)`` builds one from the two argument sets (a preset's ``sampling.plan`` and ``sampling.window``).
"""

from __future__ import annotations

import math

from samplers.grids import STREAM_WINDOW, derive_seed
from samplers.compose import MAX_STEPS, compose_plan
from samplers.plans import Plan
from samplers.rules import FLAG, Rule, at_least, between, integer, one_of, optional

WINDOW_STRATEGIES = ("progressive", "random", "geometric", "linear_decay", "exp_decay", "frozen")

# Every argument of WindowSchedule (but ``num_steps`` and ``seed``, the plan's and the run's) and what it takes; whether
# they fit the plan's steps is checked by building the schedule (flowgrpo/config/check.py does both before anything loads).
WINDOW_RULES: dict[str, Rule] = {
    "size": integer(1, MAX_STEPS),
    "strategy": one_of(*WINDOW_STRATEGIES),
    "start": integer(0, MAX_STEPS),
    "interval": integer(1),
    "stride": integer(1, MAX_STEPS),
    "roll_back": FLAG,
    "interval_max": integer(1),
    "interval_min": integer(1),
    "decay_rate": at_least(0),
    "decay_offset": integer(0, MAX_STEPS),
    "low": integer(0, MAX_STEPS),
    "high": optional(integer(0, MAX_STEPS)),
    "high_fraction": optional(between(0, 1)),
    "ratio": Rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1, "a number in (0, 1)"),
}


class WindowSchedule:
    """Start of the SDE window per iteration (see module docstring)."""

    def __init__(
        self,
        num_steps: int,
        size: int,
        strategy: str = "progressive",
        *,
        start: int = 0,
        interval: int = 25,
        stride: int = 1,
        roll_back: bool = False,
        interval_max: int = 10,
        interval_min: int = 1,
        decay_rate: float = 0.1,
        decay_offset: int = 13,
        low: int = 0,
        high: int | None = None,
        high_fraction: float | None = None,
        ratio: float = 0.5,
        seed: int = 0,
    ):
        if strategy not in WINDOW_STRATEGIES:
            raise ValueError(f"unknown window strategy {strategy!r}; use one of {WINDOW_STRATEGIES}")
        if not 1 <= size <= num_steps:
            raise ValueError(f"window size {size} must lie in [1, num_steps={num_steps}]")
        self.num_steps, self.size, self.strategy = int(num_steps), int(size), strategy
        self.last = self.num_steps - self.size  # the largest start
        if not 0 <= start <= self.last:
            raise ValueError(f"window start {start} must lie in [0, {self.last}] (T − w)")
        if interval < 1 or stride < 1 or not 1 <= interval_min <= interval_max:
            raise ValueError(
                f"need interval ≥ 1, stride ≥ 1, 1 ≤ interval_min ≤ interval_max; got {interval}, "
                f"{stride}, {interval_min}, {interval_max}"
            )
        if high is None:
            high = self.last if high_fraction is None else math.floor(num_steps * high_fraction) - size
        if not 0 <= low <= high <= self.last:
            raise ValueError(f"random window range [{low}, {high}] must lie in [0, {self.last}]")
        self.initial, self.interval, self.stride = int(start), int(interval), int(stride)
        self.roll_back = bool(roll_back)
        self.interval_max, self.interval_min = int(interval_max), int(interval_min)
        self.decay_rate, self.decay_offset = float(decay_rate), int(decay_offset)
        self.low, self.high, self.seed = int(low), int(high), int(seed)
        if not 0 < ratio < 1:
            raise ValueError(f"geometric window ratio must lie in (0, 1), got {ratio}")
        self.ratio = float(ratio)
        self._iteration, self._start, self._held = 0, self.initial, 0

    def extreme_starts(self) -> tuple[int, ...]:
        """The smallest and the largest start the window can take (one when it never moves): the plans a config
        check builds to see that every position fits."""
        if self.strategy == "frozen":
            return (self.initial,)
        if self.strategy in ("random", "geometric"):
            return tuple(sorted({self.low, self.high}))
        return tuple(sorted({0 if self.roll_back else self.initial, self.last}))

    def interval_at(self, start: int) -> int:
        """τ: iterations the window holds position ``start`` before it moves."""
        if self.strategy == "linear_decay":
            if self.last == 0:
                return self.interval_max
            frac = start / self.last
            return max(1, math.floor(self.interval_max - (self.interval_max - self.interval_min) * frac + 0.5))
        if self.strategy == "exp_decay":
            excess = max(0, start - self.decay_offset)
            return max(1, math.ceil(self.interval * math.exp(-self.decay_rate * excess) - 1e-12))
        return self.interval

    def _next(self, start: int) -> int:
        if start >= self.last:
            return 0 if self.roll_back else self.last
        return min(start + self.stride, self.last)

    def start_at(self, iteration: int) -> int:
        """Window start for ``iteration`` (advances the state; iterations never go back)."""
        iteration = int(iteration)
        if self.strategy == "frozen":
            return self.initial
        if self.strategy == "random":
            return self.low + derive_seed(STREAM_WINDOW, self.seed, iteration) % (self.high - self.low + 1)
        if self.strategy == "geometric":  # invert the truncated geometric CDF at a uniform of (seed, iteration)
            u = (derive_seed(STREAM_WINDOW, self.seed, iteration) % 2**53) / 2**53
            n = self.high - self.low + 1
            weights = [self.ratio**k for k in range(n)]
            target, total = u * sum(weights), 0.0
            for k, w in enumerate(weights):
                total += w
                if target < total:
                    return self.low + k
            return self.high
        if iteration < self._iteration:
            raise ValueError(
                f"window schedule is at iteration {self._iteration}; it cannot go back to {iteration} "
                "(load_state_dict of an earlier checkpoint to rewind)"
            )
        while self._iteration < iteration:
            self._iteration += 1
            self._held += 1
            if self._held >= self.interval_at(self._start):
                self._start, self._held = self._next(self._start), 0
        return self._start

    def state_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "num_steps": self.num_steps,
            "size": self.size,
            "iteration": self._iteration,
            "start": self._start,
            "held": self._held,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("strategy", "num_steps", "size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"window checkpoint has {key}={state[key]!r} but this schedule has "
                    f"{getattr(self, key)!r}; build the schedule with the checkpoint's config"
                )
        self._iteration, self._start = int(state["iteration"]), int(state["start"])
        self._held = int(state["held"])


class PlanSchedule:
    """The plan for iteration n: ``compose_plan(**plan_kwargs, window=(l_n, w))``."""

    def __init__(self, plan_kwargs: dict, window: WindowSchedule | None = None, name: str = "custom"):
        self.plan_kwargs = {**plan_kwargs, "name": plan_kwargs.get("name", name)}
        self.name, self.window = self.plan_kwargs["name"], window
        if window is not None and window.num_steps != plan_kwargs.get("num_steps"):
            raise ValueError(
                f"window schedule has num_steps={window.num_steps} but the plan has "
                f"{plan_kwargs.get('num_steps')}; they must match"
            )
        self._plans: dict = {}
        self._build(window.initial if window is not None else None)  # fail early on bad arguments

    def _build(self, start: int | None) -> Plan:
        if start not in self._plans:
            kwargs = dict(self.plan_kwargs)
            if start is not None:
                kwargs["window"] = (start, self.window.size)
            try:
                self._plans[start] = compose_plan(**kwargs)
            except TypeError as exc:  # an unknown key in a config
                raise ValueError(f"bad plan arguments for {self.name!r}: {exc}") from exc
        return self._plans[start]

    def plan_at(self, start: int | None) -> Plan:
        """The plan with the window at ``start`` (None: a plan without a moving window)."""
        return self._build(start)

    def window_start(self, iteration: int) -> int | None:
        return None if self.window is None else self.window.start_at(iteration)

    def plan(self, iteration: int) -> Plan:
        """The plan of ``iteration`` (plans are cached per window position)."""
        return self._build(self.window_start(iteration))

    def state_dict(self) -> dict:
        return {"name": self.name, "window": None if self.window is None else self.window.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if (state.get("window") is None) != (self.window is None):
            raise ValueError("checkpoint and schedule disagree on having a moving window")
        if self.window is not None:
            self.window.load_state_dict(state["window"])


def build_schedule(plan: dict, window: dict | None = None, *, seed: int = 0, name: str = "custom") -> PlanSchedule:
    """The schedule of ``compose_plan`` arguments ``plan`` and, when ``window`` is given (``WindowSchedule``'s
    arguments but the plan's steps and the seed), an SDE window that moves with training."""
    plan_kwargs = {**plan, "name": name}
    schedule = None
    if window:
        try:
            schedule = WindowSchedule(plan_kwargs["num_steps"], seed=seed, **window)
        except TypeError as exc:
            raise ValueError(f"bad window arguments {window}: {exc}") from exc
    return PlanSchedule(plan_kwargs, schedule, name)


__all__ = ["PlanSchedule", "WINDOW_RULES", "WINDOW_STRATEGIES", "WindowSchedule", "build_schedule"]
