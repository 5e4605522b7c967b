"""Context parallelism (train.context_parallel, flowgrpo/engine/context.py) in CPU processes (gloo): a sample's
tokens split over 2 processes train what one process trains.

Each case trains a tiny pipeline of the real diffusers classes for 2 iterations in 1 process and with its sequence
split over 2 (diffusers' Ulysses attention), recording (tests/engine/context_parallel_run.py) every rollout's leaves,
stored transitions and log-probs, every optimizer step's summed gradient and the final weights. Split or not, the
networks compute the same sums in another order (the attention of a head runs on one process, the projections on
each process's tokens), so the comparison is float32 rounding scaled to each tensor's size; counts are exact, and
the transition learner's ratio at inner epoch 0 stays 1 to the last bits of what one process gives. The launch of 4
processes, 2 data-parallel ranks x 2 context ranks sharded with FSDP2, equals 1 process too, and its checkpoint
resumes at context degree 1. The trainings and resume checks run in the shared launches of
tests/engine/distributed_scenarios.py (one launch per process count; each test declares its own in SHARED_RUNS).
Every test here runs several processes: ``xdist_group("processes")`` keeps them on one pytest worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distributed_scenarios import Scenario, shared_runs  # noqa: F401 (shared_runs: a fixture)

SMALL = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "train.iterations": 2,
         "train.prompts_per_iteration": 2, "train.learning_rate": 1e-4, "log.samples_every": 0, "log.gallery": False,
         "eval.limit": 2, "log.grad_noise_every": 0}
VIDEO = {"prompts": "toy-video-train", "eval.prompts": "toy-video-eval", "eval.reward": "toy_video",
         "model.num_frames": 5, "rewards": "[{name: 'train_fixtures:VideoBrightness'}]"}
IMAGE = {"rewards": "[{name: 'train_fixtures:Brightness'}]"}
LEARNERS = {"flow_grpo": {}, "diffusion_nft": {"learner.train_times": 2},
            "dgpo": {"learner.train_times": 2, "learner.time_min": 0.5},
            "branchgrpo": {"sampling.plan.group_size": 1, "sampling.plan.num_steps": 8, "sampling.plan.splits": "[0,3]"}}


def _train(nproc: int, model: str, preset: str, default: str, sharded: bool = False, **settings) -> Scenario:
    """A recorded training in ``nproc`` processes (tests/engine/context_parallel_run.py) of the tiny ``model``."""
    return Scenario.train(nproc, model, default, preset, fsdp=sharded, record=True, **{**SMALL, **settings})


def _recorded(outcome) -> dict:
    """The recording of every data rank (rollouts in slot order) and the layout."""
    record = outcome.record
    layout = json.loads((record / "layout.json").read_text())
    ranks = [torch.load(record / f"rank{r}.pt") for r in range(layout["data_world"])]
    # one record per iteration, prompt-major as a single process's (a record's rows are sorted by prompt)
    parts = sorted((r for rank in ranks for r in rank["rollouts"]), key=lambda r: (r["iteration"], r["slots"]))
    rollouts = []
    for it in sorted({r["iteration"] for r in parts}):
        mine = [r for r in parts if r["iteration"] == it]
        rollouts.append({"iteration": it, "slots": [s for r in mine for s in r["slots"]],
                         **{k: torch.cat([r[k] for r in mine]) for k in ("leaves", "states", "log_probs")}})
    return {**layout, "rollouts": rollouts, "grads": ranks[0]["grads"], "weights": ranks[0]["weights"],
            "metrics": [json.loads(line) for line in (Path(layout["run"]) / "metrics.jsonl").read_text().splitlines()]}


def _close(a: torch.Tensor, b: torch.Tensor, what: str, ulps: float = 256) -> None:
    """Equal up to float32 rounding of sums over the tensor's size: ``ulps`` of its largest magnitude."""
    assert a.shape == b.shape, what
    if not b.numel():  # a forward-process learner's rollout stores no transitions
        return
    scale = float(b.abs().max()) or 1.0
    worst = float((a - b).abs().max())
    assert worst <= ulps * torch.finfo(torch.float32).eps * scale, f"{what}: {worst:.3g} against a scale of {scale:.3g}"


