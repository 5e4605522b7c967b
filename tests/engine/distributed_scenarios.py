"""Shared launches for the multi-process tests: one launch per process count runs, one after another in one process
group, every training (a "scenario") the selected tests of tests/engine/test_sharded.py, test_context_parallel.py and
test_train_distributed.py need at that count, instead of one launch (process start, ~6 s of imports, a model build)
per training.

A test module declares its scenarios with a module-level ``SHARED_RUNS(test_name, **params)``: the test's roles
(``"one"``, ``"two"``...) -> :class:`Scenario`. The ``shared_runs`` fixture gathers, once a session, the scenarios of
the tests selected in it (``request.session.items``, so ``-k`` launches only what the selected tests need), merges
equal ones (a 1-process reference two tests compare with runs once), and launches them:

    python -m torch.distributed.run --standalone --nproc_per_node N tests/engine/distributed_scenarios.py SPECS.json

for N = 1, 2, 4 in turn (again, for what needs an output of a later count: a 4-process checkpoint resumed at 1).
Each test then gets its own scenarios' outcomes (``shared_runs["two"].run``...) and asserts on them as before.

In the launch (``main`` below) every scenario is what the training script does (flowgrpo.cli.train.main: load the
config on the script's default, preflight, train, build the gallery), with the scenario's FSDP2 launch variables
set while it runs; between scenarios accelerate's process-wide state is reset and the process group stays. A
scenario that raises writes its traceback to its status folder and ends the launch (its processes may have stopped
inside different collectives, so the group cannot be trusted further): the fixture relaunches the scenarios not yet
run, and only the tests of the failed one fail, with its traceback.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
            "FSDP_RESHARD_AFTER_FORWARD": "true"}
GROUP_TIMEOUT_S = 300  # a collective waiting longer than this fails its scenario (a process stopped elsewhere)
LAUNCH_TIMEOUT_S = 3600


def launch_env(**extra) -> dict:
    """The environment of every launch of these tests: CPU processes, one thread each, tests/ importable (the reward
    plug-ins of train_fixtures)."""
    return {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra}


# ==================================================================== what a test declares
@dataclass(frozen=True)
class Scenario:
    """One training (or one resume check) in a launch of ``world`` processes.

    model      the tiny pipeline folder it trains: sd3, wan, wan22, flux, qwen (built once a session)
    default    the training script's embedded default: default (train_t2i.py) or default_t2v (train_t2v.py)
    preset     --preset NAME, or None
    settings   key=value overrides on top of train_fixtures.overrides (sorted pairs; see ``train``)
    fsdp       the FSDP2 launch variables (FSDP_ENV) are set while it runs
    record     records rollouts, gradients and weights (tests/engine/context_parallel_run.py)
    after      trains on in this scenario's output folder after it (a stopped run resumed)
    load       not a training: resumes this scenario's newest checkpoint and checks every tensor
               (tests/engine/sharded_load.py); ``settings`` are then the resume's overrides
    """

    world: int
    model: str = ""
    default: str = "default"
    preset: str | None = None
    settings: tuple = ()
    fsdp: bool = False
    record: bool = False
    after: Scenario | None = None
    load: Scenario | None = None

    @classmethod
    def train(cls, world: int, model: str, default: str = "default", preset: str | None = None, *, fsdp: bool = False,
              record: bool = False, after: Scenario | None = None, **settings) -> Scenario:
        return cls(world, model, default, preset, tuple(sorted((k, str(v)) for k, v in settings.items())), fsdp,
                   record, after)

    @classmethod
    def resume_check(cls, world: int, of: Scenario, **settings) -> Scenario:
        """``of``'s newest checkpoint resumed in a launch of ``world`` processes, sharded with FSDP2 (sharded_load)."""
        return cls(world, settings=tuple(sorted((k, str(v)) for k, v in settings.items())), fsdp=True, load=of)

    @property
    def name(self) -> str:
        digest = hashlib.sha1(repr(self).encode()).hexdigest()[:8]
        what = f"load-{self.load.name}" if self.load else f"{self.model}-{self.preset or self.default}"
        return f"p{self.world}-{what}{'-fsdp' if self.fsdp else ''}-{digest}"

    def needs(self) -> list[Scenario]:
        return [s for s in (self.after, self.load) if s is not None]


# ==================================================================== the fixture's side: launching, outcomes
@dataclass
class Outcome:
    """What a scenario left: its run folder, the result its launch wrote, or why it failed."""

    scenario: Scenario
    folder: Path  # the scenario's status folder (status files, result.json, record/)
    error: str | None = None
    result: dict = field(default_factory=dict)

    def ok(self) -> "Outcome":
        if self.error is not None:
            pytest.fail(f"the shared launch's scenario {self.scenario.name} failed:\n{self.error}", pytrace=False)
        return self

    @property
    def run(self) -> Path:
        """The run folder it trained into (its output folder's run)."""
        return Path(self.ok().result["run"])

    @property
    def line(self) -> str:
        """A resume check's line: "resumed equal: <n> tensors (<k> sharded) at <N> processes (context groups of C)"."""
        return self.ok().result["line"]

    @property
    def record(self) -> Path:
        """The folder of a recorded training's recording (layout.json, rank<r>.pt)."""
        self.ok()
        return self.folder / "record"


