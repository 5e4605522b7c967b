"""SIGINT / SIGTERM stop a run within one model call, with an atomic checkpoint of the last finished
iteration that resumes bit-identically, one line saying how to resume, exit status 130 / 143, and no
process left behind under `accelerate launch` (flowgrpo/run/interrupts.py)."""

import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowgrpo.config import load_config
from flowgrpo.run.paths import configs_dir

ROOT = Path(__file__).resolve().parents[2]
ANALYTIC = str(configs_dir() / "analytic.yaml")
QUIET = ["log.progress=false", "log.samples_every=0", "log.gallery=false", "log.save_every=0", "eval.every=2",
         "train.micro_batch=64"]  # several micro-batches per update: a signal can land between two of them
TRAINING_KEYS = ("loss", "grad_norm", "reward/analytic_hit_mean", "advantage/abs_mean", "nfe/rollout", "nfe/train_forward")


def _config(out: Path, *extra: str):
    return load_config(None, None, [f"output_dir={out}", "train.iterations=4", *QUIET, *extra], base=ANALYTIC)


def _rows(cfg) -> list[dict]:
    return [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]


def _in_evaluation() -> bool:
    return any(frame.function == "evaluate" for frame in inspect.stack())


class SignalAt:
    """A forward pre-hook on the model's network that sends ``signum`` to this process at the first call
    that ``when(trainer)`` picks, then counts the calls that still start."""

    def __init__(self, trainer, signum, when):
        self.trainer, self.signum, self.when = trainer, signum, when
        self.sent, self.calls_after = False, 0
        trainer.model.transformer.register_forward_pre_hook(self)  # before the trainer's own hook

    def __call__(self, module, args):
        if self.sent:
            self.calls_after += 1
        elif self.when(self.trainer):
            self.sent = True
            os.kill(os.getpid(), self.signum)  # the handler runs before os.kill returns


