"""The memory check before the first rollout (flowgrpo/memory/check.py, ``check_before_rollout``): the iteration's
planned memory per GPU against what the device has, read from the loaded pipeline's own configurations. The device
is a CUDA one whose free memory is set by the test (torch.cuda.mem_get_info patched), so it runs on any CPU."""

from types import SimpleNamespace

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.memory import (GIB, PLAN_OVER_MEASURED, architecture_from_configs, check_before_rollout,
                             memory_verdict, pipeline_configs, plan)
from flowgrpo.run.errors import UserError


@pytest.fixture(scope="module")
def setup(tiny_sd3_dir):
    from diffusers import DiffusionPipeline

    pipeline = DiffusionPipeline.from_pretrained(str(tiny_sd3_dir))
    # sampling.chunk=8: the group's rollout in one call, as the plan below counts it (0 would be the plan's choice)
    cfg = load_config(None, None, [f"model.pretrained={tiny_sd3_dir}", "train.micro_batch=4", "sampling.chunk=8"])
    model = SimpleNamespace(device="cuda", pipeline=pipeline)
    arch = architecture_from_configs("sd3", pipeline_configs(pipeline))
    planned = plan(arch, cfg.model, 1, False, group=8, micro_batch=4, steps=10, margin=0.0).total
    return cfg, model, planned


def _check(monkeypatch, setup, available, warnings):
    cfg, model, _ = setup
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(available), 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    return check_before_rollout(cfg, model, 1, False, 8, 10, warnings.append)


def test_the_verdict_allows_for_the_plans_measured_overestimate():
    assert memory_verdict(100, 100) == "fits"
    assert memory_verdict(145, 100) == "tight" and memory_verdict(146, 100) == "no"


def test_a_run_that_fits_passes_silently(monkeypatch, setup):
    warnings = []
    assert _check(monkeypatch, setup, 10 * setup[2], warnings) == "fits" and warnings == []


def test_a_tight_run_is_a_warning_with_the_numbers(monkeypatch, setup):
    warnings = []
    assert _check(monkeypatch, setup, setup[2] / 1.2, warnings) == "tight"
    assert len(warnings) == 1 and "memory is tight" in warnings[0] and "sampling.plan.group_size" in warnings[0]


def test_a_run_that_cannot_fit_is_refused_with_the_numbers_and_the_keys(monkeypatch, setup):
    planned = setup[2]
    with pytest.raises(UserError) as refused:
        _check(monkeypatch, setup, planned / PLAN_OVER_MEASURED / 2, [])
    message = str(refused.value)
    assert message.startswith("this run cannot fit: the memory plan puts this iteration at ")
    assert f"{planned / GIB:.2f} GiB per GPU" in message and "lower sampling.plan.group_size (at most " in message
    assert "train.micro_batch (at most " in message and "docs/memory.md" in message
    assert "model.finetune=lora" not in message  # already a LoRA
    # on a GPU: the options that move what a sample holds off it, and the context split
    assert "(sampling.latent_storage=host model.offload_text_encoders=true train.activation_offload=true)" in message
    assert "train.context_parallel=N" in message


def test_a_full_fine_tuning_run_that_cannot_fit_names_the_lora_too(monkeypatch, setup):
    """A paper's full fine-tuning recipe (DanceGRPO, MixGRPO, BranchGRPO on FLUX) refused on one GPU names the LoRA."""
    cfg, model, _ = setup
    full = load_config(None, None, [f"model.pretrained={cfg.model.pretrained}", "train.micro_batch=4",
                                    "model.finetune=full"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    with pytest.raises(UserError, match=r"model\.finetune=lora model\.reference=auto train\.learning_rate=3e-4"):
        check_before_rollout(full, model, 1, False, 8, 10, [].append)


def test_other_devices_and_families_without_an_architecture_are_not_checked(monkeypatch, setup):
    cfg, model, _ = setup
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 0))
    assert check_before_rollout(cfg, SimpleNamespace(device="meta", pipeline=model.pipeline), 1, False, 8, 10, print) is None
    other = SimpleNamespace(**{**vars(cfg)})
    other.model = SimpleNamespace(**{**vars(cfg.model), "family": "analytic"})  # the analytic world: no pipeline
    assert check_before_rollout(other, model, 1, False, 8, 10, print) is None


def test_the_loaded_pipeline_reads_as_its_folder_does(setup, tiny_sd3_dir):
    """pipeline_configs: the same architecture (components, parameters, linears, blocks) as the folder's files."""
    from flowgrpo.memory import read_architecture

    cfg, model, _ = setup
    loaded = architecture_from_configs("sd3", pipeline_configs(model.pipeline))
    folder = read_architecture(cfg.model, folder=tiny_sd3_dir)
    assert sorted(loaded.components, key=str) == sorted(folder.components, key=str)
    assert loaded.linears == folder.linears and loaded.blocks == folder.blocks and loaded.geometry == folder.geometry


