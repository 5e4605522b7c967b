"""A VLM judge over any OpenAI-compatible chat-completions server (vLLM, SGLang, a hosted API).

    mode="pointwise"   one request per image: the judge ends its answer with "Final Score: x" (1-5);
                       score = x / 5. No parsable score -> NaN (info["raw"] keeps the answer).
                       parse="first": DiffusionNFT's / Flow-GRPO's UnifiedReward parsing instead (the first
                       "Final Score: x" with x starting 1-5; none -> 0.0).
    mode="pairwise"    Pref-GRPO: inside each group of G images for one prompt, every one of the
                       C(G, 2) pairs is judged ("Final Answer: Image 1" / "Image 2" / "Tie"); a
                       sample's score is its win rate = (wins + 0.5 * ties) / judged pairs. Groups come
                       from metadata[i]["group"] or consecutive blocks of `group_size`. both_orders=True
                       judges each pair twice, swapped, to cancel position bias.

Images travel as PNG data URLs (resized to `image_size` on the long side when set, as Flow-GRPO's
512). Each request is retried `retries` times with exponential backoff; a request that still fails
leaves NaN for that sample (pointwise) or drops that pair (pairwise) and is recorded in
info["errors"]. Requests run on a thread pool of `max_workers`.

Editing (``VLMEditJudge``, reward "vlm_edit_judge"): the judge also sees each result's source image, shown first
("Image 1" the source, then the result or, pairwise, the two results), and the prompt is the instruction: it judges
whether the instruction was carried out and the rest of the source left as it was (EDIT_POINTWISE_TEMPLATE,
EDIT_PAIRWISE_TEMPLATE; any other template may be given). The server is a local one (vLLM or SGLang serving an edit
judge such as EditScore or a general VLM) or a hosted API, as for VLMJudge.

Run: VLMJudge("http://127.0.0.1:8000/v1", "UnifiedReward-7b", mode="pointwise")(images, prompts)
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import itertools
import json
import logging
import math
import os
import re
import time
import urllib.error
import urllib.request

import torch

from rewards.base import Reward, RewardOutput

logger = logging.getLogger(__name__)

POINTWISE_TEMPLATE = (
    "You are shown an image generated from a text prompt. Judge (1) how faithfully it depicts the prompt "
    "(objects, counts, attributes, spatial relations) and (2) its visual quality (clarity, detail, colour, "
    "overall appeal). Explain briefly, then end with 'Final Score: x' where x is a number from 1 (worst) to "
    "5 (best).\nPrompt: {prompt}"
)
PAIRWISE_TEMPLATE = (
    "You are shown two images, Image 1 and Image 2, generated from the same text prompt. Decide which one "
    "depicts the prompt more faithfully and has better visual quality. Explain briefly, then end with "
    "'Final Answer: Image 1', 'Final Answer: Image 2' or 'Final Answer: Tie'.\nPrompt: {prompt}"
)
EDIT_POINTWISE_TEMPLATE = (
    "Image 1 is a source image and Image 2 is the result of editing it with the instruction below. Judge (1) how "
    "completely the result carries out the instruction and (2) how well everything the instruction does not ask to "
    "change is left as it was in the source, and the result's visual quality. Explain briefly, then end with "
    "'Final Score: x' where x is a number from 1 (worst) to 5 (best).\nInstruction: {prompt}"
)
EDIT_PAIRWISE_TEMPLATE = (
    "Image 1 is a source image; Image 2 and Image 3 are two results of editing it with the instruction below. Decide "
    "which result carries out the instruction better while leaving the rest of the source as it was. Explain "
    "briefly, then end with 'Final Answer: Image 1' for the first result (Image 2), 'Final Answer: Image 2' for the "
    "second (Image 3) or 'Final Answer: Tie'.\nInstruction: {prompt}"
)
_SCORE = re.compile(r"Final\s+Score\s*[:：]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_ANSWER = re.compile(r"Final\s+Answer\s*[:：]\s*\**\s*(Image\s*1|Image\s*2|Tie)", re.IGNORECASE)
_BETTER = re.compile(r"Image\s*([12])\s+is\s+(?:better|superior|preferred)", re.IGNORECASE)


_FIRST_SCORE = re.compile(r"Final Score:\s*([1-5](?:\.\d+)?)")
PARSERS = ("last", "first")


def parse_score(text: str, score_max: float = 5.0, parse: str = "last") -> float:
    """parse="last" (default): the last 'Final Score: x' in text (any case, optional ** around x) divided by
    score_max; NaN when absent or outside [0, score_max]. parse="first": DiffusionNFT's / Flow-GRPO's UnifiedReward
    rule: the first 'Final Score:' (exact case) followed by a digit 1-5 and optional decimals, divided by score_max;
    0.0 when there is none (a failed judgement scores 0, not NaN)."""
    if parse == "first":
        match = _FIRST_SCORE.search(text or "")
        return float(match.group(1)) / score_max if match else 0.0
    if parse != "last":
        raise ValueError(f"parse={parse!r} is not one of {PARSERS}")
    matches = _SCORE.findall(text or "")
    if not matches:
        return math.nan
    value = float(matches[-1])
    return value / score_max if 0.0 <= value <= score_max else math.nan


def parse_winner(text: str) -> int | None:
    """1 or 2 for the winning image, 0 for a tie, None when the answer names neither."""
    matches = _ANSWER.findall(text or "")
    if matches:
        answer = matches[-1].replace(" ", "").lower()
        return 0 if answer == "tie" else int(answer[-1])
    better = _BETTER.findall(text or "")
    return int(better[-1]) if better else None


def win_rates(group_size: int, comparisons: list[tuple[int, int, int | None]]) -> tuple[list[float], list[int]]:
    """comparisons: (i, j, outcome) with local indices, outcome 1 = i won, 2 = j won, 0 = tie, None = not
    judged (skipped). Returns (win rate per member, NaN when none of its pairs was judged; judged count)."""
    wins = [0.0] * group_size
    judged = [0] * group_size
    for i, j, outcome in comparisons:
        if outcome is None:
            continue
        judged[i] += 1
        judged[j] += 1
        if outcome == 0:
            wins[i] += 0.5
            wins[j] += 0.5
        else:
            wins[i if outcome == 1 else j] += 1.0
    return [w / n if n else math.nan for w, n in zip(wins, judged)], judged


def image_data_url(image: torch.Tensor, image_size: int | None = None) -> str:
    """uint8 [3, H, W] -> 'data:image/png;base64,...' (long side resized to image_size, bicubic, if set)."""
    from PIL import Image

    pil = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    if image_size and max(pil.size) != image_size:
        scale = image_size / max(pil.size)
        pil = pil.resize((max(1, round(pil.size[0] * scale)), max(1, round(pil.size[1] * scale))), Image.BICUBIC)
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class VLMJudge(Reward):
    name = "vlm_judge"
    modality = "image"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, mode: str = "pointwise", *,
                 api_key_env: str = "OPENAI_API_KEY", group_size: int | None = None, both_orders: bool = False,
                 image_size: int | None = 512, temperature: float = 0.0, max_tokens: int | None = 1024,
                 timeout: float = 120.0, retries: int = 2, backoff_s: float = 0.5, max_workers: int = 8,
                 score_max: float = 5.0, pointwise_template: str = POINTWISE_TEMPLATE,
                 pairwise_template: str = PAIRWISE_TEMPLATE, extra_body: dict | None = None, parse: str = "last"):
        if mode not in ("pointwise", "pairwise"):
            raise ValueError(f"mode must be 'pointwise' or 'pairwise', got {mode!r}")
        if parse not in PARSERS:
            raise ValueError(f"parse must be one of {PARSERS}, got {parse!r}")
        self.parse = parse
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.mode = model, mode
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.group_size, self.both_orders, self.image_size = group_size, both_orders, image_size
        self.temperature, self.max_tokens, self.timeout = temperature, max_tokens, float(timeout)
        self.retries, self.backoff_s, self.max_workers = int(retries), float(backoff_s), int(max_workers)
        self.score_max = float(score_max)
        self.pointwise_template, self.pairwise_template = pointwise_template, pairwise_template
        self.extra_body = dict(extra_body or {})
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # ----------------------------------------------------------------- HTTP

    def chat(self, image_urls: list[str], text: str) -> str:
        """One chat completion with the images then the text; returns the answer's content."""
        content = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
        content.append({"type": "text", "text": text})
        body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                "temperature": self.temperature, **self.extra_body}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with self._opener.open(request, timeout=self.timeout) as response:
                    answer = json.loads(response.read())
                return str(answer["choices"][0]["message"]["content"] or "")
            except urllib.error.HTTPError as exc:
                last_error = RuntimeError(f"{self.url} answered {exc.code}: {exc.read()[:300]!r}")
                if exc.code < 500 and exc.code not in (408, 429):
                    break
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                last_error = exc
        raise RuntimeError(f"VLM judge request failed after retries: {last_error}")

    def _map(self, jobs: list[tuple[list[str], str]]) -> list[tuple[str | None, str | None]]:
        """Run chat() on every (image_urls, text); returns (answer, error) per job, in order."""

        def run(job):
            try:
                return self.chat(*job), None
            except Exception as exc:  # noqa: BLE001  (one failed request must not fail the batch)
                logger.warning("vlm judge: %s", exc)
                return None, f"{type(exc).__name__}: {exc}"

        if not jobs:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs))) as pool:
            return list(pool.map(run, jobs))

    # ----------------------------------------------------------------- scoring

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        urls = [image_data_url(image, self.image_size) for image in images]
        if self.mode == "pointwise":
            return self._pointwise(urls, prompts)
        return self._pairwise(urls, prompts, metadata)

    def _pointwise(self, urls, prompts, lead: list[list[str]] | None = None) -> RewardOutput:
        """``lead``: per sample, the images shown before it (an edit's source)."""
        lead = lead or [[] for _ in urls]
        results = self._map([([*first, u], self.pointwise_template.format(prompt=p))
                             for u, p, first in zip(urls, prompts, lead)])
        scores = [math.nan if answer is None else parse_score(answer, self.score_max, self.parse)
                  for answer, _ in results]
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32),
                            info={"raw": [a for a, _ in results], "errors": [e for _, e in results]})

    def groups(self, batch: int, metadata) -> list[list[int]]:
        if metadata is not None and all("group" in m for m in metadata):
            members: dict = {}
            for i, m in enumerate(metadata):
                members.setdefault(json.dumps(m["group"], sort_keys=True, default=str), []).append(i)
            return list(members.values())
        if not self.group_size:
            raise ValueError("pairwise VLM judge needs groups: metadata[i]['group'] or group_size=G")
        if batch % self.group_size:
            raise ValueError(f"batch of {batch} is not a multiple of group_size={self.group_size}")
        return [list(range(s, s + self.group_size)) for s in range(0, batch, self.group_size)]

    def _pairwise(self, urls, prompts, metadata, lead: list[list[str]] | None = None) -> RewardOutput:
        groups = self.groups(len(urls), metadata)
        lead = lead or [[] for _ in urls]
        jobs, keys = [], []
        for g, members in enumerate(groups):
            for a, b in itertools.combinations(range(len(members)), 2):
                i, j = members[a], members[b]
                text = self.pairwise_template.format(prompt=prompts[i])
                jobs.append(([*lead[i], urls[i], urls[j]], text))
                keys.append((g, a, b, False))
                if self.both_orders:
                    jobs.append(([*lead[i], urls[j], urls[i]], text))
                    keys.append((g, a, b, True))
        results = self._map(jobs)
        comparisons: list[list] = [[] for _ in groups]
        errors, raw = [], []
        for (g, a, b, swapped), (answer, error) in zip(keys, results):
            winner = None if answer is None else parse_winner(answer)
            if winner and swapped:
                winner = 3 - winner  # the answer names positions; map back to (a, b)
            raw.append({"pair": [groups[g][a], groups[g][b]], "swapped": swapped, "answer": answer, "winner": winner})
            if error:
                errors.append(error)
            comparisons[g].append((a, b, winner))
        scores, judged = [math.nan] * len(urls), [0] * len(urls)
        for g, members in enumerate(groups):
            rates, counts = win_rates(len(members), comparisons[g])
            for m, i in enumerate(members):
                scores[i], judged[i] = rates[m], counts[m]
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32),
                            info={"judged_pairs": judged, "comparisons": raw, "errors": errors})


class VLMEditJudge(VLMJudge):
    """The VLM judge of an edit: source, result and instruction (module docstring); a sample of a group is judged
    against the others of its group (pairwise) with the group's source shown first."""

    name = "vlm_edit_judge"
    sees_condition = True

    def __init__(self, base_url: str, model: str, api_key: str | None = None, mode: str = "pointwise", *,
                 pointwise_template: str = EDIT_POINTWISE_TEMPLATE, pairwise_template: str = EDIT_PAIRWISE_TEMPLATE,
                 **options):
        super().__init__(base_url, model, api_key, mode, pointwise_template=pointwise_template,
                         pairwise_template=pairwise_template, **options)

    def score_uint8(self, images, prompts, metadata, conditions) -> RewardOutput:
        urls = [image_data_url(image, self.image_size) for image in images]
        lead = [[image_data_url(source, self.image_size) for source in row] for row in conditions]
        if self.mode == "pointwise":
            return self._pointwise(urls, prompts, lead)
        return self._pairwise(urls, prompts, metadata, lead)
