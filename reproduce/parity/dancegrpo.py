"""DanceGRPO against XueZeyue/DanceGRPO's own sampler, step by step, on a tiny FLUX.

The official side runs the checkout's code, loaded at run time from ``DANCEGRPO_PATH`` (nothing of it is part of this
project): from fastvideo/train_grpo_flux.py, whose module-level imports (wandb, FSDP utilities, its reward models) it
does not need, the definitions of ``sample_reference_model`` (the σ grid: linspace, then ``sd3_time_shift``; x_T, one
draw for the group with --init_same_noise; one sample at a time through ``run_sample_step``; the decode of each
sample for its reward), ``run_sample_step``, ``flux_step``, ``sd3_time_shift`` and the packing helpers are read with
``ast`` and executed, with the launch's arguments (scripts/finetune/finetune_flux_grpo.sh over the argparse defaults,
as reproduce/official/dancegrpo.py reads them); then the statements of ``train_one_step`` from ``batch_size = ...``
to ``train_timesteps = ...`` (the cut of the last step, the advantages, the per-sample permutations and the count of
trained steps), on its rollout. Its reward model is a stand-in (the scores are not compared).

The tiny FLUX is ``flowgrpo.tiny.build_tiny_flux_pipeline`` saved as tests/models/test_flux.py saves it (FLUX.1-dev's
scheduler config), with 16 latent channels (a 64-channel transformer, a 16-channel VAE) because the official code
hard-codes FLUX's 16; its VAE downsamples 2x where the code assumes 8x, so the official ``h``/``w`` are 4x flowgrpo's
resolution (the same 8 x 8 latents). flowgrpo's side is the preset's plan as its recipe resolves on FLUX.1-dev
(``resolve("dancegrpo", "flux_dev", rewards)``, the tiny weights swapped in), rolled out by ``samplers.rollout``
through the FLUX adapter as flowgrpo's rollout runs it: inside ``model.integer_timesteps(sampling.integer_timesteps)``
(the recipe's true: the network told ⌊1000σ⌋ of the float32 grid, sampling.plan.grid=linear_float32, as the official
int(σ·1000)), with the recipe's leaf (predicted: the samples are the last step's x̂0). Both sides get the same text
embeddings (flowgrpo's ``encode_prompts``), x_T and every step's ε (the official ``torch.randn`` / ``randn_like`` are
fed flowgrpo's draws, packed into its token layout), and the official ``torch.randperm`` of the trained steps is fed
the permutation flowgrpo drew for each sample, so the rule (how many, of which steps, per sample) is what is compared.
The official code's bfloat16 casts (x_T is drawn in bfloat16) and its CUDA autocast are run at float32 (its ``torch``
is a stand-in whose ``bfloat16`` is float32), so the comparison is at float32 tolerance.

Beside the rows, the notes compare (each against float32 ulps of its values, and each with a negative control: the
option off, computed in the same run): the rewarded sample (flowgrpo's leaves, sampling.plan.leaf, against the
latents the official code decodes for its reward; control: the last x'), the advantages of one set of rewards
(flowgrpo's ``credit.assign`` with the recipe's advantage section, advantage.std_correction, against the official
statements; control: std_correction 0), the optimizer steps' composition (flowgrpo's TransitionLearner split,
train.update_split=samples, against the official loop's steps every gradient_accumulation_steps samples; control:
update_split=groups), and the rollout with sampling.integer_timesteps=false (the network told 1000σ).

Rows: one per (sample, step), sample-major: σ → σ' on each side, whether each side draws noise there and trains it,
|Δx'| and |Δlog p| against float32 tolerances of the values (the log-prob's of its terms' magnitude: its −log s and
−½ log 2π nearly cancel the squared term).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # reproduce/: official, parity
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: flowgrpo, samplers

from official import Checkout  # noqa: E402
from parity import MethodReport, StepRow, max_diff, recorded_step_noise, tolerance  # noqa: E402
from samplers.kernels import HALF_LOG_2PI, kernel_coefficients, transition  # noqa: E402

SCRIPT = "fastvideo/train_grpo_flux.py"
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow star"]
PROMPT = "a green triangle left of a yellow star"
RESOLUTION = 16  # flowgrpo's pixels: the tiny VAE's 2x gives 16 x 8 x 8 latents, packed to 16 tokens of 64
OFFICIAL_VAE_FACTOR = 8  # the official code's SPATIAL_DOWNSAMPLE: its h, w are 8x the latent's


# ---------------------------------------------------------------------------------------------------- the tiny FLUX
def tiny_flux(folder: Path) -> str:
    """tests/models/test_flux.py's tiny FLUX (guidance-distilled, FLUX.1-dev's scheduler config) with FLUX's 16 latent
    channels: a 64-channel transformer (2x2 packing) and a 16-channel VAE of the same configs, saved once."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
    from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER

    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0, image_size=RESOLUTION)
    torch.manual_seed(1)
    transformer = FluxTransformer2DModel.from_config(pipe.transformer.config, in_channels=64)
    vae = AutoencoderKL.from_config(pipe.vae.config, latent_channels=16)
    components = dict(pipe.components, transformer=transformer, vae=vae,
                      scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))
    FluxPipeline(**components).save_pretrained(folder)
    return str(folder)


