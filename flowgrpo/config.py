"""The training configuration: OmegaConf structured dataclasses, every field commented.

A run's config is built in layers, later ones winning:
  configs/default.yaml  →  configs/presets/<method>.yaml  →  configs/models/<model>.yaml (under
  ``model``)  →  the preset's paper recipe (real models only)  →  ``key=value`` overrides from the command line.
The first layer is the entry point's embedded default: ``configs/default.yaml`` (train_t2i.py, the
tiny SD3 on toy images) or ``configs/default_t2v.yaml`` (train_t2v.py, the tiny Wan on toy videos),
chosen with ``load_config(..., default=...)``.
``load_config`` merges and validates: unknown keys fail (with a "did you mean"), and impossible
numbers fail with an error that prints them. ``describe_batches`` is logged at start-up.
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from flowgrpo.run.errors import ConfigError
from samplers.rules import (  # noqa: F401  (re-exported: the schema's RULES tables use them)
    FINITE, FLAG, MAPPING, TEXT, Rule, above, at_least, between, is_number, one_of, optional,
)
from flowgrpo.models.config import ModelConfig, validate_model_config
from flowgrpo.run.paths import configs_dir


# what each key takes: the constructors of samplers/rules.py, shared with the plan's and the window's own rules
_number = is_number


NAMES = Rule(lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x.strip() for x in v),
             "a list of names, e.g. [brightness, toy]")
BETAS = Rule(lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(_number(b) and 0 <= b < 1 for b in v),
             "two numbers in [0, 1), e.g. [0.9, 0.999]")
FOLDER_NAME = Rule(lambda v: isinstance(v, str) and v not in ("", ".", "..") and v == v.strip()
                   and not any(c in v for c in ("/", "\\", "\0")),
                   "a plain folder name (no '/', '\\' or '..', no surrounding spaces): the run folder is "
                   "output_dir/run_name; put a path in output_dir= instead")

@dataclass
class SamplingConfig:
    method: str = "flow_grpo"  # a samplers.METHOD_PRESETS name: the rollout plan and its schedule
    plan: dict = field(default_factory=dict)  # overrides of the preset's compose_plan arguments (num_steps, eta, group_size, splits, ...)
    window: dict = field(default_factory=dict)  # overrides of the preset's window schedule (size, strategy, interval, stride, ...)
    shift: Optional[float] = None  # time shift of the rollout grid; None = the model's
    guidance_scale: Optional[float] = None  # CFG scale in rollout and training; None = the model's
    max_batch: int = 256  # cap on rows per velocity call (memory)
    reduce: str = "mean"  # log-prob reduction over latent elements: mean (every public repo) | sum (true density)
    # the log-prob's form: gaussian (the density) | squared_error (−reduce(x' − μ)², no 1/(2s²): Flow-GRPO's CPS code,
    # whose clip range binds on that scale; the KL keeps the step's s)
    log_prob: str = "gaussian"
    # the rollout's network calls (and the transition learner's recompute of its transitions) are told the integer
    # timestep ⌊1000σ⌋ while the kernels step the exact σ, as DiffusionNFT's and DGPO's SD3 rollouts and DanceGRPO's,
    # MixGRPO's and BranchGRPO's FLUX steps do; false: σ·1000 (Flow-GRPO's, AWM's, the pipelines')
    integer_timesteps: bool = False
    batches_per_iteration: int = 1  # rollout batches per iteration; rewards of batch b run while batch b+1 samples
    RULES: ClassVar[dict] = {"method": TEXT, "plan": MAPPING, "window": MAPPING, "shift": optional(above(0)),
                             "guidance_scale": optional(at_least(0)), "max_batch": at_least(1),
                             "reduce": one_of("mean", "sum"), "log_prob": one_of("gaussian", "squared_error"),
                             "integer_timesteps": FLAG,
                             "batches_per_iteration": at_least(1)}


@dataclass
class RewardSpec:
    name: str = "toy"  # registered reward name or dotted path module:Class
    weight: float = 1.0  # weight in the multi-reward combination; a single reward is scaled by it too (−1 minimises it)
    kwargs: dict = field(default_factory=dict)  # passed to the reward's constructor
    timeout_s: float = 600.0  # one scoring call's limit: a reward that hangs gives NaN for the batch (0 = no limit)
    RULES: ClassVar[dict] = {"name": TEXT, "weight": FINITE, "kwargs": MAPPING, "timeout_s": at_least(0)}


@dataclass
class AdvantageConfig:
    std: str = "group"  # z-score denominator: group (per group) | global (whole batch) | none (A = r − group mean, Dr. GRPO)
    eps: float = 1e-4  # added to the std
    std_correction: int = 0  # the std divides by n − this: 0 the population's (Flow-GRPO's np.std), 1 torch.std's (DanceGRPO, MixGRPO)
    clip: float = 5.0  # advantages are clipped to [-clip, clip]
    # several rewards: gdpo (z-score each in its group, weighted sum, z-score the sum) | zsum (the same sum, not
    # z-scored again: MixGRPO's) | sum (weighted sum of raw rewards, then the group z-score: DiffusionNFT's, Flow-GRPO's)
    multi_reward: str = "gdpo"
    tree_value: str = "mean"  # BranchGRPO node value: mean of descendant leaves | path_weighted (softmax of β·log p(path))
    tree_beta: float = 1.0  # β of path_weighted node values
    best_of_n: int = 0  # DanceGRPO best-of-N: train only the top n/2 and bottom n/2 samples of each group (0 = all)
    # a group whose rewards are all equal (A = 0): skip (never computed, kept in the normalisers) | train (A = 0
    # rows stay in the loss, as the reference codes do: NFT's r = 1/2 term pulls toward θ_old, a KL term still acts)
    tied_groups: str = "skip"
    # GARDO's diversity-aware shaping: positive advantages times the sample's nearest-sibling cosine distance over
    # its group's mean (features: the decoded samples at 16x16); docs/hacking.md
    diversity: bool = False
    RULES: ClassVar[dict] = {"std": one_of("group", "global", "none"), "eps": above(0), "std_correction": one_of(0, 1),
                             "clip": above(0),
                             "multi_reward": one_of("gdpo", "zsum", "sum"), "tree_value": one_of("mean", "path_weighted"),
                             "tree_beta": above(0), "best_of_n": at_least(0), "tied_groups": one_of("skip", "train"),
                             "diversity": FLAG}


@dataclass
class LossConfig:
    clip_range: float = 1e-4  # PPO ε; 1e-4 for mean-reduced log-probs, 1e-5 for windows/cps, 2e-6 for GRPO-Guard
    ratio: str = "plain"  # plain: exp(lp_θ − lp_old) | guard: GRPO-Guard's normalised ratio (needs μ_old)
    step_weight: str = "none"  # none | inv_delta (GRPO-Guard 1/Δ) | sage (gradient-norm equaliser); plan weights (TempFlow) always apply
    kl_coef: float = 0.0  # β of the KL to the reference policy (0 = off)
    kl_form: str = "exact"  # exact: reduce_D(Δμ²)/(2s²) | flow_grpo: Flow-GRPO's SD3 code, which drops Δ inside s
    anchor_kl_coef: float = 0.0  # SAGE: KL to a moving anchor copy of the policy (0 = off)
    anchor_refresh: int = 10  # SAGE: optimizer steps between anchor refreshes
    rollout_kl_coef: float = 0.0  # SAGE: KL to the rollout policy μ_old (0 = off)
    # the KL terms' weight: constant (the two coefficients above) | sage (SAGE's adaptive weight, per transition:
    # ramped from anchor_kl_min to anchor_kl_coef over its first 100 transitions, then x0.9 while the mean of the
    # last 10 KLs exceeds 1.5·anchor_kl_coef, x1.1 while it is below 0.5·anchor_kl_coef, within [anchor_kl_min,
    # anchor_kl_coef]; the rollout term keeps its ratio rollout_kl_coef/anchor_kl_coef to it)
    anchor_kl_schedule: str = "constant"
    anchor_kl_min: float = 1e-7
    normalize: str = "group"  # loss normalisation: group (per group or tree, by its trained transitions) | transition (plain mean)
    likelihood_backend: str = "reference"  # per-transition likelihood terms (flowgrpo/likelihood/): reference (PyTorch, the
    #   specification) | fused (the csrc/ op; fails with instructions if it cannot be built) | auto (fused when it can)
    RULES: ClassVar[dict] = {"clip_range": above(0), "ratio": one_of("plain", "guard"),
                             "step_weight": one_of("none", "inv_delta", "sage"), "kl_coef": at_least(0),
                             "kl_form": one_of("exact", "flow_grpo"), "anchor_kl_coef": at_least(0),
                             "anchor_refresh": at_least(1), "rollout_kl_coef": at_least(0),
                             "anchor_kl_schedule": one_of("constant", "sage"), "anchor_kl_min": at_least(0),
                             "normalize": one_of("group", "transition"),
                             "likelihood_backend": one_of("reference", "fused", "auto")}


@dataclass
class SoftCopyConfig:
    """A soft copy θ_c ← λ·θ_c + (1 − λ)·θ of the trained weights, λ = min(rate·(n − delay), max) after
    ``delay`` optimizer steps n (0 before): NFT's sampling policy, AWM's EMA, DGPO's ema_ref."""

    rate: float = 0.001  # λ grows by this per optimizer step
    max: float = 0.5  # λ's ceiling
    delay: int = 0  # optimizer steps with λ = 0 (the copy follows θ exactly)
    RULES: ClassVar[dict] = {"rate": at_least(0), "max": between(0, 1), "delay": at_least(0)}


