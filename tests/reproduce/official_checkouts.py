"""The official checkouts the trajectory-parity tests compare against (tests/reproduce/test_peer_parity_<code>.py):
a test module names its code base (``CODE = "awm"``) and marks itself with ``needs_checkout(CODE)``, which skips it
naming the variable to set where the checkout is missing; tests/reproduce/conftest.py's ``checkout`` and ``reports``
fixtures then give that code base's checkout (reproduce/official/<code>.py names its repository and variable) and its
``reproduce/parity/<code>.py`` run."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

# the code bases whose launch configs are ml_collections files, executed to be read
ML_COLLECTIONS = {"flow_grpo", "diffusion_nft", "awm", "dgpo"}


def official(code: str):
    return importlib.import_module(f"official.{code}")


def needs_checkout(code: str):
    """Skip unless the code base's checkout variable is set, saying which to set."""
    return pytest.mark.skipif(not os.environ.get(official(code).ENV),
                              reason=f"set {official(code).ENV} to a checkout of {official(code).REPOSITORY}")


def note(report, start: str) -> str:
    """The one note of a parity report that starts with ``start``."""
    found = [n for n in report.notes if n.startswith(start)]
    assert len(found) == 1, (start, report.notes)
    return found[0]


def number(text: str, after: str) -> float:
    """The number written right after ``after`` in a report's note."""
    return float(text.split(after, 1)[1].split(" ")[0].rstrip("),;"))
