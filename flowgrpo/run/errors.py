"""User errors: bad input that the user fixes (a config key, a prompts file, a reward name, a path), as
opposed to a bug.

Every such error is a :class:`UserError` (:class:`ConfigError` and
``flowgrpo.data.PromptFileError`` are ones) whose message names the fix. The entry points
(train_t2i.py / train_t2v.py through flowgrpo/cli/train.py, and the ``flowgrpo`` command) print it as one
line, ``<program>: error: <message>``, and exit with status 2, without a traceback unless ``--debug``.
docs/errors.md lists every class of bad input with its message.
"""

from __future__ import annotations

import difflib

EXIT_USER_ERROR = 2


class UserError(Exception):
    """Bad input; the message names what is wrong and how to fix it."""


class ConfigError(UserError, ValueError):
    """A bad configuration; the message names the key, the value and the fix."""


def reward_class(name: str, where: str):
    """The reward class ``name`` refers to (a registered name or ``package.module:Class``), imported but
    not built; a :class:`UserError` naming ``where`` (the config key or option) when there is none."""
    from rewards import REGISTRY, Reward
    from rewards.common import import_object

    target = REGISTRY.get(name, name)
    if not isinstance(name, str) or (":" not in target and "." not in target):
        close = difflib.get_close_matches(str(name), list(REGISTRY), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"unknown reward {name!r} in {where}; {hint}use a registered reward ({', '.join(sorted(REGISTRY))}) "
                        "or a dotted path such as 'my_package.my_module:MyReward'")
    try:
        cls = import_object(target)
    except ValueError as exc:
        cause = exc.__cause__ or exc
        raise UserError(f"cannot import reward {name!r} ({where}): {cause}; check the module path and that its "
                        "package is installed (docs/rewards.md)") from None
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise UserError(f"{name!r} ({where}) is not a reward: name a rewards.base.Reward subclass (docs/rewards.md)")
    return cls


def build_reward(name: str, kwargs: dict, where: str):
    """The reward ``name`` built with ``kwargs``; a :class:`UserError` naming ``where`` when it cannot be found or its
    constructor raises (missing weights, a bad keyword, an unreachable server...), with the constructor's error."""
    cls = reward_class(name, where)
    try:
        return cls(**(kwargs or {}))
    except Exception as exc:  # noqa: BLE001  (whatever a plug-in raises: one line naming it)
        lines = str(exc).strip().splitlines()
        raise UserError(f"reward {name!r} ({where}) could not be built: {type(exc).__name__}: "
                        f"{lines[-1] if lines else ''}; check its kwargs and that what it loads (weights, a server) "
                        "is there (docs/rewards.md)") from None
