"""The official runs' training prompt sets, by name: where each comes from, its checksum, and its file here.

A set is a file of an official repository at a commit, named by its git blob id (``git hash-object FILE`` prints it:
the SHA-1 of ``blob <size>\\0`` and the bytes), which is how the repositories themselves name it, so the id proves the
file is the official one byte for byte. A set small enough is shipped in configs/prompts/; the others are fetched once
into the user's cache (``flowgrpo prompts fetch NAME``, or on first use), checked against the id, then read like any
prompt file. configs/prompts/SOURCES.md lists the sets, their sources, licences and the presets whose recipes name
them.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flowgrpo.run.errors import UserError

# where a fetched set is read from: {repository}, {commit} and {path} filled in (FLOWGRPO_PROMPTS_URL overrides it, e.g.
# a mirror reachable from a cluster without GitHub: file:///shared/mirror/{repository}/{commit}/{path})
DEFAULT_URL = "https://raw.githubusercontent.com/{repository}/{commit}/{path}"


@dataclass(frozen=True)
class PromptSet:
    """One official training prompt set: the file ``path`` of ``repository`` at ``commit``, git blob id ``blob``."""

    name: str
    repository: str
    commit: str
    path: str
    blob: str
    licence: str
    what: str  # what the prompts are, and which official runs train on them
    shipped: str = ""  # its file in configs/prompts/ when flowgrpo ships it

    @property
    def filename(self) -> str:
        return self.shipped or f"{self.name}{Path(self.path).suffix}"

    @property
    def url(self) -> str:
        template = os.environ.get("FLOWGRPO_PROMPTS_URL") or DEFAULT_URL
        return template.format(repository=self.repository, commit=self.commit, path=self.path)


FLOW_GRPO = ("yifan123/flow_grpo", "ac4c86e8cae021841f1fde853d340e0db67690dd")  # the commit the blob ids were read at
DANCEGRPO = ("XueZeyue/DanceGRPO", "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344")
TRAINING_PROMPT_SETS = {s.name: s for s in (
    PromptSet("geneval-train", *FLOW_GRPO, "dataset/geneval/train_metadata.jsonl",
              "0b97e8a6802c08fc7537cd00c76ae79c851bddcb", "MIT (flow_grpo)",
              "Flow-GRPO's GenEval-style training prompts with their objects, counts, colours and positions (the "
              "GenEval launches of Flow-GRPO, DiffusionNFT, AWM, DGPO, GRPO-Guard, TempFlow, OP-GRPO)"),
    PromptSet("ocr-train", *FLOW_GRPO, "dataset/ocr/train.txt", "3ce0521b77b0a9031191d66ecc36ebaaf27a3922",
              "MIT (flow_grpo)",
              "Flow-GRPO's text-rendering training prompts (the OCR launches of the Flow-GRPO family and Flow-Factory's "
              "CRD)"),
    PromptSet("pickscore-train", *FLOW_GRPO, "dataset/pickscore/train.txt", "a437bd921c03fbc00c4e7ce148ae2d28fcd6e49b",
              "MIT (flow_grpo); the prompts are Pick-a-Pic's (Kirstain et al. 2023)",
              "25,432 Pick-a-Pic prompts (the PickScore, HPS, CLIPScore and multi-reward launches of the Flow-GRPO "
              "family, UniRL's Flow-DPPO)", shipped="pickscore_train.txt"),
    PromptSet("hpd-train", *DANCEGRPO, "assets/prompts.txt", "b47234e475645222ca9a0bb7742ebf4d08123855",
              "Apache-2.0 (DanceGRPO); the prompts are HPDv2's (Wu et al. 2023)",
              "the HPDv2 training prompts DanceGRPO ships (DanceGRPO, MixGRPO, BranchGRPO, G²RPO and VisualGRPO's "
              "E-GRPO embed this same file)"),
)}


class PromptSetError(UserError, ValueError):
    """An official prompt set that is not here and could not be fetched, or whose bytes are not the official ones."""


def git_blob_id(data: bytes) -> str:
    """The id git gives a file of these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache_dir() -> Path:
    """Where fetched sets are kept: $FLOWGRPO_CACHE/prompts, else $XDG_CACHE_HOME/flowgrpo/prompts (~/.cache/...)."""
    if os.environ.get("FLOWGRPO_CACHE"):
        return Path(os.environ["FLOWGRPO_CACHE"]) / "prompts"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowgrpo" / "prompts"


def local_file(name: str) -> Path:
    """Where set ``name``'s file is (or goes) on this machine: configs/prompts/ when shipped, else the cache."""
    from flowgrpo.run.paths import configs_dir

    s = TRAINING_PROMPT_SETS[name]
    return configs_dir() / "prompts" / s.shipped if s.shipped else cache_dir() / s.filename


def prompt_set_file(name: str, fetch: bool = True) -> Path:
    """The checked file of set ``name``: shipped, already fetched, or (``fetch``) fetched now. A file whose bytes are
    not the official ones is refused (and a fetched one is not kept)."""
    s, path = TRAINING_PROMPT_SETS[name], local_file(name)
    if path.is_file():
        found = git_blob_id(path.read_bytes())
        if found != s.blob:
            raise PromptSetError(f"prompt set {name!r}: {path} is not {s.repository}@{s.commit[:7]} {s.path} (its git "
                                 f"blob id is {found}, the official file's {s.blob}); delete it and run `flowgrpo "
                                 f"prompts fetch {name}`")
        return path
    if not fetch:
        raise PromptSetError(f"prompt set {name!r} is not on this machine: `flowgrpo prompts fetch {name}` puts it at "
                             f"{path}")
    return download(s, path)


def download(s: PromptSet, path: Path) -> Path:
    """Fetch ``s`` to ``path``: written under a temporary name and moved into place only once its blob id is the
    official one (several processes fetching at once each write their own and the last move wins, the same bytes)."""
    where = (f"fetch it where the network reaches the source (`flowgrpo prompts fetch {s.name}`), or put the file "
             f"({s.repository}@{s.commit[:7]} {s.path}) at {path}")
    try:
        with urllib.request.urlopen(s.url, timeout=60) as response:  # noqa: S310 (a URL of this table, or the user's)
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PromptSetError(f"prompt set {s.name!r} could not be fetched from {s.url} ({exc}); {where}") from None
    found = git_blob_id(data)
    if found != s.blob:
        raise PromptSetError(f"prompt set {s.name!r}: {s.url} gave {len(data):,} bytes whose git blob id is {found}, "
                             f"not the official file's {s.blob}; nothing was kept. {where}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)
    print(f"flowgrpo: fetched the training prompts {s.name!r} ({len(data):,} bytes, git blob {s.blob[:12]}) from {s.url} "
          f"into {path}", file=sys.stderr, flush=True)
    return path


def describe() -> list[str]:
    """A line per set: its name, where it is here (or that it is not yet), its source and what it is."""
    lines = []
    for name, s in TRAINING_PROMPT_SETS.items():
        path = local_file(name)
        state = "shipped" if s.shipped else ("fetched" if path.is_file() else "not fetched")
        lines.append(f"{name:16s} {state:12s} {s.repository}@{s.commit[:7]} {s.path} (git blob {s.blob[:12]}; "
                     f"{s.licence}): {s.what}")
    return lines
