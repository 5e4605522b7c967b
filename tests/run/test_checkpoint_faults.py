"""Faults while saving and resuming lose nothing already saved (flowgrpo/run/checkpoint.py): a process killed
(SIGKILL) while writing a checkpoint leaves the previous one intact and resumable; a full disk while saving
is one line, its partial folder removed; a truncated or corrupted checkpoint is named on resume, with the
newest one that can be read; a remote reward server that dies mid-run is retried, then the dead-reward rule
stops the run with one line and the checkpoints before it resume. The analytic world, a few seconds each."""

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowgrpo.cli.train import main
from flowgrpo.run.checkpoint import checkpoint_dirs, checkpoint_problem, readable_checkpoint
from flowgrpo.run.paths import configs_dir

ROOT = Path(__file__).resolve().parents[2]
ANALYTIC = str(configs_dir() / "analytic.yaml")
QUIET = ["log.progress=false", "log.samples_every=0", "log.gallery=false", "eval.every=0", "eval.at_start=false",
         "log.save_every=1", "log.keep_checkpoints=5", "run_name=faults"]


def _args(out: Path, iterations: int, *extra: str) -> list[str]:
    return ["--config", ANALYTIC, f"output_dir={out}", f"train.iterations={iterations}", *QUIET, *extra]


def _train(out: Path, iterations: int, *extra: str) -> int:
    return main(_args(out, iterations, *extra), prog="train_t2i.py", description="", default="default")


def _weights(run: Path, step: int) -> dict:
    return {k: v for k, v in load_file(run / "checkpoints" / f"step_{step}" / "tensors.safetensors").items()
            if k.startswith("weights.")}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """Three iterations without a fault: the weights every resumed run must reach."""
    out = tmp_path_factory.mktemp("straight")
    assert _train(out, 3) == 0
    return out / "faults"


