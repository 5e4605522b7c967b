"""User errors: bad input that the user fixes (a config key, a prompts file, a reward name, a path), as
opposed to a bug.

Every such error is a :class:`UserError` (:class:`ConfigError` and
``flowgrpo.data.PromptFileError`` are ones) whose message names the fix. The entry points
(train_t2i.py / train_t2v.py through flowgrpo/cli/train.py, and the ``flowgrpo`` command) print it as one
line, ``<program>: error: <message>``, and exit with status 2, without a traceback unless ``--debug``.
docs/errors.md lists every class of bad input with its message.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """Bad input; the message names what is wrong and how to fix it."""


class ConfigError(UserError, ValueError):
    """A bad configuration; the message names the key, the value and the fix."""


def reward_class(name: str, where: str):
    """The reward class ``name`` refers to (``rewards.reward_class``, the one resolver), imported but not built; a
    :class:`UserError` naming ``where`` (the config key or option) when there is none."""
    from rewards import RewardLookupError
    from rewards import reward_class as resolve

    try:
        return resolve(name, where)
    except RewardLookupError as exc:
        raise UserError(str(exc)) from None


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
