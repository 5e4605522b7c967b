"""Every config key declares what values it takes (``key(rule, default)`` where it is declared, flowgrpo/config/schema.py),
and every value outside is refused before anything loads, in one line naming the key, the value and what is allowed."""

from dataclasses import fields, is_dataclass

import pytest

from flowgrpo.config import Config, ConfigError, load_config
from flowgrpo.run.paths import configs_dir


def _keys(cls, prefix=""):
    """(class, field name, dotted key) of every leaf key of the config schema (the model config has its own validator;
    rewards are RewardSpecs)."""
    from flowgrpo.config import RewardSpec

    for f in fields(cls):
        if f.name == "model":
            continue
        default = f.default_factory() if callable(getattr(f, "default_factory", None)) else f.default
        if is_dataclass(default):
            yield from _keys(type(default), f"{prefix}{f.name}.")
        elif f.name == "rewards":
            yield from _keys(RewardSpec, f"{prefix}rewards[0].")
        else:
            yield cls, f.name, f"{prefix}{f.name}"


def test_every_key_declares_its_rule():
    from flowgrpo.config import rules_of

    missing = [key for cls, name, key in _keys(Config) if name not in rules_of(cls)]
    assert not missing, f"config keys declared without a rule (flowgrpo/config/schema.py key(rule, default)): {missing}"
    assert not any(hasattr(cls, "RULES") for cls, _, _ in _keys(Config)), "a second table of rules beside the keys"


@pytest.mark.parametrize("override, message", [
    ("train.adam_betas=[1.5,0.9]", r"train.adam_betas=\(1.5, 0.9\) is not allowed; use two numbers in \[0, 1\)"),
    ("train.learning_rate=-1", r"train.learning_rate=-1.0 is not allowed; use a number >= 0"),
    ("rewards=[{name: toy, weight: .nan}]", r"rewards\[0\].weight=nan is not allowed; use a finite number"),
    ("run_name=../../etc/evil", r"run_name='../../etc/evil' is not allowed; use a plain folder name"),
    ("loss.ratio=magic", r"loss.ratio='magic' is not allowed; use one of \['plain', 'guard'\]"),
    ("train.lr_final=2", r"train.lr_final=2.0 is not allowed; use a number in \[0, 1\]"),
    ("learner.nft.old.max=1.5", r"learner.nft.old.max=1.5 is not allowed; use a number in \[0, 1\]"),
    ("sampling.shift=0", r"sampling.shift=0.0 is not allowed; use null or a number > 0"),
    ("eval.steps=0", r"eval.steps=0 is not allowed; use null or a number >= 1"),
    ("train.ema_decay=1", r"train.ema_decay=1.0 is not allowed; use a number in \[0, 1\) \(0 = off\)"),
    ("log.keep_checkpoints=0", r"log.keep_checkpoints=0 is not allowed; use a number >= 1"),
    ("sampling.plan.solver=heun", r"sampling.plan.solver='heun' is not allowed; use one of \['euler', 'dpmpp_2m', 'sa_solver'\]"),
    ("sampling.plan.sa_tau=-0.1", r"sampling.plan.sa_tau=-0.1 is not allowed; use a number >= 0"),
    ("sampling.plan.sa_tau_window=[0.9,0.3]", r"sampling.plan.sa_tau_window=\[0.9, 0.3\] is not allowed; use two numbers \[lo, hi\]"),
    ("sampling.plan.sa_predictor_order=3", r"sampling.plan.sa_predictor_order=3 is not allowed; use one of \[1, 2\]"),
    ("sampling.plan.grid_ends=awn", r"sampling.plan.grid_ends='awn' is not allowed; use one of \['exact', 'awm'\]"),
    ("sampling.log_prob=laplace", r"sampling.log_prob='laplace' is not allowed; use one of \['gaussian', 'squared_error'\]"),
])
def test_a_value_outside_its_rule_is_one_line_naming_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, None, [override])


