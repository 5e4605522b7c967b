"""Remote rewards: an HTTP reward server that hosts any registered reward, and its client.

Protocol (JSON over HTTP, never pickle):

    GET  /health  -> {"status": "ok", "reward": name, "modality": ..., "max_batch": ..., "max_body_bytes": ...}
    POST /score   {"prompts": [B str], "metadata": [B objects] | null,
                   "images": [B base64 PNG]}                    (image rewards)
                or {"videos": [B base64 MP4 | B lists of base64 PNG frames]}   (video rewards)
                 "conditions": [B lists of base64 PNG]     (optional: each sample's condition images, an edit's
                                                           source; a reward that judges edits needs them)
              -> {"scores": [B float | null (NaN)], "info": {...}}

Errors are JSON {"error": message}: 400 malformed JSON or request, 401 bad or missing bearer token,
404 unknown path, 411 no Content-Length, 413 body / batch / image too large, 415 not JSON,
422 the reward rejected the input (e.g. a prompt it cannot parse), 500 the reward failed,
503 too many requests in flight, 504 scoring took longer than timeout_s. The server keeps serving.

The server binds 127.0.0.1 by default and refuses other addresses unless allow_non_loopback=True
(then set a token). Scoring runs on one worker thread, so the hosted reward is never called
concurrently. A request that times out keeps the worker busy until its call returns (a Python thread
cannot be killed); later requests queue behind it.

Run a server:   python -m rewards.remote --reward pickscore --port 8700 [--kwargs '{"divide_by": 26}']
                (token from the environment variable named by --token-env, default FLOWGRPO_REWARD_TOKEN)
Use it:         RemoteReward("http://127.0.0.1:8700", token=...)(images, prompts)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch

from rewards.base import Reward, RewardOutput
from rewards.codec import DecodeError, TooLarge, decode_png, decode_video, encode_png, encode_video

logger = logging.getLogger(__name__)
ALLOWED_KEYS = {"prompts", "metadata", "images", "videos", "conditions"}
DRAIN_LIMIT = 16 * 1024 * 1024  # bytes of a rejected body read and dropped before answering


class RequestError(Exception):
    """A request the server answers with a 4xx."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def to_jsonable(value, depth: int = 0):
    """Tensors, arrays and floats to JSON values; NaN and inf become null; unknown objects their repr."""
    if depth > 20:
        return repr(value)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.tolist() if value.dtype != torch.bfloat16 else value.float().tolist()
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, depth + 1) for v in value]
    return repr(value)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RewardServer:
    """Host `reward` over HTTP (see the module docstring). `start()` serves from a daemon thread;
    `serve_forever()` blocks. port=0 picks a free port (read it from `.port` / `.url`)."""

    def __init__(self, reward: Reward, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
                 max_body_bytes: int = 64 * 1024 * 1024, max_batch: int = 64, max_pixels: int = 2048 * 2048,
                 max_frames: int = 256, timeout_s: float = 300.0, socket_timeout_s: float = 30.0,
                 max_in_flight: int = 16, allow_non_loopback: bool = False):
        if not isinstance(reward, Reward):
            raise TypeError(f"RewardServer hosts a rewards.base.Reward, got {type(reward).__name__}")
        if reward.modality == "vector":
            raise ValueError(f"the reward server carries images and videos; {reward.name!r} scores vectors "
                             "(the analytic world): run it in the training process instead")
        if not is_loopback(host) and not allow_non_loopback:
            raise ValueError(
                f"refusing to bind {host!r}: the reward server binds loopback only unless allow_non_loopback=True "
                "(then also set a token and put it behind your own network controls)"
            )
        if not is_loopback(host) and not token:
            logger.warning("reward server on %s without a token: anyone who can reach it can use it", host)
        self.reward, self.token = reward, token
        self.max_body_bytes, self.max_batch = int(max_body_bytes), int(max_batch)
        self.max_pixels, self.max_frames, self.timeout_s = int(max_pixels), int(max_frames), float(timeout_s)
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-worker")
        self.requests_served = 0
        handler = type("Handler", (_Handler,), {"server_state": self, "timeout": socket_timeout_s})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        return f"http://{host if ':' not in host else f'[{host}]'}:{self.port}"

    def start(self) -> RewardServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="reward-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- request handling

    def health(self) -> dict:
        return {"status": "ok", "reward": self.reward.name, "modality": self.reward.modality,
                "sees_condition": bool(self.reward.sees_condition),
                "max_batch": self.max_batch, "max_body_bytes": self.max_body_bytes}

    def parse(self, body: bytes) -> tuple[torch.Tensor, list[str], list[dict] | None, torch.Tensor | None]:
        """JSON body -> (uint8 batch, prompts, metadata, uint8 conditions [B, K, 3, H, W] or None); raises
        RequestError for anything malformed."""
        try:
            request = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise RequestError(400, f"body is not valid JSON: {exc}") from None
        if not isinstance(request, dict):
            raise RequestError(400, f"body must be a JSON object with keys {sorted(ALLOWED_KEYS)}")
        unknown = set(request) - ALLOWED_KEYS
        if unknown:
            raise RequestError(400, f"unknown keys {sorted(unknown)}; allowed: {sorted(ALLOWED_KEYS)}")
        prompts, metadata = request.get("prompts"), request.get("metadata")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise RequestError(400, "'prompts' must be a list of strings, one per sample")
        if not prompts:
            raise RequestError(400, "empty batch: send at least one sample")
        if len(prompts) > self.max_batch:
            raise RequestError(413, f"batch of {len(prompts)} exceeds max_batch={self.max_batch}; split the request")
        if metadata is not None and (not isinstance(metadata, list) or not all(isinstance(m, dict) for m in metadata)):
            raise RequestError(400, "'metadata' must be null or a list of objects, one per sample")
        if metadata is not None and len(metadata) != len(prompts):
            raise RequestError(400, f"{len(prompts)} prompts but {len(metadata)} metadata entries")
        if ("images" in request) == ("videos" in request):
            raise RequestError(400, "send exactly one of 'images' (base64 PNG) or 'videos' (base64 MP4 / PNG frames)")
        key = "images" if "images" in request else "videos"
        modality = self.reward.modality
        if modality != "both" and (key == "images") != (modality == "image"):
            want = "images" if modality == "image" else "videos"
            raise RequestError(400, f"this server hosts the {modality} reward {self.reward.name!r}: send '{want}'")
        items = request[key]
        if not isinstance(items, list) or len(items) != len(prompts):
            raise RequestError(400, f"'{key}' must be a list with one entry per prompt ({len(prompts)})")
        try:
            if key == "images":
                tensors = [decode_png(x, self.max_pixels, f"images[{i}]") for i, x in enumerate(items)]
            else:
                tensors = [decode_video(x, self.max_frames, self.max_pixels, f"videos[{i}]") for i, x in enumerate(items)]
        except TooLarge as exc:
            raise RequestError(413, str(exc)) from None
        except DecodeError as exc:
            raise RequestError(400, str(exc)) from None
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise RequestError(400, f"all {key} in one request must have the same shape, got {sorted(shapes)}")
        return torch.stack(tensors), prompts, metadata, self._conditions(request.get("conditions"), len(prompts))

    def _conditions(self, rows, batch: int) -> torch.Tensor | None:
        """The request's condition images (one list of base64 PNGs per sample, as many each), or None."""
        if rows is None:
            return None
        if not isinstance(rows, list) or len(rows) != batch or not all(isinstance(r, list) and r for r in rows) \
                or len({len(r) for r in rows}) != 1:
            raise RequestError(400, f"'conditions' must be a list of {batch} non-empty lists of base64 PNG, as many each")
        try:
            images = [[decode_png(x, self.max_pixels, f"conditions[{i}][{k}]") for k, x in enumerate(r)]
                      for i, r in enumerate(rows)]
        except TooLarge as exc:
            raise RequestError(413, str(exc)) from None
        except DecodeError as exc:
            raise RequestError(400, str(exc)) from None
        if len({tuple(x.shape) for r in images for x in r}) != 1:
            raise RequestError(400, "all condition images in one request must have the same shape")
        return torch.stack([torch.stack(r) for r in images])

    def score(self, batch: torch.Tensor, prompts: list[str], metadata, conditions=None) -> dict:
        future = self._worker.submit(self.reward.score, batch, prompts, metadata,
                                     conditions if self.reward.sees_condition else None)
        try:
            out = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise RequestError(504, f"scoring took longer than timeout_s={self.timeout_s}") from None
        except (ValueError, TypeError) as exc:
            raise RequestError(422, f"{self.reward.name} rejected the input: {exc}") from None
        self.requests_served += 1
        return {"scores": to_jsonable(out.scores.float()), "info": to_jsonable(out.info)}


