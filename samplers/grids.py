"""Time grids and seed derivation: the two pure functions every rollout starts from.

Time grids (docs/math.md §0): flow time σ runs from 1 (noise) to 0 (data). ``time_grid`` is the SD3 grid:
``T + 1`` points linear in an unshifted time t = 1 − i/T, mapped through the time shift
σ = k·t / (1 + (k − 1)·t). It is returned in **float64**; the executor, ``sample_ode`` and the
trajectory record cast it to float32 once, and those float32 values are the σ the model sees and the
kernels use (the record stores them, so the training recompute uses the very same numbers).

``flash_grid`` is MixGRPO-Flash's grid: the original points up to the end of the SDE window, then
the remaining stretch re-gridded linear in the unshifted time with n = int((T − l − w + 1)·r̃) points, both
ends counted (n − 1 steps), as Tencent-Hunyuan/MixGRPO's ``run_sample_step`` builds it.

Seeds (docs/design.md, contract 5): every random draw of a rollout comes from its own ``torch.Generator``
seeded by ``derive_seed(stream, run_seed, iteration, prompt_id, node_id)``: the parts are folded
left to right through the splitmix64 finaliser (h ← mix64(h XOR part), starting from a fixed
constant, parts taken modulo 2^64) and the top bit is cleared. Draws therefore depend only on
those integers, never on batch composition, chunk size or how prompts are split across processes.
Held-out evaluation draws x_T of prompt i from ``eval_noise_seed(seed, i)`` (``eval_noise``), so every
evaluation of a run starts from the same noise, and a sample's seed is written beside it.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_SEED_BASIS = 0x6A09E667F3BCC908  # first 64 bits of frac(sqrt(2)); any fixed constant works

# Every random stream of a run, in one place (the values are part of every run's results: never renumber one).
# The rollout's streams are the first part of their derived seeds: derive_seed(stream, run_seed, iteration, ...).
STREAM_INITIAL_NOISE = 1  # x_T of a root (or of a group of roots sharing it)
STREAM_STEP_NOISE = 2  # ε of the transition out of one node
STREAM_TRAIN_SUBSET = 3  # DanceGRPO's random subset of trained steps, per root
STREAM_WINDOW = 4  # random window starts (Flow-GRPO-Fast, MixGRPO "random")
STREAM_TRAIN_DRAWS = 101  # the (t, ε) draws of the forward-process learners, per sample (learners/forward.py)
# The streams below come second, after the run's seed: make_generator(run_seed, stream, ...).
STREAM_PROMPT_PASS = 7  # flowgrpo.data.draw_prompt: the order of the prompts in each pass
STREAM_PROMPT_GROUPS = 8  # ... with train.balance_by: the order of the groups in each cycle
STREAM_PROMPT_IN_GROUP = 9  # ... and of each group's prompts in each pass over it
STREAM_PROMPT_BATCH = 14  # ... with train.prompt_draw=batch: each rollout batch's own random choice of prompts
STREAM_UPDATE_ORDER = 11  # the transition learner's order of its training units over the updates of an epoch
STREAM_FORWARD_UPDATE_ORDER = 13  # the forward-process learners' order of their groups (or dealt samples)
EVAL_SEED_OFFSET = 12345  # held-out evaluation's seed: the run's seed + this, the same at every evaluation


def _mix64(z: int) -> int:
    """splitmix64 finaliser: a bijection of 64-bit integers with good avalanche."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def fold_seed(state: int, *parts: int) -> int:
    """Continue the left fold of ``derive_seed`` from ``state`` (a prefix computed once)."""
    for part in parts:
        state = _mix64(state ^ (int(part) & _MASK64))
    return state


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that is a pure function of the integer ``parts`` (order matters)."""
    return fold_seed(_SEED_BASIS, *parts) & ((1 << 63) - 1)


def seed_prefix(*parts: int) -> int:
    """Fold state after ``parts``: ``derive_seed(*a, *b) == finish_seed(seed_prefix(*a), *b)``."""
    return fold_seed(_SEED_BASIS, *parts)


def finish_seed(prefix: int, *parts: int) -> int:
    return fold_seed(prefix, *parts) & ((1 << 63) - 1)


def make_generator(*parts: int, prefix: int | None = None) -> torch.Generator:
    """A CPU generator seeded by ``derive_seed(*parts)`` (CPU so draws match on every device);
    with ``prefix`` = ``seed_prefix(*first_parts)`` it seeds ``derive_seed(*first_parts, *parts)``."""
    generator = torch.Generator(device="cpu")
    seed = derive_seed(*parts) if prefix is None else finish_seed(prefix, *parts)
    generator.manual_seed(seed)
    return generator


def shift_sigmas(t: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3 time shift σ = k·t / (1 + (k − 1)·t); ``shift = 1`` is the identity."""
    if shift <= 0:
        raise ValueError(f"time shift must be > 0, got {shift}")
    return shift * t / (1.0 + (shift - 1.0) * t)


