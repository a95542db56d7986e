"""Discovered dependencies: what a stage that ran user code had loaded, validated on lookup."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperexport.engine.discovered import (
    DiscoveredDeps,
    changes,
    describe,
    full_key,
    snapshot,
)
from hyperexport.engine.hashing import FileDigestIndex

DECLARED = "d" * 64


@pytest.fixture
def user_code(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path with a model module that imports a helper module and a package."""
    root = tmp_path / "user"
    (root / "hxd_pkg").mkdir(parents=True)
    (root / "hxd_pkg" / "__init__.py").write_text("")
    (root / "hxd_pkg" / "util.py").write_text("SCALE = 1\n")
    (root / "hxd_helpers.py").write_text("ACT = 'relu'\n")
    (root / "hxd_model.py").write_text("import hxd_helpers\nfrom hxd_pkg import util\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    importlib.import_module("hxd_model")
    importlib.import_module("typing_extensions")
    importlib.import_module("sysconfig").get_config_vars()  # loads _sysconfigdata_*
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith(("hxd_model", "hxd_helpers", "hxd_pkg"))]:
        del sys.modules[name]


def test_snapshot_names_local_files_relatively_and_dists_by_version(user_code: Path) -> None:
    deps = snapshot(FileDigestIndex(None))
    assert deps["modules"]["hxd_helpers"][0] == "hxd_helpers.py"
    assert deps["modules"]["hxd_pkg.util"][0] == "hxd_pkg/util.py"
    assert deps["modules"]["hxd_pkg"][0] == "hxd_pkg/__init__.py"
    assert not any(name.startswith("hyperexport") for name in deps["modules"])
    assert not any(name in sys.stdlib_module_names for name in deps["modules"])
    assert deps["dists"]["pytest"] is not None  # installed: by version, not by file
    assert not any(name.startswith("_pytest") for name in deps["modules"])
    # A single-file module in site-packages belongs to its own distribution, not to whichever
    # module of that folder came first.
    assert "typing_extensions" not in deps["modules"]
    assert any(d.lower().replace("-", "_") == "typing_extensions" for d in deps["dists"])
    assert not any(name.startswith("_sysconfigdata") for name in deps["modules"])  # stdlib
    text = json.dumps(deps)
    assert str(user_code) not in text  # nothing absolute


def test_an_edited_helper_is_named(user_code: Path) -> None:
    index = FileDigestIndex(None)
    deps = snapshot(index)
    assert changes(deps, index) == []
    (user_code / "hxd_helpers.py").write_text("ACT = 'sigmoid'\n")
    (user_code / "hxd_pkg" / "util.py").write_text("SCALE = 2\n")
    found = changes(deps, FileDigestIndex(None))
    assert found == ["hxd_helpers.py", "hxd_pkg/util.py"]
    assert describe(found) == "model code changed (hxd_helpers.py, hxd_pkg/util.py)"


def test_a_removed_module_and_a_new_version_are_changes(user_code: Path) -> None:
    index = FileDigestIndex(None)
    deps = snapshot(index)
    (user_code / "hxd_helpers.py").unlink()
    deps["dists"]["pytest"] = "0.0.1"
    found = changes(deps, index)
    assert "hxd_helpers.py removed" in found
    assert any(c.startswith("pytest 0.0.1→") for c in found)


def test_moved_sources_still_match(user_code: Path, tmp_path: Path) -> None:
    """Relative identity: the same files in another folder (another checkout) still hold."""
    index = FileDigestIndex(None)
    deps = snapshot(index)
    moved = tmp_path / "elsewhere"
    shutil.copytree(user_code, moved)
    sys.path.remove(str(user_code))
    sys.path.insert(0, str(moved))
    for name in [m for m in sys.modules if m.startswith(("hxd_model", "hxd_helpers", "hxd_pkg"))]:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        assert changes(deps, index) == []
        (moved / "hxd_helpers.py").write_text("ACT = 'gelu'\n")
        assert changes(deps, index) == ["hxd_helpers.py"]
    finally:
        sys.path.remove(str(moved))
        sys.path.insert(0, str(user_code))


def test_record_then_resolve(user_code: Path, tmp_path: Path) -> None:
    index = FileDigestIndex(None)
    records = DiscoveredDeps(tmp_path / "cache", index)
    assert records.resolve(DECLARED).key is None
    assert records.resolve(DECLARED).reason == ""  # no record: not a change
    key = records.record(DECLARED)
    assert key == full_key(DECLARED, snapshot(index))
    fresh = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
    assert fresh.resolve(DECLARED).key == key
    (user_code / "hxd_helpers.py").write_text("ACT = 'sigmoid'\n")
    stale = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None)).resolve(DECLARED)
    assert stale.key is None
    assert stale.reason == "model code changed (hxd_helpers.py)"


def test_several_sets_per_declared_key(user_code: Path, tmp_path: Path) -> None:
    """The same declared key run in processes that had loaded different modules."""
    records = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
    first = records.record(DECLARED)
    (user_code / "hxd_extra.py").write_text("")
    importlib.invalidate_caches()
    importlib.import_module("hxd_extra")
    try:
        second = records.record(DECLARED)
        assert second != first
        assert len(records.sets(DECLARED)) == 2
        del sys.modules["hxd_extra"]
        (user_code / "hxd_extra.py").unlink()
        # The newer set names a file that is gone; the older one still holds.
        fresh = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
        assert fresh.resolve(DECLARED).key == first
    finally:
        sys.modules.pop("hxd_extra", None)


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"format": 1, "sets": [{"x": 1}]}'])
def test_corrupt_record_is_a_warning_and_no_hit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    records = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
    path = records.path(DECLARED)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with caplog.at_level(logging.WARNING):
        assert records.resolve(DECLARED).key is None
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_read_only_records_nothing(user_code: Path, tmp_path: Path) -> None:
    records = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None), read_only=True)
    records.record(DECLARED)
    assert not (tmp_path / "cache").exists()
