"""benchmarks/bench_scale.py on the tiny model on the CPU: the phases, images per second and MFU it reports are the
training loop's own numbers and the FLOP counter's, consistent with each other."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scale  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_scale_reports_phases_throughput_and_mfu(tmp_path):
    out = tmp_path / "scale.json"
    argv = ["--model", "tiny_sd3", "--weights", "pretrained", "--iterations", "1", "--warmup", "1",
            "--output-dir", str(tmp_path / "runs"), "--out", str(out), "train.cpu=true",
            "sampling.plan.group_size=2", "train.prompts_per_iteration=2", "sampling.plan.num_steps=2"]
    assert bench_scale.main(argv) == 0
    import json

    summary = json.loads(out.read_text())
    (row,) = summary["iterations"]
    assert row["images"] == 4 and row["images_per_s_per_gpu"] == pytest.approx(4 / row["seconds"])
    assert 0 < row["sample_model_s"] <= row["sample_s"] < row["seconds"] and 0 < row["update_model_s"] <= row["update_s"]
    assert 0 < row["mfu_sample"] < 2 and 0 < row["mfu_train"] < 2  # a CPU's matmul rate is a rough peak

    rows = row["network_rows"]  # the default: a CFG rollout (two passes a row), conditional training calls
    assert rows["sample"] == 2 * 4 * 2 and rows["grad"] > 0 and rows["update"] >= rows["grad"]