PHASES = {  # where the signal lands -> (extra config, the checkpoint the run must leave)
    "sampling": (lambda t: t.iteration == 2 and not torch.is_grad_enabled() and not _in_evaluation(), [], 2),
    "update, before the optimizer step": (lambda t: t.iteration == 2 and torch.is_grad_enabled(), [], 2),
    "evaluation": (lambda t: t.iteration == 2 and _in_evaluation(), [], 2),
    # two optimizer steps an iteration: after the first, the iteration's update finishes before the stop
    "between two optimizer steps": (lambda t: t.iteration == 2 and torch.is_grad_enabled()
                                    and t.policy.optimizer_steps + t.policy.skipped_steps > t._steps_at_checkpointable,
                                    ["train.updates_per_epoch=2"], 3),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Uninterrupted 4-iteration runs, one per config, to compare the interrupted-and-resumed ones with."""
    from flowgrpo.engine.trainer import Trainer

    runs = {}
    for extra in ([], ["train.updates_per_epoch=2"]):
        cfg = _config(tmp_path_factory.mktemp("straight"), *extra)
        Trainer(cfg).train()
        runs[tuple(extra)] = cfg
    return runs


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_signal_stops_at_the_next_model_call_and_the_checkpoint_resumes_bit_identically(phase, straight, tmp_path):
    from flowgrpo.run.interrupts import Interrupted
    from flowgrpo.engine.trainer import Trainer

    when, extra, step = PHASES[phase]
    cfg = _config(tmp_path, *extra)
    trainer = Trainer(cfg)
    hook = SignalAt(trainer, signal.SIGINT, when)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as info:
        trainer.train()
    assert hook.sent
    if "optimizer steps" in phase:
        assert hook.calls_after > 0  # the rest of the iteration's update, then the stop
    else:
        assert hook.calls_after == 0  # not even the model call under way when the signal came
    stop = info.value
    assert (stop.signum, stop.iteration, stop.total, stop.exit_status) == (signal.SIGINT, step, 4, 130)
    assert stop.saved == Path(cfg.run_dir) / "checkpoints" / f"step_{step}"
    assert sorted(p.name for p in (Path(cfg.run_dir) / "checkpoints").iterdir()) == [f"step_{step}"]  # no .tmp left
    assert signal.getsignal(signal.SIGINT) is handler  # the handlers are given back
    rows = _rows(cfg)
    assert [r["iteration"] for r in rows if "loss" in r] == list(range(1, step + 1))  # the stopped iteration logs nothing
    Trainer(cfg).train()  # the same config again: resumes from the checkpoint and finishes
    reference = straight[tuple(extra)]
    a, b = _rows(reference), _rows(cfg)
    for key in TRAINING_KEYS:
        assert [r[key] for r in a if "loss" in r] == [r[key] for r in b if "loss" in r], key
    wa = load_file(Path(reference.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    wb = load_file(Path(cfg.run_dir) / "checkpoints" / "step_4" / "tensors.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_signal_in_the_first_evaluation_saves_nothing(tmp_path):
    from flowgrpo.run.interrupts import Interrupted
    from flowgrpo.engine.trainer import Trainer

    cfg = _config(tmp_path)
    trainer = Trainer(cfg)
    SignalAt(trainer, signal.SIGTERM, lambda t: _in_evaluation())
    with pytest.raises(Interrupted) as info:
        trainer.train()
    assert (info.value.iteration, info.value.saved, info.value.exit_status) == (0, None, 143)
    assert "nothing new to save (no checkpoint yet)" in info.value.line("python train_t2i.py")
    assert not (Path(cfg.run_dir) / "checkpoints").exists()


def _train_t2i():
    spec = importlib.util.spec_from_file_location("train_t2i", ROOT / "train_t2i.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_the_entry_point_prints_one_line_and_returns_143(tmp_path, monkeypatch, capsys):
    """SIGTERM through train_t2i.py's main: one line naming the checkpoint and the command, status 143."""
    from flowgrpo.engine.trainer import Trainer

    built = []
    monkeypatch.setattr(Trainer, "__init__", _recording(Trainer.__init__, built))
    argv = ["--config", ANALYTIC, f"output_dir={tmp_path}", "train.iterations=4", *QUIET]
    code = _train_t2i()(argv)
    assert code == 143
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("interrupted")]
    assert lines == [f"interrupted (SIGTERM) at iteration 1 of 4; checkpoint saved to {tmp_path}/analytic/checkpoints/"
                     f"step_1; resume with: python train_t2i.py --config {ANALYTIC} output_dir={tmp_path} "
                     f"train.iterations=4 {' '.join(QUIET)}"]


def _recording(init, built):
    """Trainer.__init__ plus a SignalAt(SIGTERM) during iteration 1's sampling (the instrument of the test above)."""

    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(SignalAt(self, signal.SIGTERM, lambda t: t.iteration == 1 and not torch.is_grad_enabled()
                              and not _in_evaluation()))

    return wrapped


def test_the_launcher_prefix_is_read_from_its_command_line():
    from flowgrpo.run.interrupts import launcher_prefix

    accelerate = ["/v/bin/python3", "/v/bin/accelerate", "launch", "--config_file", "c.yaml", "train_t2i.py", "a=1"]
    assert launcher_prefix(accelerate, "train_t2i.py") == ["accelerate", "launch", "--config_file", "c.yaml"]
    module = ["/v/bin/python", "-m", "accelerate.commands.launch", "--num_processes", "1", "train_t2v.py"]
    assert launcher_prefix(module, "train_t2v.py") == ["accelerate", "launch", "--num_processes", "1"]
    assert launcher_prefix(["/v/bin/torchrun", "--nproc_per_node", "2", "train_t2i.py"], "train_t2i.py") == [
        "torchrun", "--nproc_per_node", "2"]
    assert launcher_prefix(["bash"], "train_t2i.py") is None
    assert launcher_prefix(["/v/bin/python", "-m", "pytest", "tests"], "train_t2i.py") is None


