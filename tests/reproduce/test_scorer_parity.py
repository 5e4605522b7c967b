"""reproduce/scorers/: the official scorer code (loaded from checkouts at run time) against flowgrpo's rewards on the
same tiny weights, images and prompts (docs/results/scorer_parity.md). Each module runs when the checkouts it needs
are set and skips naming the variables otherwise:

    DIFFUSION_NFT_PATH=... [FLOW_GRPO_PATH AWM_PATH DGPO_PATH MIXGRPO_PATH HPSV2_PATH IMAGEREWARD_PATH
    REWARD_SERVER_CHECKOUT]=... pytest tests/reproduce/test_scorer_parity.py
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

NEEDS = {  # module: the variables its first row needs (its other rows skip themselves without theirs)
    "clip": ["DIFFUSION_NFT_PATH"],
    "hps": ["HPSV2_PATH", "DIFFUSION_NFT_PATH"],
    "image_reward": ["IMAGEREWARD_PATH", "DIFFUSION_NFT_PATH"],
    "rules": ["DIFFUSION_NFT_PATH"],
}


@pytest.mark.parametrize("module", sorted(NEEDS))
def test_every_official_scorer_row_is_within_its_tolerance(module):
    missing = [v for v in NEEDS[module] if not os.environ.get(v)]
    if missing:
        pytest.skip(f"set {', '.join(missing)} (reproduce/scorers/__init__.py CHECKOUTS names their repositories)")
    import importlib

    from scorers import ScorerReport

    rows = [r for r in importlib.import_module(f"scorers.{module}").rows() if isinstance(r, ScorerReport)]
    assert rows
    for r in rows:
        print(r.line())
        assert max(abs(v) for v in r.theirs) > 0, f"{r.reward} {r.code}: the official scores are all 0"
    bad = [r.line() for r in rows if not r.ok]
    assert not bad, bad


def test_without_checkouts_every_comparison_is_skipped_naming_its_variable(monkeypatch, tmp_path):
    from scorers import CHECKOUTS, run

    for _, env in CHECKOUTS.values():
        monkeypatch.delenv(env, raising=False)
    reports, skipped = run.run(["clip", "rules"])
    assert reports == []
    assert any("DIFFUSION_NFT_PATH" in s for s in skipped) and any("MIXGRPO_PATH" in s for s in skipped)
    text = run.markdown(reports, skipped, "cmd")
    assert "Not run" in text and "DIFFUSION_NFT_PATH" in text and "0 rows equal" in text
