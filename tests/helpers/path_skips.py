"""A pytest plugin (``-p tests.helpers.path_skips`` in pyproject's ``addopts``), collection-wide:
the dynamo cases of tests parametrized over both export paths skip, naming
why, where the installed torch cannot take the dynamo path (``versions.unsupported``: torch below
``DYNAMO_PATH_FROM_TORCH``, the TorchScript-only legs of noxfile.py).

A plugin, not the root ``conftest.py``: pytest imports a root conftest of the rootless ``tests``
folder as the top-level module ``conftest``, which every build run inside the tests then records
as model code (engine/discovered.py), and which ``cache status`` in another process resolves to
another folder's ``conftest.py`` on ``sys.path``: the trace looked changed."""

from __future__ import annotations

import pytest

from hyperexport.base import versions


def _selects_dynamo(item: pytest.Item) -> bool:
    if item.path.name.startswith("test_dynamo"):  # a module of the dynamo path only
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    if callspec.params.get("dynamo") is True:
        return True
    return "dynamo" in callspec.id.split("-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = versions.unsupported(True)
    if not problems:
        return
    skip = pytest.mark.skip(reason=f"dynamo path refused here: {problems[0]}")
    for item in items:
        if _selects_dynamo(item):
            item.add_marker(skip)


#: For a test that needs the dynamo path without being parametrized over the paths (a fallback
#: between them, the path registry): skipped, naming why, where the installed torch cannot take it.
NEEDS_DYNAMO_PATH = pytest.mark.skipif(
    bool(versions.unsupported(True)),
    reason=f"dynamo path refused here: {(versions.unsupported(True) or [''])[0]}",
)
