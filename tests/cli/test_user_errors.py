"""Bad input is one line that names the fix, exit status 2, no traceback (unless --debug): every class of
docs/errors.md, through the real entry points (train_t2i.py's main, flowgrpo's main, and a real process)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowgrpo import cli

ROOT = Path(__file__).resolve().parents[2]


def _train_t2i():
    spec = importlib.util.spec_from_file_location("train_t2i", ROOT / "train_t2i.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "mixed.jsonl").write_text('{"prompt": "a", "metadata": {"task": "x"}}\n{"prompt": "b"}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a photo of a circle"}\n{oops\n')
    (tmp_path / "latin1.txt").write_bytes("a caf\u00e9 on the left\n".encode("latin-1"))
    (tmp_path / "nul.txt").write_text("a cat\0 on the left\n")  # valid UTF-8, but not text
    (tmp_path / "long.txt").write_text("a circle " * 5000 + "\n")  # a file without line breaks
    with open(tmp_path / "huge.txt", "wb") as f:  # sparse: no disk used
        f.truncate((1 << 30) + 1)
    (tmp_path / "not_a_checkpoint").mkdir()
    (tmp_path / "not_a_checkpoint" / "notes.txt").write_text("hello")
    (tmp_path / "damaged").mkdir()  # weights that do not read
    (tmp_path / "damaged" / "adapter_model.safetensors").write_bytes(b"")
    step = tmp_path / "saved" / "y" / "checkpoints" / "step_1"  # a run's checkpoint: its config names its model
    (step / "model").mkdir(parents=True)
    (step / "model" / "adapter_model.safetensors").write_bytes(b"")
    (step / "state.json").write_text(json.dumps({"config": "model:\n  family: sd3\n  pretrained: tiny-sd3\n"}))
    _edit_files(tmp_path)
    (tmp_path / "pick_reports").mkdir()  # a flowgrpo eval --benchmark pickscore output folder
    (tmp_path / "pick_reports" / "reports.jsonl").write_text('{"benchmark": "pickscore", "label": "base"}\n')
    return tmp_path


def _edit_files(folder: Path) -> None:
    """Editing sets (a prompt and its source image a row) with each kind of bad condition image."""
    import struct
    import zlib

    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 30)).save(folder / "ok.png")
    Image.new("RGBA", (8, 8), (200, 30, 30, 0)).save(folder / "rgba.png")
    Image.new("CMYK", (8, 8)).save(folder / "cmyk.jpg")
    (folder / "garbage.png").write_bytes(b"not an image at all")
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 5000, 4000, 8, 2, 0, 0, 0)  # the header of a 5000 x 4000 RGB PNG (20 MP), no pixels
    (folder / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b""))
    rows = {"edit_ok": ['"image": "ok.png"'], "edit_missing": ['"image": "nope.png"'],
            "edit_garbage": ['"image": "garbage.png"'], "edit_rgba": ['"image": "rgba.png"'],
            "edit_cmyk": ['"image": "cmyk.jpg"'], "edit_huge": ['"image": "huge.png"'],
            "edit_mixed": ['"image": "ok.png"', None], "edit_both": ['"image": "ok.png", "images": ["ok.png"]'],
            "edit_two": ['"images": ["ok.png", "ok.png"]']}
    for name, images in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(
            '{"prompt": "make the red square blue"' + (f", {i}" if i else "") + "}\n" for i in images))


def _one_line(text: str) -> str:
    """The one line of an error; progress bars of a model that loaded before the error are not lines of it."""
    lines = [line for line in text.splitlines() if line.strip() and not re.search(r"\d+%\|", line)]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# (training arguments, what the one line must say); {tmp} is the test's folder
TRAINING = [
    (["prompts={tmp}/empty.txt"], r"train_t2i.py: error: no prompts in '.*empty.txt'; .*one prompt a line"),
    (["prompts={tmp}/missing.txt"], r"prompts '.*missing.txt' is neither a built-in set \(toy-train, .*\) nor an existing"),
    (["prompts={tmp}/bad.jsonl"], r"bad.jsonl:2 is not valid JSON"),
    (["model.pretrained={tmp}/not_a_checkpoint"], r"model.pretrained='.*not_a_checkpoint' is a folder diffusers cannot load as a pipeline \(Error no file named model_index.json.*as save_pretrained writes them"),
    (["prompts={tmp}/latin1.txt"], r"prompts '.*latin1.txt' is not UTF-8 text \(byte 5: invalid continuation byte\); save it as UTF-8"),
    (["eval.prompts={tmp}/empty.txt"], r"eval.prompts: no prompts in"),
    (["prompts={tmp}/nul.txt"], r"nul.txt:1 holds the control character U\+0000: a prompts file is text \(is it a binary file\?\)"),
    (["prompts={tmp}/long.txt"], r"long.txt:1 is a prompt of 44,999 characters \(at most 20,000; .*put one prompt on each line"),
    (["prompts={tmp}/huge.txt"], r"prompts '.*huge.txt' is 1.0 GiB, more than the 1 GiB a prompt set may be .*split it"),
    (["train.balance_by=task", "prompts={tmp}/mixed.jsonl"], r"train.balance_by='task' but prompt 1 of '.*mixed.jsonl' has no metadata 'task' while others do"),
    (["train.balance_by=task", "train.prompt_draw=batch"], r"train.balance_by='task' balances the passes .* set train.balance_by='' or train.prompt_draw=pass"),
    (["train.prompt_draw=batch", "prompts={tmp}/mixed.jsonl"], r"train.prompt_draw=batch draws 8 distinct prompts a rollout batch from a set of 2: use a larger prompt set"),
    (["prompts=geneval-train"], r"prompt set 'geneval-train' could not be fetched from file:///nonexistent/yifan123/flow_grpo/.*flowgrpo prompts fetch geneval-train"),
    # condition images (an edit's source, flowgrpo/conditions.py): checked when the set is read, then where they go
    (["prompts={tmp}/edit_missing.jsonl"], r"edit_missing.jsonl:1: image 'nope.png' does not exist \(.*nope.png\); image "
                                           r"paths are relative to the prompt file's folder$"),
    (["prompts={tmp}/edit_garbage.jsonl"], r"edit_garbage.jsonl:1: image 'garbage.png' cannot be read as an image \(.*\); "
                                           r"give a PNG, JPEG or WebP file$"),
    (["prompts={tmp}/edit_rgba.jsonl"], r"edit_rgba.jsonl:1: image 'rgba.png' has mode RGBA; a condition image is RGB, "
                                        r"grey or a palette image: flatten it onto a background"),
    (["prompts={tmp}/edit_cmyk.jsonl"], r"edit_cmyk.jsonl:1: image 'cmyk.jpg' has mode CMYK; .*: save it as 8-bit RGB$"),
    (["prompts={tmp}/edit_huge.jsonl"], r"edit_huge.jsonl:1: image 'huge.png' is 5000x4000 \(20 MP\), more than the 16.8 "
                                        r"MP a condition image may be: downscale it"),
    (["prompts={tmp}/edit_mixed.jsonl"], r"prompts '.*edit_mixed.jsonl' mixes rows with different numbers of condition "
                                         r"images: 0 \(first on row 2\), 1 \(first on row 1\); give every row the same"),
    (["prompts={tmp}/edit_both.jsonl"], r"edit_both.jsonl:1 has both 'image' and 'images'; give one path as 'image'"),
    (["prompts={tmp}/edit_ok.jsonl"], r"prompts='.*edit_ok.jsonl' carries 1 condition image\(s\) per prompt but "
                                      r"model.family=sd3 generates from text alone; train an editing family \(flux2, .*flux_kontext"),
    (["--config", "configs/edit.yaml", "prompts={tmp}/edit_two.jsonl"], r"prompts='.*edit_two.jsonl' carries 2 condition "
                                                                        r"images per prompt; model.family=flux_kontext "
                                                                        r"takes at most 1$"),
    (["--config", "configs/edit.yaml", "eval.prompts=toy-eval", "eval.reward=toy"],
     r"prompts carry 1 condition image\(s\) per prompt and eval.prompts 0; evaluate on the same kind of prompts"),
    (["rewards=[{{name: toy_edit}}]"], r"rewards\[0\].name: reward 'toy_edit' judges a result against its source image, "
                                      r"and prompts='toy-train' carries none; give it an editing set"),
    (["reward_options={{pickscore: 26}}"], r"reward_options.pickscore=26 is not a mapping of the reward's options; write e.g."),
    (["rewards=[{{name: toy_dence}}]"], r"unknown reward 'toy_dence' in rewards\[0\].name; did you mean 'toy_dense'\?"),
    (["eval.reward=pickscor"], r"unknown reward 'pickscor' in eval.reward; did you mean 'pickscore'\?"),
    (["rewards=[{{name: 'no_such_module:Reward'}}]"], r"cannot import reward 'no_such_module:Reward' \(rewards\[0\].name\)"),
    (["rewards=[{{name: 'flowgrpo.config:Config'}}]"], r"'flowgrpo.config:Config' \(rewards\[0\].name\) is not a reward"),
    (["--preset", "mixgrp"], r"'mixgrp' is neither a YAML file nor one of configs/presets/: \[.*'mixgrpo'"),
    (["--model", "sd3"], r"'sd3' is neither a YAML file nor one of configs/models/"),
    (["train.iterations"], r"override 'train.iterations' is not key=value \(e.g. train.iterations=10\)"),
    (["train.iterationz=3"], r"unknown config key 'train.iterationz'; did you mean 'iterations'\?"),
    (["loss.ratio=magic"], r"loss.ratio='magic' is not allowed; use one of"),
    (["train.iterations=abc"], r"bad value for train.iterations: Value 'abc' of type 'str' could not be converted to Integer$"),
    (["rewards=[{{name:toy}}]"], r"with a space after each colon"),
    (["model.pretrained=./no/such/folder"], r"model folder './no/such/folder' does not exist"),
    (["rewards=[{{name: toy_video}}]"], r"reward 'toy_video' scores videos but the model makes images"),
    (["sampling.plan.group_size=1"], r"group_size=1: GRPO needs at least 2 samples per prompt.*set sampling.plan.group_size=2"),
    (["train.prompts_per_iteration=3", "sampling.batches_per_iteration=2"], r"prompts_per_iteration=3 is not divisible by"),
    (["model.family=sd4"], r"model config 'family' is 'sd4'; allowed: analytic, flux, flux2, flux2_klein, flux_kontext, qwen_image, qwen_image_edit, sd3, wan, z_image"),
    (["model.dtype=float8"], r"model config 'dtype' is 'float8'; allowed: float32"),
    (["model.resolution=65"], r"image size 65x65 does not fit SD3Model: .*change model.resolution"),
    (["run_name=../../etc/evil"], r"run_name='../../etc/evil' is not allowed; use a plain folder name .*put a path in output_dir="),
    (["train.adam_betas=[1.5,0.9]"], r"train.adam_betas=\(1.5, 0.9\) is not allowed; use two numbers in \[0, 1\)"),
    (["--threads", "-1"], r"threads=-1 is not allowed; use a number >= 0 \(0 = automatic, N = exactly N CPU threads\)$"),
    # the rollout plan and its window (samplers' PLAN_RULES, WINDOW_RULES, and the plan built before anything loads)
    (["sampling.plan.num_steps=-3"], r"sampling.plan.num_steps=-3 is not allowed; use an integer in \[1, 1000\]$"),
    (["sampling.plan.kernel=foo"], r"sampling.plan.kernel='foo' is not allowed; use one of \['ode', 'flow_sde', "
                                   r"'dance_sde', 'cps', 'sage_sde'\]$"),
    (["--preset", "flow_grpo", "sampling.plan.eta=nan"], r"sampling.plan.eta='nan' is not allowed; use null or a number "
                                                         r">= 0$"),
    (["sampling.plan.windw=3"], r"sampling.plan.windw is not a key of the plan; it takes \['branch_factor', 'branch_window', 'eta', "),
    (["--preset", "flow_grpo", "sampling.window.sise=3"], r"sampling.window.sise is not a key of the window; it takes "
                                                          r"\['decay_offset', 'decay_rate', "),
    (["--preset", "flow_grpo", "sampling.window.stride=2"], r"sampling.window.stride is given but sampling.window.size "
                                                            r"is not: a moving SDE window needs its size"),
    (["--preset", "mixgrpo", "sampling.window.size=30"], r"the rollout plan sampling.plan=\{'num_steps': 25, .*\} with "
                                                         r"sampling.window=\{'size': 30, .*\} cannot be built: window "
                                                         r"size 30 must lie in \[1, num_steps=25\]$"),
    (["--preset", "flow_grpo", "sampling.plan.eta=1e30"], r"cannot be built: step 0 \(flow_sde, η=1e\+30, σ 1 → [0-9.]+\): "
                                                          r"its mean or noise coefficients are not finite in float32, so "
                                                          r"its first sample would be NaN or inf; lower eta$"),
    # a method is its preset file: the retired key and the old method names say what replaced them
    (["sampling.method=flow_grpo"], r"error: sampling.method is gone: a preset's file is its whole method, .*choose a "
                                    r"method with --preset NAME"),
    (["--preset", "dance_grpo"], r"error: preset 'dance_grpo' is called 'dancegrpo' now \(--preset dancegrpo\)$"),
    (["sampling.max_batch=8"], r"error: sampling.max_batch is called sampling.chunk now: "),
    # the speed levers where they cannot apply
    (["sampling.merge_lora=true", "model.finetune=full"], r"sampling.merge_lora merges a LoRA adapter into the weights, "
                                                          r"and model.finetune=full .*set sampling.merge_lora=false$"),
    (["--config", "configs/analytic.yaml", "model.compile=true"], r"model.compile compiles the blocks of a diffusers "
                                                                  r"transformer; .*set model.compile=false$"),
    # context parallelism where it cannot split (a family without a diffusers plan: tests/engine/test_context_parallel.py)
    (["train.context_parallel=2"], r"train.context_parallel=2 must divide the launch's 1 processes .*launch a multiple "
                                   r"of 2 processes$"),
    (["--config", "configs/analytic.yaml", "train.context_parallel=2"], r"train.context_parallel splits a diffusers "
                                                                        r"transformer's token sequence; .*set "
                                                                        r"train.context_parallel=1$"),
    (["train.context_parallel=2", "train.context_parallel_ring=2"], r"ring attention merges partial attentions by their "
                                                                    r"log-sum-exp, .*train.context_parallel_ring=1 "
                                                                    r"\(Ulysses alone\)$"),
    # off-policy replay where it cannot replay (tests/engine/test_replay.py)
    (["learner.replay.per_group=1"], r"learner.replay replays stored SDE transitions, which "
                                     r"learner.name=diffusion_nft does not train on; .*set learner.replay.per_group=0$"),
    (["--preset", "branchgrpo", "learner.replay.per_group=1"], r"learner.replay keeps whole samples with their own "
                                                               r"transitions, .*use a chain plan or set "
                                                               r"learner.replay.per_group=0$"),
    (["sampling.plan.group_size=4096", "sampling.plan.num_steps=1000"],
     r"holds [0-9,]+ states per rollout batch .*more than 1,048,576: it cannot finish in memory or in any sensible "
     r"time; lower those"),
]


@pytest.mark.parametrize("argv, message", TRAINING, ids=[" ".join(a) for a, _ in TRAINING])
def test_training_user_errors_are_one_line_with_the_fix(argv, message, files, capsys, monkeypatch):
    monkeypatch.setenv("FLOWGRPO_CACHE", str(files / "cache"))  # an official set that is not here, from nowhere
    monkeypatch.setenv("FLOWGRPO_PROMPTS_URL", "file:///nonexistent/{repository}/{commit}/{path}")
    argv = [a.format(tmp=files) for a in argv] + [f"output_dir={files}/runs", "log.progress=false"]
    assert _train_t2i()(argv) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line.startswith("train_t2i.py: error: ") and re.search(message, line), line
    assert not (files / "runs").exists()  # refused before the run folder is made


def test_a_missing_builtin_model_names_the_command_that_builds_it(tmp_path, monkeypatch, capsys):
    from flowgrpo.run import paths

    monkeypatch.setattr(paths, "ASSETS_DIR", tmp_path / "assets")
    assert _train_t2i()([f"output_dir={tmp_path}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "built-in model 'tiny-sd3' is not in" in line and "build it with `flowgrpo pretrain-toy`" in line


def test_debug_shows_the_traceback(files):
    from flowgrpo.run.errors import UserError

    with pytest.raises(UserError, match="no prompts in"):
        _train_t2i()(["--debug", f"prompts={files}/empty.txt", f"output_dir={files}/runs"])


EVAL = [
    (["--checkpoint", "{tmp}/runs/x/checkpoints/step_9"],
     r"flowgrpo eval: error: --checkpoint '.*step_9' does not exist; pass a checkpoint folder such as "
     r"runs/<name>/checkpoints/step_<n>"),
    (["--checkpoint", "{tmp}/not_a_checkpoint"], r"--checkpoint '.*not_a_checkpoint' holds no model weights"),
    (["--reward", "toyy"], r"unknown reward 'toyy' in --reward; did you mean 'toy'\?"),
    (["--prompts", "{tmp}/empty.txt"], r"no prompts in '.*empty.txt'"),
    (["--prompts", "{tmp}/bad.jsonl"], r"bad.jsonl:2 is not valid JSON"),
    (["--model", "no_such_model"], r"--model 'no_such_model' is not a YAML file nor one of \['"),
    (["--pretrained", "./no/such/folder"], r"model folder './no/such/folder' does not exist"),
    (["--samples-per-prompt", "0"], r"--samples-per-prompt must be ≥ 1, got 0"),
    (["--benchmark", "geneval", "--images-per-prompt", "0"], r"--images-per-prompt must be ≥ 1, got 0"),
    (["--benchmark", "geneval", "--reward-option", "score"], r"--reward-option 'score' is not key=value"),
    (["--benchmark", "pickscore", "--reward-option", "bogus=1"],
     r"reward 'pickscore' \(configs/evaluation/pickscore.yaml\) could not be built: TypeError: .*bogus"),
    (["--benchmark", "pickscore", "--out", "{tmp}/empty.txt/evals"], r"--out '.*empty.txt/evals' cannot be created"),
    (["--benchmark", "ocr", "--out", "{tmp}/pick_reports"], r"holds pickscore reports; give each benchmark its own"),
    (["--steps", "99999999999999"], r"--steps must be at most 2,147,483,647, got 99999999999999"),
    (["--seed", "-1"], r"--seed must be an integer in \[0, 4294967295\], got -1"),
    (["--guidance", "nan"], r"--guidance must be a finite number >= 0 .*got nan"),
    (["--model", "tiny_wan"], r"--reward 'toy' scores images but --model 'tiny_wan' \(family wan\) makes videos; "
                              r"--reward per_frame --reward-option reward=toy"),
    (["--reward", "toy_video"], r"--reward 'toy_video' scores videos but --model 'tiny_sd3' \(family sd3\) makes images"),
    (["--checkpoint", "{tmp}/saved/y/checkpoints/step_1", "--model", "analytic", "--reward", "analytic_hit"],
     r"--checkpoint '.*step_1' was trained on 'tiny-sd3' \(family sd3\) but --model 'analytic' is family analytic; "
     r"leave out --model"),
    (["--output", "{tmp}/not_a_checkpoint"], r"--output '.*not_a_checkpoint' is a folder; pass a file for the JSON "
                                             r"summary, e.g. '.*not_a_checkpoint/summary.json'"),
    (["--checkpoint", "{tmp}/damaged", "--limit", "1"],
     r"--checkpoint '.*damaged' does not load into --model 'tiny_sd3' \(OSError: .*\); a checkpoint of a run loads "
     r"into the model its run trained"),
    (["--reward", "hpsv2", "--reward-option", "pretrained=nonexistent-org/no-such-hps"],
     r"reward 'hpsv2' \(--reward\) could not be built: OSError: the file 'nonexistent-org/no-such-hps/"
     r"HPS_v2.1_compressed.pt' could not be loaded \(.*\); download it with `hf download nonexistent-org/no-such-hps "
     r"HPS_v2.1_compressed.pt` \(needs the network\), or pass pretrained="),
]


@pytest.mark.parametrize("argv, message", EVAL, ids=[" ".join(a) for a, _ in EVAL])
def test_eval_user_errors_are_one_line_with_the_fix(argv, message, files, capsys, monkeypatch):
    # a weight file not in the cache: no download attempts, no retry lines (the hub reads its constant at import)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as info:
        cli.main(["eval"] + [a.format(tmp=files) for a in argv])
    assert info.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert re.search(message, line), line


@pytest.mark.parametrize("argv, message", [
    (["--pretrained", "-1"], r"model config 'pretrained' is '-1'; allowed: a hub id 'owner/name', a local folder"),
    (["--reward", "../x"], r"cannot import reward '../x' \(--reward\): the 'package' argument is required"),
    (["--steps", "1", "--guidance", "1e30"], r"the model's samples are NaN or inf"),  # finite latents, NaN decoded
])
def test_what_the_eval_options_fuzz_found_is_one_line(argv, message, capsys):
    """Every `flowgrpo eval` option fuzzed with 14 bad values (a word, empty, -1, 0, NaN, inf, 1e30, paths, a list, a
    mapping, true, '=', 'a=b=c'): these three were tracebacks (a hub id the hub rejects, a relative module path, a
    guidance that decodes finite latents to NaN)."""
    with pytest.raises(SystemExit) as info:
        cli.main(["eval", "--limit", "1", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err  # the NaN case ends after the model's start-up line, as the test below
    lines = [line for line in err.splitlines() if line.strip() and not re.search(r"\d+%\|", line)]
    assert "Traceback" not in err and re.search(message, lines[-1]) and lines[-1].startswith("flowgrpo eval: error:")


def test_eval_of_samples_that_are_not_finite_ends_in_one_line(capsys):
    """At run time, after the model loaded (its start-up line before it): a diverged checkpoint's, or a guidance scale
    too large for the weights', NaN samples end the command in one line naming both causes, status 2."""
    with pytest.raises(SystemExit) as info:
        cli.main(["eval", "--limit", "1", "--steps", "2", "--guidance", "1e30"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.fullmatch(
        r"flowgrpo eval: error: the model's samples are NaN or inf: its weights diverged .* or the guidance scale is "
        r"too large for them", err.strip().splitlines()[-1])


def test_eval_lists_the_checkpoints_next_to_a_missing_one(tmp_path, capsys):
    for step in (10, 20):
        (tmp_path / "checkpoints" / f"step_{step}" / "model").mkdir(parents=True)
    with pytest.raises(SystemExit):
        cli.main(["eval", "--checkpoint", str(tmp_path / "checkpoints" / "step_30")])
    line = _one_line(capsys.readouterr().err)
    assert re.search(r"found: .*step_10, .*step_20", line), line


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120, **kwargs)


def test_real_processes_print_one_line_and_exit_2(files):
    """The console entry points as a user runs them: the message alone on stderr, status 2."""
    train = _run([sys.executable, "train_t2i.py", f"prompts={files}/empty.txt", f"output_dir={files}/runs"])
    assert train.returncode == 2
    assert _one_line(train.stderr).startswith("train_t2i.py: error: no prompts in")
    evaluation = _run([sys.executable, "-m", "flowgrpo.cli", "eval", "--checkpoint", f"{files}/missing"])
    assert evaluation.returncode == 2 and evaluation.stdout == ""
    assert _one_line(evaluation.stderr).startswith("flowgrpo eval: error: --checkpoint")


def test_under_accelerate_launch_our_line_comes_first(files):
    """accelerate's launcher adds its own CalledProcessError traceback after a failed child (it has no
    option to leave it out but --quiet); docs/errors.md says so. Ours is the first error line, and the
    launcher's last line carries our exit status."""
    result = _run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "train_t2i.py", f"prompts={files}/empty.txt",
                   f"output_dir={files}/runs"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert lines[0].startswith("train_t2i.py: error: no prompts in"), result.stderr
    assert "returned non-zero exit status 2" in lines[-1]
    quiet = _run([sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--num_processes", "1",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "train_t2i.py",
                  f"prompts={files}/empty.txt", f"output_dir={files}/runs"])
    assert quiet.returncode == 1 and _one_line(quiet.stderr).startswith("train_t2i.py: error: no prompts in")


def test_an_output_folder_that_cannot_be_created_is_one_line(files, capsys):
    """output_dir under a file (or anywhere not writable): one line naming the folder and the key to change."""
    argv = [f"output_dir={files}/empty.txt/runs", "log.progress=false", "train.iterations=1"]
    assert _train_t2i()(argv) == 2
    assert re.search(r"the run folder .*empty.txt/runs/tiny-sd3-toy cannot be created \(Not a directory\); set "
                     r"output_dir= to a folder you can write", _one_line(capsys.readouterr().err))


def test_a_hub_id_not_in_the_cache_while_offline_names_the_download(files, capsys, monkeypatch):
    """diffusers' several-line OSError becomes one line naming the command that downloads the model (its own warning
    that the hub is unreachable comes before it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["model.pretrained=nonexistent-org/no-such-model", f"output_dir={files}/runs", "log.progress=false"]
    assert _train_t2i()(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"^train_t2i.py: error: model.pretrained='nonexistent-org/no-such-model' could not be loaded "
                     r"\(.*\); it is not in the local hub cache and HF_HUB_OFFLINE is set: download it first with "
                     r"`hf download nonexistent-org/no-such-model`", last), last


def test_errors_doc_lists_every_class_with_its_message():
    """docs/errors.md's table has a row per class tested here, with the message's words."""
    doc = (ROOT / "docs" / "errors.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and not line.startswith(("| class", "| **"))]
    stated = re.search(r"(\d+) classes: (\d+) of the training scripts .*?, (\d+) of `flowgrpo pretrain-toy`, "
                       r"(\d+) of `flowgrpo eval`", doc, re.S)
    assert stated and int(stated[1]) == len(rows) == int(stated[2]) + int(stated[3]) + int(stated[4]), (stated, len(rows))
    assert int(stated[4]) == len(EVAL)
    for fragment in ("no prompts in", "has no metadata", "is neither a built-in set", "is not valid JSON", "unknown reward",
                     "cannot import reward", "is not a reward", "is neither a YAML file nor one of",
                     "is not key=value", "unknown config key", "is not allowed", "with a space after each colon",
                     "does not exist", "scores videos but the model makes images", "holds no model weights",
                     "--samples-per-prompt must be", "build it with", "threads=-1 is not allowed", "is not UTF-8 text", "cannot be created", "could not be loaded", "cannot load as a pipeline",
                     "already holds a run with another configuration", "no valid reward in",
                     "holds a pretraining of other model sizes", "could not write checkpoint", "cannot be read (", "could not be built", "holds the control character", "is a prompt of", "a prompt set may be", "lacks transformer/", "this run cannot fit",
                     "is not a key of the plan", "is not a key of the window", "cannot be built: ",
                     "sampling.method is gone", "is called 'dancegrpo' now", "states per rollout batch",
                     "the launch started", "the policy's samples are NaN or inf", "merges a LoRA adapter",
                     "compiles the blocks of a diffusers transformer", "splits a diffusers transformer's token",
                     "must divide the launch's", "ring attention merges partial attentions",
                     "replays stored SDE transitions", "keeps whole samples with their own transitions",
                     "cannot be read as an image", "a condition image is RGB, grey or a palette image",
                     "a condition image may be", "mixes rows with different numbers of condition images",
                     "has both 'image' and 'images'", "generates from text alone", "takes at most 1",
                     "evaluate on the same kind of prompts", "judges a result against its source image"):
        assert fragment in doc, fragment
    assert "docs/errors.md" in (ROOT / "README.md").read_text()


def test_a_model_folder_missing_a_component_names_it(tiny_sd3_dir, tmp_path, capsys):
    """model_index.json names a transformer whose folder is gone (an interrupted copy): one line naming it."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_sd3_dir, model, ignore=shutil.ignore_patterns("transformer"))
    assert _train_t2i()([f"model.pretrained={model}", f"output_dir={tmp_path}/runs", "log.progress=false"]) == 2
    assert re.search(r"model.pretrained='.*model' lacks transformer/: its model_index.json names this component but "
                     r"the folder is not there .*download or copy the whole model again", _one_line(capsys.readouterr().err))


def test_a_group_too_large_for_the_memory_is_one_line_before_the_first_rollout(files, capsys):
    """The Why of issue 36: group_size=100000 started sampling 800,000 images with no word (it is now refused by the
    config check: more than 2^20 states in a rollout batch). A group under that cap that still cannot fit (16,000
    samples of 512 px) is refused by the memory plan, checked after the model loads and before anything is sampled
    (here against the host's memory), in one line."""
    from flowgrpo.memory import host_memory

    if host_memory() is None:
        pytest.skip("no /proc/meminfo")
    argv = ["sampling.plan.group_size=16000", "model.resolution=512", f"output_dir={files}/runs", "log.progress=false"]
    assert _train_t2i()(argv) == 2
    assert re.search(r"this run cannot fit: the memory plan puts this iteration at [0-9.]+ GiB per process .* and the "
                     r"host has [0-9.]+ GiB, less than .*lower sampling.plan.group_size \(at most \d+ fits\)",
                     _one_line(capsys.readouterr().err))
    assert not list((files / "runs").glob("*/samples"))  # nothing was sampled