def test_the_plan_keys_that_choose_a_solver_follow_the_samplers():
    """sampling.plan's solver keys (samplers.compose.PLAN_RULES) allow what samplers/ builds, and SA-Solver's noise is
    refused with the transition learner (it has no log-probs for those untrained steps), in one line naming the fix."""
    import samplers
    from samplers.compose import GRID_ENDS, PLAN_RULES
    from samplers.solvers import SA_CORRECTOR_ORDERS, SA_PREDICTOR_ORDERS

    assert [name for name in ("euler", "dpmpp_2m", "sa_solver", "heun") if PLAN_RULES["solver"].ok(name)] == list(
        samplers.SOLVER_NAMES)
    assert [k for k in range(-1, 5) if PLAN_RULES["sa_predictor_order"].ok(k)] == list(SA_PREDICTOR_ORDERS)
    assert [k for k in range(-1, 5) if PLAN_RULES["sa_corrector_order"].ok(k)] == list(SA_CORRECTOR_ORDERS)
    assert [e for e in ("exact", "awm", "x") if PLAN_RULES["grid_ends"].ok(e)] == list(GRID_ENDS)
    window = ["sampling.plan.kernel=flow_sde", "sampling.plan.eta=0.7",  # MixGRPO's SDE window on the default's plan
              "sampling.window={size: 4, strategy: progressive, interval: 25, stride: 1}"]
    noisy = ["learner.name=transition", *window, "sampling.plan.solver=sa_solver", "sampling.plan.sa_tau=0.4"]
    with pytest.raises(ConfigError, match=r"^sampling.plan.sa_tau=0.4 draws SA-Solver noise on untrained steps.*"
                                          r"set sampling.plan.sa_tau=0 .*or use a forward-process learner"):
        load_config(None, None, noisy)
    load_config(None, None, noisy[:-1])  # noise-free SA-Solver steps are ODE steps like any other
    load_config("awm", None, noisy[1:])  # a forward-process learner takes the noise


def test_the_squared_error_log_prob_is_refused_with_the_fused_op_naming_the_backend():
    import samplers

    from flowgrpo.config import SamplingConfig, rules_of

    assert [f for f in ("gaussian", "squared_error", "x") if rules_of(SamplingConfig)["log_prob"].ok(f)] == list(
        samplers.kernels.LOG_PROB_FORMS)
    with pytest.raises(ConfigError, match=r"^sampling.log_prob=squared_error .*set loss.likelihood_backend=reference"):
        load_config("flow_grpo", None, ["sampling.log_prob=squared_error", "loss.likelihood_backend=fused"])
    assert load_config("flow_grpo", None, ["sampling.log_prob=squared_error"]).sampling.log_prob == "squared_error"


def test_the_defaults_and_every_preset_pass_their_rules():
    from flowgrpo.run.paths import configs_dir

    for preset in [None] + sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml")):
        load_config(preset, None, [])
        load_config(preset, "sd3_5_medium", [])


# ------------------------------------------------------------------------------------------------ the fuzz
BAD_VALUES = ["nope-1", "''", "-1", "0", ".nan", ".inf", "-.inf", "1e30", "../x", "/abs/path", "[1, 2]", "{a: 1}",
              "true"]
WORLDS = {  # name -> (program, its default, extra arguments)
    "image default": ("train_t2i.py", "default", []),
    "video default": ("train_t2v.py", "default_t2v", []),
    "analytic world": ("train_t2i.py", "default", ["--config", "ANALYTIC"]),
}


def _plan_keys(windowed: bool = False, preset: str | None = None) -> list[str]:
    """The sampling.plan / sampling.window keys to fuzz: with no preset every key the plan builder and (for a plan
    with a moving window) the window schedule take; with a preset the keys its file and its recipes set."""
    from samplers.compose import PLAN_RULES
    from samplers.schedules import WINDOW_RULES

    if preset is None:
        return [f"sampling.plan.{k}" for k in PLAN_RULES] + [f"sampling.window.{k}" for k in WINDOW_RULES if windowed]
    import yaml

    from flowgrpo.run.paths import configs_dir

    data = yaml.safe_load((configs_dir() / "presets" / f"{preset}.yaml").read_text())
    blocks = [data] + [data.get("recipe") or {}] + [b for key in ("recipe_by_family", "recipe_by_reward")
                                                     for b in (data.get(key) or {}).values()]
    plan, window = set(), set()
    for block in blocks:
        plan |= set(((block.get("sampling") or {}).get("plan") or {}))
        window |= set(((block.get("sampling") or {}).get("window") or {}))
    return [f"sampling.plan.{k}" for k in sorted(plan)] + [f"sampling.window.{k}" for k in sorted(window)]


