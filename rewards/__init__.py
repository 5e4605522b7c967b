"""Reward plug-ins: a reward is a small class (see ``rewards.base.Reward``), found by name or path.

``load_reward("toy")`` builds a registered reward; ``load_reward("my_pkg.my_mod:MyReward")`` (or
``my_pkg.my_mod.MyReward``) loads any out-of-tree class with the same contract.
"""

from __future__ import annotations

import importlib

from rewards.base import Reward, RewardOutput

# name -> "module:Class"; imported lazily so optional dependencies load only when used
REGISTRY: dict[str, str] = {
    "toy": "rewards.toy.scorer:ToyScorer",
}


def load_reward(name: str, **kwargs) -> Reward:
    """Instantiate a reward by registered name or by dotted path ``package.module:Class``."""
    target = REGISTRY.get(name, name)
    if ":" in target:
        module_name, class_name = target.split(":", 1)
    elif "." in target:
        module_name, class_name = target.rsplit(".", 1)
    else:
        raise ValueError(
            f"unknown reward {name!r}; use one of {sorted(REGISTRY)} or a dotted path such as "
            "'my_package.my_module:MyReward'"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load reward {name!r} from {target!r}: {exc}") from exc
    reward = cls(**kwargs)
    if not isinstance(reward, Reward):
        raise TypeError(f"{target} is not a rewards.base.Reward subclass")
    return reward


__all__ = ["REGISTRY", "Reward", "RewardOutput", "load_reward"]
