"""Serve a run's gallery on 127.0.0.1, pick up new steps while training runs, and save review flags.

    python -m gallery runs/NAME --serve [--port 8000]

GET  /data/index.js   rebuilds the site first (incrementally, at most every ``rebuild_every`` s),
                      so the page's poll sees steps written since the last build
GET  /api/flags       the run's review/flags.json ({"version", "run", "flags": {key: flag}})
POST /api/flags       one flag {"key", "labels", "note"[, "step", "prompt"]}; no labels and an empty
                      note delete it; saved atomically to runs/NAME/review/flags.json
Everything else is a static file of the site. The server binds 127.0.0.1 only, answers only requests
whose Host is 127.0.0.1 or localhost (no DNS rebinding) and takes a POST only as application/json
from its own origin (a web page elsewhere cannot write flags through the reviewer's browser).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from gallery.build import build_site, describe

MAX_BODY = 16 * 1024
MAX_FLAGS = 100_000
_LIMITS = {"key": 300, "note": 4000, "step": 200, "prompt": 2000}
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # notes keep \t \n \r


class FlagError(ValueError):
    """A flag that is not of the documented shape (HTTP 400)."""


def validate_flag(body) -> dict:
    """The flag as stored, or FlagError naming what is wrong."""
    if not isinstance(body, dict):
        raise FlagError("a flag is a JSON object")
    unknown = set(body) - {"key", "labels", "note", "step", "prompt"}
    if unknown:
        raise FlagError(f"unknown fields {sorted(unknown)}")
    for field, limit in _LIMITS.items():
        value = body.get(field, "")
        if not isinstance(value, str) or len(value) > limit:
            raise FlagError(f"{field} must be a string of at most {limit} characters")
    if not body.get("key") or _CONTROL.search(body["key"]) or "\n" in body["key"]:
        raise FlagError("key must be a non-empty single line")
    labels = body.get("labels", [])
    if not isinstance(labels, list) or len(labels) > 8:
        raise FlagError("labels must be a list of at most 8 strings")
    for label in labels:
        if not isinstance(label, str) or not 0 < len(label) <= 40 or _CONTROL.search(label) or "\n" in label:
            raise FlagError("each label is a single line of 1 to 40 characters")
    return {"labels": sorted(set(labels)), "note": body.get("note", ""), "step": body.get("step", ""),
            "prompt": body.get("prompt", ""), "key": body["key"]}


class FlagStore:
    """runs/NAME/review/flags.json, read and rewritten whole under a lock (atomic replace)."""

    def __init__(self, run_dir: Path):
        self.run = Path(run_dir).name
        self.path = Path(run_dir) / "review" / "flags.json"
        self.lock = threading.Lock()

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        flags = data.get("flags") if isinstance(data, dict) else None
        return {"version": 1, "run": self.run, "flags": flags if isinstance(flags, dict) else {}}

    def update(self, flag: dict) -> dict | None:
        """Store (or, with no labels and no note, delete) one validated flag; returns what is stored."""
        key = flag.pop("key")
        with self.lock:
            data = self.read()
            if not flag["labels"] and not flag["note"].strip():
                data["flags"].pop(key, None)
                stored = None
            else:
                if key not in data["flags"] and len(data["flags"]) >= MAX_FLAGS:
                    raise FlagError(f"at most {MAX_FLAGS} flags per run")
                stored = data["flags"][key] = {**flag, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".flags-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        return stored


class GalleryServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, run_dir, out_dir=None, port: int = 8000, rebuild_every: float = 2.0, verbose: bool = False,
                 force: bool = False):
        self.run_dir = Path(run_dir).resolve()
        self.index = build_site(self.run_dir, out_dir, force=force)
        self.site = self.index.parent
        self.flags = FlagStore(self.run_dir)
        self.rebuild_every, self.verbose = rebuild_every, verbose
        self._built_at, self._build_lock = time.monotonic(), threading.Lock()
        super().__init__(("127.0.0.1", port), partial(_Handler, directory=str(self.site)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def rebuild_if_due(self) -> None:
        with self._build_lock:
            if time.monotonic() - self._built_at < self.rebuild_every:
                return
            try:
                build_site(self.run_dir, self.site)
            except Exception as e:  # a half-written step must not take the site down: serve the last build
                print(f"gallery: rebuild failed, serving the previous build: {e!r}", file=sys.stderr)
            self._built_at = time.monotonic()


class _Handler(SimpleHTTPRequestHandler):
    server: GalleryServer

    def _host_ok(self) -> bool:
        port = self.server.server_address[1]
        return self.headers.get("Host", "") in {f"127.0.0.1:{port}", f"localhost:{port}"}

    def _json(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'")
        super().end_headers()

    def do_GET(self) -> None:
        if not self._host_ok():
            return self._json(403, {"error": "Host must be 127.0.0.1 or localhost"})
        path = urlsplit(self.path).path
        if path == "/api/flags":
            return self._json(200, self.server.flags.read())
        if path == "/api/status":
            return self._json(200, {"served": True, "run": self.server.run_dir.name})
        if path == "/data/index.js":
            self.server.rebuild_if_due()
        super().do_GET()

    def do_HEAD(self) -> None:
        if not self._host_ok():
            return self._json(403, {"error": "Host must be 127.0.0.1 or localhost"})
        super().do_HEAD()

    def do_POST(self) -> None:
        if not self._host_ok():
            return self._json(403, {"error": "Host must be 127.0.0.1 or localhost"})
        if urlsplit(self.path).path != "/api/flags":
            return self._json(404, {"error": "POST only to /api/flags"})
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{self.headers['Host']}":
            return self._json(403, {"error": "flags are accepted only from the gallery's own page"})
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            return self._json(415, {"error": "Content-Type must be application/json"})
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._json(411, {"error": "Content-Length required"})
        if not 0 < length <= MAX_BODY:
            return self._json(413, {"error": f"a flag is at most {MAX_BODY} bytes"})
        try:
            stored = self.server.flags.update(validate_flag(json.loads(self.rfile.read(length))))
        except (FlagError, json.JSONDecodeError, UnicodeDecodeError) as e:
            return self._json(400, {"error": str(e)})
        self._json(200, {"ok": True, "flag": stored})

    def list_directory(self, path):
        self.send_error(404, "no directory listings")
        return None

    def log_message(self, format, *args) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


def serve(run_dir, out_dir=None, port: int = 8000, verbose: bool = False, force: bool = False) -> None:
    """Build, then serve until Ctrl-C."""
    server = GalleryServer(run_dir, out_dir, port, verbose=verbose, force=force)
    print(f"gallery of {server.run_dir} ({describe(server.site)}) at {server.url} "
          "(127.0.0.1 only; new steps appear while training runs; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
