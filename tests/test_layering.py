"""Imports point one way (DESIGN.md): samplers -> torch only; rewards and gallery never import flowgrpo."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imported_top_levels(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_samplers_import_only_torch_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"torch", "samplers"}
    bad = {m: f for m, f in _imported_top_levels("samplers").items() if m not in allowed}
    assert not bad, f"samplers/ may import only torch and the stdlib; found {bad}"


@pytest.mark.parametrize("package", ["rewards", "gallery"])
def test_rewards_and_gallery_do_not_import_the_learner(package):
    found = _imported_top_levels(package)
    forbidden = {"flowgrpo", "train_t2i", "train_t2v"} | ({"samplers", "rewards"} if package == "gallery" else set())
    bad = {m: f for m, f in found.items() if m in forbidden}
    assert not bad, f"{package}/ must not import {sorted(forbidden)}; found {bad}"
