"""`flowgrpo eval --benchmark geneval|ocr|pickscore`: the shipped prompt sets, the papers' report formats, the
whole protocol end to end on the tiny model with tiny random scorer models, a checkpoint's row beside the base
model's, the split over processes, and the one-line messages for what is not installed or not downloaded."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flowgrpo.cli import main
from flowgrpo.cli.tools import UserExit
from flowgrpo.data import EVALUATION_PROMPT_SETS, evaluation_prompt_file, read_prompts
from flowgrpo.protocols import GENEVAL_COLUMNS, PROTOCOLS, geneval_report, load_protocol, markdown_table, mean_report
from flowgrpo.run.paths import builtin_models, configs_dir

ROOT = Path(__file__).resolve().parents[2]
needs_shipped = pytest.mark.skipif("tiny-sd3" not in builtin_models(), reason="shipped tiny model not built")
# name -> (prompts, sha256 of the file as its source publishes it, the source named in SOURCES.md)
SHIPPED = {
    "geneval": (553, "5c48e0813e812e3c373fa5c8ed07a8f0a483be30272b4427b0559c8048e67c13",
                "djghosh13/geneval, `prompts/evaluation_metadata.jsonl`"),
    "ocr-test": (1018, "4dd8caf3ab6ade73bd376c7d14c6ca49b6eacfb1bd321e22c40714ae4a98d4dc",
                 "yifan123/flow_grpo, `dataset/ocr/test.txt`"),
    "pickscore-test": (2048, "d75c025fa451866e70f7e36243f7cdd93095523cb51f5f9651f2ce3236d20262",
                       "yifan123/flow_grpo, `dataset/pickscore/test.txt`"),
}


def test_shipped_prompt_sets_counts_checksums_and_sources():
    sources = (configs_dir() / "evaluation" / "SOURCES.md").read_text()
    assert set(SHIPPED) == set(EVALUATION_PROMPT_SETS)
    for name, (count, sha, source) in SHIPPED.items():
        path = evaluation_prompt_file(name)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, f"{path} is not byte for byte its source's"
        prompts, metadata = read_prompts(name)
        assert len(prompts) == count
        assert f"`{path.name}` | {count:,} | {source}" in sources
    assert sources.count("MIT License") == 2 and "Dhruba Ghosh" in sources and "Jie Liu" in sources
    prompts, metadata = read_prompts("geneval")
    assert all(m["task"] == m["tag"] and m["prompt"] == p for p, m in zip(prompts, metadata))
    assert all('"' in p for p in read_prompts("ocr-test")[0])  # every OCR prompt quotes the text to render
    for name in PROTOCOLS:  # every protocol names a shipped set, its images and seed (the model its settings)
        protocol = load_protocol(name)
        assert protocol.prompts in EVALUATION_PROMPT_SETS and protocol.images_per_prompt >= 1


# The models the papers evaluate, and how: (steps, CFG, resolution) and where each paper's code states them.
PAPERS_EVALUATE = {
    "sd3_5_medium": ((40, 4.5, 512), "Flow-GRPO config/grpo.py geneval_sd3, general_ocr_sd3, pickscore_sd3: "
                                     "eval_num_steps 40, guidance_scale 4.5, resolution 512"),
    "flux_dev": ((28, 3.5, 512), "Flow-GRPO config/grpo.py pickscore_flux, geneval_flux_fast: eval_num_steps 28, "
                                 "guidance_scale 3.5, resolution 512"),
    "qwen_image": ((50, 4.0, 512), "Flow-GRPO config/grpo.py pickscore_qwenimage: eval_num_steps 50, guidance_scale 4, "
                                   "resolution 512"),
}


def test_each_model_samples_as_the_papers_evaluate_it_and_a_checkpoint_as_its_run():
    """Every model config: a benchmark samples with its own steps, CFG and resolution, which for the models the papers
    evaluate are the papers' settings; a checkpoint's run's held-out settings come before them (a CFG-free run is
    evaluated CFG-free, as DiffusionNFT's scripts/evaluation.py, guidance 1.0, and Flow-GRPO's Fast no-CFG runs,
    eval_guidance_scale 1, evaluate), and the command line before both."""
    from omegaconf import OmegaConf

    from flowgrpo.protocols import sampling_settings

    configs = sorted((configs_dir() / "models").glob("*.yaml"))
    assert set(PAPERS_EVALUATE) <= {p.stem for p in configs}
    for path in configs:
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        settings = sampling_settings(cfg)
        own = (cfg["sample_steps"], cfg["guidance_scale"], cfg.get("resolution"))  # the analytic world has none
        assert (settings["steps"], settings["guidance_scale"], settings["resolution"]) == own, path.stem
        assert set(settings["from"].values()) == {"the model config's"} and len(settings["from"]) == 2 + bool(own[2])
        if path.stem in PAPERS_EVALUATE:
            assert own == PAPERS_EVALUATE[path.stem][0], f"{path.stem}: {PAPERS_EVALUATE[path.stem][1]}"
    model = {"sample_steps": 40, "guidance_scale": 4.5, "resolution": 512}
    cfg_free = {"sampling": {"guidance_scale": 1.0}, "eval": {"steps": None, "guidance_scale": None}}
    settings = sampling_settings(model, cfg_free)
    assert (settings["steps"], settings["guidance_scale"]) == (40, 1.0)
    assert settings["from"] == {"steps": "the model config's", "guidance_scale": "the run's",
                                "resolution": "the model config's"}
    held_out = {"sampling": {"guidance_scale": 1.0}, "eval": {"steps": 14, "guidance_scale": 2.0}}
    assert (sampling_settings(model, held_out)["steps"], sampling_settings(model, held_out)["guidance_scale"]) == (14, 2.0)
    assert sampling_settings(model, {"sampling": {"guidance_scale": None}})["guidance_scale"] == 4.5  # the model's
    given = sampling_settings(model, held_out, steps=3, guidance_scale=0.0, resolution=256)
    assert (given["steps"], given["guidance_scale"], given["resolution"]) == (3, 0.0, 256)
    assert set(given["from"].values()) == {"command line"}


def test_every_video_or_vector_model_is_refused_by_the_image_benchmarks_before_it_loads(tmp_path):
    """The papers' benchmarks score images: every video (and the analytic world's vector) model config is refused in one line, before anything loads
    (it was a traceback after sampling); every image model config passes that check."""
    from types import SimpleNamespace

    from flowgrpo.cli.evaluation import _check_modality
    from flowgrpo.models import FAMILIES

    for path in sorted((configs_dir() / "models").glob("*.yaml")):
        family = FAMILIES[__import__("yaml").safe_load(path.read_text())["family"]]
        for benchmark in PROTOCOLS:
            args = ["eval", "--benchmark", benchmark, "--model", path.stem, "--limit", "1", "--out",
                    str(tmp_path / benchmark), "--reward-option", "device=cpu"]
            if family.modality != "image":  # videos, and the analytic world's vectors
                with pytest.raises(UserExit, match=f"--benchmark {benchmark} scores images and --model '{path.stem}'"):
                    main(args)
            else:  # the check passes (main would go on to load the scorer and the model)
                _check_modality(load_protocol(benchmark).reward["name"], {"family": family.name},
                                SimpleNamespace(model=path.stem, benchmark=benchmark))


def test_geneval_report_by_hand():
    nan = float("nan")
    tasks = ["single_object", "single_object", "counting", "position"]
    # 2 images of 4 prompts: single_object 3/4, counting 0/2, position 1/1 (one image not scored)
    correct = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, nan]])
    report = geneval_report(correct, tasks)
    assert report["tasks"] == {"single_object": 0.75, "counting": 0.0, "position": 1.0}
    assert report["overall"] == pytest.approx(1.75 / 3)  # the mean of the task accuracies, not of the images
    assert report["correct_images"] == pytest.approx(4 / 7) and report["correct_prompts"] == 0.75
    table = markdown_table([{"benchmark": "geneval", "label": "base", "prompts": 4, "of_prompts": 553,
                             "images_per_prompt": 2, "steps": 40, "guidance_scale": 4.5, "resolution": 512, "seed": 42,
                             **report}])
    assert table.splitlines()[0] == ("| Model | Single object | Two objects | Counting | Colors | Position | "
                                     "Color attribution | Overall |")
    assert table.splitlines()[2] == "| base | 0.75 | – | 0.00 | – | 1.00 | – | 0.58 |"


def test_mean_report_by_hand():
    report = mean_report(torch.tensor([[1.0, 0.5, float("nan")], [0.0, 0.5, 1.0]]), "OCR accuracy")
    assert report["metric"] == "OCR accuracy" and report["OCR accuracy"] == pytest.approx(0.6)
    assert report["standard_error"] == pytest.approx(torch.tensor([1.0, 0.5, 0.0, 0.5, 1.0]).std().item() / 5 ** 0.5)
    assert report["not_applicable"] == 1


@pytest.fixture(scope="module")
def tiny_scorers(tmp_path_factory):
    """Tiny random GenEval detector and colour CLIP, written by `python -m rewards.tiny geneval DIR` as a user would."""
    folder = tmp_path_factory.mktemp("tiny_geneval")
    result = subprocess.run([sys.executable, "-m", "rewards.tiny", "geneval", str(folder)], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    options = result.stdout.split()  # --reward-option key=value ..., as `flowgrpo eval ... $(python -m rewards.tiny ...)`
    assert options[::2] == ["--reward-option"] * 3 and all("=" in o for o in options[1::2])
    return options


@needs_shipped
def test_geneval_end_to_end_on_the_tiny_model_prints_the_table(capsys, tmp_path, tiny_scorers):
    out = tmp_path / "geneval"
    assert main(["eval", "--benchmark", "geneval", "--model", "tiny_sd3", "--limit", "8", "--steps", "2",
                 "--out", str(out), *tiny_scorers]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["prompts"] == 8 and report["images_per_prompt"] == 4 and report["images"] == 32
    assert report["of_prompts"] == 553 and report["seed"] == 42 and report["scorer"]["score"] == "official"
    assert set(report["tasks"]) == {"single_object"}  # the first 8 prompts are single objects
    assert "| Model | Single object |" in captured.err and "| tiny_sd3 |" in captured.err
    assert (out / "report.md").read_text().count("| tiny_sd3 |") == 1
    manifest = [json.loads(line) for line in (out / "samples" / "eval_tiny_sd3" / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 32 and {m["group_size"] for m in manifest} == {4}
    assert {(m["group"], m["node"]) for m in manifest} == {(i, j) for i in range(8) for j in range(4)}
    assert all((out / "samples" / "eval_tiny_sd3" / m["file"]).is_file() for m in manifest)


@needs_shipped
def test_a_block_size_never_changes_an_image(tmp_path):
    """Prompt i's image j comes from the noise of (seed + j, i), whichever block it is sampled in."""
    from flowgrpo.models import load_model
    from flowgrpo.protocols import run_protocol
    from rewards.base import Reward, RewardOutput

    class Mean(Reward):
        name, modality = "mean", "image"

        def score_uint8(self, images, prompts, metadata):
            return RewardOutput(images.float().mean((1, 2, 3)))

    model = load_model({"family": "sd3", "pretrained": "tiny-sd3", "dtype": "float32", "device": "cpu",
                        "resolution": 32, "sample_steps": 2})
    protocol = load_protocol("pickscore")
    protocol.images_per_prompt = 2
    whole = run_protocol(model, protocol, Mean(), label="a", limit=5, block=64, progress=False, out=tmp_path / "a")
    blocks = run_protocol(model, protocol, Mean(), label="b", limit=5, block=2, progress=False, out=tmp_path / "b")
    # the same noise; a batch of other prompts may move the model's float rounding, never an image
    assert whole["PickScore"] == pytest.approx(blocks["PickScore"], rel=1e-5)
    for j in range(2):
        for i in range(5):
            a, b = (np.asarray(Image.open(tmp_path / x / "samples" / f"eval_{x}" / f"p{i:05d}_{j}.png"), dtype=int)
                    for x in ("a", "b"))
            assert np.abs(a - b).max() <= 1
    other = (np.asarray(Image.open(tmp_path / "a" / "samples" / "eval_a" / f"p00000_{j}.png"), dtype=int) for j in (0, 1))
    assert np.abs(next(other) - next(other)).mean() > 10  # image 1 of a prompt is another sample than image 0