def test_on_the_cpu_the_host_memory_is_the_device(setup):
    """A CPU run is checked against the host's available memory (Linux /proc/meminfo): the tiny model's plan fits."""
    from flowgrpo.memory import host_memory

    cfg, model, _ = setup
    if host_memory() is None:
        pytest.skip("no /proc/meminfo")
    assert check_before_rollout(cfg, SimpleNamespace(device="cpu", pipeline=model.pipeline), 1, False, 8, 10, print) == "fits"


# ----------------------------------------------------------------------------- the rollout's chunk (sampling.chunk: 0)


@pytest.fixture(scope="module")
def planned_chunk(setup, tiny_sd3_dir):
    """A run whose sampling.chunk is 0 (the plan's choice), with the first iteration's group and steps (8 and 6:
    configs/default.yaml's plan), and its plan with the whole group in one call."""
    from flowgrpo.memory.check import run_plan

    cfg = load_config(None, None, [f"model.pretrained={tiny_sd3_dir}", "train.micro_batch=4"])
    model = SimpleNamespace(device="cpu", pipeline=setup[1].pipeline, shift_for=lambda steps: 3.0)
    whole = run_plan(cfg, model, 1, False, 8, 6, 80 * GIB)  # on the CPU: the whole group
    return cfg, model, whole


def _on_cuda(monkeypatch, model, free):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free), 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    return SimpleNamespace(**{**vars(model), "device": "cuda"})


def test_on_the_cpu_the_rollout_is_the_whole_level_in_one_call(planned_chunk):
    """Off a GPU nothing is planned against: 0, no cap (the rollout's whole level, every node of a step, in one call)."""
    from flowgrpo.memory import rollout_chunk

    cfg, model, whole = planned_chunk
    assert cfg.sampling.chunk == 0 and whole.chunk is None and whole.rollout_forward == 8 * whole.rollout_forward_sample
    assert rollout_chunk(cfg, model, 1, False) == 0


def test_on_a_gpu_the_rollout_chunk_is_the_largest_that_fits(monkeypatch, planned_chunk):
    """rollout_chunk: the group when the device has room for its whole call; when it has room beside the rest for
    three samples' calls (with the plan's 10 % margin), three; never less than one."""
    from flowgrpo.memory import SAFETY_MARGIN, rollout_chunk

    cfg, model, whole = planned_chunk
    assert rollout_chunk(cfg, _on_cuda(monkeypatch, model, 80 * GIB), 1, False) == 8
    rest = whole.fixed + whole.rollout_record + whole.context_buffers
    free = (rest + 3.5 * whole.rollout_forward_sample) / (1 - SAFETY_MARGIN)
    assert rollout_chunk(cfg, _on_cuda(monkeypatch, model, free), 1, False) == 3
    assert rollout_chunk(cfg, _on_cuda(monkeypatch, model, 1), 1, False) == 1


def test_the_check_plans_the_chunk_the_trainer_will_use(monkeypatch, planned_chunk):
    """check_before_rollout's plan of a run with sampling.chunk 0 on a GPU counts the rollout call rollout_chunk
    chooses; on the CPU the whole group's."""
    from flowgrpo.memory import SAFETY_MARGIN
    from flowgrpo.memory.check import run_plan

    cfg, model, whole = planned_chunk
    rest = whole.fixed + whole.rollout_record
    free = (rest + 2.5 * whole.rollout_forward_sample) / (1 - SAFETY_MARGIN)
    planned = run_plan(cfg, _on_cuda(monkeypatch, model, free), 1, False, 8, 6, free)
    assert planned.chunk == 2 and planned.rollout_forward == 2 * whole.rollout_forward_sample


def test_the_runs_memory_options_reach_the_plan(setup, tiny_sd3_dir):
    """sampling.latent_storage, model.offload_text_encoders, train.activation_offload: the run's plan reads them."""
    from flowgrpo.memory.check import run_plan

    cfg = load_config(None, None, [f"model.pretrained={tiny_sd3_dir}", "train.micro_batch=4", "sampling.chunk=3",
                                   "sampling.latent_storage=host", "model.offload_text_encoders=true",
                                   "train.activation_offload=true"])
    planned = run_plan(cfg, setup[1], 1, False, 8, 6, 80 * GIB)
    assert planned.chunk == 3 and planned.rollout_record == 0 and "rollout latents" in planned.host
    assert planned.offloaded and all(planned.frozen[name] == 0 for name in planned.offloaded)
    assert planned.activation_offload and "training activations (saved tensors)" in planned.host