class _Handler(BaseHTTPRequestHandler):
    server_state: RewardServer  # set on the subclass made per server
    protocol_version = "HTTP/1.0"  # one request per connection: no keep-alive state to get wrong
    error_content_type = "application/json"
    error_message_format = '{"error": "%(message)s (%(code)d)"}'

    def log_message(self, fmt, *args) -> None:  # route the stdlib's stderr log to logging
        logger.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _authorized(self) -> bool:
        token = self.server_state.token
        if not token:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorized():
            return self._send(401, {"error": "missing or wrong bearer token (header 'Authorization: Bearer <token>')"})
        if self.path.split("?")[0] != "/health":
            return self._send(404, {"error": f"unknown path {self.path!r}; use GET /health or POST /score"})
        self._send(200, self.server_state.health())

    def _drain(self, length: int) -> None:
        """Read and drop an unread body (up to a cap) so the client sees the error response instead of a
        connection reset."""
        remaining = min(length, self.server_state.max_body_bytes, DRAIN_LIMIT)
        try:
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 1 << 16))
                if not chunk:
                    break
                remaining -= len(chunk)
        except OSError:
            pass

    def do_POST(self) -> None:  # noqa: N802
        state = self.server_state
        started = time.perf_counter()
        length, body_read = 0, False
        try:
            length_header = self.headers.get("Content-Length")
            if length_header is None:
                raise RequestError(411, "Content-Length is required")
            try:
                length = int(length_header)
            except ValueError:
                raise RequestError(400, f"bad Content-Length {length_header!r}") from None
            if length < 0:
                length = 0
                raise RequestError(400, "negative Content-Length")
            if not self._authorized():
                raise RequestError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")
            if self.path.split("?")[0] != "/score":
                raise RequestError(404, f"unknown path {self.path!r}; use POST /score")
            content_type = self.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise RequestError(415, f"Content-Type must be application/json, got {content_type!r}")
            if length > state.max_body_bytes:
                raise RequestError(413, f"body of {length} bytes exceeds max_body_bytes={state.max_body_bytes}")
            body = self.rfile.read(length)
            body_read = True
            if len(body) != length:
                raise RequestError(400, f"body ended after {len(body)} of {length} bytes")
            if not state._slots.acquire(blocking=False):
                raise RequestError(503, "server busy: too many requests in flight; retry later")
            try:
                batch, prompts, metadata, conditions = state.parse(body)
                payload = state.score(batch, prompts, metadata, conditions)
            finally:
                state._slots.release()
            payload["info"]["server_seconds"] = round(time.perf_counter() - started, 4)
            self._send(200, payload)
        except RequestError as exc:
            if not body_read:
                self._drain(length)
            self._send(exc.status, {"error": exc.message})
        except (socket.timeout, ConnectionError) as exc:
            logger.info("reward server: client connection failed: %s", exc)
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001  (the server must keep serving)
            logger.exception("reward server: %s failed", state.reward.name)
            try:
                self._send(500, {"error": f"{state.reward.name} failed: {type(exc).__name__}: {exc}"})
            except OSError:
                self.close_connection = True


