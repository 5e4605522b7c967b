"""CPU threads: the automatic rule, the `threads` key and --threads of training and `flowgrpo eval`
reach torch in the running job, and the choice is printed at start-up."""

import importlib.util
from pathlib import Path

import pytest
import torch

from flowgrpo import cli
from flowgrpo.run.paths import builtin_models, configs_dir
from flowgrpo.run.threads import auto_threads, available_cpus, busy_cores, choose_threads
from rewards.analytic import AnalyticHit
from rewards.toy.scorer import ToyScorer

ROOT = Path(__file__).resolve().parents[2]


class VectorThreads(AnalyticHit):
    """The analytic world's reward, noting torch's thread count each time the running job scores."""

    seen: list[int] = []

    def score_vectors(self, x, prompts, metadata):
        VectorThreads.seen.append(torch.get_num_threads())
        return super().score_vectors(x, prompts, metadata)


class ImageThreads(ToyScorer):
    seen: list[int] = []

    def score_uint8(self, images, prompts, metadata):
        ImageThreads.seen.append(torch.get_num_threads())
        return super().score_uint8(images, prompts, metadata)


@pytest.mark.parametrize("cpus, busy, processes, torch_default, expected", [
    (2, 1.0, 1, 2, 1),    # the measured case: another process on one of two cores -> one thread
    (2, 0.1, 1, 2, 2),    # an idle machine: every core
    (2, 2.0, 1, 2, 1),    # all busy: still one
    (4, 1.4, 1, 4, 3),    # busy rounds to the nearest core
    (8, 0.0, 2, 8, 4),    # two processes of one launch share the CPUs
    (3, 0.0, 4, 3, 1),    # more processes than CPUs: one each
    (64, 0.0, 1, 32, 32),  # never more than torch's default (the physical cores)
])
def test_the_automatic_rule(cpus, busy, processes, torch_default, expected):
    assert auto_threads(cpus, busy, processes, torch_default) == expected


def test_choice_order_and_the_measurement(monkeypatch):
    for key in ("ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (choose_threads(0).threads, choose_threads(0).reason) == (3, "from OMP_NUM_THREADS")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # under accelerate launch, which sets OMP_NUM_THREADS itself
    assert choose_threads(0).reason == ("from OMP_NUM_THREADS, which accelerate launch sets "
                                        "(1 unless --num_cpu_threads_per_process N)")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert choose_threads(5).line() == "using 5 CPU threads (as asked)"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(available_cpus() * 2))
    assert choose_threads(0).threads == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    auto = choose_threads(0)
    assert 1 <= auto.threads <= available_cpus() and auto.reason.startswith(f"auto: {available_cpus()} CPUs, ")
    assert 0.0 <= busy_cores(0.05) <= available_cpus() + 0.05
    from flowgrpo.run.errors import UserError

    with pytest.raises(UserError, match="threads=-1 is not allowed; use a number >= 0"):
        choose_threads(-1)


def _train_t2i():
    spec = importlib.util.spec_from_file_location("train_t2i", ROOT / "train_t2i.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("how, expected", [(["--threads", "1"], 1), (["threads=2"], 2), ([], 1)])
def test_training_runs_with_the_chosen_threads_and_says_so(how, expected, tmp_path, monkeypatch, capsys):
    """--threads N and threads=N reach torch in the trained process; with neither, OMP_NUM_THREADS (set
    here) is the automatic choice. The count is restored when main() returns."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    VectorThreads.seen.clear()
    before = torch.get_num_threads()
    code = _train_t2i()(["--config", str(configs_dir() / "analytic.yaml"), *how, f"output_dir={tmp_path}",
                         "rewards=[{name: 'test_threads:VectorThreads'}]", "train.iterations=1", "eval.every=0",
                         "eval.at_start=false", "log.progress=false", "log.samples_every=0", "log.gallery=false"])
    assert code == 0
    assert VectorThreads.seen and set(VectorThreads.seen) == {expected}
    err = capsys.readouterr().err
    line = f"using {expected} CPU thread{'s' if expected > 1 else ''} "
    line += "(as asked)" if how else "(from OMP_NUM_THREADS; set with --threads N or threads=N)"
    assert line in err.splitlines()
    assert torch.get_num_threads() == before


@pytest.mark.skipif("tiny-sd3" not in builtin_models(), reason="shipped tiny model not built")
def test_eval_runs_with_the_chosen_threads_and_says_so(capsys):
    ImageThreads.seen.clear()
    before = torch.get_num_threads()
    assert cli.main(["eval", "--threads", "2", "--limit", "2", "--steps", "1",
                     "--reward", "test_threads:ImageThreads"]) == 0
    assert ImageThreads.seen == [2]
    captured = capsys.readouterr()
    assert "using 2 CPU threads (as asked)" in captured.err.splitlines() and captured.out.startswith("{")
    assert torch.get_num_threads() == before
