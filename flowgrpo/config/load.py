"""Loading a run's configuration: the layers (the method's preset, the embedded default and its tiny block, a
--config file, the model config, the paper's recipe on a real model, command-line overrides) merged onto the schema,
with the layer that set each key kept (``Resolved.provenance``, printed by ``flowgrpo config``), then checked
(flowgrpo/config/check.py)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from flowgrpo.config.check import resolved_plan, validate
from flowgrpo.config.schema import Config, ModelConfig, RewardSpec, to_yaml
from flowgrpo.models.config import check_model_config
from flowgrpo.run.errors import ConfigError
from flowgrpo.run.paths import configs_dir


# plans renamed to their preset's name (a method has one name: its preset file's)
RENAMED_METHODS = {"dance_grpo": "dancegrpo", "sage_grpo": "sage", "branch_grpo": "branchgrpo",
                   "branch_grpo_mix": "branchgrpo_mix", "tempflow_grpo": "tempflow"}



def _resolve_yaml(spec: str, folder: str) -> Path:
    path = Path(spec)
    if path.is_file():
        return path
    candidate = configs_dir() / folder / f"{spec.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    if folder == "presets" and spec in RENAMED_METHODS:
        raise ConfigError(f"preset {spec!r} is called {RENAMED_METHODS[spec]!r} now (--preset {RENAMED_METHODS[spec]})")
    names = sorted(p.stem for p in (configs_dir() / folder).glob("*.yaml"))
    where = "configs/" if folder == "." else f"configs/{folder}/"
    raise ConfigError(f"{spec!r} is neither a YAML file nor one of {where}: {names}")


# keys that were renamed or removed: a config that still writes one is refused in one line naming what replaced it
RETIRED_KEYS = {
    "sampling.method": "sampling.method is gone: a preset's file is its whole method, the rollout plan under sampling.plan "
                       "(compose_plan's arguments) and its moving window under sampling.window; choose a method with "
                       "--preset NAME and change its plan with sampling.plan.KEY=VALUE",
    "recipe_preset": "recipe_preset is called preset now: the method the file is written for (its recipe on real models)",
    "sampling.max_batch": "sampling.max_batch is called sampling.chunk now: samples per rollout network call (0 = the "
                          "memory plan's choice)",
}


def _unknown_key_message(exc: Exception, schema: Any) -> str:
    key = getattr(exc, "key", None) or str(exc).split("'")[1] if "'" in str(exc) else str(exc)
    full = getattr(exc, "full_key", key)
    if str(full) in RETIRED_KEYS:
        return RETIRED_KEYS[str(full)]
    parent = OmegaConf.select(OmegaConf.structured(schema), full.rsplit(".", 1)[0]) if "." in str(full) else None
    known = list(parent.keys()) if isinstance(parent, DictConfig) else list(OmegaConf.structured(schema).keys())
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys here: {known}"
    return f"unknown config key {full!r}{hint}"


# A preset states a whole method in these sections. The embedded default and a --config file name the method they are
# written for (``preset:``) and change it in these sections; they are dropped where another method is chosen (the
# default's 6-step plan, its learner's draw count would otherwise leak into the paper's method).
METHOD_SECTIONS = ("sampling", "learner", "advantage", "loss")


# the model configs of the built-in tiny worlds (docs/presets.md): a run on one of them (or with no --model) takes the
# tiny world's CPU settings; any other model config is a real model and takes the preset's paper recipe
TINY_WORLD_MODELS = ("tiny_sd3", "tiny_wan", "tiny_kontext", "analytic")
# top-level blocks of a config YAML that say where the settings apply, not settings themselves:
#   tiny:              (the embedded defaults) the tiny world's CPU settings, applied only in the tiny world
#   preset:            (the embedded defaults, a --config file) the method the file is written for: the preset a run
#                      without --preset takes, under the file's own method sections (its recipe on a real model)
#   recipe:            (a preset) its paper's recipe on real models, applied only with a real model config
#   recipe_by_reward:  (a preset) {reward name: settings} on top of `recipe`, when the run trains on that one reward;
#                      `several`: when it trains on more than one
#   recipe_by_family:  (a preset) {family: settings} on top of both, where the paper differs by model family
WORLD_BLOCKS = ("tiny", "preset", "recipe", "recipe_by_family", "recipe_by_reward")


def is_real_model(model: str | None) -> bool:
    """Whether ``--model`` names a real model (its runs take the presets' paper recipes), not a tiny-world one."""
    return bool(model) and Path(model).stem not in TINY_WORLD_MODELS


def _blocks(layer: DictConfig) -> dict:
    """Take the WORLD_BLOCKS out of a loaded YAML layer: {block: its content}."""
    return {name: layer.pop(name) for name in WORLD_BLOCKS if name in layer}


@dataclass
class Resolved:
    """A run's configuration and where each of its settings came from: ``provenance`` maps every dotted leaf key
    (``sampling.plan.*`` and ``sampling.window.*`` with the method's full plan and window, as ``resolved_plan``
    gives them) to the layer that set it last, one of LAYER_NAMES, with the file in brackets where there is one."""

    config: Config
    merged: list = field(repr=False)  # [(layer name, file or None, the layer)] in the order they were merged

    @property
    def layers(self) -> list:
        """[(layer name, file or None)] in the order they were merged."""
        return [(name, where) for name, where, _ in self.merged]

    @functools.cached_property
    def provenance(self) -> dict:
        """Computed when asked (``flowgrpo config``): a run's load does not pay for it."""
        return _provenance(self.config, self.merged)


# the layers of a run's configuration, first to last (``flowgrpo config`` prints each key's)
LAYER_NAMES = ("schema default", "embedded default", "tiny block", "base config", "preset method", "model config",
               "recipe", "recipe_by_reward", "recipe_by_family", "run name", "override",
               "plan builder default")


def load_config(preset: str | None = None, model: str | None = None, overrides: list[str] | None = None,
                base: str | dict | None = None, default: str = "default") -> Config:
    """The validated run configuration (``resolve(...).config``): the method's preset, the embedded default, a
    --config file, the model, the paper's recipe (real models) and overrides onto the schema; see ``resolve``."""
    return resolve(preset, model, overrides, base, default).config


def resolve(preset: str | None = None, model: str | None = None, overrides: list[str] | None = None,
            base: str | dict | None = None, default: str = "default") -> Resolved:
    """Merge the layers onto the schema, then validate, keeping which layer set each key (``Resolved``).

    The method is the preset ``preset`` (--preset), else the one the --config file ``base`` is written for (its
    ``preset:``), else the embedded default's. A method the files are written for is merged first and the files change
    it: preset ← default ← its tiny block ← base ← model ← overrides; a --preset goes over the files instead: default ←
    tiny block ← base ← preset ← model ← overrides. A file's METHOD_SECTIONS are dropped where another method is
    chosen (the embedded default's also on a real model and under any --preset: they are the tiny world's).

    Two worlds (docs/presets.md). With no ``model`` or a tiny-world model config (TINY_WORLD_MODELS), the default's
    ``tiny:`` block (its CPU-scaled training settings) follows the default. With a real model config, that block is
    left out and the preset's paper recipe follows the preset (``recipe:``, then ``recipe_by_reward:`` for the rewards
    trained on, then ``recipe_by_family:`` for the model's family, the most specific), after the model config, so a
    family's recipe may set model keys (the paper's text length, full fine-tuning). Overrides always win.

    ``default`` is the embedded default: a name in configs/ ("default" for text-to-image,
    "default_t2v" for text-to-video) or a YAML file."""
    layers, dotlist = _layers(preset, model, overrides, base, default)
    return apply_overrides(_merge(Config(), [layer for _, _, layer in layers], overrides), layers, dotlist, overrides)


def config_loader(preset: str | None = None, model: str | None = None, base: str | dict | None = None,
                  default: str = "default"):
    """``load_config(preset, model, overrides, base, default)`` as a function of ``overrides``, for checking many of
    them: the layers under the overrides read and merged once, then each call merges its overrides onto a copy of that
    merge and checks the result with the code ``resolve`` ends in (``apply_overrides``): the same config, or the same
    ConfigError. On a real model the layers depend on the overrides (the recipe for the rewards they name), and a
    layer that is refused may be refused naming an override: there each call is ``load_config`` itself."""
    def each_time(overrides: list[str] | None) -> Config:
        return load_config(preset, model, overrides, base, default)

    if is_real_model(model):
        return each_time
    try:
        layers, _ = _layers(preset, model, None, base, default)
        merged = _merge(Config(), [layer for _, _, layer in layers])
    except ConfigError:  # a layer refused: each call refuses it as resolve does (its message may name an override)
        return each_time
    frozen = pickle.dumps(merged)  # copied per call: unpickled in a fifth of copy.deepcopy's time

    def load(overrides: list[str] | None) -> Config:
        return apply_overrides(pickle.loads(frozen), layers, _dotlist(overrides), overrides).config

    return load


def _dotlist(overrides: list[str] | None) -> DictConfig | None:
    """The command line's ``key=value`` overrides as a config layer (None when there are none)."""
    if not overrides:
        return None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.iterations=10)")
    return OmegaConf.from_dotlist(overrides)


