"""What values an input takes: a ``Rule`` is a test and its words for the error (``allowed``).

The plan builder (``plans.PLAN_RULES``) and the window schedule (``schedules.WINDOW_RULES``) declare one rule per
argument beside their code; flowgrpo's config schema declares its keys' rules with the same constructors
(flowgrpo/config/schema.py), so every key a user can type is checked, and refused, the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """``ok(value)``: whether the value is allowed; ``allowed``: what is, in words (``use <allowed>``)."""

    ok: Callable[[Any], bool]
    allowed: str


def is_number(v) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def one_of(*values) -> Rule:
    """One of ``values``, of the same type (so ``true`` is not the integer 1)."""
    return Rule(lambda v: any(v == x and type(v) is type(x) for x in values), f"one of {list(values)}")


def at_least(low: float) -> Rule:
    return Rule(lambda v: is_number(v) and v >= low, f"a number >= {low:g}")


def above(low: float) -> Rule:
    return Rule(lambda v: is_number(v) and v > low, f"a number > {low:g}")


def between(low: float, high: float) -> Rule:
    return Rule(lambda v: is_number(v) and low <= v <= high, f"a number in [{low:g}, {high:g}]")


def in_open_closed(low: float, high: float) -> Rule:
    return Rule(lambda v: is_number(v) and low < v <= high, f"a number in ({low:g}, {high:g}]")


def integer(low: int, high: int | None = None) -> Rule:
    """An integer in [low, high] (no upper bound when ``high`` is None)."""
    words = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    return Rule(lambda v: is_integer(v) and v >= low and (high is None or v <= high), words)


def optional(rule: Rule) -> Rule:
    return Rule(lambda v: v is None or rule.ok(v), f"null or {rule.allowed}")


def integers(low: int = 0) -> Rule:
    """A list of integers >= ``low`` (step indices: whether they fit the plan is checked where it is built)."""
    return Rule(lambda v: isinstance(v, (list, tuple)) and all(is_integer(x) and x >= low for x in v),
                f"a list of integers >= {low}, e.g. [0, 3]")


def interval(low: float = 0.0, high: float = 1.0) -> Rule:
    return Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(is_number(b) for b in v)
                and low <= v[0] <= v[1] <= high,
                f"two numbers [lo, hi] with {low:g} <= lo <= hi <= {high:g}, e.g. [0.3, 0.9]")


FINITE = Rule(is_number, "a finite number")
FLAG = Rule(lambda v: isinstance(v, bool), "true or false")
TEXT = Rule(lambda v: isinstance(v, str), "a string")
MAPPING = Rule(lambda v: isinstance(v, dict), "a mapping {key: value}")


def refusal(key: str, value, rule: Rule) -> str | None:
    """The one-line refusal of ``key=value`` under ``rule`` (None: allowed)."""
    return None if rule.ok(value) else f"{key}={value!r} is not allowed; use {rule.allowed}"


__all__ = ["FINITE", "FLAG", "MAPPING", "Rule", "TEXT", "above", "at_least", "between", "in_open_closed", "integer",
           "integers", "interval", "is_integer", "is_number", "one_of", "optional", "refusal"]
