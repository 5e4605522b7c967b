"""A checkout at another commit than the one flowgrpo's data were read at is refused in one line naming the commit to
check out (reproduce/official/__init__.py ``Checkout.from_env``), before any reader or parity run fails deep inside on
a moved file; ``any_commit`` (extract.py --any-commit, OFFICIAL_ANY_COMMIT=1) reads it all the same. Temporary git
repositories and COMMIT-file folders, no network."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

from official import ANY_COMMIT, Checkout, WrongCommit, read_at  # noqa: E402
from official import flow_grpo, sage  # noqa: E402

READ_AT = "9745241cf1101407e9b518dd4f10498092150522"  # yifan123/flow_grpo, every file of its presets' data
OLDER = "ac4c86e0000000000000000000000000000000000"  # any other commit


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(ANY_COMMIT, raising=False)


def test_the_commits_the_data_were_read_at_are_those_of_the_presets_data():
    wanted = read_at(flow_grpo.REPOSITORY)
    assert wanted["config/grpo.py"] == READ_AT
    assert wanted["flow_grpo/diffusers_patch/flux_pipeline_with_logprob_fast.py"] == READ_AT  # flow_grpo_fast's
    assert set(wanted.values()) == {READ_AT}
    # a second repository's file cited in another code's data counts for that repository
    muon = read_at(sage.MUON_REPOSITORY)
    assert list(muon) == ["hyvideo/optim/muon.py"] and muon["hyvideo/optim/muon.py"].startswith("60783e7")
    assert "hyvideo/optim/muon.py" not in read_at(sage.REPOSITORY)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_git_clone_at_another_commit_is_told_the_one_checkout_to_run(tmp_path, monkeypatch):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "README.md").write_text("an older clone\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "older"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv(flow_grpo.ENV, str(tmp_path))
    with pytest.raises(WrongCommit) as caught:
        Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (f"FLOW_GRPO_PATH is yifan123/flow_grpo at {head[:7]}; flowgrpo's recipes were read at 9745241: "
                       f"git -C {tmp_path.resolve()} checkout {READ_AT}")
    # re-reading a newer commit on purpose
    assert Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV, any_commit=True).commits == {"*": head}
    monkeypatch.setenv(ANY_COMMIT, "1")
    assert Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV).commits == {"*": head}


def test_a_commit_file_folder_is_told_the_commit_each_file_needs(tmp_path, monkeypatch):
    monkeypatch.setenv(flow_grpo.ENV, str(tmp_path))
    # one commit for every file: the one commit to put there
    (tmp_path / "COMMIT").write_text(f"{OLDER}\n")
    with pytest.raises(WrongCommit, match=f"^FLOW_GRPO_PATH is yifan123/flow_grpo at ac4c86e; flowgrpo's recipes were "
                                          f"read at 9745241: put its files at {READ_AT} in "):
        Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV)
    # files from different commits: each file at the wrong one is named with the commit it needs
    (tmp_path / "COMMIT").write_text(f"{READ_AT}\n{OLDER} config/grpo.py\n{OLDER} scripts/train_sd3.py\n")
    with pytest.raises(WrongCommit) as caught:
        Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("FLOW_GRPO_PATH holds yifan123/flow_grpo files at other commits than flowgrpo's recipes "
                              f"were read at: {READ_AT} for config/grpo.py (has ac4c86e), scripts/train_sd3.py (has "
                              "ac4c86e); ")
    # the data's commit, written short, and a folder that records none are taken as they are
    (tmp_path / "COMMIT").write_text("9745241\n")
    Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV)
    (tmp_path / "COMMIT").unlink()
    assert Checkout.from_env(flow_grpo.REPOSITORY, flow_grpo.ENV).commits == {}
