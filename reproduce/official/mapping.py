"""What each official key is in flowgrpo, and whether a preset's run resolves to the official value.

A map (reproduce/official/map/<code>.yaml, one per official code base) has:

- ``presets``: the presets that follow this code (a preset without public code, GRPO-Guard, TempFlow, takes the
  code its paper builds on, and says where it differs under ``differs``).
- ``keys``: official key -> what it is in flowgrpo. A string is a flowgrpo key taking the same value; a mapping
  ``{key: K, value: EXPR}`` gives the value as a Python expression of ``v`` (this key's official value) and ``o``
  (every official value of the launch, ``o['sample.num_steps']``), ``{keys: {K1: EXPR1, K2: EXPR2}}`` several keys;
  ``{part_of: OTHER}``: the key only enters OTHER's expression (which must name it).
- ``none``: official key (or an ``fnmatch`` pattern) -> ``{kind: ..., why: ...}``, a key with no counterpart, where
  ``kind`` is one of NONE_KINDS.
- ``differs``: preset -> official key -> why flowgrpo's run deliberately differs there (the check then requires that
  it *does* differ, so a stale reason fails too); ``all`` applies to every preset of the map.
- ``launches``: optional, launch name -> the same three sections, for keys whose meaning differs in one launch.

``check(preset)`` composes the preset's run for every official launch (its model config, its rewards) through the
very resolution ``flowgrpo config`` prints (``flowgrpo.config.resolve``) and compares every mapped key; an official
key that is neither mapped nor listed is *unmapped*, and tests/engine/test_official_recipes.py requires none.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from official import DATA, MAPS, ROOT, read_data

NONE_KINDS = {
    "logging": "what it logs or where (wandb, log and save folders, run names, intervals)",
    "paths": "where its data, weights and caches are (flowgrpo reads prompts and models by name)",
    "hardware": "how it spreads over devices and precision settings flowgrpo sets per machine (accelerate, FSDP)",
    "evaluation": "its held-out evaluation, which does not change what is trained",
    "unused": "set, but the training code never reads it for this launch",
    "implementation": "a feature flowgrpo does another way, with the same effect on the run (the reason says how)",
    "reward": "how a reward model is built or served (flowgrpo's reward plug-ins, docs/rewards.md)",
    "unsupported": "a setting flowgrpo has no key for, so its run differs there (the reason says how, by how much, "
                   "and the core change that would add it)",
}


ENTRY_FIELDS = {"key", "value", "keys", "part_of", "kind", "why"}  # what a map entry may hold


@lru_cache(maxsize=None)
def load_map(code: str) -> dict:
    return check_fields(yaml.safe_load((MAPS / f"{code}.yaml").read_text()), code)


def check_fields(table, code: str):
    """``table`` (a map), refused when an entry holds a field no entry has: in a YAML flow mapping an unquoted comma in
    a reason (``{kind: x, why: a, b}``) cuts the reason short and makes a key of the rest."""

    def walk(node, path):
        if not isinstance(node, dict):
            return
        if node.keys() & {"kind", "why", "key", "part_of"}:
            extra = sorted(set(node) - ENTRY_FIELDS)
            if extra:
                raise ValueError(f"reproduce/official/map/{code}.yaml {path}: unknown field(s) {extra}; quote a reason "
                                 "that holds a comma")
        for k, v in node.items():
            walk(v, f"{path}/{k}")

    walk(table, "")
    return table


def codes() -> list[str]:
    return sorted(p.stem for p in MAPS.glob("*.yaml"))


def code_of(preset: str) -> str:
    found = [code for code in codes() if preset in load_map(code).get("presets", [])]
    if len(found) != 1:
        raise LookupError(f"preset {preset!r} is listed by {len(found)} maps in reproduce/official/map/ (expected 1)")
    return found[0]


def presets_with_data() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.yaml"))


def overrides_for(launch: dict) -> list[str]:
    """The command-line overrides that make a flowgrpo run train what the launch trains (its rewards)."""
    names = launch["rewards"]
    return ["rewards=[" + ", ".join(f"{{name: {n}}}" for n in names) + "]"] if names else []


_PLANS: dict = {}  # id(cfg) -> (cfg, its resolved plan and window): one resolution per composed run


def effective(cfg, key: str):
    """The value a run uses for ``key``: ``sampling.plan.*`` and ``sampling.window.*`` as the method's plan and
    window resolve them (flowgrpo.config.resolved_plan; a window's keys are None in a run without one), every other
    key as the config holds it."""
    import dataclasses

    from flowgrpo.config import resolved_plan

    section, _, name = key.rpartition(".")
    if section in ("sampling.plan", "sampling.window"):
        if _PLANS.get(id(cfg), (None,))[0] is not cfg:
            _PLANS.clear()
            _PLANS[id(cfg)] = (cfg, resolved_plan(cfg))
        plan, window = _PLANS[id(cfg)][1]
        if section == "sampling.window" and window is None:
            from samplers.schedules import WINDOW_RULES

            if name in WINDOW_RULES:
                return None  # a run without a moving window: none of its arguments
        table = plan if section == "sampling.plan" else (window or {})
        if name not in table:
            raise KeyError(f"{key}: the {section.split('.')[1]} takes no {name!r}")
        return table[name]
    node, spec = cfg, None
    # rewards[0].weight or rewards.0.weight: an index; rewards[pickscore].kwargs.divide_by: the reward of that name
    for part in re.findall(r"[^.\[\]]+|\[[^\]]+\]", key):
        index = part.strip("[]")
        if spec is not None and node is spec.kwargs and part not in node:
            return reward_default(spec.name, part)  # an option the run leaves to the reward: its constructor's default
        spec = node if hasattr(node, "kwargs") and hasattr(node, "name") else spec
        if index.isdigit() and isinstance(node, (list, tuple)) and int(index) < len(node):
            node = node[int(index)]
        elif part.startswith("[") and isinstance(node, (list, tuple)):
            named = [item for item in node if getattr(item, "name", None) == index]
            if len(named) != 1:
                raise KeyError(f"{key}: the run has {len(named)} entries named {index!r}")
            node = named[0]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(f"{key} is not a flowgrpo config key")
    if dataclasses.is_dataclass(node):
        return dataclasses.asdict(node)
    if isinstance(node, (list, tuple)):
        return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in node]
    return node


def reward_default(name: str, option: str):
    """The default of the reward ``name``'s constructor option ``option`` (what a run that does not set it scores with)."""
    import inspect

    from rewards import reward_class

    parameter = inspect.signature(reward_class(name).__init__).parameters.get(option)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise KeyError(f"the {name} reward takes no option {option!r} with a default")
    return parameter.default


def same(want, got) -> bool:
    """Equal as a run uses them: numbers to 1e-12 relative (an int and a float alike), lists item by item."""
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(want) == len(got) and all(same(a, b) for a, b in zip(want, got))
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) and not isinstance(want, bool) and not isinstance(got, bool):
        return math.isclose(float(want), float(got), rel_tol=1e-12, abs_tol=0.0) or want == got
    return want == got


