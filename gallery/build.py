"""Render a run directory (docs/design.md, "The run folder") into a static review site.

    python -m gallery runs/NAME            # -> runs/NAME/gallery/index.html
    from gallery import build_site; build_site("runs/NAME")

The site is self-contained, so it opens from disk (file://), serves from any folder and zips:

    index.html, *.js, gallery.css           the page (plain JS, no framework, no network)
    data/index.js                           run summary, steps (train and eval) with counts and means
    data/steps/<step>.js                    one shard per step: prompt groups and their samples
    data/metrics.js, data/prompts.js        metric columns for the charts; prompt -> steps for compare
    data/flags.js                           review/flags.json of the run as it was at build time
    media/<step>/<file>                     the samples, hard-linked (copied across file systems)
    thumbs/<step>/<file>.jpg                JPEG thumbnails of images larger than THUMB_LIMIT pixels

Data files are JavaScript (``galleryLoad(kind, key, payload)``), not JSON, because a page opened
from file:// may load scripts but not fetch files. Builds are incremental: a step whose manifest
is unchanged (size and mtime) is not re-read, and existing thumbnails are not redrawn.
Only files are read: nothing from the training code is imported.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import time
from pathlib import Path
from urllib.parse import quote

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = ("index.html", "gallery.js", "views.js", "charts.js", "gallery.css")
THUMB_LIMIT = 160  # images with a side above this many pixels get a thumbnail
THUMB_SIZE = 256  # longest side of a thumbnail
VIDEO_SUFFIXES = {".mp4", ".webm", ".mov"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}
CACHE_VERSION = 4  # bump when the shard format changes: every step is re-read once
_SAFE_FILE = re.compile(r"^[^/\\\x00-\x1f]+$")
_STEP_NUMBER = re.compile(r"(\d+)$")


def build_site(run_dir, out_dir=None, force: bool = False) -> Path:
    """Build (or update) the gallery of ``run_dir``; returns the path of its index.html."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    out = Path(out_dir).resolve() if out_dir is not None else run_dir / "gallery"
    (out / "data" / "steps").mkdir(parents=True, exist_ok=True)
    for name in STATIC_FILES:
        _write_if_changed(out / name, (STATIC / name).read_bytes())

    cache_path = out / "data" / "build_cache.json"
    cache = {} if force else _read_json(cache_path, {})
    if cache.get("version") != CACHE_VERSION:
        cache = {}
    old_steps = cache.get("steps", {})
    steps, new_cache = [], {}
    for folder in _step_folders(run_dir / "samples"):
        manifest = folder / "manifest.jsonl"
        st = manifest.stat()
        sig = f"{st.st_size}-{st.st_mtime_ns}"
        shard = out / "data" / "steps" / f"{_file_key(folder.name)}.js"
        cached = old_steps.get(folder.name)
        if cached and cached["sig"] == sig and shard.exists():
            summary = cached["summary"]
        else:
            summary, payload = _read_step(folder, out)
            _write_if_changed(shard, _js("step", folder.name, payload))
        summary["shard"] = f"data/steps/{quote(shard.name)}?v={sig}"
        new_cache[folder.name] = {"sig": sig, "summary": summary}
        steps.append(summary)
    for stale in (out / "data" / "steps").glob("*.js"):
        if stale.stem not in {_file_key(s["name"]) for s in steps}:
            stale.unlink()
    steps.sort(key=lambda s: (s["iteration"] if s["iteration"] is not None else -1, s["kind"] != "eval", s["name"]))

    metrics_sig, metrics_keys = _write_metrics(run_dir / "metrics.jsonl", out, cache.get("metrics"))
    new_cache["metrics"] = {"sig": metrics_sig, "keys": metrics_keys}
    _write_if_changed(out / "data" / "prompts.js", _js("prompts", "", _prompt_index(steps)))
    flags = _read_json(run_dir / "review" / "flags.json", {}).get("flags", {})
    _write_if_changed(out / "data" / "flags.js", _js("flags", "", flags if isinstance(flags, dict) else {}))

    config = run_dir / "config.yaml"
    index = {
        "run": run_dir.name,
        "run_path": str(run_dir),
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": config.read_text(errors="replace")[:200_000] if config.exists() else "",
        "reward_names": _union(s["reward_names"] for s in steps),
        "tasks": sorted(_union(s["tasks"] for s in steps)),
        "num_samples": sum(s["samples"] for s in steps),
        "steps": [{k: v for k, v in s.items() if k != "prompts"} for s in steps],
        "metric_keys": metrics_keys,
        "metrics_version": metrics_sig,
    }
    _write_if_changed(out / "data" / "index.js", _js("index", "", index))
    _write_if_changed(cache_path, json.dumps({"version": CACHE_VERSION, "steps": new_cache}).encode())
    return out / "index.html"


def describe(site: Path) -> str:
    """'N steps, M samples' of a built site (for the command line)."""
    index = json.loads(_strip_js((Path(site) / "data" / "index.js").read_text()))
    return f"{len(index['steps'])} steps, {index['num_samples']} samples"


def _strip_js(text: str) -> str:
    return text[text.index("{"): text.rindex("}") + 1]