GRIDS = ("linear", "linear_float32", "scheduler", "dpmsolver")
TRAIN_TIMESTEPS = 1000  # the flow-matching schedulers' num_train_timesteps


def time_grid(num_steps: int, shift: float = 3.0, terminal: float | None = None, spacing: str = "linear") -> torch.Tensor:
    """σ grid [num_steps + 1] float64 from 1 to 0 (σ_0 = 1, σ_T = 0) with the SD3 time shift; with ``terminal``,
    stretched so that the last σ before 0 is ``terminal`` (``terminal_stretch``).

    ``spacing``: "linear" spaces the unshifted t as 1, 1 − 1/T, …, 1/T (what the pipelines pass as ``sigmas``);
    "scheduler" is diffusers' FlowMatchEulerDiscreteScheduler left to space them itself (the grid DiffusionNFT's and
    AWM's code train on): T points from 1 to its σ_min = shift(1/1000), shifted, so the last σ before 0 is
    shift(shift(1/1000)) (SD3's shift 3: 0.0089, where the linear grid of 10 steps stops at 0.25). "dpmsolver" is
    diffusers' DPMSolverMultistepScheduler with flow sigmas (DGPO's rollout): t_i = 1 − a_{T−i} of a = linspace(1,
    1/1000, T + 1), i < T, shifted once, so σ_0 = shift(0.999) < 1, then 0. "linear_float32" is the linear grid
    computed in float32 as DanceGRPO's, MixGRPO's and BranchGRPO's ``sd3_time_shift(shift, torch.linspace(1, 0, T + 1))``:
    the same points to a float32 ulp (at T = 20 and shift 3 its σ_6 is 0.87499994, the linear grid's 0.875), and that
    ulp decides the integer timestep ⌊1000σ⌋ those codes tell the network (sampling.integer_timesteps)."""
    if int(num_steps) != num_steps or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps}")
    if spacing not in GRIDS:
        raise ValueError(f"grid spacing must be one of {GRIDS}, got {spacing!r}")
    if spacing == "linear":
        t = torch.linspace(1.0, 0.0, int(num_steps) + 1, dtype=torch.float64)
    elif spacing == "linear_float32":
        t32 = torch.linspace(1.0, 0.0, int(num_steps) + 1, dtype=torch.float32)
        k = float(shift)
        sigmas = ((k * t32) / (1 + (k - 1) * t32)).double()
        return terminal_stretch(sigmas, terminal)(sigmas)
    elif spacing == "dpmsolver":
        a = torch.linspace(1.0, 1.0 / TRAIN_TIMESTEPS, int(num_steps) + 1, dtype=torch.float64)
        t = torch.cat([torch.flip(1.0 - a, [0])[:-1], torch.zeros(1, dtype=torch.float64)])
        sigmas = shift_sigmas(t, shift)
        sigmas[-1] = 0.0
        return terminal_stretch(sigmas, terminal)(sigmas)
    else:
        low = float(shift_sigmas(torch.tensor(1.0 / TRAIN_TIMESTEPS, dtype=torch.float64), shift))
        t = torch.cat([torch.linspace(1.0, low, int(num_steps), dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    sigmas = shift_sigmas(t, shift)
    sigmas[0], sigmas[-1] = 1.0, 0.0  # exact endpoints whatever the rounding of the shift
    return terminal_stretch(sigmas, terminal)(sigmas)


def terminal_stretch(sigmas: torch.Tensor, terminal: float | None):
    """The map σ -> 1 − (1 − σ)/s that a scheduler's ``shift_terminal`` applies (Qwen-Image: 0.02), with s chosen
    so that the last σ of ``sigmas`` before its final 0 becomes ``terminal``; σ = 1 stays 1 and the final 0 stays 0
    (diffusers' FlowMatchEulerDiscreteScheduler stretches its sigmas before appending the 0). The identity for
    ``terminal=None`` or a grid of one step."""
    if terminal is None or sigmas.numel() < 3:
        return lambda s: s
    if not 0 < terminal < 1:
        raise ValueError(f"shift_terminal must be in (0, 1), got {terminal}")
    scale = (1.0 - float(sigmas[-2])) / (1.0 - terminal)

    def stretch(s: torch.Tensor) -> torch.Tensor:
        out = 1.0 - (1.0 - s) / scale
        return torch.where(s == 0, torch.zeros_like(out), out)

    return stretch


def flash_tail_points(num_steps: int, window_end: int, ratio: float) -> int:
    """Points of MixGRPO-Flash's re-gridded tail, both ends counted: int(max((T − window_end + 1)·r̃, 1)), the official
    code's ``num_post_steps`` (fastvideo/utils/sampling_utils.py, run_sample_step: the float product of
    ``sigma_schedule.size(0) − 1 − last_false_index`` = T − (l + w − 1) and the ratio, truncated). Where that is 1 the
    official rollout stops at σ_{l+w} without reaching σ = 0 (a window ending late: (T − l − w + 1)·r̃ < 2); flowgrpo
    takes 2 there (one step to σ = 0) so that every rollout ends at the data. 0 when the window reaches the end."""
    if not 0 < ratio <= 1:
        raise ValueError(f"post-window compress ratio must be in (0, 1], got {ratio}")
    if not 0 <= window_end <= num_steps:
        raise ValueError(f"window end {window_end} must lie in [0, {num_steps}]")
    if window_end == num_steps:
        return 0
    return max(int(max((num_steps - window_end + 1) * ratio, 1)), 2)


def flash_steps(num_steps: int, window_end: int, ratio: float) -> int:
    """Number of steps of MixGRPO-Flash's grid: l + w + n − 1 with n = ``flash_tail_points`` (window_end = l + w):
    T = 25, w = 4, l = 0 gives 4 + 8 − 1 = 11 at r̃ = 0.4 and 4 + 4 − 1 = 7 at r̃ = 0.2."""
    points = flash_tail_points(num_steps, window_end, ratio)
    return window_end + (points - 1 if points else 0)


def flash_grid(num_steps: int, shift: float, window_end: int, ratio: float, terminal: float | None = None) -> torch.Tensor:
    """MixGRPO-Flash σ grid [flash_steps + 1] float64: original points up to ``window_end``, then the
    rest of the way to σ = 0 re-gridded with ``flash_tail_points`` points (the first is σ_{window_end}), linear in the
    unshifted t from 1 − window_end/T to 0 and shifted (with ``terminal``, every point goes through the stretch of the
    original T-step grid)."""
    total = flash_steps(num_steps, window_end, ratio)
    stretch = terminal_stretch(time_grid(num_steps, shift), terminal)
    head = time_grid(num_steps, shift, terminal)[: window_end + 1]
    tail_steps = total - window_end
    if tail_steps == 0:
        return head
    t_start = 1.0 - window_end / num_steps
    t_tail = torch.linspace(t_start, 0.0, tail_steps + 1, dtype=torch.float64)[1:]
    tail = stretch(shift_sigmas(t_tail, shift))
    tail[-1] = 0.0
    return torch.cat([head, tail])


__all__ = [
    "EVAL_SEED_OFFSET",
    "STREAM_FORWARD_UPDATE_ORDER",
    "STREAM_INITIAL_NOISE",
    "STREAM_PROMPT_BATCH",
    "STREAM_PROMPT_GROUPS",
    "STREAM_PROMPT_IN_GROUP",
    "STREAM_PROMPT_PASS",
    "STREAM_STEP_NOISE",
    "STREAM_TRAIN_DRAWS",
    "STREAM_TRAIN_SUBSET",
    "STREAM_UPDATE_ORDER",
    "STREAM_WINDOW",
    "derive_seed",
    "finish_seed",
    "flash_grid",
    "flash_steps",
    "flash_tail_points",
    "make_generator",
    "seed_prefix",
    "shift_sigmas",
    "GRIDS",
    "terminal_stretch",
    "time_grid",
]


def eval_noise_seed(seed: int, index: int) -> int:
    """The generator seed of prompt ``index``'s x_T in an evaluation with ``seed`` (recorded per sample)."""
    return seed * 1_000_003 + index


def eval_noise(shape: tuple[int, ...], seed: int, indices) -> torch.Tensor:
    """x_T [len(indices), *shape] for each prompt index: a pure function of (seed, prompt index), whatever the batching."""
    noise = [torch.randn(shape, generator=torch.Generator().manual_seed(eval_noise_seed(seed, i))) for i in indices]
    return torch.stack(noise)
