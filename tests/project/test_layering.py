"""Imports point one way (docs/design.md, "Layers"), read from the source with ``ast``, function-level imports
included: no circle anywhere, no package importing a higher one, and the engine's contract visible in the
imports (learners see the policy, never the loop)."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flowgrpo", "samplers", "rewards", "worlds", "gallery")

# top-level packages: what each may import of the project (besides itself)
MAY_IMPORT = {
    "samplers": set(),  # torch and the standard library only
    "worlds": set(),  # torch, numpy, PIL (the contact sheets) and the standard library only
    "rewards": {"worlds"},  # scorers read their world's grammar; never the learner
    "gallery": set(),  # reads run folders only
    "flowgrpo": {"samplers", "worlds", "rewards", "gallery"},  # gallery: the command lines alone (below)
}
# flowgrpo's own layers, lowest first: a module may import modules of its own layer or lower ones
FLOWGRPO_LAYERS = {
    "flowgrpo": 0, "flowgrpo.run": 0,
    "flowgrpo.models": 1, "flowgrpo.likelihood": 1, "flowgrpo.data": 1,
    "flowgrpo.config": 2, "flowgrpo.evaluate": 2, "flowgrpo.protocols": 2, "flowgrpo.memory": 2,
    "flowgrpo.engine": 3,
    "flowgrpo.tiny": 4,
    "flowgrpo.cli": 5,
}
# what a learner may import of the engine: the policy surface and the formulas, never the loop's phases
LEARNER_MAY_IMPORT = {"flowgrpo.engine.learners", "flowgrpo.engine.policy", "flowgrpo.models.copies",
                      "flowgrpo.engine.credit", "flowgrpo.engine.loss"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, module: str, known: dict) -> tuple[set[str], set[str]]:
    """(project modules imported, other top-level names imported) by the file at ``path``."""
    project, other = set(), set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in targets:
            parts = name.split(".")
            hit = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in known), None)
            if hit is not None:
                if hit != module:
                    project.add(hit)
                    if isinstance(node, ast.ImportFrom):
                        break  # `from a import b`: b itself when it is a module, else a
            elif parts[0] not in PACKAGES:
                other.add(parts[0])
    return project, other


@pytest.fixture(scope="module")
def graph():
    known = _modules()
    return known, {m: _imports(p, m, known) for m, p in known.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return next(FLOWGRPO_LAYERS[".".join(parts[:k])] for k in range(len(parts), 0, -1)
                if ".".join(parts[:k]) in FLOWGRPO_LAYERS)


def test_samplers_and_worlds_import_only_torch_numpy_and_the_standard_library(graph):
    """(and PIL, for the worlds' contact sheets)"""
    _, edges = graph
    allowed = {"samplers": {"torch"}, "worlds": {"torch", "numpy", "PIL"}}
    for module, (_, other) in edges.items():
        top = module.split(".")[0]
        if top in allowed:
            bad = other - set(sys.stdlib_module_names) - allowed[top]
            assert not bad, f"{module} imports {sorted(bad)}: {top}/ may import only {sorted(allowed[top])} and the stdlib"


def test_packages_import_only_lower_ones(graph):
    _, edges = graph
    for module, (project, _) in edges.items():
        top = module.split(".")[0]
        for target in project:
            other = target.split(".")[0]
            assert other == top or other in MAY_IMPORT[top], f"{module} imports {target}: {top}/ may not import {other}/"
            if other == "gallery" and top != "gallery":
                assert module.startswith("flowgrpo.cli"), f"{module} imports {target}: only the command lines build the gallery"


def test_flowgrpo_layers_point_down(graph):
    _, edges = graph
    for module, (project, _) in edges.items():
        if not module.startswith("flowgrpo"):
            continue
        for target in project:
            if target.startswith("flowgrpo"):
                assert _layer(target) <= _layer(module), (
                    f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)}), a higher layer")


