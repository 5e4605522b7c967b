"""Two CPU processes (gloo) compute what one process computes with the same global batch.

Seeds, prompt slots, groups, advantages and the gradient normalisation are identical by construction;
what differs is float rounding: a process runs the model on a different batch composition (its own
prompts), so a velocity row can differ in its last bits, and a group z-score amplifies that when the
group's spread is tiny. Hence tolerances rather than bit equality here (the resume test, which
replays the same batches, is bit-exact)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distributed_scenarios import Scenario, launch_env, shared_runs  # noqa: F401 (shared_runs: a fixture)
from train_fixtures import overrides

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "train.iterations": 2,
            "train.prompts_per_iteration": 4, "train.learning_rate": 1e-4,  # small steps: Adam magnifies rounding
            "rewards": "[{name: 'train_fixtures:Brightness'}]"}


def _run(nproc: int, preset: str | None) -> Scenario:
    """``torchrun`` with ACCELERATE_USE_CPU (the CPU launch as docs/scaling.md writes it): a training of the shared
    launch of ``nproc`` processes (tests/engine/distributed_scenarios.py)."""
    return Scenario.train(nproc, "sd3", "default", preset, **SETTINGS)


def SHARED_RUNS(test: str, preset: str | None = None, counted: str | None = None) -> dict:
    """Each test's trainings (role -> Scenario)."""
    if test == "test_two_processes_equal_one":
        return {"one": _run(1, preset), "two": _run(2, preset)}
    if test == "test_an_accelerate_launch_on_a_machine_without_gpus_is_one_run":
        return {"one": _run(1, "flow_grpo")}  # test_two_processes_equal_one[flow_grpo-...]'s
    return {}


def _accelerate_launch(nproc: int, model_dir: str, out: Path, preset: str | None) -> Path:
    """``accelerate`` as a user types it on a machine without GPUs: ``accelerate launch --config_file
    configs/accelerate/fsdp2.yaml --num_processes N`` and no CPU flag."""
    args = overrides(model_dir, out, **SETTINGS)
    env = launch_env()
    env.pop("ACCELERATE_USE_CPU", None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "fsdp2.yaml"), "--num_processes", str(nproc)]
    cmd += [str(ROOT / "train_t2i.py"), *(["--preset", preset] if preset else []), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "tiny-sd3-toy"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several processes: one such test at a time (pyproject's --dist loadgroup)
@pytest.mark.parametrize("preset, counted", [("flow_grpo", "trained_transitions"), (None, "trained_samples")])
def test_two_processes_equal_one(shared_runs, preset, counted):
    """Both families of learners: the transition learner (Flow-GRPO) and the default's forward-process one (NFT)."""
    one, two = shared_runs["one"].run, shared_runs["two"].run
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    tolerance = {"reward/brightness_mean": 1e-5, counted: 0, "advantage/abs_mean": 2e-3, "grad_norm": 2e-3}
    for key, rel in tolerance.items():
        a, b = [r[key] for r in rows[0]], [r[key] for r in rows[1]]
        assert a == pytest.approx(b, rel=rel, abs=1e-7), key
    wa = load_file(one / "checkpoints" / "step_2" / "tensors.safetensors")
    wb = load_file(two / "checkpoints" / "step_2" / "tensors.safetensors")
    for key in (k for k in wa if k.startswith("weights.")):
        # Adam turns near-zero gradient differences into O(lr) steps on single elements: compare norms
        assert (wa[key] - wb[key]).norm() <= 1e-2 * wa[key].norm() + 1e-8, key  # measured: ~2e-3


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_an_accelerate_launch_on_a_machine_without_gpus_is_one_run(tiny_sd3_dir, tmp_path, shared_runs):
    """``accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2`` with no --cpu on a CPU
    machine: the two processes form one run (each row written once, the one-process gradient norm) instead of two
    runs that each train the whole batch into the same folder (which logged every row twice at twice the norm)."""
    if torch.cuda.is_available():
        pytest.skip("a machine with GPUs launches one process per GPU")
    one = shared_runs["one"].run
    two = _accelerate_launch(2, tiny_sd3_dir, tmp_path / "two", "flow_grpo")
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    assert [r["iteration"] for r in rows[1]] == [1, 2]
    assert [r["grad_norm"] for r in rows[0]] == pytest.approx([r["grad_norm"] for r in rows[1]], rel=2e-3)


def test_a_launch_whose_processes_are_not_one_run_is_refused(monkeypatch):
    from types import SimpleNamespace

    from flowgrpo.run.errors import ConfigError
    from flowgrpo.run.launch import check_launch

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = SimpleNamespace(run_dir=Path("runs/x"))
    with pytest.raises(ConfigError, match=r"^the launch started 2 processes \(WORLD_SIZE\) but accelerate put this one "
                                          r"in a run of 1 .*add --cpu \(train.cpu=true\)$"):
        check_launch(SimpleNamespace(num_processes=1), cfg)
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_launch(SimpleNamespace(num_processes=1), cfg)
