"""The configuration schema: OmegaConf structured dataclasses, each key declared once with what it takes beside
its default (``key(rule, default)``; the rules are samplers/rules.py's constructors, shared with the plan's and the
window's own rules) and a comment. ``rules_of(cls)`` reads them; ``flowgrpo.config.check`` applies them."""

from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from flowgrpo.models.config import ModelConfig
from samplers.rules import FINITE, FLAG, MAPPING, TEXT, Rule, above, at_least, between, in_open_closed, is_number, one_of, optional


# what each key takes: the constructors of samplers/rules.py, shared with the plan's and the window's own rules
_number = is_number


def key(rule: Rule, default: Any = MISSING, *, factory: Any = MISSING):
    """A config key declared once: what it takes (``rule``) beside its default (or its default's ``factory``)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def rules_of(cls) -> dict:
    """{key: its rule} of a config class's keys that declare one (every key but nested sections)."""
    return {f.name: f.metadata["rule"] for f in fields(cls) if "rule" in f.metadata}


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
    # the rollout plan: samplers.compose_plan's arguments (num_steps, kernel, eta, group_size, splits, ...); a preset
    # writes its method's whole plan, unset ones take compose_plan's defaults (docs/samplers.md)
    plan: dict = key(MAPPING, factory=dict)
    # the SDE window that moves with training: samplers.WindowSchedule's arguments (size, strategy, interval, stride,
    # ...); empty: the plan is the same every iteration
    window: dict = key(MAPPING, factory=dict)
    shift: Optional[float] = key(optional(above(0)), None)  # time shift of the rollout grid; None = the model's
    guidance_scale: Optional[float] = key(optional(at_least(0)), None)  # CFG scale in rollout and training; None = the model's
    # the rollout's forward in chunks of this many samples per network call (with CFG each call carries 2x as many
    # rows, [uncond; cond]) instead of the whole level at once; memory only: the same samples and log-probs (within
    # float rounding). 0 = the memory plan's choice at start-up (flowgrpo.memory.rollout_chunk: on a GPU what fits, on a
    # CPU the whole level; docs/scaling.md)
    chunk: int = key(at_least(0), 0)
    # what the rollout record keeps of its latents (the states before and after each trained transition, roots and
    # leaves): float32 (as sampled, in model.dtype) | bfloat16 (half the bytes: the walk rounds its states to bfloat16
    # at the trained steps, so the stored log-probs are those of the rounded states and ρ = 1 exactly at epoch 0) |
    # host (on the CPU, pinned where CUDA; the same numbers as float32). The likelihood math reads them back in the
    # rollout's dtype on the model's device (docs/scaling.md, "What a video sample holds")
    latent_storage: str = key(one_of("float32", "bfloat16", "host"), "float32")
    reduce: str = key(one_of("mean", "sum"), "mean")  # log-prob reduction over latent elements: mean (every public repo) | sum (true density)
    # the log-prob's form: gaussian (the density) | squared_error (−reduce(x' − μ)², no 1/(2s²): Flow-GRPO's CPS code,
    # whose clip range binds on that scale; the KL keeps the step's s)
    log_prob: str = key(one_of("gaussian", "squared_error"), "gaussian")
    # the rollout's network calls (and the transition learner's recompute of its transitions) are told the integer
    # timestep ⌊1000σ⌋ while the kernels step the exact σ, as DiffusionNFT's and DGPO's SD3 rollouts and DanceGRPO's,
    # MixGRPO's and BranchGRPO's FLUX steps do; false: σ·1000 (Flow-GRPO's, AWM's, the pipelines')
    integer_timesteps: bool = key(FLAG, False)
    # roll out (and evaluate) with the LoRA merged into the weights: no adapter products while sampling; the base
    # weights are restored exactly afterwards (model.finetune=lora; not with FSDP2 sharding)
    merge_lora: bool = key(FLAG, False)
    batches_per_iteration: int = key(at_least(1), 1)  # rollout batches per iteration; rewards of batch b run while batch b+1 samples