def test_learners_see_the_policy_never_the_loop(graph):
    _, edges = graph
    for module, (project, _) in edges.items():
        if module.startswith("flowgrpo.engine.learners"):
            engine = {t for t in project if t.startswith("flowgrpo.engine")}
            bad = {t for t in engine if not any(t == ok or t.startswith(ok + ".") for ok in LEARNER_MAY_IMPORT)}
            assert not bad, f"{module} imports {sorted(bad)}: a learner sees the policy and the formulas, not the loop"
            source = (ROOT / Path(*module.split("."))).with_suffix(".py")
            text = source.read_text() if source.is_file() else (ROOT / Path(*module.split(".")) / "__init__.py").read_text()
            assert "trainer." not in text and "self.trainer" not in text, f"{module} reads a trainer attribute"


def test_the_import_graph_has_no_circle(graph):
    known, edges = graph
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components (the graph is a few hundred modules deep at most)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in known:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)  # other tests (a JSON nesting bomb) rely on the default limit
    assert not circles, f"import circles: {circles}"


def test_the_plan_is_asked_not_rederived():
    """plan_arguments (the config's view of the plan) is read by the config code alone; the loop asks the plan."""
    users = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
             if "plan_arguments" in p.read_text() and p.parent != ROOT / "flowgrpo" / "config"]
    assert not users, f"plan_arguments outside flowgrpo/config/: {users}"


def test_the_trainer_reads_like_a_recipe():
    lines = (ROOT / "flowgrpo" / "engine" / "trainer.py").read_text().count("\n")
    assert lines <= 300, f"flowgrpo/engine/trainer.py has {lines} lines (at most 300)"


def test_nothing_cites_a_file_outside_the_repository():
    """Every document the code and docs point to is in the repository (docs/math.md, docs/design.md, ...)."""
    outside = ["../" + "shared", *(name + ".md" for name in ("MATH", "DESIGN", "STYLE", "LAYOUT", "ENVIRONMENT",
                                                           "MEASUREMENTS", "PAPERS"))]
    found = []
    for path in ROOT.rglob("*"):
        if any(part in (".git", ".venv", "runs", "node_modules", "build", "dist") or part.startswith(".")
               for part in path.relative_to(ROOT).parts):
            continue
        if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".toml", ".txt", ".js", ".html", ".cpp", ".h", ".cu", ""):
            text = path.read_text(errors="ignore")
            found += [f"{path.relative_to(ROOT)}: {name}" for name in outside if name in text]
    assert not found, f"references to files outside the repository: {found[:20]}"


# paths that are written as examples or exist only elsewhere (a built wheel's package data, a run's output)
NOT_FILES_HERE = {"configs/presets/x.yaml", "flowgrpo/_data", "flowgrpo/_data/configs", "flowgrpo/_data/csrc",
                  "csrc/likelihood", "docs/results/memory_check.json", "docs/bench_methods.jsonl"}


HISTORIC = ("reproduce/official/data", "docs/results/suite_cost/")


def test_every_path_the_code_and_docs_cite_exists():
    """A path into the project written in a docstring, a comment or a doc (flowgrpo/..., tests/..., docs/..., ...) names
    a file or folder that exists: docs and docstrings that drift from the code fail here. Patterns (``test_<family>.py``,
    ``*``) and NOT_FILES_HERE are left out; reproduce/official/data, the results' data files and the suite-cost
    measurements (docs/results/suite_cost/, reports of the tree as it was then) are records, not citations."""
    import re

    cited = re.compile(r"(?<![\w/.-])((?:flowgrpo|samplers|rewards|gallery|csrc|configs|tests|docs|benchmarks|worlds|"
                       r"constraints|reproduce)/[\w/.-]*\w)(?![\w<{*])")
    missing = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in (".git", ".venv", "runs", "node_modules", "build", "dist") or part.startswith(".")
               for part in rel.parts) or not path.is_file():
            continue
        # the official data and the suite-cost measurements (reports of the tree as it was then) are records
        if path.suffix not in (".py", ".md", ".yaml", ".toml", ".sh") or str(rel).startswith(HISTORIC):
            continue
        for match in cited.finditer(path.read_text(errors="ignore")):
            target = match.group(1)
            if target not in NOT_FILES_HERE and not (ROOT / target).exists():
                missing.append(f"{rel}: {target}")
    assert not missing, f"cited paths that do not exist: {sorted(set(missing))[:30]}"