def resolved(preset: str, folder: str, rewards: list[str], overrides: tuple[str, ...] = (), model: str = "flux_dev"):
    """The preset's run on the launch's model config (FLUX.1-dev) with its rewards, the tiny weights swapped in."""
    from flowgrpo.config import resolve

    base = ["rewards=[" + ", ".join(f"{{name: {n}}}" for n in rewards) + "]", f"model.pretrained={folder}",
            f"model.resolution={RESOLUTION}", "model.device=cpu", "model.max_sequence_length=16",
            "model.dtype=float32", "model.gradient_checkpointing=false"]
    return resolve(preset, model, base + list(overrides)).config


# ---------------------------------------------------------------------------------------------------- the official code
def read_functions(checkout: Checkout, relpath: str, names: list[str]) -> tuple[ast.Module, list[ast.FunctionDef]]:
    path = checkout.file(relpath)
    tree = ast.parse(path.read_text(), str(path))
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = sorted(set(names) - set(found))
    if missing:
        raise RuntimeError(f"{relpath} no longer defines {missing}; this comparison reads them from there")
    return tree, [found[n] for n in names]


def body_slice(function: ast.FunctionDef, first: str, last: str) -> list[ast.stmt]:
    """The statements of ``function``'s body from the one whose source starts with ``first`` to the one whose source
    starts with ``last``, both included."""
    sources = [ast.unparse(s) for s in function.body]
    starts = [i for i, s in enumerate(sources) if s.startswith(first)]
    ends = [i for i, s in enumerate(sources) if s.startswith(last)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise RuntimeError(f"{function.name}(): the statements from {first!r} to {last!r} are no longer where this "
                           "comparison reads them")
    return function.body[starts[0]: ends[0] + 1]


class Feeder:
    """The official code's random draws, fed in order: x_T (``torch.randn``), the steps' ε (``torch.randn_like``,
    tagged with the step the progress bar is on) and the trained steps' permutations (``torch.randperm``)."""

    def __init__(self, initial: list[torch.Tensor], noise: list[torch.Tensor], perms: list[torch.Tensor] | None = None):
        self.initial, self.noise, self.perms = list(initial), list(noise), list(perms or [])
        self.step = None  # the step index the official loop is on
        self.loop = -1  # how many sampling loops (progress bars) have started before this one
        self.tags: list[tuple[int, int]] = []  # (loop, step) of every ε drawn

    @staticmethod
    def _check(what: str, eps: torch.Tensor, shape) -> torch.Tensor:
        if tuple(eps.shape) != tuple(shape):
            raise RuntimeError(f"the official code asked for {what} of shape {tuple(shape)}, flowgrpo drew {tuple(eps.shape)}")
        return eps

    def randn(self, *shape, device=None, dtype=None, generator=None, **_):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        if not self.initial:
            raise RuntimeError(f"the official code drew more x_T than flowgrpo (shape {tuple(shape)})")
        return self._check("x_T", self.initial.pop(0), shape).to(torch.float32)

    def randn_like(self, like: torch.Tensor, **_):
        if not self.noise:
            raise RuntimeError(f"the official code drew more step noise than flowgrpo (step {self.step})")
        self.tags.append((self.loop, self.step))
        return self._check("step noise", self.noise.pop(0), like.shape).to(like.dtype)

    def randperm(self, n, **_):
        if not self.perms:
            raise RuntimeError("the official code drew more permutations than flowgrpo")
        return self._check("a permutation", self.perms.pop(0), (n,))

    def used_up(self):
        left = {"x_T": len(self.initial), "step noise": len(self.noise), "permutations": len(self.perms)}
        left = {k: v for k, v in left.items() if v}
        if left:
            raise RuntimeError(f"the official code left flowgrpo's draws unused: {left}")


def torch_standin(feeder: Feeder) -> types.ModuleType:
    """``torch`` for the official code: everything torch's, except that bfloat16 is float32 (its bf16 casts and draws
    stay float32), autocast does nothing (the model runs in float32 on the CPU), and the draws come from ``feeder``."""
    module = types.ModuleType("torch")
    module.__getattr__ = lambda name: getattr(torch, name)
    module.bfloat16 = torch.float32
    module.autocast = lambda *args, **kwargs: contextlib.nullcontext()
    module.randn, module.randn_like, module.randperm = feeder.randn, feeder.randn_like, feeder.randperm
    return module


def progress(feeder: Feeder):
    """The official ``tqdm``: the steps as they are, each noted on ``feeder`` while the loop body runs."""
    def bar(iterable, **_):
        feeder.loop += 1
        for i in iterable:
            feeder.step = i
            yield i
        feeder.step = None
    return bar


class VaeProbe:
    """The official code's VAE: the tiny one, every latent it decodes kept (the sample its reward scores)."""

    def __init__(self, vae):
        self.vae, self.decoded = vae, []

    def enable_tiling(self):
        pass

    def decode(self, latents, return_dict=False):
        self.decoded.append(latents.detach().clone())
        return self.vae.decode(latents, return_dict=return_dict)


class _Tokens(list):
    def to(self, *args, **kwargs):
        return torch.zeros(len(self), 4)


def reward_standin():
    """(reward_model, tokenizer, preprocess_val) for --use_hpsv2: scores of 0 (the rewards are not compared)."""
    def model(image, text):
        return {"image_features": torch.zeros(image.shape[0], 4), "text_features": torch.zeros(text.shape[0], 4)}

    return model, _Tokens, lambda image: torch.zeros(3, 4, 4)


@contextlib.contextmanager
def official_workdir():
    """A scratch working directory (the official code saves each decoded sample under ./images) and RANK=0."""
    previous, rank = os.getcwd(), os.environ.get("RANK")
    with tempfile.TemporaryDirectory(prefix="dancegrpo-official-") as tmp:
        os.makedirs(Path(tmp) / "images")
        os.chdir(tmp)
        os.environ["RANK"] = "0"
        try:
            yield tmp
        finally:
            os.chdir(previous)
            if rank is None:
                os.environ.pop("RANK", None)
            else:
                os.environ["RANK"] = rank


def launch_args(checkout: Checkout, module, preset: str, latent_hw: tuple[int, int]) -> SimpleNamespace:
    """The launch's arguments (reproduce/official/<code>.py's extraction), with the image size of the tiny latents."""
    launch = module.launches(checkout, preset)[0]
    args = SimpleNamespace(**{k: v.value for k, v in launch.values.items() if not k.startswith(("code.", "launch."))})
    args.h, args.w = latent_hw[0] * OFFICIAL_VAE_FACTOR, latent_hw[1] * OFFICIAL_VAE_FACTOR
    return args


# ---------------------------------------------------------------------------------------------------- flowgrpo
@contextlib.contextmanager
def recorded_next_states():
    """Inside, flowgrpo's executor keeps each step's next level as its kernels computed it (step -> [nodes, *latent]),
    before a leaf rule replaces the last one (sampling.plan.leaf=predicted: the samples are the last step's x̂0)."""
    import samplers.executor as executor

    original, levels = executor._Run.apply, {}

    def apply(self, i, *args, **kwargs):
        out = original(self, i, *args, **kwargs)
        levels[i] = out.detach().clone()  # a level in several edge groups: the last call returns it whole
        return out

    executor._Run.apply = apply
    try:
        yield levels
    finally:
        executor._Run.apply = original


def ours(cfg, model, cond, iteration: int = 0):
    """flowgrpo's rollout of the preset's plan as its rollout runs it (the network told integer timesteps with
    sampling.integer_timesteps): plan, record, the states and velocities of every level (in the level's node order;
    ``states[T]`` the last step's x' as its kernel drew it, ``leaf`` the samples the rewards score), the step ε's it
    drew (per step, [nodes, children, *latent]) and the permutations of its training subsets."""
    import samplers
    from flowgrpo.engine.rollout import plan_schedule

    plan = plan_schedule(cfg, model).plan(iteration)
    base = model.velocity_fn(cond, cfg.sampling.guidance_scale)
    levels: list[tuple[float, torch.Tensor, torch.Tensor]] = []

    def velocity(x, sigma, cond_index):
        v = base(x, sigma, cond_index)
        s = float(sigma.reshape(-1)[0])
        if levels and levels[-1][0] == s:  # a level in several chunks
            levels[-1] = (s, torch.cat([levels[-1][1], x]), torch.cat([levels[-1][2], v]))
        else:
            levels.append((s, x.detach().clone(), v.detach().clone()))
        return v

    perms, randperm = [], torch.randperm

    def recorded_randperm(*args, **kwargs):
        out = randperm(*args, **kwargs)
        perms.append(out.clone())
        return out

    torch.randperm = recorded_randperm
    try:
        with recorded_step_noise() as draws, recorded_next_states() as drawn, torch.no_grad(), \
                model.integer_timesteps(cfg.sampling.integer_timesteps):
            record = samplers.rollout(
                velocity, plan, prompt_ids=[0], latent_shape=model.latent_shape(), seed=cfg.train.seed,
                iteration=iteration, dtype=model.dtype, device=model.device, max_batch=cfg.sampling.chunk or None,
                reduce=cfg.sampling.reduce, log_prob_form=cfg.sampling.log_prob)
    finally:
        torch.randperm = randperm
    last = plan.num_steps - 1
    return SimpleNamespace(plan=plan, record=record, states=[x for _, x, _ in levels] + [drawn[last]],
                           leaf=record.leaf_state, velocities=[v for _, _, v in levels], draws=draws, perms=perms)


def advantages(cfg, record, plan, leaf_rewards: torch.Tensor, **changes):
    """flowgrpo's advantages of the rollout for ``leaf_rewards`` [leaves] or [leaves, rewards] (in leaf order), as the
    trainer assigns them (``credit.assign`` with the run's advantage section and reward weights; ``changes``: fields of that
    section changed, a control): (per leaf, per stored transition)."""
    import dataclasses

    from flowgrpo.engine import credit

    section = dataclasses.replace(cfg.advantage, **changes)
    weights = torch.tensor([spec.weight for spec in cfg.rewards], dtype=torch.float32)
    rewards = leaf_rewards if leaf_rewards.dim() == 2 else leaf_rewards.reshape(-1, 1)
    out, _ = credit.assign([record], [[0]], rewards.to(torch.float32), weights, section,
                           plan.branches, lambda t: t, 0)
    return out.leaves[0], out.transitions[0]


def update_composition(cfg, record, **changes) -> list[dict[int, int]]:
    """The optimizer steps of one pass as flowgrpo's transition learner deals them (TransitionLearner._updates with the
    run's train section; ``changes``: fields of it changed, a control): per step, root (sample) -> its transitions."""
    import dataclasses

    from flowgrpo.engine.learners.transition import TransitionLearner, TransitionRow

    conf = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))
    gpp = record.groups_per_prompt
    roots = TransitionLearner._root_nodes(record.node_parent.tolist())
    rows = [TransitionRow(0, r, 0.0, 1.0, int(record.group[r]) % gpp, 0) for r in range(record.num_transitions)]
    chains = [(0, 0, roots[int(record.node[r])]) for r in range(record.num_transitions)]
    learner = SimpleNamespace(cfg=conf)
    steps = TransitionLearner._updates(learner, rows, set(), sorted({row.group for row in rows}), 0, 0, chains)
    out = []
    for selected in steps:
        count: dict[int, int] = {}
        for i in selected:
            count[chains[i][2]] = count.get(chains[i][2], 0) + 1
        out.append(dict(sorted(count.items())))
    return out