@dataclass
class RewardSpec:
    name: str = key(TEXT, "toy")  # registered reward name or dotted path module:Class
    weight: float = key(FINITE, 1.0)  # weight in the multi-reward combination; a single reward is scaled by it too (−1 minimises it)
    kwargs: dict = key(MAPPING, factory=dict)  # passed to the reward's constructor
    timeout_s: float = key(at_least(0), 600.0)  # one scoring call's limit: a reward that hangs gives NaN for the batch (0 = no limit)


@dataclass
class AdvantageConfig:
    std: str = key(one_of("group", "global", "none"), "group")  # z-score denominator: group (per group) | global (whole batch) | none (A = r − group mean, Dr. GRPO)
    eps: float = key(above(0), 1e-4)  # added to the std
    std_correction: int = key(one_of(0, 1), 0)  # the std divides by n − this: 0 the population's (Flow-GRPO's np.std), 1 torch.std's (DanceGRPO, MixGRPO)
    clip: float = key(above(0), 5.0)  # advantages are clipped to [-clip, clip]
    # V-GRPO's soft clip: A ← η·tanh(A/η) before the clip (0 = off); it bounds the rare extreme z-scores smoothly
    soft_clip: float = key(at_least(0), 0.0)
    # several rewards: gdpo (z-score each in its group, weighted sum, z-score the sum) | zsum (the same sum, not
    # z-scored again: MixGRPO's) | sum (weighted sum of raw rewards, then the group z-score: DiffusionNFT's, Flow-GRPO's)
    multi_reward: str = key(one_of("gdpo", "zsum", "sum"), "gdpo")
    tree_value: str = key(one_of("mean", "path_weighted"), "mean")  # BranchGRPO node value: mean of descendant leaves | path_weighted (softmax of β·log p(path))
    tree_beta: float = key(above(0), 1.0)  # β of path_weighted node values
    # a tree's normalisation: depth (BranchGRPO: node values z-scored among the prompt's nodes of each depth) | leaves
    # (TreeGRPO: the leaves' group z-scores, a node's advantage their mean or path-weighted mean below it, as it is)
    tree_norm: str = key(one_of("depth", "leaves"), "depth")
    best_of_n: int = key(at_least(0), 0)  # DanceGRPO best-of-N: train only the top n/2 and bottom n/2 samples of each group (0 = all)
    # a group whose rewards are all equal (A = 0): skip (never computed, kept in the normalisers) | train (A = 0
    # rows stay in the loss, as the reference codes do: NFT's r = 1/2 term pulls toward θ_old, a KL term still acts)
    tied_groups: str = key(one_of("skip", "train"), "skip")
    # GARDO's diversity-aware shaping: positive advantages times the sample's nearest-sibling cosine distance over
    # its group's mean (features: the decoded samples at 16x16); docs/hacking.md
    diversity: bool = key(FLAG, False)


