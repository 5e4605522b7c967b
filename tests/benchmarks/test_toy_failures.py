"""benchmarks/toy_failures.py: per-task clause credits and scene sizes of saved toy images."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from worlds.toy import scenes

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import toy_failures  # noqa: E402


def _clean(prompts: list) -> torch.Tensor:
    return torch.stack([torch.from_numpy(scenes.render_prompt(p, seed=i).copy()).permute(2, 0, 1)
                        for i, p in enumerate(prompts)])


def test_clean_renders_are_exact_scenes_with_full_credit():
    prompts = scenes.eval_prompts()
    table = toy_failures.failure_table(_clean(prompts), [p.text for p in prompts])
    assert set(table) == set(scenes.TASKS)
    for task, row in table.items():
        assert row["images"] == 32, task
        assert row["exact"] == 1.0 and row["extra"] == 0.0, (task, row)
        assert row["score"] > 0.95 and all(c > 0.95 for c in row["credit"].values()), (task, row)
    assert set(table["position"]["credit"]) == {"object", "color", "position"}
    assert set(table["single_object"]["credit"]) == {"object"}


def test_an_extra_object_is_counted_and_costs_the_object_clause():
    """"a photo of a triangle" drawn as two triangles: one extra component, object credit 1 - |2 - 1| / 1 = 0."""
    prompt = scenes.parse_prompt("a photo of a triangle")
    scene = scenes.Scene((scenes.ToyObject("triangle", "red", 18, 32, 9), scenes.ToyObject("triangle", "blue", 46, 32, 9)))
    image = torch.from_numpy(scenes.render(scene).copy()).permute(2, 0, 1)[None]
    row = toy_failures.failure_table(image, [prompt.text])["single_object"]
    assert row["more"] == 1.0 and row["extra"] == 1.0
    assert row["credit"]["object"] == 0.0 and row["score"] == 0.0


def test_command_line_reads_an_eval_folder(tmp_path):
    prompts = scenes.eval_prompts()[::16]
    rows = []
    for i, (p, image) in enumerate(zip(prompts, _clean(prompts))):
        Image.fromarray(image.permute(1, 2, 0).numpy().astype(np.uint8)).save(tmp_path / f"{i:05d}.png")
        rows.append(json.dumps({"file": f"{i:05d}.png", "prompt": p.text}))
    (tmp_path / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    out = subprocess.run([sys.executable, str(BENCH / "toy_failures.py"), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    assert f"{len(prompts)} images" in out and "| position |" in out


def test_a_folder_without_manifest_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="flowgrpo eval --save-images"):
        toy_failures.read_folder(tmp_path)


def test_a_manifest_naming_a_missing_image_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"file": "00000.png", "prompt": "a photo of a triangle"}) + "\n")
    with pytest.raises(SystemExit, match="lacks 1 of the images.*00000.png.*--save-images"):
        toy_failures.read_folder(tmp_path)
