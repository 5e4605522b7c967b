"""benchmarks/bench_transfer.py on a tiny random SD3: a task's run trains on that task's training prompts
alone and reports the same task's held-out score; a single prompt is tested against its own task."""

import json
import sys
from pathlib import Path

import pytest

from train_fixtures import overrides

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_transfer as bench  # noqa: E402


@pytest.mark.parametrize("spec, task, count", [(("task", "counting"), "counting", 9),
                                               (("prompt", "a photo of a blue square"), "colors", 1)],
                         ids=["task", "prompt"])
def test_a_run_trains_on_its_prompts_alone_and_reads_its_task(spec, task, count, tiny_sd3_dir, tmp_path):
    extra = overrides(tiny_sd3_dir, tmp_path, **{"rewards": "[{name: toy_dense, weight: 1.0}]", "log.gallery": False,
                                                  "eval.limit": 0, "eval.every": 1, "log.samples_every": 1})  # every task held out
    result = bench.run_job((spec, 2, 1, extra, 1))
    assert result["task"] == task and result["prompts"] == count
    assert [r["iteration"] for r in result["rows"]] == [0, 1, 2]  # a held-out evaluation every iteration
    assert result["rows"][0]["reward"] is None and all(0 <= r["reward"] <= 1 for r in result["rows"][1:])
    assert all(0 <= r["held_out_task"] <= 1 and 0 <= r["held_out"] <= 1 for r in result["rows"])
    written = [json.loads(line) for line in (tmp_path / "bench-transfer" / f"{bench.job_name(spec)}.jsonl").read_text().splitlines()]
    assert {row["metadata"]["task"] for row in written} == {task} and len(written) == count
    # every sample it trained on came from those prompts (the run's sample manifests)
    manifests = sorted((Path(result["run_dir"]) / "samples").glob("step_*/manifest.jsonl"))
    trained = {json.loads(line)["prompt"] for m in manifests for line in m.read_text().splitlines()}
    assert manifests and trained <= {row["prompt"] for row in written}


def test_an_unknown_task_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="choose from single_object"):
        bench.write_prompts(("task", "colours"), tmp_path / "x.jsonl")


def test_a_held_out_set_without_the_task_names_the_fix(tiny_sd3_dir, tmp_path):
    extra = overrides(tiny_sd3_dir, tmp_path, **{"rewards": "[{name: toy_dense, weight: 1.0}]", "log.gallery": False,
                                                  "eval.limit": 4})  # the first 4 held-out prompts: single objects only
    with pytest.raises(ValueError, match="holds no counting prompts; leave eval.limit"):
        bench.run_job((("task", "counting"), 1, 1, extra, 1))
    assert not (tmp_path / "bench-transfer-counting").exists()  # refused before the run starts