# --------------------------------------------------------------------------- client


class RemoteRewardError(RuntimeError):
    """The server answered with an error (status) or could not be reached after the retries."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteReward(Reward):
    """A reward scored by a RewardServer. Retries connection errors, timeouts, 408/429/5xx with
    exponential backoff (backoff_s * 2^attempt); a 4xx other than 408/429 is the caller's error and is
    raised at once. batch_size: samples per request (default: the server's max_batch)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0, retries: int = 2,
                 backoff_s: float = 0.5, batch_size: int | None = None, video_format: str = "png",
                 name: str | None = None, modality: str | None = None):
        self.url, self.token, self.timeout = url.rstrip("/"), token, float(timeout)
        self.retries, self.backoff_s, self.video_format = int(retries), float(backoff_s), video_format
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via env proxies
        self.batch_size = batch_size
        health = self.health() if modality is None or batch_size is None or name is None else {}
        if health:
            modality = modality or health["modality"]
            self.batch_size = batch_size or int(health["max_batch"])
            name = name or f"remote:{health['reward']}"
        self.name, self.modality = name, modality
        self.sees_condition = bool(health.get("sees_condition", False))  # the hosted reward judges edits

    def _request(self, path: str, payload: dict | None) -> dict:
        data = None if payload is None else json.dumps(payload, allow_nan=False).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + path, data=data, headers=headers,
                                             method="GET" if data is None else "POST")
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                try:
                    message = json.loads(exc.read()).get("error", "")
                except Exception:  # noqa: BLE001
                    message = exc.reason
                error = RemoteRewardError(f"{self.url}{path} answered {exc.code}: {message}", exc.code)
                if exc.code not in (408, 429) and exc.code < 500:
                    raise error from None
                last_error = error
            except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
                last_error = exc
            logger.warning("remote reward %s%s: attempt %d failed: %s", self.url, path, attempt + 1, last_error)
        raise RemoteRewardError(f"{self.url}{path} failed after {self.retries + 1} attempts: {last_error}",
                                getattr(last_error, "status", None))

    def health(self) -> dict:
        return self._request("/health", None)

    def score_uint8(self, images, prompts, metadata, conditions=None) -> RewardOutput:
        scores, infos, sizes = [], [], []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            payload: dict = {"prompts": prompts[start:stop], "metadata": None if metadata is None else metadata[start:stop]}
            try:
                json.dumps(payload["metadata"], allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{self.name}: metadata must be JSON-serialisable (no NaN) to send it: {exc}") from None
            if conditions is not None:
                payload["conditions"] = [[encode_png(x) for x in row] for row in conditions[start:stop]]
            if images.ndim == 4:
                payload["images"] = [encode_png(image) for image in images[start:stop]]
            else:
                payload["videos"] = [encode_video(video, self.video_format) for video in images[start:stop]]
            response = self._request("/score", payload)
            chunk = response.get("scores")
            if not isinstance(chunk, list) or len(chunk) != len(payload["prompts"]):
                raise RemoteRewardError(f"{self.url}/score returned {len(chunk) if isinstance(chunk, list) else chunk!r} "
                                        f"scores for {len(payload['prompts'])} samples")
            scores += [math.nan if s is None else float(s) for s in chunk]
            infos.append(response.get("info", {}))
            sizes.append(len(chunk))
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), info=_merge_infos(infos, sizes))