SAFE = {"int": int, "float": float, "round": round, "min": min, "max": max, "len": len, "sum": sum, "abs": abs,
        "bool": bool, "str": str, "list": list, "sorted": sorted, "math": math, "None": None, "True": True,
        "False": False}


def evaluate(expression: str, v, o: dict):
    # the names as globals: a comprehension's own scope sees globals, not eval's locals
    return eval(expression, {"__builtins__": {}, **SAFE, "v": v, "o": o})  # noqa: S307 (the project's own maps)


@dataclass
class Row:
    """One official key of one launch: what flowgrpo makes of it."""

    launch: str
    official: str
    value: Any
    source: str
    status: str  # same | wrong | differs | differs_but_same | none | part_of | unmapped | error
    flowgrpo: dict = field(default_factory=dict)  # flowgrpo key -> (wanted, got)
    why: str = ""
    kind: str = ""


def _sections(table: dict, preset: str, launch: str) -> tuple[dict, dict, dict]:
    keys, none, differs = dict(table.get("keys") or {}), dict(table.get("none") or {}), {}
    differs.update((table.get("differs") or {}).get("all") or {})
    differs.update((table.get("differs") or {}).get(preset) or {})
    special = (table.get("launches") or {}).get(launch) or {}
    keys.update(special.get("keys") or {})
    none.update(special.get("none") or {})
    differs.update((special.get("differs") or {}).get("all") or {})
    differs.update((special.get("differs") or {}).get(preset) or {})
    return keys, none, differs


def _none_entry(none: dict, key: str):
    if key in none:
        return none[key]
    for pattern, entry in none.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(key, pattern):
            return entry
    return None


def check(preset: str, resolve=None) -> list[Row]:
    """Every official key of every launch of ``preset``, resolved: one Row each."""
    from flowgrpo.config import resolve as default_resolve
    from flowgrpo.models.families import FAMILIES

    resolve = resolve or default_resolve
    data = read_data(preset)
    table = load_map(code_of(preset))
    rows: list[Row] = []
    for name, launch in data["launches"].items():
        family = yaml.safe_load((ROOT / "configs" / "models" / f"{launch['model']}.yaml").read_text())["family"]
        default = "default_t2v" if FAMILIES[family].modality == "video" else "default"
        cfg = resolve(preset, launch["model"], overrides_for(launch), default=default).config
        values = {k: entry["value"] for k, entry in launch["values"].items()}
        keys, none, differs = _sections(table, preset, name)
        for okey, entry in launch["values"].items():
            row = Row(name, okey, entry["value"], entry["source"], "unmapped")
            rows.append(row)
            rule = keys.get(okey)
            if rule is None:
                listed = _none_entry(none, okey)
                if listed is not None:
                    row.status, row.kind, row.why = "none", listed.get("kind", ""), listed.get("why", "")
                continue
            if isinstance(rule, dict) and "part_of" in rule:
                other = keys.get(rule["part_of"])
                named = isinstance(other, dict) and okey in " ".join(str(x) for x in _expressions(other))
                row.status = "part_of" if named else "error"
                row.why = rule["part_of"] if named else f"part_of {rule['part_of']!r}, whose expression does not name it"
                continue
            try:
                for fkey, expression in _targets(rule).items():
                    want = entry["value"] if expression is None else evaluate(expression, entry["value"], values)
                    row.flowgrpo[fkey] = (want, effective(cfg, fkey))
            except Exception as exc:  # noqa: BLE001  (reported per row, the test names it)
                row.status, row.why = "error", f"{type(exc).__name__}: {exc}"
                continue
            equal = all(same(w, g) for w, g in row.flowgrpo.values())
            if okey in differs:
                row.status, row.why = ("differs_but_same", differs[okey]) if equal else ("differs", differs[okey])
            else:
                row.status = "same" if equal else "wrong"
    return rows


def _targets(rule) -> dict[str, str | None]:
    if isinstance(rule, str):
        return {rule: None}
    if "keys" in rule:
        return dict(rule["keys"])
    return {rule["key"]: rule.get("value")}


def _expressions(rule) -> list:
    return [e for e in _targets(rule).values() if e]


def summary(rows: list[Row]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        out[row.status] = out.get(row.status, 0) + 1
    return out


def official_keys_in(expression: str) -> list[str]:
    return re.findall(r"o\[['\"]([^'\"]+)['\"]\]", expression)


def _path(p: Path) -> str:
    return str(p.relative_to(ROOT))