@dataclass
class LossConfig:
    # the policy term's trust region: clip (PPO's clipped ratio at clip_range) | kl_mask (Flow-DPPO: −A·ρ unclipped, a
    # transition dropped where its step's exact Gaussian KL to the rollout policy, reduce_D((μ_θ − μ_old)²)/(2s²), is
    # at least kl_mask_threshold and ρ moves further on A's side; needs μ_old, which the rollout then stores)
    policy_loss: str = key(one_of("clip", "kl_mask"), "clip")
    kl_mask_threshold: float = key(above(0), 1e-5)  # Flow-DPPO's δ, on the sampling.reduce=mean scale of its code
    clip_range: float = key(above(0), 1e-4)  # PPO ε; 1e-4 for mean-reduced log-probs, 1e-5 for windows/cps, 2e-6 for GRPO-Guard
    ratio: str = key(one_of("plain", "guard"), "plain")  # plain: exp(lp_θ − lp_old) | guard: GRPO-Guard's normalised ratio (needs μ_old)
    step_weight: str = key(one_of("none", "inv_delta", "sage"), "none")  # none | inv_delta (GRPO-Guard 1/Δ) | sage (gradient-norm equaliser); plan weights (TempFlow) always apply
    kl_coef: float = key(at_least(0), 0.0)  # β of the KL to the reference policy (0 = off)
    kl_form: str = key(one_of("exact", "flow_grpo"), "exact")  # exact: reduce_D(Δμ²)/(2s²) | flow_grpo: Flow-GRPO's SD3 code, which drops Δ inside s
    anchor_kl_coef: float = key(at_least(0), 0.0)  # SAGE: KL to a moving anchor copy of the policy (0 = off)
    anchor_refresh: int = key(at_least(1), 10)  # SAGE: optimizer steps between anchor refreshes
    rollout_kl_coef: float = key(at_least(0), 0.0)  # SAGE: KL to the rollout policy μ_old (0 = off)
    # the KL terms' weight: constant (the two coefficients above) | sage (SAGE's adaptive weight, per transition:
    # ramped from anchor_kl_min to anchor_kl_coef over its first 100 transitions, then x0.9 while the mean of the
    # last 10 KLs exceeds 1.5·anchor_kl_coef, x1.1 while it is below 0.5·anchor_kl_coef, within [anchor_kl_min,
    # anchor_kl_coef]; the rollout term keeps its ratio rollout_kl_coef/anchor_kl_coef to it)
    anchor_kl_schedule: str = key(one_of("constant", "sage"), "constant")
    anchor_kl_min: float = key(at_least(0), 1e-7)
    normalize: str = key(one_of("group", "transition"), "group")  # loss normalisation: group (per group or tree, by its trained transitions) | transition (plain mean)
    likelihood_backend: str = key(one_of("reference", "fused", "auto"), "reference")  # per-transition likelihood terms (flowgrpo/likelihood/): reference (PyTorch, the
    #   specification) | fused (the csrc/ op; fails with instructions if it cannot be built) | auto (fused when it can)


@dataclass
class SoftCopyConfig:
    """A soft copy θ_c ← λ·θ_c + (1 − λ)·θ of the trained weights, λ = min(start + rate·(n − delay), max) after
    ``delay`` optimizer steps n (``start`` before): NFT's sampling policy, AWM's EMA, DGPO's ema_ref, CRD's copies."""

    rate: float = key(at_least(0), 0.001)  # λ grows by this per optimizer step
    max: float = key(between(0, 1), 0.5)  # λ's ceiling
    delay: int = key(at_least(0), 0)  # optimizer steps with λ = start (0: the copy follows θ exactly)
    start: float = key(between(0, 1), 0.0)  # λ before and at the delay, and where its ramp begins


@dataclass
class NFTConfig:
    beta: float = key(above(0), 1.0)  # β of the implicit policies v± (1.0 in the reference code; 0.1 for OCR)
    # the sampling policy θ_old, updated after each iteration (reference code's default: λ = min(0.001·n, 0.5))
    old: SoftCopyConfig = field(default_factory=SoftCopyConfig)


@dataclass
class AWMConfig:
    # w in ℓ = −w·mean_D(v − u)²: uniform | t | t2 | huber | ghuber (the reference configs') | adaptive (V-GRPO's and
    # DiffusionNFT's x0 error normalised by its own detached size: ℓ = −mean_D(e²)/sg(max(mean_D|e|, 1e-5)), e = x̂0 − x0)
    weighting: str = key(one_of("uniform", "t", "t2", "huber", "ghuber", "adaptive"), "ghuber")
    # where the ratio is formed: draw (ρ = exp(ℓ_θ − ℓ_old) per training draw, AWM's) | sample (one ρ per sample from
    # the mean of ℓ over its K draws inside the exp, V-GRPO's ELBO-surrogate ratio; a sample's draws stay together)
    ratio: str = key(one_of("draw", "sample"), "draw")
    ghuber_power: float = key(above(0), 0.25)  # p of ghuber: ℓ = −t·((m + 1e-10)^p − 1e-10^p)/p, m = mean_D(v − u)²
    clip_range: float = key(above(0), 1.0)  # PPO ε on ρ = exp(ℓ_θ − ℓ_old) (the reference configs' 1.0)
    ema_kl_coef: float = key(at_least(0), 0.0)  # v-space KL to the EMA of the weights (the reference: 1.0, with kl_coef > 0)
    sample_with_ema: bool = key(FLAG, False)  # off-policy: roll out with the EMA weights, ℓ_old from them too
    ema: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.001, max=0.3))