def _layers(preset: str | None, model: str | None, overrides: list[str] | None, base: str | dict | None,
            default: str) -> tuple[list, DictConfig | None]:
    """The layers of ``resolve`` under the overrides, [(layer name, file or None, the layer)] first to last, and the
    overrides as a layer (``_dotlist``; None when there are none)."""
    schema = Config()
    real = is_real_model(model)
    default_path = _resolve_yaml(default, ".")
    defaults = _load_yaml(default_path)
    world = _blocks(defaults)
    base_layer = None
    if isinstance(base, dict):
        base_layer = ("base config", None, OmegaConf.create(base))
    elif base:
        path = _resolve_yaml(base, "presets")
        base_layer = ("base config", str(path), _load_yaml(path))
    written_for = _blocks(base_layer[2]).get("preset") if base_layer else None  # the method a --config file is for
    # the method: --preset, else the one the --config file is written for, else the embedded default's
    method = preset or written_for or world.get("preset")
    tiny = world.get("tiny") if not real else None
    # a file's method sections change the method it is written for: dropped where another is chosen; the embedded
    # default's (and its tiny block's) are the tiny world's, dropped on a real model and under any --preset
    if preset or real or method != world.get("preset"):
        for block in (defaults, tiny):
            for section in METHOD_SECTIONS:
                if block is not None:
                    block.pop(section, None)
    if base_layer and written_for and written_for != method:
        for section in METHOD_SECTIONS:
            base_layer[2].pop(section, None)
    recipes: dict = {}
    preset_layer, preset_path = None, None
    if method:
        preset_path = _resolve_yaml(method, "presets")
        loaded = _load_yaml(preset_path)
        recipes = _blocks(loaded)
        preset_layer = ("preset method", str(preset_path), loaded)
    # a method the files are written for lies under them (they change it); a --preset goes over them
    layers: list = [preset_layer] if not preset else []
    layers += [("embedded default", str(default_path), defaults), ("tiny block", f"{default_path} (tiny:)", tiny),
               base_layer]
    if preset:
        layers.append(preset_layer)
    layers = [layer for layer in layers if layer is not None and layer[2] is not None]
    model_layer = None
    if model:
        model_path = _resolve_yaml(model, "models")
        model_layer = ("model config", str(model_path), OmegaConf.create({"model": _load_yaml(model_path)}))
    dotlist = _dotlist(overrides)
    if real:  # the paper's recipe: in general, for the rewards trained on, then for the model's family (most specific)
        family = model_layer[2].model.get("family", ModelConfig.family)
        by_reward, reward_name = None, None
        if recipes.get("recipe_by_reward"):  # the rewards the run trains on, as the layers and overrides say
            rewards = _merge(schema, [layer for _, _, layer in layers] + [model_layer[2], dotlist]).rewards
            names = {(r.get("name") if isinstance(r, dict) else r.name) for r in rewards}
            table = recipes["recipe_by_reward"]
            reward_name = names.pop() if len(names) == 1 else "several" if names else None
            by_reward = table.get(reward_name) if reward_name else None
        for name, block in (("recipe", recipes.get("recipe")), ("recipe_by_reward", by_reward)):
            if block is not None and "model" in block:
                raise ConfigError(f"preset {method!r}: its {name} block sets model keys ({', '.join(block.model)}); a "
                                  "paper's model settings go under recipe_by_family.<family>, the family it trained")
        # the model config first, then the paper's recipe: a family's recipe may set how the paper ran that model
        # (its text length, full fine-tuning), which the model config's generic values would otherwise hide
        by_family = (recipes.get("recipe_by_family") or {}).get(family)
        layers += [model_layer, ("recipe", f"{preset_path} (recipe:)", recipes.get("recipe")),
                   ("recipe_by_reward", f"{preset_path} (recipe_by_reward.{reward_name}:)", by_reward),
                   ("recipe_by_family", f"{preset_path} (recipe_by_family.{family}:)", by_family)]
        # a real run is not the tiny world's: named after its model and method unless run_name is given
        layers.append(("run name", None, OmegaConf.create(
            {"run_name": f"{Path(model).stem}-{Path(method).stem if method else 'default'}"})))
    else:
        layers.append(model_layer)
    return [layer for layer in layers if layer is not None and layer[2] is not None], dotlist