class Runs(dict):
    """A test's roles -> outcomes; ``runs[role]`` fails the test with the scenario's traceback when it failed."""

    def __getitem__(self, role: str) -> Outcome:
        return super().__getitem__(role).ok()


def _declared(item) -> dict[str, Scenario]:
    declare = getattr(getattr(item, "module", None), "SHARED_RUNS", None)
    if declare is None:
        return {}
    params = dict(getattr(getattr(item, "callspec", None), "params", {}))
    return declare(item.originalname, **params) or {}


def _closure(scenarios) -> list[Scenario]:
    """Every scenario and what it needs, each once, a scenario after what it needs, else in the order first seen."""
    order: list[Scenario] = []

    def visit(s: Scenario) -> None:
        if s in order:
            return
        for n in s.needs():
            visit(n)
        order.append(s)

    for s in scenarios:
        visit(s)
    return order


class Launcher:
    """The session's shared launches: built on the first test that asks, run once (see the module docstring)."""

    def __init__(self, request):
        self.request, self.outcomes = request, {}
        self.base = request.getfixturevalue("tmp_path_factory").mktemp("shared_launches")
        self._models: dict[str, str] = {}
        scenarios = [s for item in request.session.items for s in _declared(item).values()]
        self.pending = _closure(scenarios)
        self.launches: list[tuple[int, float, int]] = []  # (world, seconds, scenarios) of each launch

    def model_dir(self, model: str) -> str:
        """The tiny pipeline folder of ``model``: the session's fixture (sd3, wan), else built here once."""
        if model not in self._models:
            if model in ("sd3", "wan"):
                self._models[model] = self.request.getfixturevalue(f"tiny_{model}_dir")
            else:
                from train_fixtures import save_tiny_wan22

                build = {"wan22": save_tiny_wan22, "flux": save_tiny_flux, "qwen": save_tiny_qwen,
                         "kontext": save_tiny_edit}[model]
                self._models[model] = str(build(self.request.getfixturevalue("tmp_path_factory").mktemp(f"tiny_{model}")))
        return self._models[model]

    def folder(self, s: Scenario) -> Path:
        return self.base / s.name

    def output_dir(self, s: Scenario) -> Path:
        return self.output_dir(s.after) if s.after is not None else self.folder(s) / "out"

    def spec(self, s: Scenario) -> dict:
        spec = {"name": s.name, "status": str(self.folder(s)), "fsdp": s.fsdp, "record": s.record}
        if s.load is not None:
            return {**spec, "kind": "load", "source": str(self.folder(s.load)), "args": [f"{k}={v}" for k, v in s.settings]}
        from train_fixtures import overrides

        args = overrides(self.model_dir(s.model), self.output_dir(s), **dict(s.settings))
        return {**spec, "kind": "train", "default": s.default, "preset": s.preset, "args": args}

    def outcome(self, s: Scenario) -> Outcome:
        """What the status folder says: done, failed (with every process's traceback), or None (not run)."""
        folder = self.folder(s)
        if (folder / "ok").is_file():
            return Outcome(s, folder, result=json.loads((folder / "result.json").read_text()))
        failed = sorted(folder.glob("failed.rank*"), key=lambda p: p.stat().st_mtime)
        if failed:
            return Outcome(s, folder, "\n".join(f"--- {p.name.split('.')[-1]} (the processes in the order they failed)\n"
                                                f"{p.read_text()}" for p in failed))
        return None

    def run_all(self) -> None:
        while self.pending:
            progressed = False
            for world in sorted({s.world for s in self.pending}):
                batch: list[Scenario] = []
                for s in list(self.pending):
                    if s.world != world:
                        continue
                    needs = [self.outcomes.get(n) for n in s.needs()]
                    if any(o is not None and o.error for o in needs):
                        self.outcomes[s] = Outcome(s, self.folder(s), "not run: a scenario it needs failed: " + ", ".join(
                            n.name for n, o in zip(s.needs(), needs) if o is not None and o.error))
                        self.pending.remove(s)
                        progressed = True
                    elif all(o is not None or n in batch for n, o in zip(s.needs(), needs)):
                        batch.append(s)
                if batch:
                    self._launch(world, batch)
                    progressed = True
            assert progressed, f"scenarios that can never run: {[s.name for s in self.pending]}"

    def _launch(self, world: int, batch: list[Scenario]) -> None:
        specs = [self.spec(s) for s in batch]
        n = len(self.launches)
        spec_file = self.base / f"launch{n}-p{world}.json"
        spec_file.write_text(json.dumps(specs, indent=1))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
               str(Path(__file__)), str(spec_file)]
        started = time.time()
        with open(self.base / f"launch{n}-p{world}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=launch_env(), cwd=ROOT,
                                    timeout=LAUNCH_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                rc = "timed out"
        self.launches.append((world, time.time() - started, len(batch)))
        with open(self.base / "launches.txt", "a") as summary:  # what each launch cost: the suite's time budget
            summary.write(f"launch{n}: {world} processes, {len(batch)} scenarios, {time.time() - started:.1f} s, "
                          f"exit status {rc}\n")
        tail = (self.base / f"launch{n}-p{world}.log").read_text()[-4000:]
        ran_any = False
        for s in batch:
            outcome = self.outcome(s)
            if outcome is None and (self.folder(s) / "started").is_file():
                outcome = Outcome(s, self.folder(s), f"the launch ended (exit status {rc}) during this scenario; "
                                                      f"the end of its output:\n{tail}")
            if outcome is not None:
                ran_any = True
                self.outcomes[s] = outcome
                self.pending.remove(s)
        if not ran_any:  # the launch ran nothing: every scenario of it fails with the launch's output
            for s in batch:
                self.outcomes[s] = Outcome(s, self.folder(s), f"the launch (exit status {rc}) ran nothing:\n{tail}")
                self.pending.remove(s)


def shared(request) -> Runs:
    """The outcomes of the requesting test's scenarios (the session's launches run on the first call)."""
    session = request.session
    launcher = getattr(session, "_flowgrpo_shared_launches", None)
    if launcher is None:
        launcher = Launcher(request)
        session._flowgrpo_shared_launches = launcher
    mine = _declared(request.node)
    missing = [s for s in _closure(mine.values()) if s not in launcher.outcomes and s not in launcher.pending]
    launcher.pending += missing  # a test the session did not list at its start (a rerun): its own launches now
    launcher.run_all()
    return Runs({role: launcher.outcomes[s] for role, s in mine.items()})


@pytest.fixture
def shared_runs(request) -> Runs:
    """The test's shared-launch scenarios (its module's SHARED_RUNS), run: role -> Outcome."""
    return shared(request)


# ==================================================================== tiny pipelines of the context-parallel tests
def save_tiny_flux(folder) -> str:
    """The tiny FLUX.1-dev of tests/models/test_flux.py, with the toy world's prompts in its tokenizer."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
    from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER
    from worlds.toy import scenes

    corpus = [p.text for p in scenes.train_prompts() + scenes.eval_prompts()]
    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(corpus, max_length=16), seed=0, image_size=32)
    FluxPipeline(**dict(pipe.components, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))).save_pretrained(folder)
    return str(folder)


def save_tiny_qwen(folder) -> str:
    from flowgrpo.tiny.qwen_image import save_tiny_qwen_image
    from worlds.toy import scenes

    return save_tiny_qwen_image(folder, [p.text for p in scenes.train_prompts() + scenes.eval_prompts()])


def save_tiny_edit(folder) -> str:
    """The tiny FLUX.1-Kontext (random weights, the shipped edit model's architecture) for the editing world."""
    from flowgrpo.tiny.builders import save_tiny_kontext

    return save_tiny_kontext(folder, [])


# ==================================================================== the launch's side
def _train(spec: dict) -> dict:
    """What train_t2i.py / train_t2v.py do (flowgrpo.cli.train.main, without leaving the process group)."""
    from flowgrpo.cli.train import build_gallery, preflight
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from flowgrpo.run.threads import set_threads

    cfg = load_config(spec["preset"], None, spec["args"], default=spec["default"])
    preflight(cfg)
    set_threads(cfg.threads)
    trainer = Trainer(cfg)
    if spec["record"]:
        from context_parallel_run import record, save_record

        recording = record(trainer)
    trainer.train()
    build_gallery(cfg)
    if spec["record"]:
        save_record(trainer, recording, Path(spec["status"]) / "record")
    return {"run": str(cfg.run_dir)}


def _load(spec: dict) -> dict:
    from sharded_load import resumed_equal

    source = json.loads((Path(spec["source"]) / "result.json").read_text())
    return {"line": resumed_equal(str(Path(source["run"]) / "config.yaml"), spec["args"]), "run": source["run"]}


def main(spec_file: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    from flowgrpo.run.interrupts import follow_launcher

    follow_launcher()  # as the training script: stop when the launcher dies
    # the group accelerate would form (gloo over the launch), formed here to stay for every scenario
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    for spec in json.loads(Path(spec_file).read_text()):
        status = Path(spec["status"])
        status.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            (status / "started").write_text("")
        print(f"=== scenario {spec['name']} (rank {rank} of {world})", flush=True)
        env = FSDP_ENV if spec["fsdp"] else {}
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        started = time.time()
        try:
            result = _train(spec) if spec["kind"] == "train" else _load(spec)
        except BaseException:
            (status / f"failed.rank{rank}").write_text(traceback.format_exc())
            print(f"=== scenario {spec['name']} failed on rank {rank}:\n{traceback.format_exc()}", flush=True)
            sys.stderr.flush()
            os._exit(1)  # the others may wait in a collective: the launcher ends them, the fixture relaunches the rest
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        dist.barrier()
        if rank == 0:
            (status / "result.json").write_text(json.dumps({**result, "seconds": time.time() - started}))
            (status / "ok").write_text("")
        AcceleratorState._reset_state(reset_partial_state=True)
        gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
