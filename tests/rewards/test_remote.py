"""The reward server and its client: remote scores equal local ones, malformed requests get a 4xx
while the server keeps serving, concurrent clients, a fuzz test, timeouts and client retries.

Every server runs in a thread on 127.0.0.1, port 0.
Run: .venv/bin/pytest tests/rewards/test_remote.py -q
"""

import base64
import http.client
import io
import json
import math
import random
import socket
import threading
import time

import pytest
import torch
from PIL import Image

from rewards import Reward, RewardOutput, load_reward
from rewards.codec import encode_png
from rewards.remote import RemoteReward, RemoteRewardError, RewardServer
from rewards.runner import RewardRunner
from tolerance import assert_close_ulps

torch.set_num_threads(1)
TOKEN = "s3cret-token"
PROMPTS = ["a photo of a cat", "two dogs", 'a sign that says "hi"']


def _images(n=3, height=24, width=32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, height, width, generator=g) * 255).round() / 255


def _png(image_uint8: torch.Tensor, mode: str = "RGB", fmt: str = "PNG") -> str:
    pil = Image.fromarray(image_uint8.permute(1, 2, 0).numpy()).convert(mode)
    buffer = io.BytesIO()
    pil.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


class Slow(Reward):
    name = "slow"

    def score_uint8(self, images, prompts, metadata):
        time.sleep(0.5)
        return RewardOutput(scores=torch.zeros(len(prompts)))


class Crashes(Reward):
    name = "crashes"

    def score_uint8(self, images, prompts, metadata):
        raise RuntimeError("model exploded")


