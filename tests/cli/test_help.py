"""--help is where a user looks first: the training scripts list the presets, model configs and the
config reference; `flowgrpo --help` lists every command, the gallery included."""

import importlib.util
from pathlib import Path

import pytest

from flowgrpo import cli
from flowgrpo.run.paths import configs_dir

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("script", ["train_t2i.py", "train_t2v.py"])
def test_training_help_lists_presets_models_and_the_config_reference(script, capsys):
    text = _help(_script(script).main, ["--help"], capsys)
    flat = " ".join(text.split())  # argparse wraps lines
    presets = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))
    models = sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml"))
    assert len(presets) >= 10 and len(models) >= 5
    assert f"presets (--preset NAME, configs/presets/): {', '.join(presets)}" in flat
    assert f"models (--model NAME, configs/models/): {', '.join(models)}" in flat
    assert "flowgrpo/config/schema.py" in flat and "docs/errors.md" in flat
    assert "--threads N" in flat and "--debug" in flat


def test_training_help_reads_the_preset_folder_at_run_time(tmp_path, monkeypatch, capsys):
    """A preset file dropped into configs/presets/ shows up without touching the code."""
    from flowgrpo.cli import train as launch

    for folder in ("presets", "models"):
        (tmp_path / folder).mkdir()
    (tmp_path / "presets" / "my_method.yaml").write_text("sampling: {plan: {num_steps: 10}}\n")
    (tmp_path / "models" / "my_model.yaml").write_text("family: sd3\n")
    monkeypatch.setattr(launch, "configs_dir", lambda: tmp_path)
    flat = " ".join(_help(_script("train_t2i.py").main, ["--help"], capsys).split())
    assert "configs/presets/): my_method" in flat and "configs/models/): my_model" in flat


def test_flowgrpo_help_lists_the_gallery_and_the_training_scripts(capsys):
    text = _help(cli.main, ["--help"], capsys)
    assert "gallery" in text and "eval" in text and "pretrain-toy" in text
    assert "accelerate launch train_t2i.py" in text and "docs/errors.md" in text


def test_flowgrpo_gallery_is_the_gallery_command(tmp_path, capsys):
    text = _help(cli.main, ["gallery", "--help"], capsys)
    assert "run_dir" in text and "--serve" in text
    with pytest.raises(SystemExit) as info:  # the gallery's own argument check answers
        cli.main(["gallery", str(tmp_path / "missing")])
    assert info.value.code == 2 and "is not a directory" in capsys.readouterr().err
