"""FSDP2 in several CPU processes (gloo) trains what one process trains, and its checkpoints move between
process counts.

Launches are real: ``torch.distributed.run`` with the variables ``accelerate launch --config_file
configs/accelerate/fsdp2.yaml`` sets (FSDP_VERSION=2 ...), and the config file itself through ``accelerate
launch`` for the two-machine test. The trainings run in the shared launches of tests/engine/distributed_scenarios.py
(one launch per process count, every training of that count one after another in it; each test declares its
trainings in SHARED_RUNS below). What differs between 1 and 2 processes is float rounding alone: each
process runs the model on its own prompts (another batch composition), so a velocity can differ in its last
bits, and a group z-score of nearly tied rewards magnifies that from the second iteration on; hence the
relative tolerances of tests/engine/test_train_distributed.py for those comparisons. Sharding itself
changes nothing: 2 sharded processes equal 2 unsharded ones to the bit, and resumes are bit-identical.
Every test here runs several processes: ``xdist_group("processes")`` keeps them on one pytest worker (the
suite runs with ``--dist loadgroup``), so two of them never share the 2 cores at once.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distributed_scenarios import Scenario, launch_env, shared_runs  # noqa: F401 (shared_runs: a fixture)
from flowgrpo.run.checkpoint import checkpoint_contents, load_checkpoint
from tolerance import assert_close_ulps
from train_fixtures import overrides

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 2  # every property below shows by the second iteration (the first trained on weights already stepped)
SMALL = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "train.iterations": ITERATIONS,
         "train.prompts_per_iteration": 4, "train.learning_rate": 1e-4, "log.samples_every": 0}
# as tests/engine/test_train_distributed.py: per-iteration metrics (relative) and final weights (norm)
RELATIVE = {"reward/brightness_mean": 1e-5, "loss": 2e-3, "grad_norm": 2e-3}
BRIGHTNESS = "'train_fixtures:Brightness'"
FRAMES = "per_frame, kwargs: {reward: 'train_fixtures:Brightness'}"
VIDEO = {"train.iterations": 2, "eval.limit": 2, "eval.reward": "toy_video"}


def _train(nproc: int, model: str, preset: str | None = None, *, sharded: bool = True, default: str = "default",
           reward: str = BRIGHTNESS, after: Scenario | None = None, **settings) -> Scenario:
    """A training in ``nproc`` processes (sharded with FSDP2 when ``sharded`` and nproc > 1) of the tiny ``model``
    with the training script of ``default`` (default: train_t2i.py, default_t2v: train_t2v.py)."""
    return Scenario.train(nproc, model, default, preset, fsdp=sharded and nproc > 1, after=after,
                          **{**SMALL, **settings, "rewards": f"[{{name: {reward}}}]"})


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _tensors(run: Path, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, whole (one file or one per process)."""
    folder = run / "checkpoints" / f"step_{step}"
    saved, _ = checkpoint_contents(folder)
    return load_checkpoint(folder, {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in saved.items()})


def _assert_same_training(one: Path, two: Path, counted: str, learning_rate: float, step: int = ITERATIONS) -> None:
    """The same training in 1 and in 2 processes: per-iteration metrics within RELATIVE, counts exactly, and
    every weight (and copy of the weights) as close as Adam allows: its first steps move each element by
    ±learning rate whatever the gradient's size, so an element whose gradient is near 0 may step either way
    in two runs that round differently; every element stays within 2·lr·steps, and at most 10% of a tensor's
    elements differ by more than 1e-3 of its largest (a gradient not summed over processes moves most of them)."""
    a, b = _metrics(one), _metrics(two)
    assert len(a) == len(b) == step
    reward = next(k for k in a[0] if k.startswith("reward/") and k.endswith("_mean"))
    # the first rollout (the same base weights, each process its own prompts): float32 rounding of the batch alone
    assert_close_ulps(torch.tensor(b[0][reward], dtype=torch.float32), torch.tensor(a[0][reward], dtype=torch.float32),
                      ulps=64, msg=f"iteration 1 {reward}")
    for key, rel in {**RELATIVE, reward: RELATIVE["reward/brightness_mean"]}.items():
        if key in a[0]:
            assert [r[key] for r in a] == pytest.approx([r[key] for r in b], rel=rel, abs=1e-7), key
    assert [r[counted] for r in a] == [r[counted] for r in b], counted
    wa, wb = _tensors(one, step), _tensors(two, step)
    assert wa.keys() == wb.keys()
    for key in (k for k in wa if not k.startswith("optim.")):  # weights and every copy of them
        difference, scale = (wa[key] - wb[key]).abs(), float(wa[key].abs().max())
        assert float(difference.max()) <= 2 * learning_rate * step * 1.01 + 1e-7 * scale, key
        assert float((difference > 1e-3 * scale).float().mean()) <= 0.1, key