def apply_overrides(merged: DictConfig, layers: list, dotlist: DictConfig | None,
                    overrides: list[str] | None) -> Resolved:
    """The overrides (``dotlist``, parsed from ``overrides``) merged onto ``merged`` (the ``layers`` under them merged
    onto the schema; changed in place), then the whole config checked: the model config, the rewards, every key's
    rule and the checks across keys (``validate``). ``resolve`` ends here, and so does each call of
    ``config_loader``."""
    if dotlist is not None:
        layers = [*layers, ("override", "command line", dotlist)]
        merged = _merge(Config(), [dotlist], overrides, merged)
    cfg: Config = OmegaConf.to_object(merged)
    cfg.model = check_model_config(cfg.model)  # keys and types checked by the merge above
    try:
        cfg.rewards = [r if isinstance(r, RewardSpec) else RewardSpec(**r) for r in cfg.rewards]
    except TypeError:
        raise ConfigError(f"rewards={cfg.rewards!r}: write each reward as {{name: NAME, weight: W}} (with a space after "
                          "each colon, or YAML reads 'name:toy' as one key), e.g. rewards='[{name: toy_dense, weight: 1.0}]'") from None
    validate(cfg)
    cfg.rewards = with_reward_options(cfg.rewards, cfg.reward_options)
    return Resolved(cfg, layers)


