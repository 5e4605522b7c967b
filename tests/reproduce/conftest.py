"""Fixtures of the trajectory-parity tests (tests/reproduce/official_checkouts.py): ``checkout``, the checkout of the
module's ``CODE``, and ``reports``, its ``reproduce/parity/<code>.py`` run keyed by method name."""

from __future__ import annotations

import importlib

import pytest

from official_checkouts import ML_COLLECTIONS, official


@pytest.fixture(scope="module")
def checkout(request):
    code = request.module.CODE
    if code in ML_COLLECTIONS:
        pytest.importorskip("ml_collections", reason=f"{code}'s launch configs are ml_collections files "
                                                      "(pip install -e '.[official]')")
    from official import Checkout

    return Checkout.from_env(official(code).REPOSITORY, official(code).ENV)


@pytest.fixture(scope="module")
def reports(request, checkout):
    return {r.method: r for r in importlib.import_module(f"parity.{request.module.CODE}").run(checkout)}