def _override(key: str, value: str) -> str:
    """``key=value`` as the command line writes it (a reward's keys are written inside the rewards list)."""
    if key.startswith("rewards[0]."):
        field = key.split(".", 1)[1]
        return f"rewards=[{{name: {value}}}]" if field == "name" else f"rewards=[{{name: toy, {field}: {value}}}]"
    return f"{key}={value}"


def _fuzz(monkeypatch, capsys, tmp_path, program, default, extra, keys) -> int:
    """Each key with each of BAD_VALUES (see the tests below); the number refused. Every value goes through the
    checks the entry point runs on its arguments (``resolve``'s ``apply_overrides``: the overrides merged onto the
    world's layers, read and merged once here by ``config_loader``, then every rule and cross-key check); each key's
    first refused value then goes through the real entry point itself, which must refuse it in the same one line."""
    import flowgrpo.cli.train as cli
    from flowgrpo.config.load import config_loader
    from flowgrpo.run.errors import UserError

    class Accepted(Exception):
        """preflight reached: the value passed every config check (a valid value; nothing loads)."""

    def stop(*args, **kwargs):
        raise Accepted

    monkeypatch.setattr(cli, "preflight", stop)
    out = tmp_path / "out"
    existing = out / "kept"
    existing.mkdir(parents=True)
    (existing / "marker").write_text("untouched")
    given = [f"output_dir={out}", "run_name=kept"]
    options = dict(zip(extra[::2], extra[1::2]))  # --preset NAME, --config FILE as the entry point reads them
    assert set(options) <= {"--preset", "--config"}, extra
    check = config_loader(options.get("--preset"), None, options.get("--config"), default)
    refused = 0
    for key in keys:
        first = None  # the key's first refused value, and the refusal
        for value in BAD_VALUES:
            override = _override(key, value)
            try:
                check([*given, override])
            except UserError as exc:  # the entry point prints f"{program}: error: {exc}" (checked below) and exits 2
                line = f"{program}: error: {exc}"
                assert len([part for part in line.splitlines() if part.strip()]) == 1 and "Traceback" not in line, \
                    (override, line)
                refused += 1
                first = first or (override, line)
        assert first, f"{key}: none of {BAD_VALUES} is refused"
        override, expected = first  # through the real entry point: refused with the same one line, exit 2
        try:
            status = cli.main([*extra, *given, override], prog=program, description="", default=default)
        except Accepted:
            raise AssertionError(f"{override}: the config checks refuse it ({expected!r}), but the entry point "
                                 "accepted it") from None
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1 and "Traceback" not in err, (override, err)
        assert lines[0].startswith(f"{program}: error: "), (override, lines)
        assert lines == [expected], (override, lines)
    assert sorted(p.name for p in out.iterdir()) == ["kept"] and [p.name for p in existing.iterdir()] == ["marker"]
    assert (existing / "marker").read_text() == "untouched"
    return refused


def _stated(pattern: str) -> tuple[int, int]:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    found = re.search(pattern, doc)
    assert found, pattern
    return int(found[1]), int(found[2])


@pytest.mark.slow
@pytest.mark.parametrize("world", list(WORLDS))
def test_every_leaf_key_fuzzed_ends_in_one_line_before_anything_loads(world, tmp_path, capsys, monkeypatch):
    """Every leaf key of the world's config, and every key its rollout plan (and window) takes, with each of
    BAD_VALUES (wrong types, negative, zero, NaN, ±inf, huge, empty, path-like): a value its rule (or a cross-key
    check, or the plan's own construction) refuses ends with exit 2, one line, no traceback, before any model loads,
    with nothing written under output_dir and an existing run folder untouched; a value the checks pass would reach
    preflight (a valid one: nothing is loaded). Every value goes through the entry point's checks on the world's
    layers read once (``_fuzz``), and each key's first refused value through the real entry point, which must refuse
    it in the same line. Every key must refuse at least one value, and docs/errors.md states the counts."""
    program, default, extra = WORLDS[world]
    extra = [str(configs_dir() / "analytic.yaml") if e == "ANALYTIC" else e for e in extra]
    base = str(configs_dir() / "analytic.yaml") if extra else None
    windowed = bool(load_config(None, None, [], base=base, default=default).sampling.window)
    keys = [key for _, _, key in _keys(Config)] + _plan_keys(windowed)
    refused = _fuzz(monkeypatch, capsys, tmp_path, program, default, extra, keys)
    assert _stated(rf"{world}:\s+(\d+)\s+keys,\s+(\d+)\s+bad\s+values\s+refused") == (len(keys), refused), \
        (world, len(keys), refused)