def composition_note(cfg, record, group: int, per_step: int, trained: str) -> str:
    """The optimizer steps' composition, the official code's (a step every ``per_step`` samples of a group of ``group``
    in rollout order, each with ``trained``) beside flowgrpo's (``update_composition``) and its update_split=groups
    control."""
    official = [len(range(s, min(s + per_step, group))) for s in range(0, group, per_step)]
    steps = update_composition(cfg, record)
    control = update_composition(cfg, record, update_split="groups")
    return (f"optimizer steps: the official {official} samples a step (every {per_step} in rollout order, each with "
            f"{trained}); flowgrpo's (train.update_split={cfg.train.update_split}) {[len(s) for s in steps]} samples a "
            f"step, transitions per sample {sorted({n for s in steps for n in s.values()})}; control, "
            f"update_split=groups: {[len(s) for s in control]} samples a step")


def log_prob_tolerance(values: torch.Tensor, plan, i: int) -> float:
    """Float32 ulps of a step's log-prob terms: the values and |log s| + ½ log 2π, which nearly cancel in them."""
    step = plan.steps[i]
    sig = plan.sigmas.to(torch.float32).tolist()
    std = float(kernel_coefficients(step.kernel, sig[i], sig[i + 1], step.eta)[2][0])
    return tolerance(torch.cat([values.reshape(-1).to(torch.float32), torch.tensor([abs(math.log(std)) + HALF_LOG_2PI])]))


