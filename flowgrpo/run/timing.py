"""The time spent inside a model's network calls (``FlowModel.call_timer``): forwards with and without autograd,
the backward through them, their rows and CFG passes. The adapter times its own calls (flowgrpo/models/base.py),
the engine the backward (``Policy.backward``); the trainer logs it per phase and ``benchmarks/bench_overhead.py``
reads it. It lives here, below both layers, because the model creates it and the engine reads it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class CallTimer:
    """Time spent inside the model's network: every transformer call ``FlowModel.velocity`` makes
    (rollout, training, reference, evaluation; a CFG call ``[uncond; cond]`` is one call of two
    passes) and the backward through those calls.

    - forward: wall time around each network call, split by whether autograd records it
      (``grad``: training forwards; ``no_grad``: rollout, old-policy, reference and evaluation ones).
      On CUDA the times come from events recorded on the current stream (read, with one
      synchronisation, by ``totals()``), so timing never stalls the GPU; elsewhere from the host
      clock, which is the device's on CPU (other devices are synchronised around the call).
    - backward: a gradient hook on each network output that requires grad marks the moment the
      backward pass reaches the network; the time from the first such mark to the end of the
      enclosing ``backward()`` block (the learner's ``loss.backward``) is the network's backward.
      What the backward does before it reaches a network output (the loss and kernel math above
      it) is not counted; what little it does between two network calls of one loss is.
      A backward pass outside a ``backward()`` block is counted in ``unattributed_backwards``.

    ``totals()`` returns running sums; subtract two of them to get a span's (``CallTimer.delta``).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._events = self.device.type == "cuda"
        self.forward_calls = {"grad": 0, "no_grad": 0}
        self.forward_rows = {"grad": 0, "no_grad": 0}  # network batch rows (a CFG call counts 2 per latent)
        self.cfg_calls = 0  # calls that ran the two CFG passes as one batch
        self.backward_calls = 0
        self.unattributed_backwards = 0
        self._seconds = {"forward_grad": 0.0, "forward_no_grad": 0.0, "backward": 0.0}
        self._pending: list[tuple[str, object, object]] = []  # CUDA: (key, start event, end event)
        self._in_backward = False
        self._backward_mark = None  # time or event at which the open backward reached a network output
        self._paused = False

    # -- clocks ------------------------------------------------------------------------------
    def _now(self):
        if self._events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.device.type not in ("cpu", "meta"):
            getattr(torch, self.device.type).synchronize()
        return time.perf_counter()

    def _add(self, key: str, start, end) -> None:
        if self._events:
            self._pending.append((key, start, end))
        else:
            self._seconds[key] += end - start

    # -- the two measurements ----------------------------------------------------------------
    @contextmanager
    def forward(self, rows: int, cfg: bool) -> Iterator[Callable[[torch.Tensor], None]]:
        """Around one network call of ``rows`` batch rows; yields ``watch(output)``, which arms the
        backward mark on an output that requires grad."""
        kind = "grad" if torch.is_grad_enabled() else "no_grad"
        if self._paused:
            yield lambda output: None
            return
        start = self._now()
        try:
            yield self._watch
        finally:
            self._add(f"forward_{kind}", start, self._now())
            self.forward_calls[kind] += 1
            self.forward_rows[kind] += rows
            self.cfg_calls += int(cfg)

    def _watch(self, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(self._reached)

    def _reached(self, grad: torch.Tensor) -> None:
        if not self._in_backward:
            self.unattributed_backwards += 1
        elif self._backward_mark is None:
            self._backward_mark = self._now()

    @contextmanager
    def backward(self) -> Iterator[None]:
        """Around a backward pass (``loss.backward()``): the network's share of it is counted."""
        self._in_backward, self._backward_mark = True, None
        try:
            yield
        finally:
            self._in_backward = False
            if self._backward_mark is not None:
                self._add("backward", self._backward_mark, self._now())
                self.backward_calls += 1
            self._backward_mark = None

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Inside, network calls are not counted (a measurement's own call, such as the FLOP count of one pass)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    # -- reading -----------------------------------------------------------------------------
    def totals(self) -> dict[str, float]:
        """Running sums: seconds (forward_grad, forward_no_grad, forward, backward, total) and counts."""
        if self._pending:
            torch.cuda.synchronize(self.device)
            for key, start, end in self._pending:
                self._seconds[key] += start.elapsed_time(end) / 1000.0
            self._pending.clear()
        s = dict(self._seconds)
        s["forward"] = s["forward_grad"] + s["forward_no_grad"]
        s["total"] = s["forward"] + s["backward"]
        s.update({f"calls_{k}": float(v) for k, v in self.forward_calls.items()})
        s.update({f"rows_{k}": float(v) for k, v in self.forward_rows.items()})
        s["cfg_calls"] = float(self.cfg_calls)
        s["backward_calls"] = float(self.backward_calls)
        s["unattributed_backwards"] = float(self.unattributed_backwards)
        return s

    @staticmethod
    def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
        """What happened between two ``totals()``."""
        return {k: after[k] - before.get(k, 0.0) for k in after}
