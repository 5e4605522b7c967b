"""``--dist loadgroup`` on pytest 9: the tests marked ``xdist_group(NAME)`` (the multi-process ones) go to one worker.

Loaded by tests/conftest.py.
"""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    group_items(config, items)


def group_items(config, items) -> int:
    """``--dist loadgroup`` (pyproject's addopts): pytest-xdist sends the tests marked ``xdist_group(NAME)`` to one
    worker by the suffix ``@NAME`` it adds to their node ids on the worker. pytest-xdist 3.8 writes that suffix to
    ``item._nodeid``, which pytest 9 no longer reads (a node id is ``item._id``): the suffix was lost and the
    multi-process tests ran on both workers at once, each launch's processes fighting the other's for the 2 cores.
    This adds the suffix where the installed pytest keeps the id, unless xdist's own hook already did. Returns the
    number of items grouped (tests/project/test_suite_cost.py checks it)."""
    if not getattr(config.option, "loadgroup", False):
        return 0
    grouped = 0
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid:
            continue
        nodeid = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid)
        else:
            item._nodeid = nodeid
        grouped += 1
    return grouped
