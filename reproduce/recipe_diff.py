"""What a change did to the presets' runs: every official launch's resolved config, before (a git revision) and now.

    python reproduce/recipe_diff.py --before 4dab3ba            # a markdown table of every key that changed
    python reproduce/recipe_diff.py --before 4dab3ba --json F   # and the data

Each preset is composed for each of its official launches (its model config and rewards, as the map check composes
it: reproduce/official/mapping.py ``overrides_for``) through ``flowgrpo.config.resolve``, once in a copy of the tree at
``--before`` (``git archive``, run by the same Python) and once in this tree, and the flattened configs are compared
key by key. A key only one side has is listed with ``(absent)`` on the other, except a key new to the schema that a
launch leaves at its default (its run is the one it was).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# run in a tree (this one or the revision's copy): {preset: {launch: {key: value}}} as JSON on stdout
_COMPOSE = r"""
import json, sys, yaml
from pathlib import Path
root = Path(sys.argv[1])
sys.path[:0] = [str(root), str(root / "reproduce"), str(root / "benchmarks")]
from flowgrpo.config import resolve
from flowgrpo.config.schema import to_yaml
from flowgrpo.models.families import FAMILIES
from flowgrpo.run.run_dir import flatten
data = next(p for p in (root / "reproduce" / "official" / "data", root / "docs" / "official" / "data") if p.is_dir())
out = {}
for path in sorted(data.glob("*.yaml")):
    table = yaml.safe_load(path.read_text())
    for name, launch in table["launches"].items():
        family = yaml.safe_load((root / "configs" / "models" / f"{launch['model']}.yaml").read_text())["family"]
        default = "default_t2v" if FAMILIES[family].modality == "video" else "default"
        rewards = launch["rewards"]
        overrides = ["rewards=[" + ", ".join(f"{{name: {r}}}" for r in rewards) + "]"] if rewards else []
        cfg = resolve(table["preset"], launch["model"], overrides, default=default).config
        out.setdefault(table["preset"], {})[name] = {k: v for k, v in flatten(yaml.safe_load(to_yaml(cfg))).items()}
from flowgrpo.config.schema import Config
out["__defaults__"] = {"": flatten(yaml.safe_load(to_yaml(Config())))}
json.dump(out, sys.stdout, default=str)
"""


def compose(root: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", _COMPOSE, str(root)], capture_output=True, text=True, cwd=root)
    if result.returncode:
        raise SystemExit(f"composing the presets in {root} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def diff(before: dict, after: dict) -> list[tuple[str, str, str, object, object]]:
    """[(preset, launch, key, before, after)] of every key whose value differs (absent on one side included); a key
    new to the schema that a launch leaves at its default (the run it was before) is not a change."""
    rows, defaults = [], after.pop("__defaults__")[""]
    before.pop("__defaults__", None)
    for preset in sorted(set(before) | set(after)):
        for launch in sorted(set(before.get(preset, {})) | set(after.get(preset, {}))):
            b, a = before.get(preset, {}).get(launch, {}), after.get(preset, {}).get(launch, {})
            for key in sorted(set(b) | set(a)):
                if key not in b and key in defaults and a.get(key) == defaults[key]:
                    continue
                if b.get(key, "(absent)") != a.get(key, "(absent)"):
                    rows.append((preset, launch, key, b.get(key, "(absent)"), a.get(key, "(absent)")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        before = compose(Path(tmp))
    rows = diff(before, compose(ROOT))
    launches = sum(len(v) for v in before.values())
    print(f"{len(rows)} changed values over {launches} official launches of {len(before)} presets "
          f"(before: {args.before})\n")
    print("| preset | launch | key | before | after |\n|---|---|---|---|---|")
    for preset, launch, key, b, a in rows:
        print(f"| {preset} | {launch} | `{key}` | `{b}` | `{a}` |")
    if args.json:
        Path(args.json).write_text(json.dumps([dict(zip(("preset", "launch", "key", "before", "after"), r))
                                               for r in rows], indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