@needs_shipped
def test_ocr_protocol_end_to_end_with_a_reader_of_our_own(capsys, tmp_path):
    """The OCR protocol's prompts, scorer options and table through the command, with an engine that reads nothing:
    every score is 0 (the prompts' quoted texts are the targets, none is read)."""
    out = tmp_path / "ocr"
    assert main(["eval", "--benchmark", "ocr", "--limit", "3", "--steps", "2", "--out", str(out),
                 "--reward-option", "reader=train_fixtures:blank_reader"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metric"] == "OCR accuracy" and report["OCR accuracy"] == 0.0 and report["images"] == 3
    assert report["scorer"]["full_credit_if_contained"] is True
    assert "| tiny_sd3 | 0.00 ± 0.00 |" in (out / "report.md").read_text()


def test_a_checkpoint_row_beside_the_base_model(capsys, tiny_sd3_dir, tmp_path, tiny_scorers):
    """--checkpoint of a run evaluates its weights into the same folder: the table gains its row, and the gallery
    compares the two models' images prompt by prompt. The run trained CFG-free: its held-out evaluation and its
    checkpoint's benchmark row sample CFG-free (the run's guidance), the base model at its own CFG."""
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from gallery import build_site
    from train_fixtures import PLUGIN_REWARD, overrides

    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "train.iterations": 1,
        "model.lora_rank": 2, "model.lora_alpha": 2.0, "log.samples_every": 0, "sampling.guidance_scale": 1.0}),
        base=PLUGIN_REWARD)
    Trainer(cfg).train()
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/guidance_scale"] for r in rows if "eval/guidance_scale" in r] == [1.0]  # the model's is 3.0
    checkpoint = tmp_path / cfg.run_name / "checkpoints" / "step_1"
    out = tmp_path / "geneval"
    common = ["eval", "--benchmark", "geneval", "--limit", "3", "--images-per-prompt", "2", "--steps", "2",
              "--resolution", "32", "--out", str(out), *tiny_scorers]
    assert main([*common, "--pretrained", tiny_sd3_dir]) == 0
    assert main([*common, "--checkpoint", str(checkpoint)]) == 0
    reports = [json.loads(line) for line in (out / "reports.jsonl").read_text().splitlines()]
    assert [r["label"] for r in reports] == ["tiny_sd3", f"{cfg.run_name}/step_1"]
    assert reports[1]["checkpoint"] == str(checkpoint) and reports[1]["steps"] == 2 and reports[1]["resolution"] == 32
    assert [r["guidance_scale"] for r in reports] == [3.0, 1.0]
    assert reports[1]["settings_from"]["guidance_scale"] == "the run's"
    table = (out / "report.md").read_text()
    assert "| tiny_sd3 |" in table and f"| {cfg.run_name}/step_1 |" in table
    assert "CFG 3.0, 32 px" in table and "CFG 1.0 (its run's), 32 px" in table
    assert main([*common, "--checkpoint", str(checkpoint), "--guidance", "2"]) == 0  # the command line before the run
    assert json.loads((out / "reports.jsonl").read_text().splitlines()[-1])["guidance_scale"] == 2.0
    assert main([*common, "--checkpoint", str(checkpoint)]) == 0
    site = build_site(out)
    prompts = (site.parent / "data" / "prompts.js").read_text()
    assert "eval_tiny_sd3" in prompts and f"eval_{cfg.run_name}_step_1" in prompts
    # the models in training order, as the manifests say (not the digits a model's name ends with: tiny_sd3)
    text = (site.parent / "data" / "index.js").read_text()
    index = json.loads(text[text.index("{"): text.rindex("}") + 1])
    assert [(s["name"], s["iteration"]) for s in index["steps"]] == [("eval_tiny_sd3", 0), (f"eval_{cfg.run_name}_step_1", 1)]