def _step_folders(samples: Path) -> list[Path]:
    if not samples.is_dir():
        return []
    return sorted(p for p in samples.iterdir() if p.is_dir() and (p / "manifest.jsonl").is_file())


def _read_step(folder: Path, out: Path) -> tuple[dict, dict]:
    """Parse one manifest into (summary for the index, shard payload); links media and thumbnails."""
    name = folder.name
    kind = "train" if re.fullmatch(r"step_\d+", name) else "eval"
    number = _STEP_NUMBER.search(name)
    groups: dict[tuple, dict] = {}
    reward_names: list[str] = []
    ids: set[str] = set()
    # the manifest's own iteration wins (a benchmark's folders are named after models); else the folder's number
    bad_lines, iteration, from_name = 0, None, int(number.group(1)) if number else None
    media = _StepMedia(folder, out)
    for line in (folder / "manifest.jsonl").read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad_lines += 1  # e.g. a manifest being written right now: the next build reads it whole
            continue
        if not isinstance(row, dict):
            bad_lines += 1
            continue
        if iteration is None and isinstance(row.get("iteration"), int):
            iteration = row["iteration"]
        metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        prompt = str(row.get("prompt", ""))
        slot, group = _int(row.get("prompt_slot")), _int(row.get("group"))
        key = (slot, group, prompt)
        if key not in groups:
            task = metadata.get("task")
            groups[key] = {"prompt": prompt, "task": task if isinstance(task, str) else "",
                           "slot": slot, "group": group, "metadata": metadata, "size": None, "stats": {},
                           "run_seed": _seed(row.get("seed")), "samples": [],
                           # the prompt's condition images (an edit's source), shown beside its samples
                           "sources": [media.fields(f, None)["thumb"] for f in row.get("sources") or []
                                       if isinstance(f, str)]}
        g = groups[key]
        if g["size"] is None:  # the group's true size and reward statistics, saved samples or not
            g["size"] = _int(row.get("group_size"))
        if not g["stats"] and isinstance(row.get("group_rewards"), dict):
            g["stats"] = row["group_rewards"]
        rewards = row.get("rewards") if isinstance(row.get("rewards"), dict) else {}
        for r in rewards:
            if str(r) not in reward_names:
                reward_names.append(str(r))
        node, parent = _int(row.get("node")), _int(row.get("parent"))
        file = row.get("file")
        sample_id = Path(file).stem if isinstance(file, str) and file else f"s{slot or 0:04d}_n{node or 0:04d}"
        while sample_id in ids:
            sample_id += "~"
        ids.add(sample_id)
        sample = {"id": sample_id, "node": node, "parent": parent, "seed": _seed(row.get("noise_seed")),
                  "rewards": {str(k): _float(v) for k, v in rewards.items()}, "adv": _float(row.get("advantage"))}
        sample.update(media.fields(file, row.get("poster")))
        groups[key]["samples"].append(sample)

    iteration = iteration if iteration is not None else from_name
    group_list = list(groups.values())
    for g in group_list:
        # per reward [mean, std, n] over every sample of the group (None: not recorded), aligned like "r"
        g["stats"] = [_group_stat(g["stats"].get(r)) for r in reward_names]
        for s in g["samples"]:  # rewards as a list aligned with the step's reward names
            s["r"] = [s["rewards"].get(r) for r in reward_names]
            del s["rewards"]
    means = {}
    for k, r in enumerate(reward_names):
        values = [s["r"][k] for g in group_list for s in g["samples"] if s["r"][k] is not None]
        means[r] = sum(values) / len(values) if values else None
    summary = {
        "name": name, "kind": kind, "iteration": iteration,
        "samples": sum(len(g["samples"]) for g in group_list), "groups": len(group_list),
        "reward_names": reward_names, "reward_means": means, "bad_lines": bad_lines,
        "tasks": sorted({g["task"] for g in group_list if g["task"]}),
        "prompts": sorted({(g["prompt"], g["task"]) for g in group_list}),
    }
    return summary, {"name": name, "kind": kind, "iteration": iteration, "reward_names": reward_names,
                     "groups": group_list}