@dataclass
class NFTConfig:
    beta: float = 1.0  # β of the implicit policies v± (1.0 in the reference code; 0.1 for OCR)
    # the sampling policy θ_old, updated after each iteration (reference code's default: λ = min(0.001·n, 0.5))
    old: SoftCopyConfig = field(default_factory=SoftCopyConfig)
    RULES: ClassVar[dict] = {"beta": above(0)}  # the loss divides by β


@dataclass
class AWMConfig:
    weighting: str = "ghuber"  # w in ℓ = −w·mean_D(v − u)²: uniform | t | t2 | huber | ghuber (the reference configs')
    ghuber_power: float = 0.25  # p of ghuber: ℓ = −t·((m + 1e-10)^p − 1e-10^p)/p, m = mean_D(v − u)²
    clip_range: float = 1.0  # PPO ε on ρ = exp(ℓ_θ − ℓ_old) (the reference configs' 1.0)
    ema_kl_coef: float = 0.0  # v-space KL to the EMA of the weights (the reference: 1.0, with kl_coef > 0)
    sample_with_ema: bool = False  # off-policy: roll out with the EMA weights, ℓ_old from them too
    ema: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.001, max=0.3))
    RULES: ClassVar[dict] = {"weighting": one_of("uniform", "t", "t2", "huber", "ghuber"), "ghuber_power": above(0),
                             "clip_range": above(0), "ema_kl_coef": at_least(0), "sample_with_ema": FLAG}


@dataclass
class DGPOConfig:
    beta: float = 100.0  # β_dgpo of the group preference −log σ(−(β/G)·Σ_i A_i·δ_i) (GenEval/OCR; PickScore 10)
    clip_range: float = 0.01  # a sample's error stops contributing when ρ = exp(e_old − e_θ) leaves 1 ± ε on A's side
    # ema_ref: the "old" policy of the clip, updated after every optimizer step
    ema_ref: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.001, max=0.3))
    # roll out with ema_ref's weights once this many optimizer steps are taken (the reference code switches its
    # sampler to the EMA after 500 steps, 200 for OCR); 0 = always the current weights
    sample_with_ema_after: int = 0
    RULES: ClassVar[dict] = {"beta": above(0), "clip_range": above(0), "sample_with_ema_after": at_least(0)}


