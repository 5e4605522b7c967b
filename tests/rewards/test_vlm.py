"""The OpenAI-compatible VLM judge against a local fake chat-completions server (a deterministic test
double: it reads the images it is sent and answers from their brightness).

Run: .venv/bin/pytest tests/rewards/test_vlm.py -q
"""

import base64
import io
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from rewards.vlm import VLMJudge, parse_score, parse_winner, win_rates

torch.set_num_threads(1)
API_KEY = "test-key"


def _brightness(url: str) -> float:
    assert url.startswith("data:image/png;base64,")
    pil = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert pil.format == "PNG"
    return float(np.asarray(pil).mean()) / 255


class FakeJudge(BaseHTTPRequestHandler):
    requests: list = []  # (prompt text, image sizes) per request, shared by the test

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions" or self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self.send_response(401)
            self.end_headers()
            return
        content = body["messages"][0]["content"]
        urls = [c["image_url"]["url"] for c in content if c["type"] == "image_url"]
        text = next(c["text"] for c in content if c["type"] == "text")
        FakeJudge.requests.append((text, [Image.open(io.BytesIO(base64.b64decode(u.split(",")[1]))).size for u in urls]))
        if "fail" in text:
            self.send_response(500)
            self.end_headers()
            return
        levels = [_brightness(u) for u in urls]
        if "garbled" in text:
            answer = "I like it."
        elif len(levels) == 1:
            answer = f"Looks fine.\nFinal Score: {1 + 4 * levels[0]:.2f}"
        elif "biased" in text:
            answer = "Final Answer: Image 1"  # always the first shown
        elif abs(levels[0] - levels[1]) < 1e-9:
            answer = "Both equal. Final Answer: Tie"
        else:
            answer = f"Final Answer: Image {1 if levels[0] > levels[1] else 2}"
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _flat(levels, size=16) -> torch.Tensor:
    return torch.stack([torch.full((3, size, size), v / 255) for v in levels])


def test_parsers():
    assert parse_score("reasoning... Final Score: 4.5") == pytest.approx(0.9)
    assert parse_score("final score: **3**") == pytest.approx(0.6)
    assert parse_score("Final Score: 2\n...\nFinal Score: 5") == 1.0  # the last one counts
    assert math.isnan(parse_score("Final Score: 7")) and math.isnan(parse_score("no score")) and math.isnan(parse_score(None))
    assert parse_winner("Final Answer: Image 2") == 2 and parse_winner("final answer: image 1") == 1
    assert parse_winner("Final Answer: Tie") == 0 and parse_winner("Image 2 is better overall") == 2
    assert parse_winner("hmm") is None


def test_win_rates_over_all_pairs():
    # 0 < 1 = 2 < 3 ; pair (1, 2) unjudged leaves 1 and 2 with two judged pairs each
    rates, judged = win_rates(4, [(0, 1, 2), (0, 2, 2), (0, 3, 2), (1, 2, None), (1, 3, 2), (2, 3, 2)])
    assert rates == [0.0, 0.5, 0.5, 1.0] and judged == [3, 2, 2, 3]
    rates, _ = win_rates(3, [(0, 1, 0), (0, 2, 1), (1, 2, 0)])
    assert rates == [0.75, 0.5, 0.25]
    rates, _ = win_rates(2, [(0, 1, None)])
    assert all(math.isnan(r) for r in rates)


def test_pointwise_scores_and_failures(judge_url):
    FakeJudge.requests.clear()
    judge = VLMJudge(judge_url, "fake-judge", api_key=API_KEY, image_size=24, retries=1, backoff_s=0.01)
    out = judge(_flat([0, 255, 51, 102]), ["a cat", "a dog", "garbled please", "fail please"])
    assert out.scores[0] == pytest.approx(0.2) and out.scores[1] == pytest.approx(1.0)
    assert math.isnan(out.scores[2]) and out.info["raw"][2] == "I like it."  # unparsable -> NaN
    assert math.isnan(out.scores[3]) and "500" in out.info["errors"][3]  # failed after retries -> NaN
    assert sum("fail" in text for text, _ in FakeJudge.requests) == 2  # 1 try + 1 retry
    assert all(sizes == [(24, 24)] for _, sizes in FakeJudge.requests)  # resized to image_size
    with pytest.raises(RuntimeError, match="401"):
        VLMJudge(judge_url, "fake-judge", api_key="wrong", retries=3, backoff_s=10).chat([], "hi")  # 4xx: no retry


def test_pairwise_win_rates_per_group(judge_url):
    FakeJudge.requests.clear()
    judge = VLMJudge(judge_url, "fake-judge", api_key=API_KEY, mode="pairwise", group_size=4)
    out = judge(_flat([10, 50, 50, 200, 5, 4, 3, 2]), ["p"] * 4 + ["q"] * 4)
    assert torch.allclose(out.scores, torch.tensor([0.0, 0.5, 0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0]))
    assert len(FakeJudge.requests) == 2 * 6 and out.info["judged_pairs"] == [3] * 8  # C(4, 2) per group
    by_metadata = VLMJudge(judge_url, "fake-judge", api_key=API_KEY, mode="pairwise")(
        _flat([10, 200, 50]), ["p", "q", "p"], [{"group": 0}, {"group": 1}, {"group": 0}])
    assert by_metadata.scores[0] == 0.0 and by_metadata.scores[2] == 1.0 and math.isnan(by_metadata.scores[1])
    with pytest.raises(ValueError, match="group_size"):
        VLMJudge(judge_url, "m", api_key=API_KEY, mode="pairwise")(_flat([1, 2]), ["p", "p"])


def test_pairwise_both_orders_cancels_position_bias(judge_url):
    biased = VLMJudge(judge_url, "fake-judge", api_key=API_KEY, mode="pairwise", group_size=3)
    assert biased(_flat([10, 20, 30]), ["biased"] * 3).scores.tolist() == [1.0, 0.5, 0.0]  # order decides
    fair = VLMJudge(judge_url, "fake-judge", api_key=API_KEY, mode="pairwise", group_size=3, both_orders=True)
    assert fair(_flat([10, 20, 30]), ["biased"] * 3).scores.tolist() == [0.5, 0.5, 0.5]
    assert fair(_flat([10, 20, 30]), ["fair"] * 3).scores.tolist() == [0.0, 0.5, 1.0]