PRESET_NAMES = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))


@pytest.mark.slow
def test_every_presets_plan_and_window_keys_fuzzed_end_in_one_line(tmp_path, capsys, monkeypatch):
    """With each preset (the image world), every plan and window key its file and its recipes set, fuzzed as above;
    docs/errors.md states the total."""
    total_keys = total_refused = 0
    for preset in PRESET_NAMES:
        keys = _plan_keys(preset=preset)
        total_refused += _fuzz(monkeypatch, capsys, tmp_path / preset, "train_t2i.py", "default", ["--preset", preset],
                               keys)
        total_keys += len(keys)
    assert _stated(r"with each preset:\s+(\d+)\s+plan and window keys,\s+(\d+)\s+bad\s+values\s+refused") == \
        (total_keys, total_refused), (total_keys, total_refused)


def test_the_fuzz_fails_on_a_rule_skipped_and_on_a_key_the_entry_point_lets_through(tmp_path, capsys, monkeypatch):
    """Both halves of the fuzz catch a bypass: a rule the shared checks skip refuses fewer values (the counts no
    longer match docs/errors.md), and an entry point that lets a key through without the checks fails that key's
    check through the real entry point."""
    import flowgrpo.cli.train as cli
    import flowgrpo.config.check as check
    from flowgrpo.config import TrainConfig, rules_of

    program, default, extra = WORLDS["image default"]
    key = "train.learning_rate"
    whole = _fuzz(monkeypatch, capsys, tmp_path / "whole", program, default, extra, [key])
    with monkeypatch.context() as patch:  # the learning rate's rule skipped by the checks the entry point runs too
        patch.setattr(check, "rules_of", lambda cls: {name: rule for name, rule in rules_of(cls).items()
                                                     if (cls, name) != (TrainConfig, "learning_rate")})
        assert _fuzz(patch, capsys, tmp_path / "skipped", program, default, extra, [key]) < whole
    real_load = cli.load_config

    def lets_it_through(preset, model, overrides, **kwargs):  # the entry point drops the key before its checks
        return real_load(preset, model, [o for o in overrides if not o.startswith(f"{key}=")], **kwargs)

    monkeypatch.setattr(cli, "load_config", lets_it_through)
    with pytest.raises(AssertionError, match=rf"^{key}=nope-1: the config checks refuse it .* but the entry point "
                                             "accepted it"):
        _fuzz(monkeypatch, capsys, tmp_path / "through", program, default, extra, [key])


def test_reward_options_go_under_each_rewards_own_kwargs_by_name():
    """reward_options (a preset's recipe: the official scorer's scale) reach every reward of that name wherever it
    sits in rewards[], and the entry's own kwargs win; a non-mapping is one line naming the fix."""
    from flowgrpo.config import load_config
    from flowgrpo.run.errors import ConfigError

    cfg = load_config(None, None, ["reward_options={pickscore: {divide_by: 26}, clipscore: {divide_by: 100}}",
                                   "rewards=[{name: toy}, {name: pickscore}, {name: pickscore, kwargs: {divide_by: 2}}]"])
    assert [r.kwargs for r in cfg.rewards] == [{}, {"divide_by": 26}, {"divide_by": 2}]
    with pytest.raises(ConfigError, match=r"reward_options.pickscore=3 is not a mapping.*divide_by: 26"):
        load_config(None, None, ["reward_options={pickscore: 3}"])
    with pytest.raises(ConfigError, match=r"train.balance_by='task'.*train.prompt_draw=batch"):
        load_config(None, None, ["train.balance_by=task", "train.prompt_draw=batch"])