@dataclass
class DGPOConfig:
    beta: float = key(above(0), 100.0)  # β_dgpo of the group preference −log σ(−(β/G)·Σ_i A_i·δ_i) (GenEval/OCR; PickScore 10)
    clip_range: float = key(above(0), 0.01)  # a sample's error stops contributing when ρ = exp(e_old − e_θ) leaves 1 ± ε on A's side
    # ema_ref: the "old" policy of the clip, updated after every optimizer step
    ema_ref: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.001, max=0.3))
    # roll out with ema_ref's weights once this many optimizer steps are taken (the reference code switches its
    # sampler to the EMA after 500 steps, 200 for OCR); 0 = always the current weights
    sample_with_ema_after: int = key(at_least(0), 0)


@dataclass
class CRDConfig:
    beta: float = key(above(0), 1.0)  # β of the matched implicit reward β·(r_θ − mean r_θ) ≈ a − mean a
    # the KL anchor: v-space KL to the base model's velocity at this CFG scale (CRD's CFG-anchored reference); None:
    # the rollout's guidance
    kl_cfg: Optional[float] = key(optional(at_least(0)), None)
    # reward-adaptive KL: each sample's KL weighed by m + a·(1 − m), m = kl_floor/kl_coef, a its advantage in [0, 1]
    # (a well-rewarded sample held closest to the anchor); false: kl_coef for every sample
    reward_adaptive_kl: bool = key(FLAG, True)
    kl_floor: float = key(at_least(0), 1e-4)
    # the "old" policy of the implicit reward, followed after every iteration (CRD's OCR schedule: λ = min(0.25 +
    # 0.005·n, 0.999)) and the sampling policy (λ = 0 for 75 steps, then min(0.0075·(n − 75), 0.999))
    old: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.005, max=0.999, start=0.25))
    sampler: SoftCopyConfig = field(default_factory=lambda: SoftCopyConfig(rate=0.0075, max=0.999, delay=75))


@dataclass
class ReplayConfig:
    # OP-GRPO's off-policy replay (the transition learner, chain plans; flowgrpo/engine/learners/replay.py): after each
    # iteration the best per_group samples of every group with a positive advantage are kept for `age` iterations and
    # trained again beside the fresh ones, their log-probs recomputed under θ_old and their policy term weighed by the
    # sequence-level importance weight min(max_weight, exp Σ_k (lp_now − lp_behaviour)) over their kept steps
    per_group: int = key(at_least(0), 0)  # samples kept per group (0 = off)
    age: int = key(at_least(1), 1)  # iterations a kept sample is replayed in
    steps: float = key(in_open_closed(0, 1), 0.5)  # the share of the plan's steps a kept sample keeps (the first ones)
    max_weight: float = key(above(0), 2.0)  # the cap of the importance weight