def test_geneval_is_a_training_reward_on_its_prompts(tiny_sd3_dir, tmp_path, tiny_scorers):
    """`rewards: [{name: geneval}]` with `prompts: geneval`: the benchmark's scorer is the training reward (Flow-GRPO's
    partial credit), read from each prompt's metadata, through a run's two iterations; and the held-out reward
    (`eval.reward: geneval` with `eval.reward_kwargs`) gives the benchmark's verdict."""
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from train_fixtures import overrides

    kwargs = dict(option.split("=", 1) for option in tiny_scorers[1::2])
    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 2, "prompts": "geneval", "log.samples_every": 1,
        "eval.reward": "geneval", "eval.prompts": "geneval", "eval.limit": 4})
        + [f"rewards=[{{name: geneval, kwargs: {json.dumps(kwargs)}}}]",
           f"eval.reward_kwargs={json.dumps({**kwargs, 'score': 'official'})}"])
    Trainer(cfg).train()
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    means = [r["reward/geneval_mean"] for r in rows if "reward/geneval_mean" in r]
    assert len(means) == 2 and all(-3 <= m <= 1 for m in means)  # the mean of 1 - |count - found| / count terms
    # the held-out evaluation: the benchmark's verdict (0/1) and Flow-GRPO's strict accuracy beside it
    final = [r for r in rows if "eval/mean_score" in r][-1]
    assert final["eval/num_images"] == 4 and final["eval/mean_score"] in (0, 0.25, 0.5, 0.75, 1)
    assert 0 <= final["eval/strict_accuracy"] <= 1
    manifest = [json.loads(line) for line in (Path(cfg.run_dir) / "samples" / "step_1" / "manifest.jsonl").read_text().splitlines()]
    assert manifest and all(m["metadata"]["tag"] in GENEVAL_COLUMNS and "geneval" in m["rewards"] for m in manifest)


