"""Fixtures of the trajectory-parity tests (tests/reproduce/official_checkouts.py): ``checkout``, the checkout of the
module's ``CODE`` (failing in one line where it is at another commit than the data were read at), and ``reports``, its
``reproduce/parity/<code>.py`` run keyed by method name."""

from __future__ import annotations

import importlib

import pytest

from official_checkouts import ML_COLLECTIONS, official


@pytest.fixture(scope="module")
def checkout(request):
    from official import Checkout, WrongCommit

    code = request.module.CODE
    wrong = None
    try:  # the commit first: a clone at another commit is told in one line, whatever else is missing
        found = Checkout.from_env(official(code).REPOSITORY, official(code).ENV)
    except WrongCommit as exc:
        wrong = str(exc)
    if wrong:  # failed outside the except: the line alone, without the exception it replaces
        pytest.fail(wrong, pytrace=False)
    if code in ML_COLLECTIONS:
        pytest.importorskip("ml_collections", reason=f"{code}'s launch configs are ml_collections files "
                                                      "(pip install -e '.[official]')")
    return found


@pytest.fixture(scope="module")
def reports(request, checkout):
    return {r.method: r for r in importlib.import_module(f"parity.{request.module.CODE}").run(checkout)}
