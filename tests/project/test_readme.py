"""README's two commands exist and CI runs the test one verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks()
    main_job, tests = blocks[0], blocks[1]
    assert "pytest" in tests and "pytest" not in main_job
    assert "constraints/cpu.txt" in main_job and "constraints/cpu.txt" in tests
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines, f".ci/run must contain the README's test command verbatim: {tests}"


def test_console_command_is_declared():
    assert 'flowgrpo = "flowgrpo.cli:main"' in (ROOT / "pyproject.toml").read_text()