class _StepMedia:
    """Links one step's files into the site: one directory listing and one media folder per step, so a
    cold build of tens of thousands of samples costs about one link() and one header read per file."""

    def __init__(self, folder: Path, out: Path):
        self.folder = folder
        self.files = {e.name for e in os.scandir(folder) if e.is_file()}
        key = _file_key(folder.name)
        self.media_dir, self.thumb_dir = out / "media" / key, out / "thumbs" / key
        self.media_dir.mkdir(parents=True, exist_ok=True)

    def fields(self, file, poster) -> dict:
        """A sample's media fields (URLs relative to the site) for its ``file`` and optional ``poster``."""
        out = {"kind": None, "src": None, "thumb": None, "w": None, "h": None}
        src = self._file(file)
        if src is None:
            return out
        suffix = src.suffix.lower()
        out["kind"] = "video" if suffix in VIDEO_SUFFIXES else "image" if suffix in IMAGE_SUFFIXES else "file"
        out["src"] = self._link(src)
        still = src if out["kind"] == "image" else self._file(poster)
        if still is not None and still.suffix.lower() in IMAGE_SUFFIXES:
            size = _image_size(still)
            out["w"], out["h"] = size if size else (None, None)
            if still != src:
                out["poster"] = self._link(still)
            if size and max(size) > THUMB_LIMIT:
                out["thumb"] = _thumbnail(still, self.thumb_dir)
            else:
                out["thumb"] = out["src"] if still == src else out["poster"]
        return out

    def _file(self, file) -> Path | None:
        """A plain file name inside the step folder (never a path out of it), that exists."""
        if not isinstance(file, str) or file not in self.files or not _SAFE_FILE.match(file) or file in (".", ".."):
            return None
        return self.folder / file

    def _link(self, src: Path) -> str:
        dst = self.media_dir / src.name
        try:
            os.link(src, dst)
        except FileExistsError:
            if not _same_file(src, dst):
                dst.unlink()
                self._link(src)
        except OSError:  # another file system, or links not allowed: a copy (kept while it matches)
            if not (dst.exists() and _same_file(src, dst)):
                shutil.copy2(src, dst)
        return f"media/{quote(self.media_dir.name)}/{quote(src.name)}"


def _same_file(src: Path, dst: Path) -> bool:
    a, b = src.stat(), dst.stat()
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev) or (a.st_size == b.st_size and b.st_mtime_ns >= a.st_mtime_ns)


def _thumbnail(src: Path, thumb_dir: Path) -> str:
    dst = thumb_dir / f"{src.name}.jpg"
    url = f"thumbs/{quote(thumb_dir.name)}/{quote(dst.name)}"
    if dst.exists() and dst.stat().st_mtime_ns >= src.stat().st_mtime_ns:
        return url
    from PIL import Image

    thumb_dir.mkdir(parents=True, exist_ok=True)
    with Image.open(src) as im:
        im.thumbnail((THUMB_SIZE, THUMB_SIZE))
        tmp = dst.with_suffix(".tmp")
        im.convert("RGB").save(tmp, "JPEG", quality=85)
    os.replace(tmp, dst)
    return url


def _image_size(path: Path) -> tuple[int, int] | None:
    """(width, height); PNG headers are read directly (fast for tens of thousands of files)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) == 24:
        return struct.unpack(">II", head[16:24])
    try:
        from PIL import Image

        with Image.open(path) as im:
            return im.size
    except Exception:  # an unreadable image still shows in the page, only without its size
        return None


def _write_metrics(path: Path, out: Path, cached: dict | None) -> tuple[str, list[str]]:
    """metrics.jsonl -> data/metrics.js as columns aligned with ``iteration`` (numbers or null)."""
    target = out / "data" / "metrics.js"
    if not path.is_file():
        _write_if_changed(target, _js("metrics", "", {"iteration": [], "series": {}}))
        return "none", []
    st = path.stat()
    sig = f"{st.st_size}-{st.st_mtime_ns}"
    if cached and cached.get("sig") == sig and target.exists():
        return sig, cached["keys"]
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), (int, float)):
            rows.append(row)
    keys = _union([k for k, v in r.items() if k != "iteration" and (v is None or isinstance(v, (int, float)))] for r in rows)
    series = {k: [_round(_float(r.get(k))) for r in rows] for k in keys}
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    _write_if_changed(target, _js("metrics", "", {"iteration": [r["iteration"] for r in rows], "series": series}))
    return sig, list(series)


def _prompt_index(steps: list[dict]) -> list[dict]:
    """Every prompt with the steps (names) it was sampled in, most-repeated first."""
    found: dict[str, dict] = {}
    for s in steps:
        for prompt, task in s["prompts"]:
            entry = found.setdefault(prompt, {"prompt": prompt, "task": task, "steps": []})
            entry["steps"].append(s["name"])
    return sorted(found.values(), key=lambda e: (-len(e["steps"]), e["prompt"]))


def _js(kind: str, key: str, payload) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False)  # ASCII-only: safe inside JS
    return f"galleryLoad({json.dumps(kind)},{json.dumps(key)},{body});\n".encode()


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a page reading while we build sees the old or the new file, never half


def _read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return default


def _file_key(step: str) -> str:
    """A step folder's name as a safe file name: itself when plain, else sanitised + a short hash."""
    if re.fullmatch(r"[A-Za-z0-9_.-]+", step):
        return step
    return re.sub(r"[^A-Za-z0-9_.-]", "_", step) + "-" + hashlib.sha1(step.encode()).hexdigest()[:8]


def _union(lists) -> list:
    seen: dict = {}
    for items in lists:
        for x in items:
            seen.setdefault(x, None)
    return list(seen)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seed(value) -> str | None:
    """A seed as text: generator seeds have up to 63 bits, more than a JavaScript number holds exactly."""
    return str(value) if _int(value) is not None else None


def _group_stat(value) -> list | None:
    if not isinstance(value, dict) or _int(value.get("n")) is None:
        return None
    return [_float(value.get("mean")), _float(value.get("std")), value["n"]]


def _float(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")