@needs_shipped
@pytest.mark.slow
@pytest.mark.xdist_group("processes")
def test_two_processes_score_what_one_scores(tmp_path):
    """`torchrun --nproc_per_node 2 -m flowgrpo.cli eval --benchmark ...`: each process samples and scores its share
    of each block; the report and the images are those of one process."""
    from rewards.tiny import tiny_clip_folder

    clip = tiny_clip_folder(tmp_path / "clip")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    reports = []
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), "-m",
               "flowgrpo.cli", "eval", "--benchmark", "pickscore", "--limit", "5", "--steps", "2", "--out", str(out),
               "--reward-option", f"pretrained={clip}", "--reward-option", f"processor={clip}"]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
        reports.append(json.loads((out / "reports.jsonl").read_text()))
        assert len((out / "samples" / "eval_tiny_sd3" / "manifest.jsonl").read_text().splitlines()) == 5
    assert reports[0]["PickScore"] == pytest.approx(reports[1]["PickScore"], rel=1e-5)


def _flowgrpo(*args, env=None):
    result = subprocess.run([sys.executable, "-m", "flowgrpo.cli", *args], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})}, timeout=300)
    return result.returncode, result.stderr.strip().splitlines()[-1]


def test_what_is_missing_is_one_line_naming_the_fix():
    """Before the model loads: PaddleOCR not installed (the CPU machine's case), PickScore's weights not downloaded
    (offline), a malformed scorer option."""
    if importlib.util.find_spec("paddleocr") is None:
        code, line = _flowgrpo("eval", "--benchmark", "ocr", "--limit", "1")
        assert code == 2 and "pip install 'flowgrpo[ocr]'" in line and line.startswith("flowgrpo eval: error:")
    code, line = _flowgrpo("eval", "--benchmark", "pickscore", "--limit", "1", env={"HF_HUB_OFFLINE": "1"})
    assert code == 2 and "`hf download yuvalkirstain/PickScore_v1`" in line
    with pytest.raises(UserExit, match="is not key=value"):
        main(["eval", "--benchmark", "geneval", "--reward-option", "score"])
