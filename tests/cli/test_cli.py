"""The `flowgrpo` command: eval prints the JSON summary; bad input names the fix."""

import json
import subprocess
import sys

import pytest
import torch

from flowgrpo.cli import main
from flowgrpo.evaluate import best_of_k
from flowgrpo.run.paths import builtin_models

needs_shipped = pytest.mark.skipif("tiny-sd3" not in builtin_models(), reason="shipped tiny model not built")


@needs_shipped
def test_eval_prints_summary_with_scores_per_task(capsys, tmp_path):
    assert main(["eval", "--limit", "12", "--steps", "4", "--save-images", str(tmp_path / "imgs"),
                 "--output", str(tmp_path / "s.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("mean_score", "strict_accuracy", "per_task", "num_images", "seconds"):
        assert key in summary
    assert summary["num_images"] == 12 and 0.0 <= summary["mean_score"] <= 1.0
    assert json.loads((tmp_path / "s.json").read_text()) == summary
    assert len(list((tmp_path / "imgs").glob("*.png"))) == 12


@needs_shipped
def test_eval_reads_txt_and_jsonl_prompt_files(capsys, tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("a photo of a red circle\n\na photo of two squares\n")
    main(["eval", "--prompts", str(txt), "--steps", "2"])
    assert json.loads(capsys.readouterr().out)["num_images"] == 2
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a photo of a blue square", "metadata": {"task": "colors"}}) + "\n")
    main(["eval", "--prompts", str(jsonl), "--steps", "2"])
    assert list(json.loads(capsys.readouterr().out)["per_task"]) == ["colors"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--prompts", "nope.txt"], "neither a built-in set (toy-train"),
        (["eval", "--model", "no_such_model"], "is not a YAML file nor one of"),
    ],
)
def test_bad_input_names_the_fix(argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert message in str(info.value)


def test_bad_jsonl_line_is_reported_with_its_number(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a photo of a circle"}\n{oops\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2 is not valid JSON"):
        main(["eval", "--prompts", str(bad)])


def test_console_script_help_lists_the_subcommands():
    result = subprocess.run([sys.executable, "-m", "flowgrpo.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "eval" in result.stdout and "pretrain-toy" in result.stdout


def test_eval_of_a_video_model_scores_clips_and_saves_gifs(capsys, tmp_path):
    from flowgrpo.tiny import TinyWanSizes, build_t5_tokenizer, build_tiny_wan_pipeline
    from worlds.toy import clips

    sizes = TinyWanSizes(vae_base_dim=8, latent_channels=8, text_width=32, num_layers=1, num_heads=2, head_dim=12,
                         ffn_dim=32, freq_dim=32)
    corpus = [p.text for p in clips.train_prompts() + clips.eval_prompts()]
    build_tiny_wan_pipeline(build_t5_tokenizer(corpus, 16), sizes).save_pretrained(tmp_path / "wan")
    assert main(["eval", "--model", "tiny_wan", "--pretrained", str(tmp_path / "wan"), "--prompts", "toy-video-eval",
                 "--reward", "toy_video", "--limit", "3", "--steps", "2", "--save-images", str(tmp_path / "clips")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_images"] == 3 and list(summary["per_task"]) == ["direction"]
    assert len(list((tmp_path / "clips").glob("*.gif"))) == 3


def test_eval_of_a_training_checkpoint_scores_what_training_evaluated(capsys, tiny_sd3_dir, tmp_path):
    """`flowgrpo eval --checkpoint runs/<name>/checkpoints/step_<n>` takes the run's model config and
    its evaluation weights (EMA here), and scores exactly what the trainer's own evaluation scored."""
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from train_fixtures import PLUGIN_REWARD, overrides

    cfg = load_config("flow_grpo", None, overrides(tiny_sd3_dir, tmp_path, **{
        "sampling.plan.group_size": 2, "sampling.plan.num_steps": 4, "train.iterations": 1, "train.ema_decay": 0.5,
        "model.lora_rank": 2, "model.lora_alpha": 2.0, "log.samples_every": 0}), base=PLUGIN_REWARD)
    trainer = Trainer(cfg)
    trained = trainer.train()
    checkpoint = tmp_path / cfg.run_name / "checkpoints" / "step_1"
    assert (checkpoint / "model").is_dir()
    from flowgrpo.models import load_model

    saved = load_model(cfg.model)
    saved.load_trainable(checkpoint / "model")
    for ema, param, loaded in zip(trainer.ema.values, trainer.policy.params, saved.trainable_parameters()):
        assert torch.equal(loaded, ema)  # the evaluation (EMA) weights, not the raw ones
    assert any(not torch.equal(e, p) for e, p in zip(trainer.ema.values, trainer.policy.params))
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(checkpoint), "--limit", "4", "--steps", "2",
                 "--seed", str(cfg.train.seed + 12345)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == tiny_sd3_dir
    assert summary["mean_score"] == pytest.approx(trained["eval/mean_score"], abs=1e-6)


def test_best_of_k_by_hand():
    nan = float("nan")
    scores = torch.tensor([[0.1, nan, nan], [0.5, 0.2, nan], [0.3, 0.9, nan], [0.0, 0.0, nan]])
    out = best_of_k(scores)
    assert out["samples_per_prompt"] == 4 and out["mean_over_samples"] == pytest.approx(2.0 / 7, abs=1e-4)
    # k = 1: only prompt 0 is scored (0.1); k = 2: 0.5 and 0.2; k = 4: 0.5 and 0.9; the all-NaN prompt never counts
    assert out["best_of"] == {1: pytest.approx(0.1), 2: pytest.approx(0.35), 4: pytest.approx(0.7)}
    with pytest.raises(ValueError, match=r"\[K samples, N prompts\]"):
        best_of_k(scores[0])


@needs_shipped
def test_eval_samples_per_prompt_reports_headroom_and_keeps_the_first_seed(capsys, tmp_path):
    args = ["eval", "--limit", "3", "--steps", "2"]
    main(args)
    single = json.loads(capsys.readouterr().out)
    main([*args, "--samples-per-prompt", "3", "--save-images", str(tmp_path / "imgs")])
    summary = json.loads(capsys.readouterr().out)
    assert summary["mean_score"] == single["mean_score"]  # the first seed's numbers are unchanged
    head = summary["headroom"]
    assert head["samples_per_prompt"] == 3 and set(head["best_of"]) == {"1", "2", "3"}
    assert head["best_of"]["1"] == pytest.approx(single["mean_score"], abs=1e-4)
    assert head["best_of"]["1"] <= head["best_of"]["2"] <= head["best_of"]["3"]
    assert sorted(p.name for p in (tmp_path / "imgs").iterdir()) == ["seed_0", "seed_1", "seed_2"]
    assert len(list((tmp_path / "imgs" / "seed_2").glob("*.png"))) == 3
    with pytest.raises(SystemExit, match="--samples-per-prompt must be ≥ 1"):
        main([*args, "--samples-per-prompt", "0"])


def test_before_after_by_hand():
    from flowgrpo.evaluate import before_after, before_after_lines

    first = torch.tensor([0.0, 1.0, 0.5, float("nan")])
    last = torch.tensor([1.0, 1.0, 0.5, 0.2])
    stats = before_after(first, last, ["a", "a", "b", "b"])
    # start: [0, 1, 0.5] mean 0.5, std 0.5, se 0.5/√3; end: [1, 1, 0.5, 0.2] mean 0.675; change: [1, 0, 0] mean 1/3
    assert stats["n"] == 3 and stats["start"][0] == pytest.approx(0.5) and stats["start"][1] == pytest.approx(0.5 / 3**0.5)
    assert stats["end"][0] == pytest.approx(0.675) and stats["change"][0] == pytest.approx(1 / 3)
    assert stats["change"][1] == pytest.approx((1 / 3) ** 0.5 / 3**0.5)  # std of [1, 0, 0] is √(1/3)
    assert stats["per_task"] == {"a": pytest.approx((0.5, 1.0)), "b": pytest.approx((0.5, 0.35))}
    lines = before_after_lines(stats, "toy", 0, 40)
    assert lines[0].startswith("held-out toy over 3 samples: iteration 0 0.500 ± 0.289 -> iteration 40 0.675") and "+0.333" in lines[0]
    with pytest.raises(ValueError, match="same samples twice"):
        before_after(first, last[:2])


def test_second_half_level_by_hand():
    from flowgrpo.evaluate import second_half_level

    evaluations = [{"iteration": 0, "scores": [0.0, 0.5, 1.0]}, {"iteration": 40, "scores": [9.0, 9.0, 9.0]},
                   {"iteration": 80, "scores": [1.0, 0.5, 1.0]}, {"iteration": 100, "scores": [0.0, 1.0, 1.0]}]
    level = second_half_level(evaluations)  # iterations 80 and 100 (≥ 50): per-sample means [0.5, 0.75, 1.0]
    assert level["evaluations"] == 2 and level["iterations"] == (80, 100) and level["end"][0] == pytest.approx(0.75)
    assert level["change"][0] == pytest.approx(0.25)  # changes [0.5, 0.25, 0]: mean 0.25, std 0.25
    assert level["change"][1] == pytest.approx(0.25 / 3**0.5)
    with pytest.raises(ValueError, match="after the first"):
        second_half_level(evaluations[:1])
    late_start = [{"iteration": 60, "scores": [0.0, 0.5, 1.0]}, {"iteration": 100, "scores": [0.0, 1.0, 1.0]}]
    assert second_half_level(late_start)["evaluations"] == 1  # the start (iteration 60 ≥ 50) is not its own level


def _config_lines(capsys, argv) -> list[str]:
    assert main(["config", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_config_prints_the_resolved_run_with_the_layer_of_every_key(capsys):
    """`flowgrpo config` is the resolution the run uses (flowgrpo.config.resolve): its YAML, comments stripped, is the
    resolved config with the method's whole plan; each key names the layer that set it last."""
    import yaml

    from flowgrpo.config import resolve, resolved_plan, to_yaml

    argv = ["--preset", "flow_grpo", "--model", "sd3_5_medium", "rewards=[{name: pickscore}]", "train.iterations=7"]
    lines = _config_lines(capsys, argv)
    body = [line for line in lines if not line.startswith("#")]
    shown = yaml.safe_load("\n".join(line.split("  # ")[0].split("# ")[0] if "# " in line else line for line in body))
    resolved = resolve("flow_grpo", "sd3_5_medium", ["rewards=[{name: pickscore}]", "train.iterations=7"])
    want = yaml.safe_load(to_yaml(resolved.config))
    plan, window = resolved_plan(resolved.config)
    want["sampling"]["plan"], want["sampling"]["window"] = plan, window or {}
    assert shown == json.loads(json.dumps(want))  # tuples as the YAML lists they print as
    comment = _comments(body)
    assert comment["train.iterations"] == "override [command line]"
    assert comment["loss.kl_coef"] == "recipe_by_reward [configs/presets/flow_grpo.yaml (recipe_by_reward.pickscore:)]"
    assert comment["model.max_sequence_length"].startswith("recipe_by_family [configs/presets/flow_grpo.yaml")
    assert comment["model.lora_rank"] == "model config [configs/models/sd3_5_medium.yaml]"
    assert comment["sampling.plan.train_fraction"] == "preset method [configs/presets/flow_grpo.yaml]"
    assert comment["sampling.plan.branch_factor"] == "plan builder default [samplers/compose.py compose_plan]"
    assert comment["train.grad_clip"] == "schema default" and comment == resolved.provenance
    tiny = _comments([line for line in _config_lines(capsys, ["--preset", "flow_grpo"]) if not line.startswith("#")])
    assert tiny["train.learning_rate"] == "tiny block [configs/default.yaml (tiny:)]"
    assert not any("recipe" in origin for origin in tiny.values())  # the tiny world never takes a recipe


def _comments(body: list[str]) -> dict[str, str]:
    """{dotted key: its comment} of the printed YAML (nesting read from the indentation)."""
    out, path = {}, []
    for line in body:
        depth = (len(line) - len(line.lstrip())) // 2
        key = line.strip().split(":")[0]
        path = path[:depth] + [key]
        if "# " in line:
            out[".".join(path)] = line.split("# ", 1)[1]
    return out


def test_config_refuses_bad_input_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["config", "--preset", "flow_grpo", "loss.clip_range=-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flowgrpo config: error: loss.clip_range=-1.0 is not allowed; use a number > 0"]


def test_options_and_overrides_come_in_any_order_on_every_entry_point(tmp_path, monkeypatch, capsys):
    """train_t2i.py a=1 --preset flow_grpo b=2 takes both overrides (argparse refused b=2 as an unrecognized
    argument); so do `flowgrpo config` and `flowgrpo prompts`, and the gallery takes its options around the folder."""
    from flowgrpo.cli import tools
    from flowgrpo.cli import train as train_cli
    from gallery import cli as gallery_cli

    seen = {}

    def stop(cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(train_cli, "preflight", stop)
    with pytest.raises(SystemExit):
        train_cli.main(["train.iterations=3", "--preset", "dgpo", f"output_dir={tmp_path}", "--threads", "1",
                        "train.seed=5"], prog="train_t2i.py", description="", default="default")
    cfg = seen["cfg"]
    assert (cfg.train.iterations, cfg.train.seed, cfg.threads, cfg.learner.name) == (3, 5, 1, "dgpo")
    assert tools.main(["config", "train.iterations=7", "--preset", "dgpo", "train.seed=3"]) == 0
    out = capsys.readouterr().out
    assert "iterations: 7" in out and "seed: 3" in out and "name: dgpo" in out
    args = tools.parse(tools.build_parser(), ["prompts", "fetch", "ocr-train", "--debug", "pickscore-train"])
    assert (args.command, args.action, args.names, args.debug) == ("prompts", "fetch", ["ocr-train", "pickscore-train"], True)
    with pytest.raises(SystemExit):
        gallery_cli.main(["--force", str(tmp_path / "missing"), "--port", "0"])  # parsed, then refused: no such run
    assert "is not a directory" in capsys.readouterr().err