def scored(plan, cfg, i: int, x: torch.Tensor, v: torch.Tensor, x_next: torch.Tensor) -> torch.Tensor:
    """flowgrpo's log-prob of x → x' at step i (samplers.kernels.transition, as the learner scores it)."""
    step = plan.steps[i]
    sig = plan.sigmas.to(torch.float32).tolist()
    return transition(step.kernel, x, v, sig[i], sig[i + 1], step.eta, next_state=x_next, reduce=cfg.sampling.reduce,
                      form=cfg.sampling.log_prob).log_prob


# ---------------------------------------------------------------------------------------------------- the comparison
class Official:
    """The checkout's sampler and the trained-step selection of its training step, as the module docstring says."""

    FUNCTIONS = ["sd3_time_shift", "flux_step", "assert_eq", "prepare_latent_image_ids", "pack_latents",
                 "unpack_latents", "run_sample_step", "sample_reference_model", "train_one_step"]

    def __init__(self, checkout: Checkout, args: SimpleNamespace):
        self.checkout, self.args = checkout, args
        tree, functions = read_functions(checkout, SCRIPT, self.FUNCTIONS)
        self.definitions = ast.Module(body=functions[:-1], type_ignores=[])
        self.selection = ast.Module(body=body_slice(functions[-1], "batch_size = all_latents.shape[0]",
                                                    "train_timesteps = int("), type_ignores=[])
        self.where = (f"{SCRIPT} sample_reference_model, run_sample_step, flux_step, sd3_time_shift, pack_latents, "
                      f"prepare_latent_image_ids; train_one_step from 'batch_size = ...' to 'train_timesteps = ...'")

    def namespace(self, feeder: Feeder) -> dict:
        from diffusers.image_processor import VaeImageProcessor
        from PIL import Image

        scope = {"torch": torch_standin(feeder), "math": math, "os": os, "tqdm": progress(feeder),
                 "VaeImageProcessor": VaeImageProcessor, "Image": Image}
        path = str(self.checkout.file(SCRIPT))
        exec(compile(self.definitions, path, "exec"), scope)
        return scope

    def sample(self, feeder: Feeder, transformer, vae, cond, members: int, caption: str):
        """sample_reference_model for one prompt's group (--use_group repeats its embeddings num_generations times)."""
        scope = self.namespace(feeder)
        embeds = cond.prompt_embeds[:1].repeat_interleave(members, 0)
        pooled = cond.pooled_prompt_embeds[:1].repeat_interleave(members, 0)
        text_ids = torch.zeros(members, 3)  # the precomputed embeddings' text ids: encode_prompt's, all zero
        model, tokenizer, preprocess = reward_standin()
        probe = VaeProbe(vae)
        with official_workdir(), torch.no_grad():
            rewards, latents, log_probs, sigmas, image_ids = scope["sample_reference_model"](
                self.args, "cpu", transformer, probe, embeds, pooled, text_ids, model, tokenizer, [caption] * members,
                preprocess)
        return SimpleNamespace(scope=scope, latents=latents, log_probs=log_probs, sigmas=sigmas, image_ids=image_ids,
                               decoded=probe.decoded, text_ids=text_ids, embeds=embeds, pooled=pooled)

    def select(self, feeder: Feeder, run, rewards: torch.Tensor) -> dict:
        """train_one_step's statements on the rollout: the cut, the advantages, the permutations, the trained count."""
        scope = dict(run.scope, args=self.args, reward=rewards, all_latents=run.latents, all_log_probs=run.log_probs,
                     sigma_schedule=run.sigmas, all_image_ids=run.image_ids, text_ids=run.text_ids,
                     encoder_hidden_states=run.embeds, pooled_prompt_embeds=run.pooled,
                     gather_tensor=lambda t: t, dist=SimpleNamespace(get_rank=lambda: 1))
        exec(compile(self.selection, str(self.checkout.file(SCRIPT)), "exec"), scope)
        return scope


