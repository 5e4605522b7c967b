"""The README is a user guide whose commands work: CI runs its test command verbatim, every training and
`flowgrpo` command in it parses and loads its config, its reward plug-in scores a batch, every link
resolves, and every measured number links to the docs/results page that holds the command behind it."""

import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _fenced() -> list[tuple[str, str]]:
    """(language, text) of every fenced code block, in order."""
    blocks, language, body = [], None, []
    for line in README.splitlines():
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(body).strip()))
                language = None
        elif language is not None:
            body.append(line)
    return blocks


def _blocks(language: str) -> list[str]:
    return [text for lang, text in _fenced() if lang == language]


def _command_lines() -> list[str]:
    """Every command of the README's shell blocks (``bash`` or unlabelled), continuations joined, comments cut."""
    lines = []
    for lang, text in _fenced():
        if lang not in ("", "bash"):
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                lines.append(line)
    return lines


def test_ci_runs_the_readme_test_command():
    blocks = _blocks("bash")
    main_job, tests = blocks[0], blocks[1]
    assert "pytest" in tests and "pytest" not in main_job
    assert "constraints/cpu.txt" in main_job and "constraints/cpu.txt" in tests
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines, f".ci/run must contain the README's test command verbatim: {tests}"


def test_console_command_is_declared():
    assert 'flowgrpo = "flowgrpo.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert README.count("\n") <= 250


def _training_commands() -> list[tuple[str, list[str]]]:
    out = []
    for line in _command_lines():
        match = re.search(r"\b(train_t2[iv])\.py\b(.*)$", line)
        if match and "pytest" not in line:
            out.append((match.group(1), shlex.split(match.group(2))))
    return out


@pytest.mark.parametrize("script, argv", _training_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_training_command_loads_its_config(script, argv):
    from flowgrpo.config import load_config

    options, overrides = {"--preset": None, "--model": None, "--config": None}, []
    it = iter(argv)
    for arg in it:
        if arg in options:
            options[arg] = next(it)
        else:
            assert "=" in arg, f"{script}.py {argv}: {arg!r} is neither an option nor key=value"
            overrides.append(arg)
    load_config(options["--preset"], options["--model"], overrides, base=options["--config"],
                default="default" if script == "train_t2i" else "default_t2v")


def test_the_training_commands_are_found():
    assert len(_training_commands()) >= 6  # the main job, methods, your model, GPUs, processes, the analytic world


def test_every_flowgrpo_command_parses():
    from flowgrpo.cli.tools import build_parser

    # a shell substitution $(...) gives options at run time (python -m rewards.tiny prints --reward-option ...)
    commands = [shlex.split(re.sub(r"\$\([^)]*\)", "", line))[1:] for line in _command_lines() if line.startswith("flowgrpo ")]
    assert commands
    for argv in commands:
        build_parser().parse_args(argv)


def test_the_reward_plugin_scores_a_batch(tmp_path, monkeypatch):
    source = next(b for b in _blocks("python") if "class " in b and "Reward" in b)
    assert source.count("\n") <= 15, "the README promises a plug-in of about 15 lines"
    (tmp_path / "my_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    from rewards import load_reward

    reward = load_reward("my_rewards:Colourful")
    grey, red = torch.full((1, 3, 8, 8), 0.5), torch.zeros(1, 3, 8, 8)
    red[:, 0] = 1.0
    out = reward(torch.cat([grey, red]), ["a", "b"])
    assert out.scores.shape == (2,) and float(out.scores[0]) == 0.0 and float(out.scores[1]) == 1.0


def test_every_link_resolves():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_every_measured_number_links_to_its_results_page():
    """A paragraph, list item or table row outside the code blocks that states a measured number (a decimal)
    links to a docs/results page, and that page holds a command."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    units = [u for para in re.split(r"\n\s*\n", prose) for u in re.split(r"\n(?=- |\| )", para)]
    for unit in units:
        if re.search(r"(?<![\w.])\d+\.\d+(?![\w.])", unit.replace("0.42.1", "").replace("2.13.0", "")):
            pages = re.findall(r"\((docs/results/[^)#]+)", unit)
            assert pages, f"a measured number without its docs/results link: {unit.strip()[:160]}"
            for page in pages:
                text = (ROOT / page).read_text()
                assert re.search(r"python3? |accelerate launch|pytest", text), f"{page} holds no command"