@dataclass
class LearnerConfig:
    # the update rule (flowgrpo/engine/learners/): transition (the denoising-MDP GRPO loss on stored SDE transitions,
    # docs/math.md §3: every plan preset) | diffusion_nft | awm | dgpo (forward-process learners on the clean samples, §5)
    name: str = "transition"
    # --- forward-process learners: K training draws (t, ε) per sample and inner epoch, x_t = (1 − t)·x0 + t·ε
    train_times: int = 4  # K
    # plan (K of the rollout grid's points in [time_min, time_max], without replacement) | stratified (those points cut
    # into K runs of neighbours, one drawn from each: AWM's draw) | uniform | logit_normal
    time_sampler: str = "plan"
    time_min: float = 0.0  # training times below are not drawn (DGPO trains only high-noise t)
    time_max: float = 1.0  # training times above are not drawn
    logit_mean: float = 0.0  # logit_normal: t = shift(sigmoid(N(mean, std))) with the rollout's time shift
    logit_std: float = 1.0
    share_draws: str = "sample"  # sample (each its own t and ε) | group (one t and ε per group and draw: DGPO)
    # draw (the K times drawn with each draw's ε, shared as share_draws says) | iteration (one set of K times per
    # iteration and inner epoch for every sample, ε still per share_draws: DGPO's code)
    share_times: str = "draw"
    # train at t = ⌊1000t⌋/1000 and tell the network the integer 1000t (DGPO's code trains at its scheduler's integer
    # timesteps); false: the drawn t as it is
    integer_times: bool = False
    train_guidance: str = "conditional"  # conditional (CFG-free training) | cfg (sampling.guidance_scale, as the rollout)
    adv_max: float = 5.0  # A_max: advantages clipped to ±A_max (NFT's optimality probability, AWM's scale)
    kl_coef: float = 0.0  # v-space KL to the reference policy: kl_coef·mean_D(v_θ − v_ref)²
    nft: NFTConfig = field(default_factory=NFTConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    dgpo: DGPOConfig = field(default_factory=DGPOConfig)
    RULES: ClassVar[dict] = {"name": TEXT, "train_times": at_least(1),
                             "time_sampler": one_of("plan", "stratified", "uniform", "logit_normal"),
                             "time_min": between(0, 1), "time_max": between(0, 1), "logit_mean": FINITE,
                             "logit_std": above(0), "share_draws": one_of("sample", "group"),
                             "share_times": one_of("draw", "iteration"), "integer_times": FLAG,
                             "train_guidance": one_of("conditional", "cfg"), "adv_max": above(0), "kl_coef": at_least(0)}


@dataclass
class TrainConfig:
    iterations: int = 40  # GRPO iterations (rollout + update)
    prompts_per_iteration: int = 8  # prompts per iteration over all processes (each with its whole group)
    inner_epochs: int = 1  # passes over each iteration's transitions
    updates_per_epoch: int = 1  # optimizer steps per pass (transitions split evenly, whole groups kept)
    # what an update's share of the pass is made of: groups (whole groups or trees, each weighed as one) |
    # transitions (the transition learner: every trained transition shuffled across groups and cut into
    # updates_per_epoch equal parts, BranchGRPO's stepping; each still carries its group's normalising weight) |
    # samples (chains: every group's samples in a seeded order dealt out to the updates, each sample with all its
    # transitions or draws, so each step trains a share of every group: Flow-GRPO's, DanceGRPO's, MixGRPO's codes)
    update_split: str = "groups"
    micro_batch: int = 64  # transitions per forward/backward (gradient accumulation inside an update)
    learning_rate: float = 3e-4
    # the learning rate over the run, a pure function of the iteration (resumes need no scheduler state):
    # constant | cosine (half a cosine from learning_rate down to lr_final·learning_rate at train.iterations)
    # | linear (a straight line between the same two ends)
    lr_schedule: str = "constant"
    lr_final: float = 0.0  # the end of a cosine or linear schedule, as a fraction of learning_rate
    weight_decay: float = 0.0
    # adamw | muon (Muon on the weights of 2+ dimensions, AdamW with adam_betas on the rest: SAGE-GRPO's optimizer,
    # flowgrpo/engine/optim.py)
    optimizer: str = "adamw"
    adam_betas: tuple = (0.9, 0.999)
    grad_clip: float = 1.0  # max gradient norm (0 = off)
    ema_decay: float = 0.0  # EMA of trainable weights used for evaluation (0 = off), λ = min(decay, (1 + n)/(10 + n))
    mixed_precision: str = "no"  # accelerate's: no | bf16 | fp16
    seed: int = 0  # every random draw is a pure function of (seed, iteration, prompt, node)
    # draw training prompts so that every value of this metadata key (e.g. "task") comes up equally often:
    # each run of N slots (N values) holds one prompt of each value, each value's prompts in their own seeded
    # order. "" (or a prompt set whose prompts carry no such key, e.g. a .txt file) draws every prompt once
    # per pass; a set where only some prompts carry it is refused.
    balance_by: str = ""
    cpu: bool = False  # force CPU (and make accelerate run distributed on CPU with gloo)
    # stop the run, naming the reward and its last error, after this many consecutive iterations in which no
    # sample got a finite reward (a reward that fails on every call); such iterations are never checkpointed (0 = never stop)
    max_iterations_without_reward: int = 3
    RULES: ClassVar[dict] = {
        "iterations": at_least(1), "prompts_per_iteration": at_least(1), "inner_epochs": at_least(1),
        "updates_per_epoch": at_least(1), "update_split": one_of("groups", "transitions", "samples"),
        "micro_batch": at_least(1), "learning_rate": at_least(0),
        "lr_schedule": one_of("constant", "cosine", "linear"), "lr_final": between(0, 1), "weight_decay": at_least(0),
        "optimizer": one_of("adamw", "muon"),
        "adam_betas": BETAS, "grad_clip": at_least(0), "ema_decay": Rule(lambda v: _number(v) and 0 <= v < 1,
                                                                          "a number in [0, 1) (0 = off)"),
        "mixed_precision": one_of("no", "bf16", "fp16"), "seed": at_least(0), "balance_by": TEXT, "cpu": FLAG,
        "max_iterations_without_reward": at_least(0)}


@dataclass
class EvalConfig:
    every: int = 10  # evaluate every N iterations (0 = only at the end)
    prompts: str = "toy-eval"  # toy-eval | toy-train | a .txt or .jsonl file
    limit: int = 0  # use only the first N prompts (0 = all)
    steps: Optional[int] = None  # ODE steps; None = the model config's sample_steps
    reward: str = "toy"  # the held-out ("gold") reward
    batch_size: int = 64
    at_start: bool = True  # evaluate the starting model too
    # the reward-hacking watch (flowgrpo/engine/watch.py, docs/hacking.md): guards scored on the held-out samples
    # (held_out: the held-out reward's scores; image statistics brightness, saturation, high_frequency, diversity,
    # flicker; reward names), an alarm when one moves against its direction by more than hacking_threshold standard
    # errors (paired with the first evaluation) and hacking_min_effect of its spread while the training reward has
    # risen; stop_on_hacking then stops the run with a checkpoint
    guards: list = field(default_factory=lambda: ["held_out"])
    hacking_threshold: float = 3.0  # standard errors of the paired change
    hacking_min_effect: float = 0.1  # and at least this many standard deviations of the guard over the start's samples
    stop_on_hacking: bool = False
    RULES: ClassVar[dict] = {"every": at_least(0), "prompts": TEXT, "limit": at_least(0), "steps": optional(at_least(1)),
                             "reward": TEXT, "batch_size": at_least(1), "at_start": FLAG, "guards": NAMES,
                             "hacking_threshold": above(0), "hacking_min_effect": at_least(0),
                             "stop_on_hacking": FLAG}


@dataclass
class LogConfig:
    save_every: int = 20  # checkpoint every N iterations (0 = only at the end)
    keep_checkpoints: int = 2  # newest checkpoints kept
    samples_every: int = 10  # write sample PNGs (videos: MP4s + poster PNGs) and their manifest every N iterations (0 = never)
    eval_samples: int = 64  # held-out evaluation samples written per evaluation to samples/eval_<n>/ (the first N eval prompts; 0 = none)
    samples_per_prompt: int = 4  # leaves written per prompt when samples are written
    video_fps: int = 8  # frame rate of the sample MP4s of video models
    tensorboard: bool = True  # also write TensorBoard events (needs the tensorboard package)
    progress: bool = True  # progress bars
    gallery: bool = True  # build the review site (gallery/) into <run>/gallery at the end of the run
    wandb: bool = False  # also log metrics to Weights & Biases (pip install wandb; project "flowgrpo", run = run_name)
    # measure the gradient noise scale every N iterations from the update's per-micro-batch gradients (0 = never);
    # logs grad_noise/* and prints one line when the batch is below it (flowgrpo/engine/noise_scale.py)
    grad_noise_every: int = 10
    RULES: ClassVar[dict] = {"save_every": at_least(0), "keep_checkpoints": at_least(1), "samples_every": at_least(0),
                             "eval_samples": at_least(0), "samples_per_prompt": at_least(1), "video_fps": at_least(1),
                             "tensorboard": FLAG, "progress": FLAG, "gallery": FLAG, "wandb": FLAG,
                             "grad_noise_every": at_least(0)}


@dataclass
class Config:
    run_name: str = "tiny-sd3-toy"  # the run folder is <output_dir>/<run_name>
    output_dir: str = "runs"
    resume: bool = True  # continue from the newest checkpoint of the run folder if there is one
    # a rerun whose config differs from the run folder's in keys that change the experiment (flowgrpo/run/run_dir.py:
    # NEUTRAL_KEYS lists the others) is refused; true continues with the change, appended to config_history.jsonl
    allow_config_change: bool = False
    # torch CPU threads per process (--threads N): 0 = automatic (OMP_NUM_THREADS if set, else the cores no other
    # process is busy on, shared by this machine's processes; flowgrpo/run/threads.py), N = exactly N; printed at start-up
    threads: int = 0
    prompts: str = "toy-train"  # training prompts: toy-train | a .txt or .jsonl file
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rewards: list = field(default_factory=lambda: [RewardSpec()])  # list of RewardSpec
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # model: checked by flowgrpo/models/config.py validate_model_config; rewards: each a RewardSpec, by its RULES
    RULES: ClassVar[dict] = {"run_name": FOLDER_NAME, "output_dir": TEXT, "resume": FLAG, "allow_config_change": FLAG,
                             "threads": Rule(lambda v: _number(v) and v >= 0,
                                             "a number >= 0 (0 = automatic, N = exactly N CPU threads)"),
                             "prompts": TEXT}

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


# plans renamed to their preset's name (a method has one name: its preset file's)
RENAMED_METHODS = {"dance_grpo": "dancegrpo", "sage_grpo": "sage", "branch_grpo": "branchgrpo",
                   "branch_grpo_mix": "branchgrpo_mix", "tempflow_grpo": "tempflow"}

# the learners of flowgrpo/engine/learners/ (its LEARNERS registry; tests/engine/test_policy.py keeps the two equal)
LEARNER_NAMES = ("transition", "diffusion_nft", "awm", "dgpo")



def _resolve_yaml(spec: str, folder: str) -> Path:
    path = Path(spec)
    if path.is_file():
        return path
    candidate = configs_dir() / folder / f"{spec.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    names = sorted(p.stem for p in (configs_dir() / folder).glob("*.yaml"))
    where = "configs/" if folder == "." else f"configs/{folder}/"
    raise ConfigError(f"{spec!r} is neither a YAML file nor one of {where}: {names}")


def _unknown_key_message(exc: Exception, schema: Any) -> str:
    key = getattr(exc, "key", None) or str(exc).split("'")[1] if "'" in str(exc) else str(exc)
    full = getattr(exc, "full_key", key)
    parent = OmegaConf.select(OmegaConf.structured(schema), full.rsplit(".", 1)[0]) if "." in str(full) else None
    known = list(parent.keys()) if isinstance(parent, DictConfig) else list(OmegaConf.structured(schema).keys())
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys here: {known}"
    return f"unknown config key {full!r}{hint}"


# A preset states a whole method: each of these sections that it writes replaces the embedded default's (the
# default's 6-step plan, its learner's draw count or its advantage std would otherwise leak into the paper's method).
METHOD_SECTIONS = ("sampling", "learner", "advantage", "loss")


# the model configs of the built-in tiny worlds (docs/presets.md): a run on one of them (or with no --model) takes the
# tiny world's CPU settings; any other model config is a real model and takes the preset's paper recipe
TINY_WORLD_MODELS = ("tiny_sd3", "tiny_wan", "analytic")
# top-level blocks of a config YAML that say where the settings apply, not settings themselves:
#   tiny:              (the embedded defaults) the tiny world's CPU settings, applied only in the tiny world
#   recipe_preset:     (the embedded defaults) the preset whose recipe a real-model run without --preset takes
#   recipe:            (a preset) its paper's recipe on real models, applied only with a real model config
#   recipe_by_reward:  (a preset) {reward name: settings} on top of `recipe`, when the run trains on that one reward;
#                      `several`: when it trains on more than one
#   recipe_by_family:  (a preset) {family: settings} on top of both, where the paper differs by model family
WORLD_BLOCKS = ("tiny", "recipe_preset", "recipe", "recipe_by_family", "recipe_by_reward")


def is_real_model(model: str | None) -> bool:
    """Whether ``--model`` names a real model (its runs take the presets' paper recipes), not a tiny-world one."""
    return bool(model) and Path(model).stem not in TINY_WORLD_MODELS


def _blocks(layer: DictConfig) -> dict:
    """Take the WORLD_BLOCKS out of a loaded YAML layer: {block: its content}."""
    return {name: layer.pop(name) for name in WORLD_BLOCKS if name in layer}


@dataclass
class Resolved:
    """A run's configuration and where each of its settings came from: ``provenance`` maps every dotted leaf key
    (``sampling.plan.*`` and ``sampling.window.*`` with the method's full plan and window, as ``resolved_plan``
    gives them) to the layer that set it last, one of LAYER_NAMES, with the file in brackets where there is one."""

    config: Config
    merged: list = field(repr=False)  # [(layer name, file or None, the layer)] in the order they were merged

    @property
    def layers(self) -> list:
        """[(layer name, file or None)] in the order they were merged."""
        return [(name, where) for name, where, _ in self.merged]

    @functools.cached_property
    def provenance(self) -> dict:
        """Computed when asked (``flowgrpo config``): a run's load does not pay for it."""
        return _provenance(self.config, self.merged)


# the layers of a run's configuration, first to last (``flowgrpo config`` prints each key's)
LAYER_NAMES = ("schema default", "embedded default", "tiny block", "base config", "preset method", "model config",
               "recipe", "recipe_by_reward", "recipe_by_family", "run name", "override",
               "method plan", "plan builder default")


def load_config(preset: str | None = None, model: str | None = None, overrides: list[str] | None = None,
                base: str | dict | None = None, default: str = "default") -> Config:
    """The validated run configuration (``resolve(...).config``): default ← base ← preset ← model ← recipe ←
    overrides onto the schema; see ``resolve``."""
    return resolve(preset, model, overrides, base, default).config


def resolve(preset: str | None = None, model: str | None = None, overrides: list[str] | None = None,
            base: str | dict | None = None, default: str = "default") -> Resolved:
    """Merge default ← base ← preset ← model ← overrides onto the schema, then validate, keeping which layer set
    each key (``Resolved``).

    A METHOD_SECTIONS section that the preset writes replaces the embedded default's section (schema defaults
    under the preset's keys) instead of merging into it.

    Two worlds (docs/presets.md). With no ``model`` or a tiny-world model config (TINY_WORLD_MODELS), the default's
    ``tiny:`` block (its CPU-scaled training settings) follows the default. With a real model config, that block is
    left out and the preset's paper recipe follows the preset (``recipe:``, then ``recipe_by_reward:`` for the rewards
    trained on, then ``recipe_by_family:`` for the model's family, the most specific), after the model config, so a
    family's recipe may set model keys (the paper's text length, full fine-tuning); with no preset, the recipe of the
    default's method (``recipe_preset:``). Overrides always win.

    ``default`` is the embedded default: a name in configs/ ("default" for text-to-image,
    "default_t2v" for text-to-video) or a YAML file."""
    schema = Config()
    real = is_real_model(model)
    default_path = _resolve_yaml(default, ".")
    defaults = OmegaConf.load(default_path)
    world = _blocks(defaults)
    layers: list = [("embedded default", str(default_path), defaults)]
    if "tiny" in world and not real:
        layers.append(("tiny block", f"{default_path} (tiny:)", world["tiny"]))
    if isinstance(base, dict):
        layers.append(("base config", None, OmegaConf.create(base)))
    elif base:
        path = _resolve_yaml(base, "presets")
        layers.append(("base config", str(path), OmegaConf.load(path)))
    recipes: dict = {}
    method = preset or (world.get("recipe_preset") if real else None)
    preset_path = None
    if method:
        preset_path = _resolve_yaml(method, "presets")
        loaded = OmegaConf.load(preset_path)
        recipes = _blocks(loaded)
        layers.append(("preset method", str(preset_path), loaded))
        for section in METHOD_SECTIONS:  # the preset's method replaces the default's, key by key it would leak
            if section in loaded:
                defaults.pop(section, None)
    model_layer = None
    if model:
        model_path = _resolve_yaml(model, "models")
        model_layer = ("model config", str(model_path), OmegaConf.create({"model": OmegaConf.load(model_path)}))
    dotlist = None
    if overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not key=value (e.g. train.iterations=10)")
        dotlist = OmegaConf.from_dotlist(overrides)
    if real:  # the paper's recipe: in general, for the rewards trained on, then for the model's family (most specific)
        family = model_layer[2].model.get("family", ModelConfig.family)
        by_reward, reward_name = None, None
        if recipes.get("recipe_by_reward"):  # the rewards the run trains on, as the layers and overrides say
            rewards = _merge(schema, [layer for _, _, layer in layers] + [model_layer[2], dotlist]).rewards
            names = {(r.get("name") if isinstance(r, dict) else r.name) for r in rewards}
            table = recipes["recipe_by_reward"]
            reward_name = names.pop() if len(names) == 1 else "several" if names else None
            by_reward = table.get(reward_name) if reward_name else None
        for name, block in (("recipe", recipes.get("recipe")), ("recipe_by_reward", by_reward)):
            if block is not None and "model" in block:
                raise ConfigError(f"preset {method!r}: its {name} block sets model keys ({', '.join(block.model)}); a "
                                  "paper's model settings go under recipe_by_family.<family>, the family it trained")
        # the model config first, then the paper's recipe: a family's recipe may set how the paper ran that model
        # (its text length, full fine-tuning), which the model config's generic values would otherwise hide
        by_family = (recipes.get("recipe_by_family") or {}).get(family)
        layers += [model_layer, ("recipe", f"{preset_path} (recipe:)", recipes.get("recipe")),
                   ("recipe_by_reward", f"{preset_path} (recipe_by_reward.{reward_name}:)", by_reward),
                   ("recipe_by_family", f"{preset_path} (recipe_by_family.{family}:)", by_family)]
        # a real run is not the tiny world's: named after its model and method unless run_name is given
        layers.append(("run name", None, OmegaConf.create(
            {"run_name": f"{Path(model).stem}-{Path(method).stem if method else 'default'}"})))
    else:
        layers.append(model_layer)
    layers = [layer for layer in layers if layer is not None and layer[2] is not None]
    if dotlist is not None:
        layers.append(("override", "command line", dotlist))
    cfg: Config = OmegaConf.to_object(_merge(schema, [layer for _, _, layer in layers], overrides))
    cfg.model = validate_model_config(cfg.model)
    try:
        cfg.rewards = [r if isinstance(r, RewardSpec) else RewardSpec(**r) for r in cfg.rewards]
    except TypeError:
        raise ConfigError(f"rewards={cfg.rewards!r}: write each reward as {{name: NAME, weight: W}} (with a space after "
                          "each colon, or YAML reads 'name:toy' as one key), e.g. rewards='[{name: toy_dense, weight: 1.0}]'") from None
    validate(cfg)
    return Resolved(cfg, layers)


def _leaves(node, prefix: str = "") -> dict:
    """{dotted key: value} of the leaves of a plain mapping (a list is one leaf)."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _provenance(cfg: Config, layers: list) -> dict:
    """Every leaf key of the resolved config (and of its resolved plan and window) -> the layer that set it last."""
    import yaml

    final = _leaves(yaml.safe_load(to_yaml(cfg)))
    plan, window = resolved_plan(cfg)
    final.update({f"sampling.plan.{k}": v for k, v in plan.items()})
    final.update({f"sampling.window.{k}": v for k, v in (window or {}).items()})
    origin = {key: "schema default" for key in final}
    import samplers

    method = samplers.METHOD_PRESETS.get(cfg.sampling.method, {})
    for key in plan:
        origin[f"sampling.plan.{key}"] = "method plan [samplers/plans.py]" if key in method.get("plan", {}) else \
            "plan builder default [samplers/plans.py compose_plan]"
    for key in window or {}:
        origin[f"sampling.window.{key}"] = "method plan [samplers/plans.py]" if key in (method.get("window") or {}) \
            else "plan builder default [samplers/schedules.py WindowSchedule]"
    for name, where, layer in layers:
        label = f"{name} [{_short(where)}]" if where else name
        for key in _leaves(OmegaConf.to_container(layer)):
            if key in final:
                origin[key] = label
            else:  # a layer's whole mapping or list (rewards) counts for the leaves under it
                for leaf in final:
                    if leaf.startswith(key + ".") or leaf == key:
                        origin[leaf] = label
    if "shift" not in method.get("plan", {}) and "shift" not in cfg.sampling.plan:
        origin["sampling.plan.shift"] = (f"sampling.shift ({origin['sampling.shift']})" if cfg.sampling.shift is not None
                                         else "the model's shift for the plan's steps (sampling.shift is null)")
    return origin


def _short(where: str) -> str:
    """A layer's file relative to the project (configs/presets/x.yaml), or as it is."""
    root = str(configs_dir().parent) + "/"
    return where.replace(root, "")


def resolved_plan(cfg: Config) -> tuple[dict, dict | None]:
    """The run's whole plan and window arguments: the builders' defaults (``compose_plan``, ``WindowSchedule``), under
    the method's (samplers.METHOD_PRESETS), under ``sampling.plan`` / ``sampling.window``. The window is None for a
    method without a moving window. The grid's time shift is the model's unless the config sets one (None here)."""
    import inspect

    import samplers

    method = samplers.METHOD_PRESETS[cfg.sampling.method]
    builder = {k: (None if p.default is inspect.Parameter.empty else p.default)
               for k, p in inspect.signature(samplers.compose_plan).parameters.items() if k not in ("name", "window")}
    builder["shift"] = cfg.sampling.shift  # None: the model's, for the plan's number of steps (plan_schedule)
    plan = {**builder, **method["plan"], **dict(cfg.sampling.plan)}
    if method["window"] is None:
        return plan, None
    window_builder = {k: (None if p.default is inspect.Parameter.empty else p.default)
                      for k, p in inspect.signature(samplers.WindowSchedule).parameters.items()
                      if k not in ("num_steps", "seed")}
    return plan, {**window_builder, **method["window"], **dict(cfg.sampling.window)}


def _merge(schema: Config, layers: list, overrides: list[str] | None = None) -> DictConfig:
    """The layers (None skipped) merged onto the schema; a bad key or value is a ConfigError naming it (the
    override that carried it, when a mapping meets a list or a number: OmegaConf names no key then)."""
    merged = OmegaConf.structured(schema)
    for layer in layers:
        if layer is None:
            continue
        try:
            merged = OmegaConf.merge(merged, layer)
        except (ConfigKeyError, ValidationError) as exc:
            if isinstance(exc, ConfigKeyError) or "not in" in str(exc):
                raise ConfigError(_unknown_key_message(exc, schema)) from None
            key, first = getattr(exc, "full_key", None), str(exc).splitlines()[0]  # OmegaConf's message has 4 lines
            raise ConfigError(f"bad value for {key}: {first}" if key else f"bad config value: {first}") from None
        except (TypeError, ValueError) as exc:
            culprit = next((item for item in overrides or [] if not _merges(merged, item)), None)
            where = f"override {culprit!r}" if culprit else "a config layer"
            raise ConfigError(f"{where} does not fit its key: a mapping, a list and a single value cannot replace one "
                              f"another ({exc}); write the value as the key's default is written "
                              "(flowgrpo/config.py, configs/README.md)") from None
    return merged


def _merges(merged: DictConfig, item: str) -> bool:
    """Whether the single override ``item`` merges onto ``merged`` without a container-type error."""
    try:
        OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
    except (TypeError, ValueError):
        return False
    except Exception:  # noqa: BLE001  (another kind of error: reported by the whole merge)
        return True
    return True




def learning_rate_at(t: "TrainConfig", iteration: int) -> float:
    """train.learning_rate scaled by train.lr_schedule at ``iteration`` of train.iterations (0-based; the
    last iteration's rate is lr_final·learning_rate)."""
    if t.lr_schedule == "constant":
        return t.learning_rate
    progress = min(1.0, iteration / max(1, t.iterations - 1))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if t.lr_schedule == "cosine" else 1.0 - progress
    return t.learning_rate * (t.lr_final + (1.0 - t.lr_final) * shape)


def check_rules(section: Any, prefix: str = "") -> None:
    """Every key against its class's ``RULES`` (recursively; ``rewards`` item by item; the model config has its own
    validator): a value outside is a ConfigError naming the key, the value and what is allowed."""
    rules = getattr(type(section), "RULES", {})
    for f in fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if f.name == "model":
            continue
        if is_dataclass(value):
            check_rules(value, f"{key}.")
        elif f.name == "rewards" and isinstance(value, list):
            for i, spec in enumerate(value):
                check_rules(spec, f"{key}[{i}].")
        elif f.name in rules and not rules[f.name].ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed; use {rules[f.name].allowed}")


def validate(cfg: Config) -> None:
    """Check choices and batch arithmetic; errors print the numbers involved."""
    import samplers

    check_rules(cfg)
    if cfg.learner.name not in LEARNER_NAMES:
        raise ConfigError(f"learner.name={cfg.learner.name!r} is unknown; use one of {sorted(LEARNER_NAMES)}")
    if cfg.sampling.method not in samplers.METHOD_PRESETS:
        renamed = RENAMED_METHODS.get(cfg.sampling.method)
        hint = f"it is called {renamed!r} now (as its preset, --preset {renamed}); " if renamed else ""
        raise ConfigError(f"sampling.method={cfg.sampling.method!r} is unknown; {hint}use one of "
                          f"{sorted(samplers.METHOD_PRESETS)}")
    if not cfg.rewards:
        raise ConfigError("rewards is empty; give at least one, e.g. rewards=[{name: toy}]")
    plan = check_plan(cfg)
    if cfg.learner.name == "transition" and plan.get("kernel") == "ode" and not plan.get("side_steps"):
        raise ConfigError(
            f"sampling.method={cfg.sampling.method!r} rolls out with ODE steps only, which leaves the transition learner "
            "nothing to train; use an SDE plan (e.g. --preset flow_grpo) or a forward-process learner "
            "(--preset diffusion_nft, awm or dgpo)"
        )
    solvers = {plan.get("solver"), plan.get("post_window_solver") if plan.get("post_window_ratio") else None}
    if cfg.learner.name == "transition" and "sa_solver" in solvers and plan.get("sa_tau", 0) > 0:
        raise ConfigError(
            f"sampling.plan.sa_tau={plan['sa_tau']} draws SA-Solver noise on untrained steps, whose log-probs the "
            "transition learner does not have; set sampling.plan.sa_tau=0 (or another solver), or use a "
            "forward-process learner (--preset awm, diffusion_nft or dgpo)"
        )
    if cfg.model.family == "analytic" and (cfg.sampling.integer_timesteps or cfg.learner.integer_times):
        raise ConfigError("sampling.integer_timesteps and learner.integer_times tell a diffusers network an integer "
                          "timestep; the analytic world's network takes σ itself: set them to false")
    if cfg.sampling.log_prob != "gaussian" and cfg.loss.likelihood_backend == "fused":
        raise ConfigError(f"sampling.log_prob={cfg.sampling.log_prob} is scored by the PyTorch likelihood terms only (the "
                          "fused op scores the Gaussian form); set loss.likelihood_backend=reference (or auto)")
    group = plan.get("group_size", 1)
    tree = bool(plan.get("splits")) or bool(plan.get("side_steps"))
    if not tree and group < 2:
        raise ConfigError(
            f"sampling.plan.group_size={group}: GRPO needs at least 2 samples per prompt to compare "
            "(a group of 1 has zero advantage); set sampling.plan.group_size=2 or more"
        )
    t = cfg.train
    if t.prompts_per_iteration % cfg.sampling.batches_per_iteration:
        raise ConfigError(
            f"train.prompts_per_iteration={t.prompts_per_iteration} is not divisible by "
            f"sampling.batches_per_iteration={cfg.sampling.batches_per_iteration}"
        )
    kl = cfg.loss.kl_coef if cfg.learner.name == "transition" else cfg.learner.kl_coef
    if cfg.model.reference == "none" and (kl > 0 or cfg.learner.name == "dgpo"):
        what = "DGPO's preference term" if cfg.learner.name == "dgpo" else f"a KL coefficient of {kl}"
        raise ConfigError(f"{what} needs the reference policy, and model.reference='none' loads none; set "
                          "model.reference=auto (a LoRA's disabled adapter, or a frozen copy for full fine-tuning)")
    if t.updates_per_epoch > t.prompts_per_iteration and t.update_split == "groups":
        raise ConfigError(
            f"train.updates_per_epoch={t.updates_per_epoch} > train.prompts_per_iteration={t.prompts_per_iteration}: "
            "each update needs at least one whole group; lower updates_per_epoch (or split updates by transitions: "
            "train.update_split=transitions)"
        )
    lo = cfg.loss
    if lo.anchor_kl_schedule == "sage" and not 0 < lo.anchor_kl_min <= lo.anchor_kl_coef:
        raise ConfigError(f"loss.anchor_kl_schedule=sage moves the KL weight between loss.anchor_kl_min="
                          f"{lo.anchor_kl_min} and loss.anchor_kl_coef={lo.anchor_kl_coef}: it needs 0 < min <= coef")
    if t.update_split == "transitions" and cfg.learner.name != "transition":
        raise ConfigError(f"train.update_split=transitions shuffles stored transitions, which learner.name="
                          f"{cfg.learner.name!r} does not train on; use train.update_split=groups or samples")
    if t.update_split == "samples":
        if tree:
            raise ConfigError("train.update_split=samples deals a group's chains to the updates, and a tree's samples share "
                              "their trunk; use train.update_split=groups or transitions with a tree plan")
        if cfg.learner.name == "dgpo":
            raise ConfigError("train.update_split=samples splits a group over optimizer steps, and DGPO's preference "
                              "compares a whole group; use train.update_split=groups")
        if t.updates_per_epoch > group:
            raise ConfigError(f"train.update_split=samples deals each group's {group} samples to train.updates_per_epoch="
                              f"{t.updates_per_epoch} updates: some would train none of a group; lower updates_per_epoch")
    lc = cfg.learner
    if not lc.time_min < lc.time_max:
        raise ConfigError(f"learner.time_min={lc.time_min} < learner.time_max={lc.time_max} is needed: training times are "
                          "drawn between them")
    if lc.name == "dgpo" and lc.share_draws != "group":
        raise ConfigError("learner.name=dgpo compares the members of a group on the same (t, ε): set learner.share_draws=group")


MAX_ROLLOUT_NODES = 2**20  # states one rollout batch may hold: a million network calls per batch is days at real size


def check_plan(cfg: Config) -> dict:
    """sampling.plan and sampling.window under the rules of every other key, before anything loads: each key one
    that the plan builder or the window schedule takes (samplers' PLAN_RULES, WINDOW_RULES, declared beside them),
    each value allowed by its rule, then the schedule built and its plan at the window's first and last position,
    so that arguments which do not fit together are refused in the builder's own words. Returns the plan's
    arguments (``plan_arguments``)."""
    import samplers
    from samplers.plans import PLAN_RULES
    from samplers.rules import refusal
    from samplers.schedules import WINDOW_RULES

    s, method = cfg.sampling, samplers.METHOD_PRESETS[cfg.sampling.method]
    for section, given, rules in (("plan", s.plan, PLAN_RULES), ("window", s.window, WINDOW_RULES)):
        unknown = sorted(set(given) - set(rules))
        if unknown:
            raise ConfigError(f"sampling.{section}.{unknown[0]} is not a key of the {section}; it takes {sorted(rules)}")
    if s.window and method["window"] is None:
        windowed = sorted(k for k, v in samplers.METHOD_PRESETS.items() if v["window"])
        raise ConfigError(f"sampling.window.{sorted(s.window)[0]}: sampling.method={s.method} has no moving window (its "
                          f"plan is the same every iteration); the methods with one: {windowed}")
    plan = plan_arguments(cfg)
    window = {**method["window"], **s.window} if method["window"] else {}
    for section, values, rules in (("plan", plan, PLAN_RULES), ("window", window, WINDOW_RULES)):
        for key, value in values.items():
            message = refusal(f"sampling.{section}.{key}", value, rules[key])
            if message:
                raise ConfigError(message)
    given = [f"sampling.{section}.{k}={v!r}" for section, values in (("plan", s.plan), ("window", s.window))
             for k, v in values.items()]
    shift = plan.get("shift") or s.shift or 3.0  # the model's shift is known once it loads; any shift builds alike
    try:
        schedule = samplers.method_schedule(s.method, plan={**s.plan, "shift": shift}, window=dict(s.window) or None)
        plans = [schedule.plan_at(start) for start in
                 (schedule.window.extreme_starts() if schedule.window is not None else (None,))]
    except ValueError as exc:
        where = f"with {', '.join(given)}" if given else "as its method sets it"
        raise ConfigError(f"the rollout plan of sampling.method={s.method} {where} cannot be built: {exc}") from None
    per_batch = cfg.train.prompts_per_iteration // max(1, s.batches_per_iteration)
    nodes = max(p.node_count() for p in plans) * max(1, per_batch)
    if nodes > MAX_ROLLOUT_NODES:
        raise ConfigError(
            f"the rollout plan of sampling.method={s.method} holds {nodes:,} states per rollout batch ({per_batch} prompts "
            f"x {nodes // max(1, per_batch):,} per prompt: group_size, branch_factor**len(splits), side_children), more "
            f"than {MAX_ROLLOUT_NODES:,}: it cannot finish in memory or in any sensible time; lower those, or "
            "train.prompts_per_iteration, or raise sampling.batches_per_iteration")
    return plan


def plan_arguments(cfg: Config) -> dict:
    """The compose_plan arguments of the run: the method preset with the config's overrides (validation reads
    them; the loop asks the plans of ``plan_schedule`` instead)."""
    import samplers

    preset = samplers.METHOD_PRESETS[cfg.sampling.method]
    return {**preset["plan"], **dict(cfg.sampling.plan)}


def plan_schedule(cfg: Config, model):
    """The run's plan schedule (samplers.method_schedule): the plan of every iteration, built with the time shift
    of sampling.plan.shift, else sampling.shift, else the model's for the plan's number of steps
    (``model.shift_for``), and the model scheduler's terminal stretch (``model.shift_terminal``; Qwen-Image)."""
    import samplers

    arguments = plan_arguments(cfg)
    shift = arguments.get("shift", cfg.sampling.shift or model.shift_for(int(arguments["num_steps"])))
    plan = {**cfg.sampling.plan, "shift": shift, "shift_terminal": getattr(model, "shift_terminal", None)}
    return samplers.method_schedule(cfg.sampling.method, plan=plan, window=dict(cfg.sampling.window) or None,
                                    seed=cfg.train.seed)


def processes_check(cfg: Config, world_size: int) -> None:
    """Groups never split across ranks: every rank samples whole prompts (with their groups)."""
    per_batch = cfg.train.prompts_per_iteration // cfg.sampling.batches_per_iteration
    if per_batch % world_size:
        raise ConfigError(
            f"train.prompts_per_iteration={cfg.train.prompts_per_iteration} / sampling.batches_per_iteration="
            f"{cfg.sampling.batches_per_iteration} = {per_batch} prompts per batch cannot be split evenly over "
            f"{world_size} processes; make it a multiple of {world_size}"
        )


def describe_batches(cfg: Config, world_size: int, leaves_per_prompt: int, learner_lines: str) -> str:
    """The derived batch arithmetic, printed at start-up; ``learner_lines``: what the learner trains per
    iteration and in how many steps (the learner's ``describe``)."""
    t = cfg.train
    per_rank = t.prompts_per_iteration // world_size
    lines = [
        f"processes: {world_size}; prompts per iteration: {t.prompts_per_iteration} ({per_rank} per process, "
        f"{cfg.sampling.batches_per_iteration} rollout batches)",
        f"samples (leaves) per prompt: {leaves_per_prompt}; per iteration: {t.prompts_per_iteration * leaves_per_prompt}",
        learner_lines,
    ]
    return "\n".join(lines)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict:
    """Every key's schema default as {dotted key: value}: what a run folder's config written before the key
    existed stands for (flowgrpo/run/run_dir.py compares configs with it)."""
    import yaml

    from flowgrpo.run.run_dir import flatten

    return flatten(yaml.safe_load(to_yaml(Config())))