CASES = {  # name -> (preset, the count of what it trains, settings)
    "flow_grpo": ("flow_grpo", "trained_transitions", {}),
    "flow_grpo-full": ("flow_grpo", "trained_transitions", {"model.finetune": "full", "train.learning_rate": 1e-5}),
    "flow_grpo-fused": ("flow_grpo", "trained_transitions", {"loss.likelihood_backend": "fused"}),
    "flow_grpo-muon": ("flow_grpo", "trained_transitions", {"train.optimizer": "muon"}),
    "branchgrpo": ("branchgrpo", "trained_transitions", {"sampling.plan.group_size": 1, "sampling.plan.num_steps": 8,
                                                         "sampling.plan.splits": "[0,3]"}),
    "nft-full": (None, "trained_samples", {"model.finetune": "full", "train.learning_rate": 1e-5}),
    "awm": ("awm", "trained_samples", {"learner.train_times": 2}),
    "dgpo": ("dgpo", "trained_samples", {"learner.train_times": 2, "learner.time_min": 0.5}),
}
# the two-machine test's settings: also the paths a short run skips: the held-out evaluation at the start (split over
# the processes) and the gradient-noise probe on every step (its norms summed over the shards)
MACHINES = {"train.iterations": 2, "eval.at_start": True, "log.grad_noise_every": 1}
# an editing family (the toy edits: an instruction and its source image a row), rewarded by a reward that sees the source
EDIT = {"model.family": "flux_kontext", "model.guidance_scale": 2.0, "prompts": "toy-edit-train",
        "eval.prompts": "toy-edit-eval", "eval.reward": "toy_edit"}