@pytest.fixture(scope="module")
def pickscore(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    from rewards.clip_rewards import PickScore
    from rewards.tiny import tiny_clip_folder

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    folder = tiny_clip_folder(tmp_path_factory.mktemp("pick") / "pick", image_size=32)
    return PickScore(str(folder), str(folder))


@pytest.fixture(scope="module")
def server(pickscore):
    with RewardServer(pickscore, token=TOKEN, max_body_bytes=200_000, max_batch=8, max_pixels=64 * 64,
                      socket_timeout_s=1.0) as srv:
        yield srv


def _post(srv, body: bytes, headers: dict | None = None, path: str = "/score", token: str | None = TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    conn.request("POST", path, body=body, headers=hdrs)
    response = conn.getresponse()
    status, payload = response.status, response.read()
    conn.close()
    return status, payload


def _request_json(srv, request) -> tuple[int, dict]:
    status, payload = _post(srv, json.dumps(request).encode())
    return status, json.loads(payload)


def _healthy(srv) -> bool:
    return RemoteReward(srv.url, token=TOKEN).health()["status"] == "ok"


# ----------------------------------------------------------------------------- equality with local scoring


def test_remote_scores_equal_local_scores(server, pickscore):
    images = _images()
    local = pickscore(images, PROMPTS)
    client = RemoteReward(server.url, token=TOKEN)
    assert client.modality == "image" and client.name == "remote:pickscore" and client.batch_size == 8
    remote = client(images, PROMPTS, [{"i": 0}, {"i": 1}, {"i": 2}])
    assert torch.equal(remote.scores, local.scores)
    assert remote.info["cosine"] == local.info["cosine"].tolist() and remote.info["server_seconds"] > 0
    chunked = RemoteReward(server.url, token=TOKEN, batch_size=2)(images, PROMPTS)  # two requests
    assert_close_ulps(chunked.scores, local.scores, ulps=16)  # batches of 2 and 3 round differently
    assert len(chunked.info["cosine"]) == 3
    assert load_reward("remote", url=server.url, token=TOKEN).name == "remote:pickscore"


def test_nan_scores_travel_as_null():
    reward = load_reward("ocr", reader=lambda image: "hi")
    with RewardServer(reward) as srv:
        status, payload = _request_json(srv, {"prompts": ["no quotes", 'says "hi"'],
                                               "images": [encode_png(torch.zeros(3, 8, 8, dtype=torch.uint8))] * 2})
        assert status == 200 and payload["scores"] == [None, 1.0]
        out = RemoteReward(srv.url)(torch.zeros(2, 3, 8, 8), ["no quotes", 'says "hi"'])
    assert math.isnan(out.scores[0]) and out.scores[1] == 1.0


@pytest.mark.parametrize("video_format", ["png", "mp4"])
def test_remote_video_scores_equal_local(video_format):
    if video_format == "mp4":
        pytest.importorskip("imageio_ffmpeg")
    from rewards.video import PerFrame

    reward = PerFrame(load_reward("jpeg_incompressibility"), "mean")
    g = torch.Generator().manual_seed(0)
    videos = (torch.rand(2, 5, 3, 16, 24, generator=g) * 255).round() / 255
    local = reward(videos, ["a", "b"])
    with RewardServer(reward) as srv:
        client = RemoteReward(srv.url, video_format=video_format)
        assert client.modality == "video"
        remote = client(videos, ["a", "b"])
        status, payload = _request_json(srv, {"prompts": ["a"], "images": [encode_png(torch.zeros(3, 8, 8,
                                                                                                  dtype=torch.uint8))]})
    assert torch.equal(remote.scores, local.scores)  # lossless transport: the very same pixels
    assert status == 400 and "send 'videos'" in payload["error"]


# ----------------------------------------------------------------------------- malformed requests


def _bad_requests():
    img = (_images(1)[0] * 255).round().to(torch.uint8)
    good = encode_png(img)
    other = encode_png(torch.zeros(3, 16, 16, dtype=torch.uint8))
    big = encode_png(torch.zeros(3, 65, 65, dtype=torch.uint8))  # over max_pixels = 64 * 64
    return [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe\x00", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),
        (json.dumps({"prompts": ["a"], "images": [good], "extra": 1}).encode(), 400, "unknown keys"),
        (json.dumps({"prompts": "a", "images": [good]}).encode(), 400, "list of strings"),
        (json.dumps({"prompts": [], "images": []}).encode(), 400, "empty batch"),
        (json.dumps({"prompts": ["a", "b"], "images": [good]}).encode(), 400, "one entry per prompt"),
        (json.dumps({"prompts": ["a"], "images": [good], "metadata": [{}, {}]}).encode(), 400, "metadata"),
        (json.dumps({"prompts": ["a"], "images": [good], "metadata": ["x"]}).encode(), 400, "list of objects"),
        (json.dumps({"prompts": ["a"]}).encode(), 400, "exactly one of"),
        (json.dumps({"prompts": ["a"], "images": [good], "videos": [[good]]}).encode(), 400, "exactly one of"),
        (json.dumps({"prompts": ["a", "b"], "images": [good, other]}).encode(), 400, "same shape"),
        (json.dumps({"prompts": ["a"], "images": ["%%%"]}).encode(), 400, "not valid base64"),
        (json.dumps({"prompts": ["a"], "images": [123]}).encode(), 400, "base64 string"),
        (json.dumps({"prompts": ["a"], "images": [base64.b64encode(b"garbage").decode()]}).encode(), 400, "readable PNG"),
        (json.dumps({"prompts": ["a"], "images": [_png(img, fmt="JPEG")]}).encode(), 400, "must be a PNG"),
        (json.dumps({"prompts": ["a"], "images": [_png(img, mode="RGBA")]}).encode(), 400, "RGB PNG"),
        (json.dumps({"prompts": ["a"], "images": [_png(img, mode="L")]}).encode(), 400, "RGB PNG"),
        (json.dumps({"prompts": ["a"], "images": [big]}).encode(), 413, "max_pixels"),
        (json.dumps({"prompts": ["a"] * 9, "images": [good] * 9}).encode(), 413, "max_batch=8"),
        (json.dumps({"prompts": ["a"], "images": ["A" * 300_000]}).encode(), 413, "max_body_bytes"),
    ]


def test_malformed_requests_get_4xx_with_a_message_and_the_server_keeps_serving(server):
    for body, status, message in _bad_requests():
        got, payload = _post(server, body)
        assert got == status, (body[:80], got, payload[:200])
        assert message in json.loads(payload)["error"], (message, payload[:200])
    assert _post(server, b"{}", token="wrong")[0] == 401
    assert _post(server, b"{}", token=None)[0] == 401
    assert _post(server, b"{}", headers={"Authorization": f"Basic {TOKEN}"}, token=None)[0] == 401
    status, payload = _post(server, b"{}", headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in json.loads(payload)["error"]
    assert _post(server, b"{}", path="/health")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 401  # health needs the token too
    conn.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # no Content-Length
        sock.sendall(f"POST /score HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.0 411")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # body cut short
        sock.sendall(f"POST /score HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{".encode())
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100).startswith(b"HTTP/1.0 400")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # slow client: socket timeout
        sock.sendall(f"POST /score HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{".encode())
        started = time.perf_counter()
        sock.recv(100)  # the server gives up after socket_timeout_s and closes
        assert time.perf_counter() - started < 5
    client = RemoteReward(server.url, token=TOKEN, retries=5, backoff_s=10)
    started = time.perf_counter()
    with pytest.raises(RemoteRewardError, match="answered 400: empty batch"):
        client._request("/score", {"prompts": []})
    assert time.perf_counter() - started < 2  # a 4xx is the caller's error: raised at once, no retries
    assert _healthy(server)
    status, payload = _request_json(server, {"prompts": ["a"], "images": [encode_png((_images(1)[0] * 255).to(torch.uint8))]})
    assert status == 200 and len(payload["scores"]) == 1


def test_reward_errors_map_to_422_and_500_and_timeouts_to_504():
    toy = load_reward("toy")
    image = [encode_png(torch.zeros(3, 64, 64, dtype=torch.uint8))]
    with RewardServer(toy) as srv:
        status, payload = _request_json(srv, {"prompts": ["a photo of a dog"], "images": image})
        assert status == 422 and "outside the grammar" in payload["error"]
    with RewardServer(Crashes()) as srv:
        status, payload = _request_json(srv, {"prompts": ["a"], "images": image})
        assert status == 500 and "model exploded" in payload["error"]
        assert RemoteReward(srv.url).health()["status"] == "ok"
    with RewardServer(Slow(), timeout_s=0.1) as srv:
        status, payload = _request_json(srv, {"prompts": ["a"], "images": image})
        assert status == 504 and "timeout_s=0.1" in payload["error"]
        time.sleep(0.5)
        assert RemoteReward(srv.url).health()["status"] == "ok"


def test_server_binds_loopback_only_unless_allowed():
    with pytest.raises(ValueError, match="loopback only"):
        RewardServer(load_reward("jpeg_compressibility"), host="0.0.0.0")


# ----------------------------------------------------------------------------- concurrency and fuzz


def test_concurrent_clients_get_their_own_scores(server, pickscore):
    batches = [(_images(2, seed=s), [f"prompt {s}", f"other {s}"]) for s in range(8)]
    expected = [pickscore(images, prompts).scores for images, prompts in batches]
    results, errors = [None] * len(batches), []

    def run(i):
        try:
            results[i] = RemoteReward(server.url, token=TOKEN, name="c", modality="image", batch_size=8)(*batches[i]).scores
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for got, want in zip(results, expected):
        assert torch.equal(got, want)


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([None, True, False, 0, -1, 1e308, "", "x" * rng.randrange(50)])
    if kind == 1:
        return rng.uniform(-1e6, 1e6)
    if kind == 2:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(20)))
    if kind == 3:
        return rng.choice([encode_png(torch.zeros(3, 8, 8, dtype=torch.uint8)), "iVBORw0KGgo=", "AAAA"])
    if kind == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["prompts", "images", "videos", "metadata", "x"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_fuzz_random_requests_never_crash_the_server(server):
    rng = random.Random(0)
    statuses = []
    for i in range(150):
        kind = i % 4
        if kind == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        elif kind == 1:
            body = json.dumps(_random_json(rng)).encode()
        elif kind == 2:  # plausible requests with random fields
            n = rng.randrange(0, 4)
            request = {"prompts": [rng.choice(["a", "", "ü" * 100]) for _ in range(n)],
                       "images": [rng.choice([encode_png(torch.zeros(3, 8, 8, dtype=torch.uint8)), "AAAA", None])
                                  for _ in range(rng.choice([n, n + 1]))]}
            if rng.random() < 0.5:
                request["metadata"] = [rng.choice([{}, {"a": [1, 2]}, 3]) for _ in range(n)]
            body = json.dumps(request).encode()
        else:  # random bytes inside a valid envelope
            body = json.dumps({"prompts": ["a"], "images": [base64.b64encode(
                b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(rng.randrange(100)))).decode()]}).encode()
        status, payload = _post(server, body)
        statuses.append(status)
        assert status == 200 or 400 <= status < 500, (status, body[:100], payload[:200])
        assert "error" in json.loads(payload) or status == 200
    for _ in range(20):  # garbage on the wire, not HTTP at all
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) + b"\r\n\r\n")
            reply = sock.recv(100)
            # an HTTP/0.9-looking request line gets the bare error body (the stdlib's rule), others a 4xx
            assert reply == b"" or reply.startswith(b'{"error"') or reply.startswith(b"HTTP/1.0 4"), reply
    assert statuses.count(200) >= 1 and statuses.count(400) >= 50
    assert _healthy(server)


# ----------------------------------------------------------------------------- client faults


def test_client_retries_then_the_runner_marks_nan():
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = RemoteReward(f"http://127.0.0.1:{port}", name="gone", modality="image", batch_size=4, retries=2,
                          backoff_s=0.01, timeout=2)
    started = time.perf_counter()
    with pytest.raises(RemoteRewardError, match="failed after 3 attempts"):
        client(_images(2), ["a", "b"])
    assert time.perf_counter() - started < 5
    with RewardRunner({"gone": (client, 1.0)}, retries=1, backoff_s=0.01) as runner:
        result = runner.score(_images(2), ["a", "b"])
    assert torch.isnan(result.scores["gone"]).all() and "RemoteRewardError" in result.errors["gone"]
    assert not result.valid.any()