def with_reward_options(rewards: list, options: dict) -> list:
    """Each reward with ``reward_options[its name]`` under its own kwargs (its own win): a preset's recipe says how the
    official run's scorer scales a reward without knowing where in the rewards list the user puts it."""
    for name, table in options.items():
        if not isinstance(table, dict):
            raise ConfigError(f"reward_options.{name}={table!r} is not a mapping of the reward's options; write e.g. "
                              "reward_options='{pickscore: {divide_by: 26}}'")
    return [dataclasses.replace(r, kwargs={**options[r.name], **r.kwargs}) if options.get(r.name) else r
            for r in rewards]


def _leaves(node, prefix: str = "") -> dict:
    """{dotted key: value} of the leaves of a plain mapping (a list is one leaf)."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _provenance(cfg: Config, layers: list) -> dict:
    """Every leaf key of the resolved config (and of its resolved plan and window) -> the layer that set it last."""
    import yaml

    final = _leaves(yaml.safe_load(to_yaml(cfg)))
    plan, window = resolved_plan(cfg)
    final.update({f"sampling.plan.{k}": v for k, v in plan.items()})
    final.update({f"sampling.window.{k}": v for k, v in (window or {}).items()})
    origin = {key: "schema default" for key in final}
    for key in plan:
        origin[f"sampling.plan.{key}"] = "plan builder default [samplers/compose.py compose_plan]"
    for key in window or {}:
        origin[f"sampling.window.{key}"] = "plan builder default [samplers/schedules.py WindowSchedule]"
    for name, where, layer in layers:
        label = f"{name} [{_short(where)}]" if where else name
        for key in _leaves(OmegaConf.to_container(layer)):
            if key in final:
                origin[key] = label
            else:  # a layer's whole mapping or list (rewards) counts for the leaves under it
                for leaf in final:
                    if leaf.startswith(key + ".") or leaf == key:
                        origin[leaf] = label
    optioned = sorted({r.name for r in cfg.rewards if cfg.reward_options.get(r.name)})
    if optioned and "rewards" in origin:  # the rewards' kwargs hold reward_options folded in (with_reward_options)
        where = sorted({v for k, v in origin.items() if k.split(".")[0] == "reward_options" and k.split(".")[1] in optioned})
        origin["rewards"] += f"; kwargs of {', '.join(optioned)} from reward_options ({'; '.join(where)})"
    if "shift" not in cfg.sampling.plan:
        origin["sampling.plan.shift"] = (f"sampling.shift ({origin['sampling.shift']})" if cfg.sampling.shift is not None
                                         else "the model's shift for the plan's steps (sampling.shift is null)")
    return origin


def _short(where: str) -> str:
    """A layer's file relative to the project (configs/presets/x.yaml), or as it is."""
    root = str(configs_dir().parent) + "/"
    return where.replace(root, "")