def test_sigkill_while_writing_a_checkpoint_leaves_the_previous_one_resumable(tmp_path, straight):
    """The second checkpoint's tensor file is half written when the process is killed (SIGKILL: no handler, no
    cleanup). step_1 stays complete and is the one resumed; the .tmp folder is never taken for a checkpoint; the
    resumed run ends bit-identical to the straight one."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import flowgrpo.run.checkpoint as checkpoint
        from flowgrpo.cli.train import main
        original, calls = checkpoint.save_file, []

        def save_file(tensors, path, *args, **kw):
            calls.append(path)
            if len(calls) == 2:  # the second checkpoint: write part of the file, then die mid-write
                with open(path, "wb") as f:
                    f.write(b"\\0" * 4096)
                    f.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(tensors, path, *args, **kw)

        checkpoint.save_file = save_file
        sys.exit(main({_args(tmp_path, 3)!r}, prog="train_t2i.py", description="", default="default"))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-2000:]
    run = tmp_path / "faults"
    assert (run / "checkpoints" / "step_2.tmp").is_dir()  # the killed write is left as it was ...
    assert [p.name for p in checkpoint_dirs(run)] == ["step_1"]  # ... and never counted
    assert checkpoint_problem(run / "checkpoints" / "step_1") is None and readable_checkpoint(run).name == "step_1"
    assert _same(_weights(run, 1), _weights(straight, 1))
    assert _train(tmp_path, 3) == 0  # resumes from step_1
    assert _same(_weights(run, 3), _weights(straight, 3))
    assert not (run / "checkpoints" / "step_2.tmp").exists()  # the next write of step_2 replaced it


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(tmp_path, straight, monkeypatch, capsys):
    """ENOSPC from the tensor file's write at the second checkpoint: exit 2, one line naming the checkpoint, the
    error and the intact step_1; no partial folder left; the same command then resumes and ends as the straight run."""
    import flowgrpo.run.checkpoint as checkpoint

    original, calls = checkpoint.save_file, []

    def full_disk(tensors, path, *args, **kw):
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"\0" * 1024)  # some bytes made it before the disk filled
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return original(tensors, path, *args, **kw)

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    assert _train(tmp_path, 3) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "could not write checkpoint" in lines[0] and "step_2" in lines[0] and "ENOSPC" in lines[0]
    assert "step_1, is intact" in lines[0] and "free space" in lines[0]
    run = tmp_path / "faults"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert _same(_weights(run, 1), _weights(straight, 1))
    monkeypatch.setattr(checkpoint, "save_file", original)
    assert _train(tmp_path, 3) == 0
    assert _same(_weights(run, 3), _weights(straight, 3))


@pytest.mark.parametrize("damage", ["truncated tensors", "garbage header", "corrupted state.json"])
def test_a_damaged_checkpoint_is_named_with_the_last_good_one(tmp_path, straight, damage, capsys):
    """The newest checkpoint is damaged after the run: resume refuses in one line naming the file and offering the
    newest readable checkpoint; moved aside as the line says, the run resumes from it and ends as the straight one."""
    assert _train(tmp_path, 2) == 0
    run = tmp_path / "faults"
    step2 = run / "checkpoints" / "step_2"
    tensors, state = step2 / "tensors.safetensors", step2 / "state.json"
    if damage == "truncated tensors":
        tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
        named = tensors
    elif damage == "garbage header":
        tensors.write_bytes(b"\xff" * 64 + tensors.read_bytes()[64:])
        named = tensors
    else:
        state.write_text(state.read_text()[:40])
        named = state
    assert _train(tmp_path, 3) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert f"checkpoint step_2 cannot be read ({named}" in lines[0] and "the newest readable one is step_1" in lines[0]
    assert _same(_weights(run, 1), _weights(straight, 1))  # nothing saved before was touched
    step2.rename(step2.with_name("step_2.bad"))  # what the line says to do
    assert _train(tmp_path, 3) == 0
    assert _same(_weights(run, 3), _weights(straight, 3))


def test_a_reward_server_that_dies_mid_run_stops_it_cleanly(tiny_sd3_dir, tmp_path, capsys):
    """The toy reward behind a RewardServer on localhost, shut down once the first checkpoint is written: the
    client retries with backoff, every later iteration scores NaN, and after train.max_iterations_without_reward
    of them the run stops with one line, exit 2. The checkpoint written before the server died is intact and
    resumes (here with the reward scored locally)."""
    import threading

    from rewards.remote import RewardServer
    from rewards.toy.scorer import ToyScorer
    from train_fixtures import overrides

    server = RewardServer(ToyScorer()).start()
    first = tmp_path / "faults" / "checkpoints" / "step_1" / "state.json"

    def kill_when_saved():
        while not first.is_file():
            threading.Event().wait(0.02)
        server.shutdown()

    threading.Thread(target=kill_when_saved, daemon=True).start()
    args = overrides(tiny_sd3_dir, tmp_path, **{"sampling.plan.group_size": 2, "sampling.plan.num_steps": 2,
                                                 "log.samples_every": 0, "log.gallery": "false", "run_name": "faults",
                                                 "train.iterations": 6, "train.max_iterations_without_reward": 2})
    reward = f"rewards=[{{name: remote, kwargs: {{url: '{server.url}', retries: 2, backoff_s: 0.05, timeout: 5}}}}]"
    status = main([*args, reward], prog="train_t2i.py", description="", default="default")
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert "no valid reward in 2 iterations in a row" in line and "remote" in line, line
    run = tmp_path / "faults"
    saved = [p.name for p in checkpoint_dirs(run)]
    assert saved and saved[0] == "step_1" and all(checkpoint_problem(run / "checkpoints" / s) is None for s in saved)
    # the run again with the reward scored locally: it resumes from the last checkpoint and finishes
    last = int(saved[-1].split("_")[1])
    again = [a for a in args if not a.startswith("train.iterations=")] + [f"train.iterations={last + 1}"]
    assert main([*again, "rewards=[{name: toy}]", "allow_config_change=true"], prog="train_t2i.py", description="",
                default="default") == 0
    assert f"step_{last + 1}" in [p.name for p in checkpoint_dirs(run)]
