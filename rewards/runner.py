"""Score batches asynchronously with several weighted rewards; failures become NaN, never crashes.

    runner = RewardRunner([{"name": "pickscore", "weight": 1.0, "kwargs": {"divide_by": 26}},
                           {"name": "jpeg_compressibility", "weight": 0.1}])
    pending = runner.submit(images, prompts, metadata)   # returns at once; sampling goes on
    result = pending.result()                            # RewardResult

Each reward of a batch runs as its own task on a thread pool (a remote reward's HTTP wait overlaps
with local work). A call that raises (or returns a malformed output) is retried `retries` times with
exponential backoff (backoff_s * 2^attempt); if it still fails, that reward's scores for the batch
are NaN, the error is stored in result.errors and logged as a warning the first time it occurs (an
identical error again is logged at DEBUG: a dead reward gives one line, not one per batch; attempts
are logged at INFO; report_failures=False leaves the reporting to the caller), and the run goes on.
``timeouts`` ({key: seconds}, 0 = none) bound one call: a reward that has not answered by then is a
failure for that batch, not retried (the call is left to finish in its thread; the reward's next call waits
for it no longer than the same timeout, then fails too), so a hung scorer cannot hang the run.
NaN rewards are never trained on: result.valid marks the samples whose total is finite.

    total = sum_k weight_k * score_k    (NaN if any component is NaN; nan_policy="skip" sums the
                                         finite components instead, NaN only if none is finite;
                                         weight-0 rewards are reported but left out of the total)

The images are cloned at submit time, so the sampler may reuse its buffers.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from dataclasses import dataclass, field

import torch

from rewards.base import Reward, RewardOutput

logger = logging.getLogger(__name__)


@dataclass
class RewardSpec:
    """One reward of a run: registered name or dotted path, its weight in the total, constructor kwargs.
    key: the name its scores are reported under (default: name; set it to use one reward twice)."""

    name: str
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)
    key: str | None = None

    @classmethod
    def parse(cls, spec) -> RewardSpec:
        if isinstance(spec, RewardSpec):
            return spec
        if isinstance(spec, str):
            return cls(name=spec)
        if not isinstance(spec, dict) and hasattr(spec, "name"):  # a config dataclass (e.g. flowgrpo.config.RewardSpec)
            spec = {k: getattr(spec, k) for k in ("name", "weight", "kwargs", "key") if hasattr(spec, k)}
        if not isinstance(spec, dict) or "name" not in spec:
            raise ValueError(f"a reward spec is a name or {{'name': ..., 'weight': ..., 'kwargs': {{...}}}}, got {spec!r}")
        unknown = set(spec) - {"name", "weight", "kwargs", "key"}
        if unknown:
            raise ValueError(f"reward spec {spec['name']!r}: unknown keys {sorted(unknown)}; allowed: name, weight, kwargs, key")
        weight = float(spec.get("weight", 1.0))
        if not math.isfinite(weight):
            raise ValueError(f"reward spec {spec['name']!r}: weight must be finite, got {weight}")
        return cls(name=str(spec["name"]), weight=weight, kwargs=dict(spec.get("kwargs") or {}), key=spec.get("key"))


def build_rewards(specs) -> dict[str, tuple[Reward, float]]:
    """Config list of specs -> {key: (reward, weight)}; keys must be unique."""
    from rewards import load_reward

    built: dict[str, tuple[Reward, float]] = {}
    for raw in specs:
        spec = RewardSpec.parse(raw)
        key = spec.key or spec.name
        if key in built:
            raise ValueError(f"reward {key!r} appears twice; give one of them a distinct 'key'")
        built[key] = (load_reward(spec.name, **spec.kwargs), spec.weight)
    return built


@dataclass
class RewardResult:
    scores: dict[str, torch.Tensor]  # key -> [B] float32, NaN = not applicable or failed
    weights: dict[str, float]
    total: torch.Tensor  # [B] float32 weighted sum (see nan_policy)
    valid: torch.Tensor  # [B] bool, total is finite
    info: dict[str, dict]  # key -> the reward's info
    errors: dict[str, str]  # key -> last error, for rewards that failed after the retries
    seconds: dict[str, float]  # key -> wall time of the reward's call(s), retries included

    def matrix(self) -> torch.Tensor:
        """[B, K] scores in reward order (the input of multi-reward advantages such as GDPO)."""
        return torch.stack(list(self.scores.values()), 1)


class RewardTimeout(TimeoutError):
    """A reward call that did not answer within its timeout."""


class RewardRunner:
    """rewards: a list of specs (see RewardSpec) or {key: (Reward, weight)}. max_workers: threads
    shared by all batches and rewards."""

    def __init__(self, rewards, *, retries: int = 2, backoff_s: float = 0.5, max_workers: int = 2,
                 nan_policy: str = "propagate", report_failures: bool = True, timeouts: dict | None = None):
        self.rewards = rewards if isinstance(rewards, dict) else build_rewards(rewards)
        if not self.rewards:
            raise ValueError("RewardRunner needs at least one reward")
        if nan_policy not in ("propagate", "skip"):
            raise ValueError(f"nan_policy must be 'propagate' or 'skip', got {nan_policy!r}")
        self.retries, self.backoff_s, self.nan_policy = int(retries), float(backoff_s), nan_policy
        self.report_failures = report_failures
        self._reported: set[tuple[str, str]] = set()  # (key, error) pairs already logged as warnings
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward")
        self._locks = {key: threading.Lock() for key in self.rewards}  # one call at a time per reward object
        self.timeouts = {key: float((timeouts or {}).get(key) or 0.0) for key in self.rewards}

    def submit(self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None,
               conditions: torch.Tensor | None = None) -> concurrent.futures.Future:
        """Start scoring; returns a Future of RewardResult (its result() never raises for reward failures).
        ``conditions``: the prompts' condition images [B, K, 3, H, W] (editing), for the rewards that see them."""
        images = images.detach().clone()
        conditions = None if conditions is None else conditions.detach().clone()
        prompts = list(prompts)
        metadata = None if metadata is None else [dict(m) for m in metadata]
        batch = images.shape[0]
        parts = {key: self._pool.submit(self._call, key, images, prompts, metadata, conditions) for key in self.rewards}
        done: concurrent.futures.Future = concurrent.futures.Future()
        remaining = [len(parts)]
        lock = threading.Lock()

        def on_done(_):
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                done.set_result(self._combine(batch, {k: f.result() for k, f in parts.items()}))
            except Exception as exc:  # noqa: BLE001
                done.set_exception(exc)

        for future in parts.values():
            future.add_done_callback(on_done)
        return done

    def score(self, images, prompts, metadata=None, conditions=None) -> RewardResult:
        """submit(...).result(): the synchronous form."""
        return self.submit(images, prompts, metadata, conditions).result()

    def _call(self, key: str, images, prompts, metadata, conditions=None) -> tuple[RewardOutput | None, str | None, float]:
        reward = self.rewards[key][0]
        started = time.perf_counter()
        error = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                out = self._invoke(key, reward, (images, prompts, metadata, conditions))
                return out, None, time.perf_counter() - started
            except Exception as exc:  # noqa: BLE001  (a failing reward never crashes the run)
                error = f"{type(exc).__name__}: {exc}"
                logger.info("reward %s: attempt %d/%d failed: %s", key, attempt + 1, self.retries + 1, error)
                if isinstance(exc, RewardTimeout):
                    break  # a retry would wait behind the call that hangs
        if self.report_failures:
            again = (key, error) in self._reported
            self._reported.add((key, error))
            logger.log(logging.DEBUG if again else logging.WARNING,
                       "reward %s failed after %d attempts; its scores for this batch are NaN: %s%s",
                       key, self.retries + 1, error, " (again)" if again else "")
        return None, error, time.perf_counter() - started

    def _invoke(self, key: str, reward: Reward, args: tuple) -> RewardOutput:
        """One call of ``reward``, one at a time per reward, bounded by its timeout (see the module docstring)."""
        lock, limit = self._locks[key], self.timeouts[key]
        if not limit:
            with lock:
                return reward(*args)
        if not lock.acquire(timeout=limit):
            raise RewardTimeout(f"still busy after timeout_s={limit:g} s with an earlier call that did not answer")
        box: dict = {}

        def call():
            try:
                box["out"] = reward(*args)
            except BaseException as exc:  # noqa: BLE001  (handed to the waiting thread)
                box["error"] = exc
            finally:
                lock.release()

        worker = threading.Thread(target=call, name=f"reward-{key}", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            raise RewardTimeout(f"no answer within timeout_s={limit:g} s")
        if "error" in box:
            raise box["error"]
        return box["out"]

    def _combine(self, batch: int, outputs: dict) -> RewardResult:
        scores, info, errors, seconds = {}, {}, {}, {}
        for key, (out, error, elapsed) in outputs.items():
            seconds[key] = elapsed
            if out is None:
                scores[key] = torch.full((batch,), math.nan)
                info[key], errors[key] = {"error": error}, error
            else:
                scores[key], info[key] = out.scores.detach().float().cpu(), out.info
        weights = {key: w for key, (_, w) in self.rewards.items()}
        # weight-0 rewards are logged only: they never make the total NaN
        stacked = torch.stack([weights[k] * scores[k] for k in scores if weights[k] != 0] or [torch.zeros(batch)])  # [K, B]
        if self.nan_policy == "propagate":
            total = stacked.sum(0)
        else:
            finite = torch.isfinite(stacked)
            total = torch.where(finite, stacked, torch.zeros_like(stacked)).sum(0)
            total[~finite.any(0)] = math.nan
        return RewardResult(scores=scores, weights=weights, total=total, valid=torch.isfinite(total), info=info,
                            errors=errors, seconds=seconds)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