def _assert_same(one: dict, split: dict, counted: str) -> None:
    assert len(one["rollouts"]) == len(split["rollouts"]) and len(one["grads"]) == len(split["grads"]) > 0
    for i, (a, b) in enumerate(zip(split["rollouts"], one["rollouts"])):
        assert a["slots"] == b["slots"]
        for key in ("leaves", "states", "log_probs"):
            _close(a[key], b[key], f"rollout {i} {key}")
    for s, (ga, gb) in enumerate(zip(split["grads"], one["grads"])):
        # a gradient sums many more products than a velocity, of terms that may cancel: its rounding scales with the
        # step's largest gradient entry, not with a cancelled tensor's own. From the second step on, the weights
        # already differ by what Adam made of the first step's rounding (an element of small gradient steps ±lr
        # whatever its size), and the gradients with them
        scale = max(float(b.abs().max()) for b in gb)
        ulps = 4096 if s == 0 else 2 ** 17
        for k, (a, b) in enumerate(zip(ga, gb)):
            worst = float((a - b).abs().max())
            assert worst <= ulps * torch.finfo(torch.float32).eps * scale, \
                f"step {s} gradient {k}: {worst:.3g} against the step's largest entry {scale:.3g}"
    # Adam's step is lr·m/√v whatever the gradient's size: an element whose gradient is near 0 may step either way in
    # two runs that round differently (the gradients above carry the comparison). As tests/engine/test_sharded.py:
    # every element within 2·lr·steps, and at most 10% of a tensor's differ by more than 1e-3 of its largest
    lr, steps = SMALL["train.learning_rate"], len(one["grads"])
    for k, (a, b) in enumerate(zip(split["weights"], one["weights"])):
        difference, scale = (a - b).abs(), float(b.abs().max())
        assert float(difference.max()) <= 2 * lr * steps * 1.01 + 1e-7 * scale, f"weight {k}"
        assert float((difference > 1e-3 * scale).float().mean()) <= 0.1, f"weight {k}"
    for a, b in zip(split["metrics"], one["metrics"]):
        assert a[counted] == b[counted], counted
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6), "loss"
        if "eval/mean_score" in b:  # the held-out evaluation at the end: sampled by each, scored by the leader
            assert a["eval/mean_score"] == pytest.approx(b["eval/mean_score"], rel=1e-4), "held-out score"
    if counted == "trained_transitions":  # ratio == 1 at inner epoch 0: as exactly as one process has it
        worst = max(r["max_abs_ratio_minus_1_epoch0"] for r in one["metrics"])
        assert all(r["max_abs_ratio_minus_1_epoch0"] <= max(worst, 2 * torch.finfo(torch.float32).eps)
                   for r in split["metrics"])


IMAGE_FAMILIES = {  # family -> (its tiny pipeline: distributed_scenarios.save_tiny_flux / save_tiny_qwen, settings)
    "flux": ("flux", {"model.family": "flux", "model.guidance_scale": 3.5, "model.max_sequence_length": 16,
                      "model.resolution": 32}),
    "qwen_image": ("qwen", {"model.family": "qwen_image", "model.guidance_scale": 4.0}),
    # an editing family: every call's sequence is the latent's tokens then the source's, split together
    "flux_kontext": ("kontext", {"model.family": "flux_kontext", "model.guidance_scale": 2.0, "prompts": "toy-edit-train",
                                 "eval.prompts": "toy-edit-eval", "eval.reward": "toy_edit"}),
}