def _merge(schema: Config, layers: list, overrides: list[str] | None = None,
           merged: DictConfig | None = None) -> DictConfig:
    """The layers (None skipped) merged onto the schema (or onto ``merged``, layers already merged onto it, in place);
    a bad key or value is a ConfigError naming it (the override that carried it, when a mapping meets a list or a
    number: OmegaConf names no key then)."""
    # the schema's node built once per process (OmegaConf.structured walks every dataclass), copied per merge
    # (unpickled: a fifth of copy.deepcopy's time); each layer merges into that copy in place (OmegaConf.merge would
    # copy the whole config again for every layer)
    if merged is None:
        merged = pickle.loads(_schema_node()) if type(schema) is Config else OmegaConf.structured(schema)
    for layer in layers:
        if layer is None:
            continue
        try:
            merged = OmegaConf.unsafe_merge(merged, layer)
        except (ConfigKeyError, ValidationError) as exc:
            if isinstance(exc, ConfigKeyError) or "not in" in str(exc):
                raise ConfigError(_unknown_key_message(exc, schema)) from None
            key, first = getattr(exc, "full_key", None), str(exc).splitlines()[0]  # OmegaConf's message has 4 lines
            raise ConfigError(f"bad value for {key}: {first}" if key else f"bad config value: {first}") from None
        except (TypeError, ValueError) as exc:
            culprit = next((item for item in overrides or [] if not _merges(merged, item)), None)
            where = f"override {culprit!r}" if culprit else "a config layer"
            raise ConfigError(f"{where} does not fit its key: a mapping, a list and a single value cannot replace one "
                              f"another ({exc}); write the value as the key's default is written "
                              "(flowgrpo/config/schema.py, configs/README.md)") from None
    return merged


@functools.lru_cache(maxsize=1)
def _schema_node() -> bytes:
    """The schema's node, pickled (``_merge`` unpickles a copy)."""
    return pickle.dumps(OmegaConf.structured(Config()))


def _load_yaml(path: str | Path) -> DictConfig:
    """``OmegaConf.load(path)``: the file read each time, its text parsed once per process (the parse and the node
    built from it are most of a config's load, and every load_config reads its layers' files again); a copy, which
    ``resolve`` may change."""
    try:
        return pickle.loads(_parsed_yaml(Path(path).read_text(encoding="utf-8")))
    except yaml.YAMLError:  # read again by name: the parser's message names the file and line
        return OmegaConf.load(path)


@functools.lru_cache(maxsize=256)
def _parsed_yaml(text: str) -> bytes:
    return pickle.dumps(OmegaConf.load(io.StringIO(text)))


def _merges(merged: DictConfig, item: str) -> bool:
    """Whether the single override ``item`` merges onto ``merged`` without a container-type error."""
    try:
        OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
    except (TypeError, ValueError):
        return False
    except Exception:  # noqa: BLE001  (another kind of error: reported by the whole merge)
        return True
    return True


def preset_names() -> list[str]:
    """The method presets shipped in configs/presets/."""
    return sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))


def preset_plan(name: str) -> tuple[dict, dict | None]:
    """A preset's rollout plan as its file writes it: (compose_plan arguments, WindowSchedule arguments or None)."""
    sampling = OmegaConf.to_container(OmegaConf.load(_resolve_yaml(name, "presets"))).get("sampling", {})
    return dict(sampling.get("plan", {})), (dict(sampling["window"]) if sampling.get("window") else None)
