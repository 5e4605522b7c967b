"""The torchvision shim: importable everywhere on CPU torch, and a no-op where torchvision loads."""

import subprocess
import sys

import pytest


def _run(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_plain_interpreter_imports_torchvision_and_dependents():
    # no flowgrpo import: the .pth hook installed with the package must do it
    result = _run("import torchvision, open_clip, timm, peft; print(torchvision.__version__)")
    assert result.returncode == 0, result.stderr


def test_hook_does_not_import_torch_at_startup():
    result = _run("import sys; print('torch' in sys.modules, 'torchvision' in sys.modules)")
    assert result.stdout.split() == ["False", "False"], result.stdout


def test_accelerate_cli_starts():
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.accelerate_cli", "env"],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Accelerate` version" in result.stdout


def test_no_op_when_torchvision_ops_library_loads():
    # simulate a matching torchvision build: the shim must define nothing
    code = (
        "import sys, flowgrpo_torchvision_compat as c\n"
        "c._remove_hook()\n"
        "c._torchvision_ops_library_loads = lambda: True\n"
        "print(c.install(), c._LIBRARY is None)\n"
    )
    result = _run(code)
    assert result.stdout.split() == ["False", "True"], result.stdout + result.stderr


def test_opt_out_variable_disables_the_shim():
    result = _run("import torchvision", FLOWGRPO_NO_TORCHVISION_COMPAT="1")
    if result.returncode == 0:
        pytest.skip("torchvision loads natively here; the opt-out has nothing to show")
    assert "torchvision::nms does not exist" in result.stderr
