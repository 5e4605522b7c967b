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
    cfg = load_config(None, None, [f"model.pretrained={tiny_sd3_dir}", "train.micro_batch=4"])
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


def test_a_full_fine_tuning_run_that_cannot_fit_names_the_lora_too(monkeypatch, setup):
    """A paper's full fine-tuning recipe (DanceGRPO, MixGRPO, BranchGRPO on FLUX) refused on one GPU names the LoRA."""
    cfg, model, _ = setup
    full = load_config(None, None, [f"model.pretrained={cfg.model.pretrained}", "train.micro_batch=4",
                                    "model.finetune=full"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    with pytest.raises(UserError, match=r"model\.finetune=lora model\.reference=auto train\.learning_rate=3e-4"):
        check_before_rollout(full, model, 1, False, 8, 10, [].append)


def test_other_devices_and_families_without_an_inventory_are_not_checked(monkeypatch, setup):
    cfg, model, _ = setup
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 0))
    assert check_before_rollout(cfg, SimpleNamespace(device="meta", pipeline=model.pipeline), 1, False, 8, 10, print) is None
    other = SimpleNamespace(**{**vars(cfg)})
    other.model = SimpleNamespace(**{**vars(cfg.model), "family": "qwen_image"})
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