@dataclass
class LearnerConfig:
    # the update rule (flowgrpo/engine/learners/): transition (the denoising-MDP GRPO loss on stored SDE transitions,
    # docs/math.md §3: every plan preset) | diffusion_nft | awm | dgpo (forward-process learners on the clean samples, §5)
    name: str = key(TEXT, "transition")
    # --- forward-process learners: K training draws (t, ε) per sample and inner epoch, x_t = (1 − t)·x0 + t·ε
    train_times: int = key(at_least(1), 4)  # K
    # plan (K of the rollout grid's points in [time_min, time_max], without replacement) | stratified (those points cut
    # into K runs of neighbours, one drawn from each: AWM's draw) | uniform | logit_normal
    time_sampler: str = key(one_of("plan", "stratified", "uniform", "logit_normal"), "plan")
    time_min: float = key(between(0, 1), 0.0)  # training times below are not drawn (DGPO trains only high-noise t)
    time_max: float = key(between(0, 1), 1.0)  # training times above are not drawn
    logit_mean: float = key(FINITE, 0.0)  # logit_normal: t = shift(sigmoid(N(mean, std))) with the rollout's time shift
    logit_std: float = key(above(0), 1.0)
    share_draws: str = key(one_of("sample", "group"), "sample")  # sample (each its own t and ε) | group (one t and ε per group and draw: DGPO)
    # draw (the K times drawn with each draw's ε, shared as share_draws says) | iteration (one set of K times per
    # iteration and inner epoch for every sample, ε still per share_draws: DGPO's code)
    share_times: str = key(one_of("draw", "iteration"), "draw")
    # train at t = ⌊1000t⌋/1000 and tell the network the integer 1000t (DGPO's code trains at its scheduler's integer
    # timesteps); false: the drawn t as it is
    integer_times: bool = key(FLAG, False)
    train_guidance: str = key(one_of("conditional", "cfg"), "conditional")  # conditional (CFG-free training) | cfg (sampling.guidance_scale, as the rollout)
    adv_max: float = key(above(0), 5.0)  # A_max: advantages clipped to ±A_max (NFT's optimality probability, AWM's scale)
    kl_coef: float = key(at_least(0), 0.0)  # v-space KL to the reference policy: kl_coef·mean_D(v_θ − v_ref)²
    nft: NFTConfig = field(default_factory=NFTConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    dgpo: DGPOConfig = field(default_factory=DGPOConfig)
    crd: CRDConfig = field(default_factory=CRDConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)


@dataclass
class TrainConfig:
    iterations: int = key(at_least(1), 40)  # GRPO iterations (rollout + update)
    prompts_per_iteration: int = key(at_least(1), 8)  # prompts per iteration over all processes (each with its whole group)
    inner_epochs: int = key(at_least(1), 1)  # passes over each iteration's transitions
    updates_per_epoch: int = key(at_least(1), 1)  # optimizer steps per pass (transitions split evenly, whole groups kept)
    # what an update's share of the pass is made of: groups (whole groups or trees, each weighed as one) |
    # transitions (the transition learner: every trained transition shuffled across groups and cut into
    # updates_per_epoch equal parts, BranchGRPO's stepping; each still carries its group's normalising weight) |
    # samples (chains: every group's samples in a seeded order dealt out to the updates, each sample with all its
    # transitions or draws, so each step trains a share of every group: Flow-GRPO's, DanceGRPO's, MixGRPO's codes)
    update_split: str = key(one_of("groups", "transitions", "samples"), "groups")
    micro_batch: int = key(at_least(1), 64)  # transitions per forward/backward (gradient accumulation inside an update)
    learning_rate: float = key(at_least(0), 3e-4)
    # the learning rate over the run, a pure function of the iteration (resumes need no scheduler state):
    # constant | cosine (half a cosine from learning_rate down to lr_final·learning_rate at train.iterations)
    # | linear (a straight line between the same two ends)
    lr_schedule: str = key(one_of("constant", "cosine", "linear"), "constant")
    lr_final: float = key(between(0, 1), 0.0)  # the end of a cosine or linear schedule, as a fraction of learning_rate
    weight_decay: float = key(at_least(0), 0.0)
    # adamw | muon (Muon on the weights of 2+ dimensions, AdamW with adam_betas on the rest: SAGE-GRPO's optimizer,
    # flowgrpo/engine/optim.py)
    optimizer: str = key(one_of("adamw", "muon"), "adamw")
    adam_betas: tuple = key(BETAS, (0.9, 0.999))
    grad_clip: float = key(at_least(0), 1.0)  # max gradient norm (0 = off)
    ema_decay: float = key(Rule(lambda v: _number(v) and 0 <= v < 1,
                                                                          "a number in [0, 1) (0 = off)"), 0.0)  # EMA of trainable weights used for evaluation (0 = off), λ = min(decay, (1 + n)/(10 + n))
    mixed_precision: str = key(one_of("no", "bf16", "fp16"), "no")  # accelerate's: no | bf16 | fp16
    seed: int = key(Rule(lambda v: is_number(v) and 0 <= v <= 2**32 - 1, "an integer in [0, 4294967295]"),
                    0)  # every random draw is a pure function of (seed, iteration, prompt, node)
    # draw training prompts so that every value of this metadata key (e.g. "task") comes up equally often:
    # each run of N slots (N values) holds one prompt of each value, each value's prompts in their own seeded
    # order. "" (or a prompt set whose prompts carry no such key, e.g. a .txt file) draws every prompt once
    # per pass; a set where only some prompts carry it is refused.
    balance_by: str = key(TEXT, "")
    # how each rollout batch's prompts are drawn: pass (a seeded permutation per pass over the set: every prompt once a
    # pass) | batch (each rollout batch a fresh random choice of distinct prompts, independent of the other batches, so
    # a prompt can come back before the others have been seen and, drawn twice in an iteration, its samples form one
    # group: the Flow-GRPO-family codes' DistributedKRepeatSampler with their per-prompt stat tracker)
    prompt_draw: str = key(one_of("pass", "batch"), "pass")
    cpu: bool = key(FLAG, False)  # force CPU (and make accelerate run distributed on CPU with gloo)
    # keep the activations the training forward saves for its backward in host memory (torch's save_on_cpu, pinned
    # where CUDA) instead of on the device: the same gradients, slower; docs/scaling.md, "What a video sample holds"
    activation_offload: bool = key(FLAG, False)
    # context (sequence) parallelism: each sample's tokens split over groups of this many processes (diffusers'
    # Ulysses/ring attention; flowgrpo/engine/context.py, docs/scaling.md); the launch's processes / this = the
    # data-parallel ranks. Wan, FLUX.1, FLUX.2, Qwen-Image. 1 = off
    context_parallel: int = key(at_least(1), 1)
    # of a context group, how many processes form rings (ring attention: needs an attention backend that returns its
    # log-sum-exp, flash or cuDNN on GPUs); the rest split heads (Ulysses). 1 = Ulysses alone
    context_parallel_ring: int = key(at_least(1), 1)
    # stop the run, naming the reward and its last error, after this many consecutive iterations in which no
    # sample got a finite reward (a reward that fails on every call); such iterations are never checkpointed (0 = never stop)
    max_iterations_without_reward: int = key(at_least(0), 3)


@dataclass
class EvalConfig:
    every: int = key(at_least(0), 10)  # evaluate every N iterations (0 = only at the end)
    prompts: str = key(TEXT, "toy-eval")  # toy-eval | toy-train | geneval | ocr-test | pickscore-test (docs/evaluation.md) | a .txt or .jsonl file
    limit: int = key(at_least(0), 0)  # use only the first N prompts (0 = all)
    steps: Optional[int] = key(optional(at_least(1)), None)  # ODE steps; None = the model config's sample_steps
    # CFG scale; None = the rollout's (sampling.guidance_scale, else the model's): a run trained CFG-free is evaluated
    # CFG-free, as Flow-GRPO's train_sd3.py and DiffusionNFT's train_nft_sd3.py evaluate at sample.guidance_scale
    guidance_scale: Optional[float] = key(optional(at_least(0)), None)
    reward: str = key(TEXT, "toy")  # the held-out ("gold") reward
    reward_kwargs: dict = key(MAPPING, factory=dict)  # passed to the held-out reward's constructor (as rewards[].kwargs)
    batch_size: int = key(at_least(1), 64)
    at_start: bool = key(FLAG, True)  # evaluate the starting model too
    # the reward-hacking watch (flowgrpo/engine/watch.py, docs/hacking.md): guards scored on the held-out samples
    # (held_out: the held-out reward's scores; image statistics brightness, saturation, high_frequency, diversity,
    # flicker; reward names), an alarm when one moves against its direction by more than hacking_threshold standard
    # errors (paired with the first evaluation) and hacking_min_effect of its spread while the training reward has
    # risen; stop_on_hacking then stops the run with a checkpoint
    guards: list = key(NAMES, factory=lambda: ["held_out"])
    hacking_threshold: float = key(above(0), 3.0)  # standard errors of the paired change
    hacking_min_effect: float = key(at_least(0), 0.1)  # and at least this many standard deviations of the guard over the start's samples
    stop_on_hacking: bool = key(FLAG, False)


@dataclass
class LogConfig:
    save_every: int = key(at_least(0), 20)  # checkpoint every N iterations (0 = only at the end)
    keep_checkpoints: int = key(at_least(1), 2)  # newest checkpoints kept
    samples_every: int = key(at_least(0), 10)  # write sample PNGs (videos: MP4s + poster PNGs) and their manifest every N iterations (0 = never)
    eval_samples: int = key(at_least(0), 64)  # held-out evaluation samples written per evaluation to samples/eval_<n>/ (the first N eval prompts; 0 = none)
    samples_per_prompt: int = key(at_least(1), 4)  # leaves written per prompt when samples are written
    video_fps: int = key(at_least(1), 8)  # frame rate of the sample MP4s of video models
    tensorboard: bool = key(FLAG, True)  # also write TensorBoard events (needs the tensorboard package)
    progress: bool = key(FLAG, True)  # progress bars
    gallery: bool = key(FLAG, True)  # build the review site (gallery/) into <run>/gallery at the end of the run
    # images/s per GPU in the metrics (perf/), and on a GPU the MFU of sampling and training (flowgrpo/engine/throughput.py)
    mfu: bool = key(FLAG, True)
    wandb: bool = key(FLAG, False)  # also log metrics to Weights & Biases (pip install wandb; project "flowgrpo", run = run_name)
    # measure the gradient noise scale every N iterations from the update's per-micro-batch gradients (0 = never);
    # logs grad_noise/* and prints one line when the batch is below it (flowgrpo/engine/noise_scale.py)
    grad_noise_every: int = key(at_least(0), 10)


@dataclass
class Config:
    run_name: str = key(FOLDER_NAME, "tiny-sd3-toy")  # the run folder is <output_dir>/<run_name>
    output_dir: str = key(TEXT, "runs")
    resume: bool = key(FLAG, True)  # continue from the newest checkpoint of the run folder if there is one
    # a rerun whose config differs from the run folder's in keys that change the experiment (flowgrpo/run/run_dir.py:
    # NEUTRAL_KEYS lists the others) is refused; true continues with the change, appended to config_history.jsonl
    allow_config_change: bool = key(FLAG, False)
    # torch CPU threads per process (--threads N): 0 = automatic (OMP_NUM_THREADS if set, else the cores no other
    # process is busy on, shared by this machine's processes; flowgrpo/run/threads.py), N = exactly N; printed at start-up
    threads: int = key(Rule(lambda v: _number(v) and v >= 0,
                                             "a number >= 0 (0 = automatic, N = exactly N CPU threads)"), 0)
    # training prompts: toy-train | an official training set (flowgrpo/prompt_sets.py, `flowgrpo prompts list`: a
    # preset's recipe names its launch's) | a .txt or .jsonl file
    prompts: str = key(TEXT, "toy-train")
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rewards: list = field(default_factory=lambda: [RewardSpec()])  # list of RewardSpec
    # reward name -> constructor options every rewards[] entry of that name takes unless it sets them in its own kwargs
    # (a preset's recipe: how the official run's scorer scales that reward, e.g. {pickscore: {divide_by: 26}});
    # folded into each entry's kwargs when the config resolves, so `flowgrpo config` shows what each reward is built with
    reward_options: dict = key(MAPPING, factory=dict)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # model: checked by flowgrpo/models/config.py validate_model_config; rewards: each a RewardSpec, by its keys' rules

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

# the values of learner.name and the class each builds (flowgrpo/engine/learners/ builds them from this one registry;
# the config, a lower layer, owns the names so that a run is checked before anything is loaded)
LEARNERS = {
    "transition": "flowgrpo.engine.learners.transition:TransitionLearner",
    "diffusion_nft": "flowgrpo.engine.learners.nft:NFTLearner",
    "awm": "flowgrpo.engine.learners.awm:AWMLearner",
    "dgpo": "flowgrpo.engine.learners.dgpo:DGPOLearner",
    "crd": "flowgrpo.engine.learners.crd:CRDLearner",
}


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict:
    """Every key's schema default as {dotted key: value}: what a run folder's config written before the key
    existed stands for (flowgrpo/run/run_dir.py compares configs with it)."""
    import yaml

    from flowgrpo.run.run_dir import flatten

    return flatten(yaml.safe_load(to_yaml(Config())))