def SHARED_RUNS(test: str, case: str | None = None, sharded: bool | None = None, trained: str | None = None) -> dict:
    """Each test's trainings (role -> Scenario), run by the shared launches (tests/engine/distributed_scenarios.py)."""
    if test == "test_sharded_equals_one_process":
        preset, _, settings = CASES[case]
        return {"one": _train(1, "sd3", preset, **settings), "two": _train(2, "sd3", preset, **settings)}
    if test == "test_sharded_default_trains_resumes_and_reshards":
        one, two = _train(1, "sd3"), _train(2, "sd3")
        stopped = _train(2, "sd3", **{"train.iterations": ITERATIONS - 1})  # stopped after the first iteration
        return {"one": one, "two": two, "plain": _train(2, "sd3", sharded=False), "stopped": stopped,
                "resumed": _train(2, "sd3", after=stopped, allow_config_change="true"),  # resumed in its folder
                "two_at_4": Scenario.resume_check(4, two), "one_at_2": Scenario.resume_check(2, one)}
    if test == "test_sharded_video":
        return {n: _train(nproc, "wan", default="default_t2v", reward=FRAMES, **VIDEO)
                for n, nproc in (("one", 1), ("two", 2))}
    if test == "test_two_experts_over_processes":
        video = {**VIDEO, "model.guidance_scale_2": 3.0, **({"model.trained_experts": trained} if trained else {})}
        return {"one": _train(1, "wan22", default="default_t2v", reward=FRAMES, **video),
                "two": _train(2, "wan22", default="default_t2v", reward=FRAMES, sharded=sharded, **video)}
    if test == "test_two_machines_on_localhost":
        return {"single": _train(2, "sd3", **MACHINES)}
    if test == "test_sharded_editing_model":
        return {n: _train(nproc, "kontext", "flow_grpo", reward="preservation", **EDIT) for n, nproc in (("one", 1), ("two", 2))}
    return {}


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_equals_one_process(shared_runs, case):
    """Every learner family sharded over 2 processes: the transition learner (its ratio == 1 contract; the
    fused likelihood op; Muon, whose orthogonal factor needs each whole matrix), a tree plan (groups whole on a
    process), the forward-process learners (NFT, AWM, DGPO), and full fine-tuning (every transformer weight sharded,
    the frozen reference copy too)."""
    preset, counted, settings = CASES[case]
    one, two = shared_runs["one"].run, shared_runs["two"].run
    _assert_same_training(one, two, counted, settings.get("train.learning_rate", SMALL["train.learning_rate"]))
    if counted == "trained_transitions":  # the rollout's log-probs are the trained policy's at inner epoch 0
        exact = settings.get("loss.likelihood_backend") != "fused"  # exact with the reference backend (docs/ops.md)
        assert all(r["max_abs_ratio_minus_1_epoch0"] <= (0.0 if exact else 1e-5) for r in _metrics(two))
    if settings.get("model.finetune") == "full":  # the exported transformer folder loads with diffusers
        from diffusers import SD3Transformer2DModel

        exported = SD3Transformer2DModel.from_pretrained(two / "checkpoints" / f"step_{ITERATIONS}" / "model")
        reference = SD3Transformer2DModel.from_pretrained(one / "checkpoints" / f"step_{ITERATIONS}" / "model")
        for (name, p), q in zip(exported.state_dict().items(), reference.state_dict().values()):
            assert float((p - q).abs().max()) <= 2 * 1e-5 * ITERATIONS * 1.01 + 1e-7 * float(q.abs().max()), name


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_sharded_default_trains_resumes_and_reshards(shared_runs):
    """The default (DiffusionNFT, LoRA) sharded over 2 processes: equal to 1 process and to 2 unsharded ones
    (bit for bit: sharding changes no number); stopped after iteration 1 and resumed, bit-identical to the
    uninterrupted run; its checkpoint resumes at 1 and 4 processes, and a 1-process one at 2, each holding
    exactly the saved weights, copies and optimizer state; the exported LoRA equals the unsharded run's."""
    last = ITERATIONS
    one, two = shared_runs["one"].run, shared_runs["two"].run
    _assert_same_training(one, two, "trained_samples", SMALL["train.learning_rate"])
    assert all(r["max_abs_vplus_minus_vold_epoch0"] == 0.0 for r in _metrics(two)[:1])  # θ_old = θ at the start
    plain = shared_runs["plain"].run
    assert (two / "checkpoints" / f"step_{last}" / "tensors").is_dir() and \
        (plain / "checkpoints" / f"step_{last}" / "tensors.safetensors").is_file()
    ws, wp = _tensors(two, last), _tensors(plain, last)
    assert all(torch.equal(ws[k], wp[k]) for k in wp), [k for k in wp if not torch.equal(ws[k], wp[k])][:5]
    for key in ("reward/brightness_mean", "loss", "trained_samples"):
        assert [r[key] for r in _metrics(two)] == [r[key] for r in _metrics(plain)], key
    from safetensors.torch import load_file

    lora_s = load_file(two / "checkpoints" / f"step_{last}" / "model" / "pytorch_lora_weights.safetensors")
    lora_p = load_file(plain / "checkpoints" / f"step_{last}" / "model" / "pytorch_lora_weights.safetensors")
    assert lora_s.keys() == lora_p.keys() and all(torch.equal(lora_s[k], lora_p[k]) for k in lora_p)

    # stopped after 1 iteration and resumed (another launch's process, as a restarted run): bit-identical
    stopped = shared_runs["stopped"].run
    assert shared_runs["resumed"].run == stopped
    assert [r["loss"] for r in _metrics(stopped)] == [r["loss"] for r in _metrics(two)]
    wr = _tensors(stopped, last)
    assert all(torch.equal(ws[k], wr[k]) for k in ws), [k for k in ws if not torch.equal(ws[k], wr[k])][:5]

    # other process counts: 2 -> 1 (in this process), 2 -> 4, 1 -> 2
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer

    cfg = load_config(default=str(two / "config.yaml"))
    trainer = Trainer(cfg)
    assert trainer.resume() and trainer.iteration == last
    held = trainer.policy.state_tensors()
    assert held.keys() == ws.keys() and all(torch.equal(held[k].cpu(), ws[k]) for k in ws)
    for nproc, role in ((4, "two_at_4"), (2, "one_at_2")):  # sharded_load.py in the shared launch of nproc processes
        line = shared_runs[role].line
        assert f"resumed equal: {len(ws)} tensors" in line and f"at {nproc} processes" in line


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_sharded_video(shared_runs):
    """The text-to-video default (DiffusionNFT on the tiny Wan2.1) sharded over 2 processes equals 1 process."""
    _assert_same_training(shared_runs["one"].run, shared_runs["two"].run, "trained_samples",
                          SMALL["train.learning_rate"], step=2)


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("sharded, trained", [(True, None), (False, "[transformer_2]")], ids=["fsdp-both", "ddp-low"])
def test_two_experts_over_processes(shared_runs, sharded, trained):
    """Wan2.2's two experts (the tiny Wan2.2 layout, boundary 875: train_fixtures.save_tiny_wan22) with DiffusionNFT,
    whose time draws are per row: a process's rows may all fall on one expert while the other's do not. Sharded, every
    process still runs both experts (the same collectives); unsharded with only the low-noise expert trained, a
    parameter one process never reached is still summed over both. Either way 2 processes train what 1 trains."""
    _assert_same_training(shared_runs["one"].run, shared_runs["two"].run, "trained_samples",
                          SMALL["train.learning_rate"], step=2)


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_two_machines_on_localhost(tiny_sd3_dir, tmp_path, shared_runs):
    """``accelerate launch --config_file configs/accelerate/fsdp2.yaml`` on two "machines" (machine ranks 0 and 1,
    one process each, rendezvous on localhost) trains what 2 processes on one machine train, to the bit."""
    cfg = overrides(tiny_sd3_dir, tmp_path / "machines", **{**SMALL, **MACHINES})
    port = str(29500 + os.getpid() % 1000)
    launches = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / "fsdp2.yaml"), "--num_machines", "2", "--num_processes", "2",
               "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", port,
               str(ROOT / "train_t2i.py"), *cfg, f"rewards=[{{name: {BRIGHTNESS}}}]"]
        launches.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=launch_env(), cwd=ROOT))
    for launch in launches:
        _, err = launch.communicate(timeout=600)
        assert launch.returncode == 0, err[-4000:]
    (machines,) = [p for p in (tmp_path / "machines").iterdir() if (p / "metrics.jsonl").is_file()]
    single = shared_runs["single"].run  # 2 processes on one machine: the shared launch of 2
    assert [r.get("loss") for r in _metrics(machines)] == [r.get("loss") for r in _metrics(single)]
    rows = _metrics(single)  # the start's evaluation, then the 2 iterations
    assert rows[0]["eval/num_images"] == 4 and all("grad_noise/trace" in r for r in rows if "loss" in r)
    assert [r.get("eval/mean_score") for r in _metrics(machines)] == [r.get("eval/mean_score") for r in rows]
    a, b = _tensors(machines, 2), _tensors(single, 2)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:5]