def SHARED_RUNS(test: str, preset: str | None = None, family: str | None = None) -> dict:
    """Each test's trainings and resume checks (role -> Scenario), run by the shared launches
    (tests/engine/distributed_scenarios.py)."""
    if test == "test_wan_split_over_two_processes_equals_one":
        settings = {**VIDEO, **LEARNERS[preset]}
        return {"one": _train(1, "wan", preset, "default_t2v", **settings),
                "two": _train(2, "wan", preset, "default_t2v", **{**settings, "train.context_parallel": 2})}
    if test == "test_image_families_split_over_two_processes_equal_one":
        model, settings = IMAGE_FAMILIES[family]
        settings = {**IMAGE, **settings}
        return {"one": _train(1, model, "flow_grpo", "default", **settings),
                "two": _train(2, model, "flow_grpo", "default", **{**settings, "train.context_parallel": 2})}
    if test == "test_two_data_ranks_by_two_context_ranks_sharded_equal_one_process_and_resume_at_another_degree":
        settings = {**VIDEO, **LEARNERS["flow_grpo"]}
        one = _train(1, "wan", "flow_grpo", "default_t2v", **settings)  # test_wan_split...[flow_grpo]'s too
        four = _train(4, "wan", "flow_grpo", "default_t2v", sharded=True, **{**settings, "train.context_parallel": 2})
        return {"one": one, "four": four,  # sharded_load.py in the shared launches of 1, 2 and 4 processes
                **{f"resumed_at_{nproc}": Scenario.resume_check(nproc, run, **{"train.context_parallel": context})
                   for nproc, run, context in ((1, four, 1), (2, four, 2), (4, one, 2))}}
    return {}


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("preset", list(LEARNERS))
def test_wan_split_over_two_processes_equals_one(shared_runs, preset):
    """The tiny Wan2.1 (3-D rotary embedding, the text unsplit) for the transition learner, on a chain and on a tree
    (BranchGRPO), DiffusionNFT and DGPO."""
    counted = "trained_transitions" if preset in ("flow_grpo", "branchgrpo") else "trained_samples"
    one, two = _recorded(shared_runs["one"]), _recorded(shared_runs["two"])
    assert (two["data_world"], two["context_size"]) == (1, 2)
    _assert_same(one, two, counted)


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("family", list(IMAGE_FAMILIES))
def test_image_families_split_over_two_processes_equal_one(shared_runs, family):
    """FLUX.1 (image and text tokens both split, 2-D ids) and Qwen-Image (text of varying length, true CFG) with the
    transition learner."""
    one, two = _recorded(shared_runs["one"]), _recorded(shared_runs["two"])
    _assert_same(one, two, "trained_transitions")


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_two_data_ranks_by_two_context_ranks_sharded_equal_one_process_and_resume_at_another_degree(shared_runs):
    """4 processes: 2 data-parallel ranks (each its own prompt) x 2 context ranks, every weight sharded with FSDP2 over
    all 4: the same rollouts, gradients and weights as 1 process. Its checkpoint resumes, every tensor exactly as
    saved, at 1 process and at 2 processes as one context group of 2; one written at 1 process resumes at 4 as 2 x 2."""
    one, four = _recorded(shared_runs["one"]), _recorded(shared_runs["four"])
    assert (four["data_world"], four["context_size"], four["sharded"]) == (2, 2, True)
    _assert_same(one, four, "trained_transitions")
    for nproc, context in ((1, 1), (2, 2), (4, 2)):
        line = shared_runs[f"resumed_at_{nproc}"].line
        assert f"at {nproc} processes (context groups of {context})" in line, line


def test_qwen_image_text_padded_for_the_split_changes_nothing(tmp_path):
    """Qwen-Image's text length varies with the prompts; split over a context group it is padded (masked) to a
    multiple of the group's size: the velocity is the unpadded one up to float32 rounding."""
    from flowgrpo.models import load_model
    from flowgrpo.tiny.qwen_image import save_tiny_qwen_image

    prompts = ["a red circle", "two blue squares on the left"]
    folder = save_tiny_qwen_image(tmp_path / "qwen", prompts)
    model = load_model(dict(family="qwen_image", pretrained=folder, device="cpu", resolution=32, guidance_scale=4.0,
                            lora_rank=4, lora_alpha=4.0))
    cond = model.encode_prompts(prompts)
    x = torch.randn(2, *model.latent_shape(), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7, 0.3])
    with torch.no_grad():
        plain = model.velocity(x, sigma, cond, 4.0)
        used = int(cond.prompt_mask.bool().any(0).nonzero().max()) + 1
        model.sequence_multiple = used + 3  # never a divisor: three masked columns more
        assert model._trim_text(cond.prompt_embeds, cond.prompt_mask)[0].shape[1] == used + 3
        padded = model.velocity(x, sigma, cond, 4.0)
    _close(padded, plain, "velocity with the text padded", ulps=64)


def test_a_family_without_a_context_parallel_plan_is_refused_in_one_line(tiny_sd3_dir):
    """SD3's diffusers class has no _cp_plan: the split is refused before any collective, naming the families."""
    from flowgrpo.engine.context import Layout, enable
    from flowgrpo.models import load_model
    from flowgrpo.run.errors import ConfigError

    model = load_model(dict(family="sd3", pretrained=tiny_sd3_dir, device="cpu", lora_rank=4, lora_alpha=4.0))
    with pytest.raises(ConfigError, match=r"SD3Transformer2DModel \(transformer\) has no context-parallel plan.*"
                                          r"train.context_parallel=1") as err:
        enable(model, Layout(data_rank=0, data_world=1, context_rank=0, context_size=2))
    assert "\n" not in str(err.value)
