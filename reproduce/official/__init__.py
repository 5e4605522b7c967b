"""The official launches, read from the official repositories: readers, and the data files they write.

A *launch* is one run a paper's code makes (a config function, a launch script): every value its config or launch
script sets, every argparse / ml_collections / dataclass default it leaves in place, and the library defaults and
hard-coded constants it relies on that change the run. The readers here take them from a checkout mechanically,
each value with its source (``file:line`` in the checkout, the commit beside it), so that nothing a script could read
is typed by hand:

- ``trace_ml_collections``: runs an ml_collections config function (Flow-GRPO, DiffusionNFT, AWM, DGPO) with
  ``ConfigDict.__setitem__`` watched, so every leaf gets the line that last assigned it (and the config-file lines
  that called it there), and returns the named locals of the config functions (``gpu_number``) too.
- ``argparse_defaults``: every ``add_argument`` of a training script (DanceGRPO, MixGRPO, BranchGRPO), by AST.
- ``dataclass_defaults``: the fields of a config dataclass (SAGE-GRPO's ``TrainingConfig``), by AST.
- ``yaml_values``: every leaf of a hydra / OmegaConf YAML launch (UniRL, VisualGRPO), each at its key's line, its
  interpolations resolved as a run without environment variables resolves them (scalars as OmegaConf reads them on
  request: ``1e-5`` a float).
- ``shell_arguments``: the ``--flag value`` pairs of a launch script's training command, with shell variables
  substituted, each at its line; ``hydra_overrides``: the ``key=value`` hydra overrides of one (VisualGRPO).
- ``code_fact``: a hard-coded constant or call argument, found by a regular expression in a named file, which must
  match exactly once (a moved or changed constant fails the extraction instead of going stale).

Each repository has a module beside this one (``official/<code>.py``) that names its checkout's environment
variable, the presets that follow its code, and its runs; ``reproduce/official/extract.py`` writes one data file per
preset to reproduce/official/data/, and reproduce/official/map/<code>.yaml says what each official key is in flowgrpo
(``reproduce/official/mapping.py``, tests/engine/test_official_recipes.py). reproduce/README.md has the formats.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
MAPS = Path(__file__).resolve().parent / "map"


class ExtractionError(RuntimeError):
    """The checkout does not say what the reader expected (a moved constant, a renamed function)."""


class WrongCommit(ExtractionError):
    """A checkout at another commit than the one flowgrpo's data were read at, told in one line with what to check
    out (the readers would otherwise fail deep inside, on a file or a constant that moved)."""


@dataclass(frozen=True)
class Value:
    """One official value and where it comes from: ``source`` is ``file:line`` in the checkout (``a < b``: the line
    that assigned it, called from b), or a short phrase for a value no line states (an argparse default left in
    place is still the ``add_argument`` line)."""

    value: Any
    source: str


@dataclass
class Launch:
    """One official run: the flowgrpo model config and rewards it corresponds to, and every official value."""

    name: str  # the official name of the run (config function, launch script)
    model: str  # the flowgrpo model config (configs/models/<model>.yaml) of the model it trains
    rewards: list[str]  # the flowgrpo reward names it trains on (as `rewards=[{name: ...}]` would list them)
    values: dict[str, Value] = field(default_factory=dict)
    entry: str = ""  # where the run is defined (``file:line``)


# set (to 1) where a checkout at another commit is read on purpose: extract.py --any-commit, re-reading a newer commit
ANY_COMMIT = "OFFICIAL_ANY_COMMIT"


@dataclass
class Checkout:
    """A checkout of an official repository: ``path`` from the environment variable ``env``; ``commit`` from its git
    metadata or a COMMIT file (a checkout assembled from several commits writes one commit per file there, as
    ``<commit> <path>`` lines, and a ``*`` line for the rest)."""

    repository: str
    env: str
    path: Path
    commits: dict[str, str]

    @classmethod
    def from_env(cls, repository: str, env: str, *, any_commit: bool | None = None) -> "Checkout":
        """The checkout ``env`` names, refused (WrongCommit) where its recorded commit of a file the data were read
        from differs from the data's (``read_at``), unless ``any_commit`` (default: the OFFICIAL_ANY_COMMIT
        variable set)."""
        value = os.environ.get(env)
        if not value:
            raise ExtractionError(f"set {env} to a checkout of https://github.com/{repository}")
        path = Path(value).resolve()
        if not path.is_dir():
            raise ExtractionError(f"{env}={value} is not a directory (a checkout of {repository})")
        checkout = cls(repository, env, path, read_commits(path))
        if any_commit is None:
            any_commit = os.environ.get(ANY_COMMIT, "") not in ("", "0")
        if not any_commit:
            checkout.require(read_at(repository))
        return checkout

    def commit_of(self, relpath: str) -> str:
        return self.commits.get(relpath) or self.commits.get("*", "unknown")

    def require(self, wanted: dict[str, str]) -> None:
        """Refuse, in one line, a checkout whose recorded commit of a file in ``wanted`` ({relpath: commit}) is
        another commit: a git checkout is told the one ``git checkout`` to run, a COMMIT-file folder the commit each
        file needs. A checkout that records no commit (no .git, no COMMIT file) is taken as it is."""
        wrong = {rel: (self.commit_of(rel), want) for rel, want in sorted(wanted.items())
                 if self.commit_of(rel) != "unknown" and not same_commit(self.commit_of(rel), want)}
        if not wrong:
            return
        needed = sorted({want for _, want in wrong.values()})
        if set(self.commits) == {"*"} and len(needed) == 1:
            have, how = self.commits["*"], (f"git -C {self.path} checkout {needed[0]}" if (self.path / ".git").exists()
                                            else f"put its files at {needed[0]} in {self.path} and that commit in "
                                                 "its COMMIT file")
            raise WrongCommit(f"{self.env} is {self.repository} at {have[:7]}; flowgrpo's recipes were read at "
                              f"{needed[0][:7]}: {how}")
        files = "; ".join(f"{want} for " + ", ".join(f"{rel} (has {have[:7]})" for rel, (have, w) in wrong.items()
                                                     if w == want) for want in needed)
        raise WrongCommit(f"{self.env} holds {self.repository} files at other commits than flowgrpo's recipes were "
                          f"read at: {files}; put those files at those commits in {self.path} and name them in its "
                          "COMMIT file")

    def file(self, relpath: str) -> Path:
        path = self.path / relpath
        if not path.is_file():
            raise ExtractionError(f"{self.repository}: {relpath} is not in the checkout {self.path}")
        return path

    def cite(self, relpath: str, line: int | None = None) -> str:
        """``repository@commit7 relpath[:line]``: how docs cite a line of this checkout."""
        return f"{self.repository}@{self.commit_of(relpath)[:7]} {relpath}" + (f":{line}" if line else "")


def same_commit(a: str, b: str) -> bool:
    """Two commit ids name the same commit: equal, or one (7 characters or more) a prefix of the other."""
    return a == b or (min(len(a), len(b)) >= 7 and (a.startswith(b) or b.startswith(a)))


def read_at(repository: str) -> dict[str, str]:
    """{relpath: commit} that the data of ``repository`` were read at: the ``commits:`` of every DATA/<preset>.yaml
    read from it (a file cited there from another repository, ``owner/name@commit7 relpath`` as SAGE-GRPO's data cite
    HunyuanVideo-1.5's Muon, counts for that one). Only each file's head is parsed: ``commits:`` precedes the
    launches."""
    import yaml

    out: dict[str, str] = {}
    for path in sorted(DATA.glob("*.yaml")):
        head = []
        with path.open() as lines:
            for line in lines:
                if line.startswith("generated_by:"):
                    break
                head.append(line)
        data = yaml.safe_load("".join(head)) or {}
        for key, commit in (data.get("commits") or {}).items():
            cited = re.match(r"^([\w.-]+/[\w.-]+)@\w+ (.+)$", key)
            owner, rel = (cited.group(1), cited.group(2)) if cited else (data.get("repository"), key)
            if owner == repository:
                out[rel] = str(commit)
    return out


def read_commits(path: Path) -> dict[str, str]:
    """{relpath or '*': commit} of a checkout: its git HEAD for every file, or the lines of its COMMIT file."""
    if (path / ".git").exists():
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  check=True).stdout.strip()
            return {"*": head}
    commits = {}
    if (path / "COMMIT").is_file():
        for line in (path / "COMMIT").read_text().splitlines():
            parts = line.split()
            if len(parts) == 1:
                commits["*"] = parts[0]
            elif len(parts) == 2:
                commits[parts[1]] = parts[0]
    return commits


# ------------------------------------------------------------------------------------------------ ml_collections
def _plain(value):
    """A config value as plain data: ConfigDicts as dicts, tuples as lists, FieldReferences resolved."""
    from ml_collections import ConfigDict, FieldReference

    if isinstance(value, FieldReference):
        value = value.get()
    if isinstance(value, ConfigDict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def trace_ml_collections(checkout: Checkout, config_file: str, function: str,
                         locals_wanted: dict[str, list[str]] | None = None,
                         cwd: str | None = None) -> tuple[dict[str, Value], dict[str, Value]]:
    """Run ``config_file``'s ``function()`` (an ml_collections config) from the checkout and return
    ({dotted key: Value} of every leaf, {function.name: Value} of the locals asked for).

    Every ``ConfigDict.__setitem__`` made by a frame in the checkout records the frames of the checkout on the stack
    (innermost first); a leaf takes the record of its own key, or of the nearest ancestor assigned whole (a dict
    literal). ``locals_wanted`` = {function name: [local names]}: their values when that function returns, at the
    line that last assigned them. The config module is imported from ``checkout.path`` with the working directory
    ``cwd`` (default: the checkout; configs call ``os.getcwd()`` for dataset paths)."""
    from ml_collections import ConfigDict

    root = str(checkout.path)
    records: dict[tuple[int, str], list[str]] = {}
    original = ConfigDict.__setitem__

    def where() -> list[str]:
        frames, frame = [], sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(root):
                frames.append(f"{os.path.relpath(name, root)}:{frame.f_lineno}")
            frame = frame.f_back
        return frames

    def watched(self, key, value):
        original(self, key, value)
        frames = where()
        if frames:
            records[(id(self), key)] = frames

    locals_found: dict[str, Value] = {}
    wanted = locals_wanted or {}

    def tracer(frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(root) or code.co_name not in wanted:
            return None

        def on_return(frame, event, arg):
            if event == "return":
                for name in wanted[code.co_name]:
                    if name in frame.f_locals:
                        line = _assignment_line(code.co_filename, code.co_name, name)
                        locals_found[f"{code.co_name}.{name}"] = Value(
                            _plain(frame.f_locals[name]), f"{os.path.relpath(code.co_filename, root)}:{line}")
            return on_return

        return on_return

    path = checkout.file(config_file)
    previous_cwd, previous_path = os.getcwd(), list(sys.path)
    ConfigDict.__setitem__ = watched
    sys.settrace(tracer)
    try:
        os.chdir(cwd or root)
        sys.path.insert(0, root)
        spec = importlib.util.spec_from_file_location(f"_official_{Path(config_file).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = getattr(module, function)()
    finally:
        sys.settrace(None)
        ConfigDict.__setitem__ = original
        os.chdir(previous_cwd)
        sys.path[:] = previous_path
    missing = {f"{f}.{n}" for f, names in wanted.items() for n in names} - set(locals_found)
    if missing:
        raise ExtractionError(f"{config_file}: {function}() never had the locals {sorted(missing)}")

    values: dict[str, Value] = {}

    def walk(node, prefix: str, inherited: list[str] | None):
        for key, child in node.items():
            dotted = f"{prefix}{key}"
            frames = records.get((id(node), key), inherited)
            if isinstance(child, ConfigDict) and len(child):
                walk(child, dotted + ".", frames)
            else:
                source = " < ".join(frames) if frames else "not assigned in the checkout"
                values[dotted] = Value(_relative(_plain(child), root), source)

    walk(config, "", None)
    return values, locals_found


def _relative(value, root: str):
    """Paths under the checkout (``os.getcwd()`` in a config) as paths relative to it: the data do not name this
    machine's folders."""
    if isinstance(value, str) and value.startswith(root):
        return value[len(root):].lstrip("/") or "."
    if isinstance(value, list):
        return [_relative(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    return value


def _assignment_line(filename: str, function: str, name: str) -> int:
    """The line of the last plain assignment ``name = ...`` in ``function`` of ``filename``."""
    tree = ast.parse(Path(filename).read_text())
    line = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in inner.targets):
                    line = max(line, inner.lineno)
    if not line:
        raise ExtractionError(f"{filename}: no assignment of {name} in {function}()")
    return line


# ---------------------------------------------------------------------------------------------------- argparse
@dataclass(frozen=True)
class Argument:
    """One ``add_argument``: its dest, default (literal, or the source text when it is not a literal), type name
    (int, float, str, bool for store_true/store_false, or the source text of ``type=``) and line."""

    dest: str
    default: Any
    type: str
    line: int


def argparse_defaults(checkout: Checkout, script: str) -> dict[str, Argument]:
    """Every ``*.add_argument("--name", ...)`` call of ``script``, by AST: {dest: Argument}."""
    tree = ast.parse(checkout.file(script).read_text())
    out: dict[str, Argument] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        long = [f for f in flags if f.startswith("--")] or flags
        if not long:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        dest = keywords["dest"].value if "dest" in keywords else long[0].lstrip("-").replace("-", "_")
        action = keywords.get("action")
        action = action.value if isinstance(action, ast.Constant) else None
        if action in ("store_true", "store_false"):
            default = action == "store_false" if "default" not in keywords else ast.literal_eval(keywords["default"])
            kind = "bool"
        else:
            default = None
            if "default" in keywords:
                try:
                    default = ast.literal_eval(keywords["default"])
                except ValueError:
                    default = ast.unparse(keywords["default"])
            kind = ast.unparse(keywords["type"]) if "type" in keywords else "str"
        out[dest] = Argument(dest, default, kind, node.lineno)
    return out


def dataclass_defaults(checkout: Checkout, module_file: str, class_name: str) -> dict[str, Argument]:
    """The annotated fields with defaults of ``class_name`` in ``module_file``: {name: Argument}. A
    ``field(default_factory=...)`` or a non-literal default is kept as its source text."""
    tree = ast.parse(checkout.file(module_file).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            out = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    default = None
                    if item.value is not None:
                        try:
                            default = ast.literal_eval(item.value)
                        except ValueError:
                            default = ast.unparse(item.value)
                    out[item.target.id] = Argument(item.target.id, default, ast.unparse(item.annotation), item.lineno)
            return out
    raise ExtractionError(f"{module_file} has no class {class_name}")


# ------------------------------------------------------------------------------------------------- shell scripts
@dataclass(frozen=True)
class ShellCommand:
    """The training command of a launch script: its program tokens before the first flag, and {flag: (value, line)}
    (a flag with no value, followed by another flag or the end, has value None)."""

    program: list[str]
    flags: dict[str, tuple[str | None, int]]
    line: int
    variables: dict[str, tuple[str, int]]


def _command_tokens(checkout: Checkout, script: str,
                    marker: str) -> tuple[int, list[tuple[str, int]], dict[str, tuple[str, int]]]:
    """(first line, [(token, line)], the script's variables) of the one command of ``script`` that contains
    ``marker``: backslash continuations joined, comments, lone closing quotes and the output's route (a pipe, a list
    operator, a redirection and what follows) left out; tokens are not substituted yet."""
    lines = checkout.file(script).read_text().splitlines()
    variables: dict[str, tuple[str, int]] = {}
    commands: list[tuple[int, list[tuple[str, int]]]] = []
    i = 0
    while i < len(lines):
        start, text, spans = i, "", []
        while True:
            raw = lines[i]
            stripped = raw.split(" #")[0] if not raw.lstrip().startswith("#") else ""
            continued = stripped.rstrip().endswith("\\")
            body = stripped.rstrip()[:-1] if continued else stripped
            spans.append((len(text), i + 1))
            text += body + " "
            i += 1
            if not continued or i >= len(lines):
                break
        assignment = re.match(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(\S*)\s*$", text)
        if assignment:
            # an assignment from a variable the script never sets (a function's loop variable, $PYTHONPATH) stays
            # unset: only a flag that uses it fails
            with contextlib.suppress(ExtractionError):
                variables[assignment.group(1)] = (_substitute(assignment.group(2), variables).strip("\"'"), start + 1)
            continue
        if marker in text:
            tokens = []
            for match in re.finditer(r"\S+", text):
                line = max(n for offset, n in spans if offset <= match.start())
                tokens.append((match.group(0), line))
            commands.append((start + 1, tokens))
    if len(commands) != 1:
        raise ExtractionError(f"{script}: {len(commands)} commands contain {marker!r} (expected exactly one)")
    start, tokens = commands[0]
    # a lone quote closing a string the command sits in (pdsh -w hosts "... torchrun ... script.py --flag ") is no token
    tokens = [t for t in tokens if t[0] not in ('"', "'")]
    # the command ends at a pipe, a list operator or a redirection (... --flag v 2>&1 | tee log): its output's route
    ends = [i for i, (token, _) in enumerate(tokens) if re.match(r"^(\||&&|;|&|\d*[<>])", token)]
    tokens = tokens[: ends[0]] if ends else tokens
    return start, tokens, variables


def shell_arguments(checkout: Checkout, script: str, marker: str) -> ShellCommand:
    """The command of ``script`` whose text contains ``marker`` (e.g. the training script's file name), with its
    backslash continuations joined and ``$VAR`` / ``${VAR}`` replaced by the script's own earlier ``VAR=value``
    assignments (``export`` included). Exactly one command may contain the marker."""
    start, tokens, variables = _command_tokens(checkout, script, marker)
    program, flags, k = [], {}, 0
    # the program: every token up to the marker where the marker is a token of its own (a launcher's flags, e.g.
    # torchrun --nnodes N script.py, stay in it, unsubstituted), else the tokens before the first flag
    marked = [i for i, (token, _) in enumerate(tokens) if token == marker]
    if marked:
        program, k = [token for token, _ in tokens[: marked[0] + 1]], marked[0] + 1
    while k < len(tokens) and not tokens[k][0].startswith("--") and not marked:
        program.append(_substitute(tokens[k][0], variables))
        k += 1
    while k < len(tokens):
        flag, line = tokens[k]
        if not flag.startswith("--"):
            raise ExtractionError(f"{script}:{line}: {flag!r} follows no flag")
        name = flag[2:]
        value = None
        if "=" in name:
            name, value = name.split("=", 1)
        elif k + 1 < len(tokens) and not tokens[k + 1][0].startswith("--"):
            k += 1
            value = tokens[k][0]
        flags[name.replace("-", "_")] = (None if value is None else " ".join(shlex.split(_substitute(value, variables))),
                                         line)
        k += 1
    return ShellCommand(program, flags, start, variables)


def _substitute(text: str, variables: dict[str, tuple[str, int]]) -> str:
    def replace(match):
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise ExtractionError(f"${name} is not assigned in the script")
        return variables[name][0]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, text)


@dataclass(frozen=True)
class HydraCommand:
    """The training command of a launch script that passes hydra overrides: its program tokens up to the marker
    (substituted: ``torchrun --nproc_per_node=8 fastvideo/train.py``) and {key: (value text, line)} of its
    ``key=value`` overrides, a config group's choice (``algorithm=grpo_merge``) among them."""

    program: list[str]
    overrides: dict[str, tuple[str, int]]
    line: int
    variables: dict[str, tuple[str, int]]


def hydra_overrides(checkout: Checkout, script: str, marker: str) -> HydraCommand:
    """The ``key=value`` hydra overrides of the command of ``script`` that contains ``marker`` as a token of its own
    (the training script), with the script's variables substituted, each at its line. Only plain overrides are read:
    ``+key``, ``++key``, ``~key`` and a flag (``--cfg``, ``-m``) after the marker are refused."""
    start, tokens, variables = _command_tokens(checkout, script, marker)
    marked = [i for i, (token, _) in enumerate(tokens) if token == marker]
    if len(marked) != 1:
        raise ExtractionError(f"{script}:{start}: {marker!r} is not one token of the command")
    program = [_substitute(token, variables) for token, _ in tokens[: marked[0] + 1]]
    overrides: dict[str, tuple[str, int]] = {}
    for token, line in tokens[marked[0] + 1:]:
        match = re.match(r"^([A-Za-z_][\w.]*)=(.*)$", token)
        if match is None:
            raise ExtractionError(f"{script}:{line}: {token!r} is not a plain hydra override key=value")
        if match.group(1) in overrides:
            raise ExtractionError(f"{script}:{line}: {match.group(1)} is overridden twice")
        overrides[match.group(1)] = (_substitute(match.group(2), variables).strip("\"'"), line)
    return HydraCommand(program, overrides, start, variables)


def omegaconf_scalar(text: str):
    """A value as OmegaConf's YAML loader reads it (``1e-5`` a float, which PyYAML's YAML 1.1 rule keeps a string)."""
    import yaml

    return yaml.load(text, Loader=_omegaconf_loader())


def _omegaconf_loader():
    """PyYAML's SafeLoader with OmegaConf's float rule and without timestamps (omegaconf/_yaml.py get_yaml_loader, the
    loader hydra reads its configs with): a number with an exponent and no dot (``1e-5``) is a float."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            """^(?:
         [-+]?[0-9]+(?:_[0-9]+)*\\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\\.[0-9_]*
        |[-+]?\\.(?:inf|Inf|INF)
        |\\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    Loader.yaml_implicit_resolvers = {
        key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for key, resolvers in Loader.yaml_implicit_resolvers.items()
    }
    return Loader


def typed(text: str | None, kind: str):
    """A launch-script value as argparse would parse it with ``type=kind`` (bool flags: present = True)."""
    if kind == "bool":
        return True if text is None else text.lower() in ("1", "true", "yes")
    if text is None:
        raise ExtractionError(f"a flag of type {kind} has no value")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def argparse_launch(checkout: Checkout, script: str, launcher: str, marker: str,
                    prefix: str = "") -> tuple[dict[str, Value], ShellCommand]:
    """Every argument of ``script`` as the launch script ``launcher`` runs it: the launcher's flag where it passes one
    (cited at its line there), else the ``add_argument`` default (cited there). A flag the script does not define is
    an error (argparse would refuse it). Keys are ``prefix + dest``."""
    arguments = argparse_defaults(checkout, script)
    command = shell_arguments(checkout, launcher, marker)
    unknown = sorted(set(command.flags) - set(arguments))
    if unknown:
        raise ExtractionError(f"{launcher} passes {unknown}, which {script} does not define")
    values = {}
    for dest, arg in sorted(arguments.items()):
        if dest in command.flags:
            text, line = command.flags[dest]
            values[prefix + dest] = Value(typed(text, arg.type if arg.type in ("int", "float", "bool") else "str"),
                                          f"{launcher}:{line}")
        else:
            values[prefix + dest] = Value(arg.default, f"{script}:{arg.line} (default)")
    return values, command


# ---------------------------------------------------------------------------------------------------- YAML files
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def yaml_values(checkout: Checkout, relpath: str, *, omegaconf: bool = False,
                skip: tuple[str, ...] = ()) -> dict[str, Value]:
    """Every leaf of the YAML file ``relpath`` (a hydra / OmegaConf config) as {dotted key: Value}, each at the line
    of its key: mappings are walked (an empty one is a leaf), a list is a leaf. OmegaConf interpolations are resolved
    as a run with no environment variable set resolves them: ``${oc.env:NAME,default}`` to its default (text, or None
    for ``null``), ``${oc.decode:text}`` to the YAML value of the text, ``${a.b}`` (absolute) and ``${..b}``
    (relative: each dot past the first one level up) to the value they name; one that names a whole section
    (``${sampling}``) stays its text. A resolved value's source names the interpolation. Merge keys and other
    resolvers are refused. ``omegaconf``: scalars as OmegaConf's loader reads them (``1e-5`` a float: a file hydra
    loads), not PyYAML's YAML 1.1 rule. ``skip``: top-level keys not read (a hydra config's ``defaults`` list and its
    ``hydra`` section, which configure the composition, not the run)."""
    import yaml

    text = checkout.file(relpath).read_text()
    loader = _omegaconf_loader() if omegaconf else yaml.SafeLoader
    root = yaml.compose(text, Loader=loader)
    data = yaml.load(text, Loader=loader)
    if not isinstance(root, yaml.MappingNode):
        raise ExtractionError(f"{relpath}: not a YAML mapping")
    raw: dict[str, tuple[Any, int]] = {}

    def walk(node, value, prefix: str):
        for key_node, child in node.value:
            if key_node.value == "<<":
                raise ExtractionError(f"{relpath}:{key_node.start_mark.line + 1}: merge keys are not read")
            dotted = f"{prefix}{key_node.value}"
            if not prefix and dotted in skip:
                continue
            if isinstance(child, yaml.MappingNode) and child.value:
                walk(child, value[key_node.value], dotted + ".")
            else:
                raw[dotted] = (value[key_node.value], key_node.start_mark.line + 1)

    walk(root, data, "")

    class _Section(Exception):
        pass

    def target(path: str, here: str) -> str:
        if not path.startswith("."):
            return path
        dots = len(path) - len(path.lstrip("."))
        node = here.split(".")[:-1]
        node = node[: len(node) - (dots - 1)] if dots > 1 else node
        return ".".join([*node, path.lstrip(".")])

    def resolve(value, here: str, seen: tuple[str, ...]):
        if not isinstance(value, str):
            return value
        while True:
            match = _INTERPOLATION.search(value)
            if match is None:
                return value
            body = match.group(1)
            if body.startswith("oc.env:"):
                default = body[len("oc.env:"):].partition(",")[2].strip()
                result = None if default in ("", "null") else default
            elif body.startswith("oc.decode:"):
                result = yaml.load(body[len("oc.decode:"):], Loader=loader)
            elif ":" in body:
                raise ExtractionError(f"{relpath}: {here} uses the resolver {body.split(':')[0]!r}, which is not read")
            else:
                name = target(body.strip(), here)
                if name in seen:
                    raise ExtractionError(f"{relpath}: {here}: the interpolation {body!r} refers to itself")
                if name in raw:
                    result = resolve(raw[name][0], name, (*seen, name))
                elif any(k.startswith(name + ".") for k in raw):
                    raise _Section
                else:
                    raise ExtractionError(f"{relpath}: {here} interpolates {body!r}, which the file does not set")
            if match.span() == (0, len(value)):
                return result
            value = value[: match.start()] + ("null" if result is None else str(result)) + value[match.end():]

    values: dict[str, Value] = {}
    for key, (value, line) in raw.items():
        source = f"{relpath}:{line}"
        if isinstance(value, str) and "${" in value:
            try:
                resolved = resolve(value, key, (key,))
            except _Section:
                resolved = value
            if resolved is not value:
                unset = ", no environment variable set" if "oc.env:" in value else ""
                source = f"{source} ({value}{unset})"
            value = resolved
        values[key] = Value(value, source)
    return values


# ---------------------------------------------------------------------------------------------------- code facts
def code_fact(checkout: Checkout, relpath: str, pattern: str, convert=ast.literal_eval,
              function: str | None = None) -> Value:
    """The first group of the one match of ``pattern`` (a regular expression, multiline) in ``relpath`` (within
    ``function``'s source when given), converted (a Python literal by default), at the line where the group starts.
    Zero or several matches are an error naming the pattern: a changed constant fails instead of going stale."""
    text = checkout.file(relpath).read_text()
    offset = 0
    if function is not None:
        tree = ast.parse(text)
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
        if len(nodes) != 1:
            raise ExtractionError(f"{relpath}: {len(nodes)} functions named {function}")
        lines = text.splitlines(keepends=True)
        offset = sum(len(line) for line in lines[: nodes[0].lineno - 1])
        text_scope = "".join(lines[nodes[0].lineno - 1: nodes[0].end_lineno])
    else:
        text_scope = text
    matches = list(re.finditer(pattern, text_scope, re.MULTILINE))
    if len(matches) != 1:
        raise ExtractionError(f"{relpath}{f' ({function})' if function else ''}: {len(matches)} matches of {pattern!r}"
                              " (expected exactly one)")
    match = matches[0]
    line = text[: offset + match.start(1)].count("\n") + 1
    return Value(convert(match.group(1)), f"{relpath}:{line}")


# ------------------------------------------------------------------------------------------ prompts and rewards
def k_repeat_sampler_facts(checkout: Checkout, script: str) -> dict[str, Value]:
    """How a Flow-GRPO-family training script (Flow-GRPO, DiffusionNFT, AWM, DGPO) draws its prompts: its
    DistributedKRepeatSampler takes the first prompts of a fresh ``randperm`` of the set each time it is told a new
    epoch, and the sampling loop tells it one per rollout batch (``epoch * num_batches_per_epoch + i``): each batch
    its own random choice (flowgrpo's train.prompt_draw=batch)."""
    return {
        "code.prompt_sampler_draw": code_fact(
            checkout, script, r"^\s*indices = torch\.(randperm)\(len\(self\.dataset\), generator=g\)\[:\s*self\.m\]", str),
        "code.prompt_sampler_epoch": code_fact(
            checkout, script, r"train_sampler\.set_epoch\((epoch \* config\.sample\.num_batches_per_epoch \+ i)\)", str),
    }


def flow_grpo_reward_facts(checkout: Checkout, rewards: list[str], scorers: str) -> dict[str, Value]:
    """How a Flow-GRPO-family code (its ``scorers`` folder: flow_grpo/) scores the rewards a launch trains on, beyond
    what its config says: PickScore's CLIP logit over 26 (``code.pickscore_divisor``); OCR's full credit to a prompt
    contained in the recognised text (``code.ocr_contained``); GenEval's images reaching the detector either as JPEGs
    posted to its server (PIL's default quality, 75) or as PIL images in-process (``code.geneval_images``)."""
    facts = {}
    if "pickscore" in rewards:
        facts["code.pickscore_divisor"] = code_fact(checkout, f"{scorers}/pickscore_scorer.py", r"scores = scores\s*/\s*(\d+)")
    if "ocr" in rewards:
        facts["code.ocr_contained"] = code_fact(checkout, f"{scorers}/ocr.py", r"^\s*if (prompt in recognized_text):", str)
    if "geneval" in rewards:
        facts["code.geneval_images"] = code_fact(
            checkout, f"{scorers}/rewards.py", r"(img\.save\(buffer, format=\"JPEG\"\)|pil_images = \[Image\.fromarray\(image\) "
            r"for image in image_batch\])", str, function="geneval_score")
    return facts


def epoch_sampler_facts(checkout: Checkout, script: str, preprocess: str, flag: str) -> dict[str, Value]:
    """How a DanceGRPO-family training script draws its prompts, and which file it draws them from: a
    ``DistributedSampler(shuffle=True)`` told the epoch (``set_epoch(epoch)``), so each pass over the set visits every
    prompt once (flowgrpo's train.prompt_draw=pass), over the text embeddings the preprocessing launch ``preprocess``
    computes from the prompt file its ``flag`` names."""
    return {
        "code.prompt_sampler": code_fact(
            checkout, script, r"sampler = (DistributedSampler)\(\s*train_dataset, rank=rank, num_replicas=world_size, "
            r"shuffle=True", str),
        "code.prompt_sampler_epoch": code_fact(checkout, script, r"^\s*sampler\.set_epoch\((epoch)\)", str),
        "code.prompt_file": code_fact(checkout, preprocess, rf'{flag} "([^"]+)"', str),
    }


# ---------------------------------------------------------------------------------------------------- data files
def write_data(preset: str, checkout: Checkout, launches: list[Launch], note: str = "") -> Path:
    """reproduce/official/data/<preset>.yaml: the launches, every value with its source, sorted keys."""
    import yaml

    # the files the sources and entries cite (``file:line``; a paper's, official/papers.py, cite none)
    files = sorted({v.source.split(":")[0] for launch in launches for v in launch.values.values() if ":" in v.source}
                   | {launch.entry.split(":")[0] for launch in launches if ":" in launch.entry})
    data = {
        "preset": preset,
        "repository": checkout.repository,
        "commits": {f: checkout.commit_of(f) for f in files},
        "generated_by": f"reproduce/official/extract.py ({checkout.env})",
        "note": note,
        "launches": {
            launch.name: {
                "model": launch.model,
                "rewards": list(launch.rewards),
                "entry": launch.entry,
                "values": {k: {"value": v.value, "source": v.source} for k, v in sorted(launch.values.items())},
            }
            for launch in launches
        },
    }
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"{preset}.yaml"
    header = (f"# The official launches of `{preset}`, read from {checkout.repository} by reproduce/official/extract.py;\n"
              "# do not edit: rerun the extraction (reproduce/README.md).\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120))
    return path


def read_data(preset: str) -> dict:
    import yaml

    return yaml.safe_load((DATA / f"{preset}.yaml").read_text())