def run(checkout: Checkout, overrides: tuple[str, ...] = ()) -> list[MethodReport]:
    """One report: the `dancegrpo` preset's plan on FLUX.1-dev (its recipe, then ``overrides``: a negative control)
    against the official launch's sampler."""
    import official.dancegrpo as code
    from diffusers import FluxPipeline

    from flowgrpo.models.base import load_model

    name, (model_name, rewards) = next(iter(code.RUNS.items()))
    report = MethodReport("dancegrpo", "dancegrpo (flux_dev recipe, finetune_flux_grpo.sh)", checkout.repository,
                          checkout.commit_of(SCRIPT), "")
    with tempfile.TemporaryDirectory(prefix="dancegrpo-parity-") as tmp:
        folder = tiny_flux(Path(tmp) / "tiny_flux_dev")
        cfg = resolved("dancegrpo", folder, rewards, overrides, model_name)
        model = load_model(cfg.model)
        model.transformer.eval()
        cond = model.encode_prompts([PROMPT])
        channels, h, w = model.latent_shape()
        args = launch_args(checkout, code, "dancegrpo", (h, w))
        official = Official(checkout, args)
        report.official = official.where + f"; {name} (h, w = {args.h}: the tiny latents)"

        mine = ours(cfg, model, cond)  # flowgrpo as its rollout runs: its draws are fed to the official code
        plan, record, G, T = mine.plan, mine.record, mine.plan.roots_per_prompt, mine.plan.num_steps
        pack = official.namespace(Feeder([], []))["pack_latents"]

        def packed(x):  # [N, C, h, w] -> the official [N, tokens, 4C]
            return pack(x.to(torch.float32), x.shape[0], channels, h, w)

        # the official draw order: one x_T, then sample by sample, step by step, one ε each
        noise = [packed(mine.draws[i][g:g + 1, 0]) for g in range(G) for i in range(T)]
        feeder = Feeder([record.root_state[:1].to(torch.float32)], noise, mine.perms)
        theirs = official.sample(feeder, model.transformer, model.vae, cond, G, PROMPT)
        rewards_fed = torch.linspace(0.20, 0.31, G)[torch.randperm(G, generator=torch.Generator().manual_seed(0))]
        selection = official.select(feeder, theirs, rewards_fed)
        feeder.used_up()

        # per sample and step: σ, stochastic, trained, x', log p
        sig = plan.sigmas.to(torch.float32).tolist()
        theirs_sig = theirs.sigmas.to(torch.float32).tolist()
        steps_of = selection["timestep_value"]  # the official int(σ·1000) of every step but the last
        count = selection["train_timesteps"]
        trained_theirs = [{steps_of.index(int(t)) for t in selection["samples"]["timesteps"][g, :count]} for g in range(G)]
        drawn = [[False] * T for _ in range(G)]
        for loop, step in feeder.tags:  # the official loop runs one sample at a time
            drawn[loop][step] = True
        leaf = record.transition_values(torch.arange(record.num_leaves, dtype=torch.float64)).round().long()
        roots = record.leaf_root[leaf]
        by_root = [int(k) for k in torch.argsort(record.leaf_root)]  # the last level's rows (leaf order) by sample
        stored = {(int(r), int(s)): float(lp) for r, s, lp in zip(roots, record.step, record.log_prob)}
        states = mine.states[:-1] + [mine.states[-1][by_root]]
        ours_x = [packed(s) for s in states]
        restored = 0.0
        for g in range(G):
            for i in range(T):
                x_ours, x_theirs = ours_x[i + 1][g], theirs.latents[g, i + 1].to(torch.float32)
                lp = scored(plan, cfg, i, states[i][g:g + 1], mine.velocities[i][g:g + 1], states[i + 1][g:g + 1])
                if (g, i) in stored:
                    restored = max(restored, abs(stored[(g, i)] - float(lp)))
                lp_theirs = theirs.log_probs[g, i:i + 1].to(torch.float32)
                report.steps.append(StepRow(
                    i, (sig[i], theirs_sig[i]), (sig[i + 1], theirs_sig[i + 1]), (plan.steps[i].stochastic, drawn[g][i]),
                    ((g, i) in stored, i in trained_theirs[g]), max_diff(x_ours, x_theirs, f"x' of sample {g} step {i}"),
                    tolerance(torch.cat([x_ours, x_theirs])), max_diff(lp, lp_theirs, f"log p of sample {g} step {i}"),
                    log_prob_tolerance(torch.cat([lp, lp_theirs]), plan, i)))
        report.notes.append(f"rows: (sample, step) for the group's {G} samples x {T} steps, sample-major; flowgrpo's "
                            "log-prob of every step by samplers.kernels.transition, the trained ones also as stored "
                            f"(largest stored - recomputed: {restored:.3g})")
        report.notes.append(f"trained: {count} of the first {T - 1} steps per sample (the official int({T - 1} x "
                            f"{args.timestep_fraction}), flowgrpo's train_subset {plan.train_subset}), the same "
                            "permutation fed to both")
        shared = bool((record.root_state == record.root_state[:1]).all())
        report.notes.append(f"x_T: one official draw for the group (--init_same_noise); flowgrpo's roots all equal: {shared}")
        mine_told = told(model, plan, cfg.sampling.integer_timesteps)
        report.notes.append(f"timesteps: the official int(σ·1000) of every step equal to the one flowgrpo's network is "
                            f"told: {list(steps_of) == mine_told} (sampling.integer_timesteps="
                            f"{cfg.sampling.integer_timesteps}, grid {plan_grid(cfg)}; the official {list(steps_of)})")

        # what the reward scores: the official decodes the last step's x̂0
        x0 = [(d - code_value(checkout, code, "code.vae_shift_factor")) * code_value(checkout, code, "code.vae_scaling_factor")
              for d in theirs.decoded]
        x0 = torch.cat([FluxPipeline._pack_latents(x, 1, channels, h, w) for x in x0])
        leaves, last_x = packed(mine.leaf[by_root]), ours_x[-1]
        report.notes.append(
            f"the rewarded sample: flowgrpo's samples (sampling.plan.leaf={plan.leaf}) against the latents the official "
            f"code decodes (its last step's x̂0): max |Δ| {max_diff(leaves, x0, 'leaf'):.3g} (tolerance "
            f"{tolerance(torch.cat([leaves, x0])):.3g}); control, the last step's x' (leaf=sample): RMS "
            f"{float((last_x.double() - x0.double()).pow(2).mean().sqrt()):.3g} away (the last step's noise, std "
            f"{float(kernel_coefficients('dance_sde', sig[T - 1], 0.0, plan.steps[T - 1].eta)[2][0]):.3g})")

        # the advantages of one set of rewards, as the trainer assigns them
        official_adv = selection["samples"]["advantages"].to(torch.float32)  # by sample
        fed = rewards_fed[record.leaf_root]  # in flowgrpo's leaf order
        adv, _ = advantages(cfg, record, plan, fed)
        adv = adv[by_root]
        control, _ = advantages(cfg, record, plan, fed, std_correction=0)
        ratio = float((control[by_root].double() / official_adv.double()).mean())
        report.notes.append(
            f"advantages of rewards {rewards_fed.min():.2f}..{rewards_fed.max():.2f} (credit.assign, advantage."
            f"std_correction={cfg.advantage.std_correction}): max |Δ| {max_diff(adv, official_adv, 'advantages'):.3g} "
            f"(tolerance {tolerance(torch.cat([adv, official_adv])):.3g}); control, std_correction=0: flowgrpo's / the "
            f"official = {ratio:.4f} (sqrt(G/(G-1)) = {math.sqrt(G / (G - 1)):.4f})")

        # the optimizer steps: the official steps after every gradient_accumulation_steps samples of the group
        report.notes.append(composition_note(cfg, record, G, args.gradient_accumulation_steps,
                                             f"its {count} trained steps"))

        # the integer timesteps off: the network told 1000σ (the same draws: they depend on the seeds alone)
        exact = ours(dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, integer_timesteps=False)),
                     model, cond)
        exact_x = torch.stack([packed(s) for s in exact.states[1:-1]] + [packed(exact.states[-1][by_root])], 1)
        most = float((exact_x.double() - theirs.latents[:, 1:].double()).abs().max())
        report.notes.append(f"control, sampling.integer_timesteps=false (the network told 1000σ): max |Δx'| {most:.3g}, "
                            f"{most / float(theirs.latents.abs().max()):.2g} of max |x'|")
    return [report]


def code_value(checkout: Checkout, code, key: str):
    return code.code_facts(checkout)[key].value


def plan_grid(cfg) -> str:
    from flowgrpo.config import resolved_plan

    return resolved_plan(cfg)[0]["grid"]


def told(model, plan, integer: bool) -> list:
    """The timestep flowgrpo's network is told at each step's σ inside the rollout's context (``FlowModel._model_time``
    within ``model.integer_timesteps(sampling.integer_timesteps)``)."""
    with model.integer_timesteps(integer):
        times = model._model_time(plan.sigmas[:-1].to(torch.float32))
    return [int(t) if float(t).is_integer() else round(float(t), 3) for t in times]


if __name__ == "__main__":  # python reproduce/parity/dancegrpo.py (DANCEGRPO_PATH set)
    from official.dancegrpo import ENV, REPOSITORY

    for r in run(Checkout.from_env(REPOSITORY, ENV)):
        print(r.line())
        for note in r.notes:
            print("    " + note)