def test_fsdp_version_1_is_refused_naming_the_fix():
    """flowgrpo shards with FSDP2 only: a launch config asking for version 1 is one line naming fsdp_version: 2."""
    from types import SimpleNamespace

    from flowgrpo.engine.sharding import fsdp_plugin
    from flowgrpo.run.errors import ConfigError

    launch = SimpleNamespace(distributed_type="FSDP", num_processes=2,
                             state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=1)))
    with pytest.raises(ConfigError, match="fsdp_version: 2"):
        fsdp_plugin(launch)
    unsharded = SimpleNamespace(distributed_type="MULTI_GPU", num_processes=2, state=SimpleNamespace())
    assert fsdp_plugin(unsharded) is None or os.environ.get("ACCELERATE_USE_FSDP") == "true"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_sharded_editing_model(shared_runs):
    """An editing family (FLUX.1-Kontext) sharded over 2 processes (FSDP2) trains what one process trains: each
    process encodes its own prompts' sources with their text, and the transformer's shards see the source's tokens
    after the latent's."""
    one, two = shared_runs["one"].run, shared_runs["two"].run
    _assert_same_training(one, two, "trained_transitions", SMALL["train.learning_rate"])
    assert all(r["max_abs_ratio_minus_1_epoch0"] == 0.0 for r in _metrics(two))