def _merge_infos(infos: list[dict], sizes: list[int]) -> dict:
    """Per-sample lists of the chunks are concatenated; other values are kept per chunk."""
    if len(infos) == 1:
        return infos[0]
    merged = {}
    for key in {k for info in infos for k in info}:
        values = [info.get(key) for info in infos]
        if all(isinstance(v, list) and len(v) == n for v, n in zip(values, sizes)):
            merged[key] = [x for v in values for x in v]
        else:
            merged[key] = values
    return merged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a registered reward over HTTP (JSON + base64 PNG/MP4).")
    parser.add_argument("--reward", required=True, help="registered name or dotted path module:Class")
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the reward")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--token-env", default="FLOWGRPO_REWARD_TOKEN",
                        help="environment variable holding the bearer token (unset: no token)")
    parser.add_argument("--allow-non-loopback", action="store_true")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-body-mb", type=float, default=64)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    from rewards import load_reward

    logging.basicConfig(level=logging.INFO)
    reward = load_reward(args.reward, **json.loads(args.kwargs))
    server = RewardServer(reward, args.host, args.port, token=os.environ.get(args.token_env) or None,
                          max_batch=args.max_batch, max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                          timeout_s=args.timeout, allow_non_loopback=args.allow_non_loopback)
    logger.info("serving %s (%s) at %s", reward.name, reward.modality, server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