# ---------------------------------------------------------------- the real thing: accelerate launch, as the README runs it
def _launch(out: Path, iterations: int) -> subprocess.Popen:
    """`accelerate launch --config_file configs/accelerate/single.yaml train_t2i.py ...` in its own process group
    (as a terminal's foreground job)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/single.yaml",
               "train_t2i.py", "--config", "configs/analytic.yaml", f"output_dir={out}", f"train.iterations={iterations}",
               "model.dim=64", "log.progress=false", "log.samples_every=0", "log.gallery=false", "eval.every=0",
               "--threads", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)


def _wait_for_training(launcher: subprocess.Popen, out: Path, timeout: float = 600) -> int:
    """Wait until an iteration has finished (a training row in metrics.jsonl); return the trainer's pid."""
    metrics = out / "analytic" / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert launcher.poll() is None, launcher.stdout.read()
        if metrics.is_file() and '"loss"' in metrics.read_text():
            children = _children(launcher.pid)
            assert len(children) == 1, children
            return children[0]
        time.sleep(0.2)
    raise AssertionError("no iteration finished in time")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _cpu_until_gone(pid: int, patience: float = 300) -> float:
    """CPU seconds ``pid`` spends from now until it exits: how long it took to stop, whatever else loads the
    machine (wall time on a busy shared CPU measures the others). Fails if it is still there after ``patience`` s."""
    start, first = time.time(), _cpu_seconds(pid)
    last = first
    while _alive(pid):
        assert time.time() - start < patience, f"process {pid} still running after {patience} s"
        last = _cpu_seconds(pid) or last
        time.sleep(0.02)
    return (last or 0.0) - (first or 0.0)


def _stop_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, output
    return lines[0]


def test_ctrl_c_under_accelerate_launch_stops_saves_and_resumes(tmp_path):
    """Ctrl-C in a terminal signals the whole foreground group: the launcher and the trainer."""
    launcher = _launch(tmp_path, 100000)
    trainer = _wait_for_training(launcher, tmp_path)
    os.killpg(launcher.pid, signal.SIGINT)
    took = _cpu_until_gone(trainer)
    launcher.wait(timeout=60)
    output = launcher.stdout.read()
    line = _stop_line(output)
    step = int(line.split("checkpoint saved to ")[1].split(";")[0].rsplit("step_", 1)[1])
    assert line.startswith(f"interrupted (SIGINT) at iteration {step} of 100000; checkpoint saved to ")
    assert line.endswith("; resume with: accelerate launch --config_file configs/accelerate/single.yaml train_t2i.py "
                         f"--config configs/analytic.yaml output_dir={tmp_path} train.iterations=100000 model.dim=64 "
                         "log.progress=false log.samples_every=0 log.gallery=false eval.every=0 --threads 1")
    assert (tmp_path / "analytic" / "checkpoints" / f"step_{step}" / "tensors.safetensors").is_file()
    assert took < 5, f"the trainer worked {took:.1f} CPU seconds after the signal"
    # the same command (with fewer iterations to go) resumes from it
    again = _launch(tmp_path, step + 1)
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    assert f"resumed from {tmp_path}/analytic/checkpoints/step_{step} (iteration {step})" in output
    assert (tmp_path / "analytic" / "checkpoints" / f"step_{step + 1}").is_dir()


def test_killing_only_the_launcher_stops_the_trainer_too(tmp_path):
    """`kill <launcher pid>` reaches the launcher alone; the trainer must not run on, orphaned."""
    launcher = _launch(tmp_path, 100000)
    trainer = _wait_for_training(launcher, tmp_path)
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    took = _cpu_until_gone(trainer)
    line = _stop_line(launcher.stdout.read())
    assert line.startswith("interrupted (SIGTERM) at iteration ") and "; checkpoint saved to " in line
    step = line.split("checkpoint saved to ")[1].split(";")[0]
    assert (Path(step) / "tensors.safetensors").is_file()
    assert took < 5, f"the trainer worked {took:.1f} CPU seconds after the launcher died"
