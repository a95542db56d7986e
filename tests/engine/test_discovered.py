"""Discovered dependencies: what a stage that ran user code had loaded, validated on lookup."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperexport.engine import opened
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


def test_snapshot_names_files_relatively_and_dists_by_version(user_code: Path) -> None:
    deps = snapshot(FileDigestIndex(None))
    assert deps["modules"]["hxd_helpers"][0] == "hxd_helpers.py"
    assert deps["modules"]["hxd_pkg.util"][0] == "hxd_pkg/util.py"
    assert deps["modules"]["hxd_pkg"][0] == "hxd_pkg/__init__.py"
    assert not any(name.startswith("hyperexport") for name in deps["modules"])
    assert not any(name in sys.stdlib_module_names for name in deps["modules"])
    assert deps["dists"]["pytest"] is not None  # installed: by version (for the reason) ...
    assert deps["modules"]["_pytest.python"][0] == "_pytest/python.py"  # ... and by content
    # A single-file module in site-packages belongs to its own distribution, not to whichever
    # module of that folder came first.
    assert deps["modules"]["typing_extensions"][0] == "typing_extensions.py"
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


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"format": 2, "sets": [{"x": 1}]}'])
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


def test_an_older_record_is_not_trusted(user_code: Path, tmp_path: Path) -> None:
    """Format 1 keyed installed libraries by version only: its sets could hide a patched
    library, so they are not used (the stage reruns once)."""
    records = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
    records.record(DECLARED)
    path = records.path(DECLARED)
    data = json.loads(path.read_text())
    data["format"] = 1
    path.write_text(json.dumps(data))
    assert DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None)).resolve(DECLARED).key is None


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    """A distribution installed in a ``site-packages`` folder on sys.path: ``hxd_inst`` 1.0."""
    from hyperexport.engine import discovered
    from hyperexport.engine import environment as fingerprint

    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "hxd_inst").mkdir(parents=True)
    (site / "hxd_inst" / "__init__.py").write_text("GAIN = 1.0\n")
    info = site / "hxd_inst-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hxd-inst\nVersion: 1.0\n")
    (info / "RECORD").write_text("hxd_inst/__init__.py,,\nhxd_inst-1.0.dist-info/RECORD,,\n")
    (info / "top_level.txt").write_text("hxd_inst\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    for memo in (discovered._distributions_by_top, fingerprint._dist_info_versions):
        memo.cache_clear()
    fingerprint.distribution_version.cache_clear()
    importlib.import_module("hxd_inst")
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("hxd_inst", None)
    for memo in (discovered._distributions_by_top, fingerprint._dist_info_versions):
        memo.cache_clear()
    fingerprint.distribution_version.cache_clear()


def test_an_edited_installed_library_is_a_change(installed: Path, tmp_path: Path) -> None:
    """Issue 21: a local patch of a library in site-packages (same version) was not seen."""
    index = FileDigestIndex(None)
    deps = snapshot(index)
    assert deps["dists"]["hxd-inst"] == "1.0"
    assert deps["modules"]["hxd_inst"][0] == "hxd_inst/__init__.py"
    assert changes(deps, index) == []
    pristine_key = DiscoveredDeps(tmp_path / "cache", index).record(DECLARED)
    init = installed / "hxd_inst" / "__init__.py"
    pristine = init.read_text()
    init.write_text("GAIN = 2.0\n")
    assert changes(deps, FileDigestIndex(None)) == ["hxd_inst/__init__.py"]
    records = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None))
    patched_key = records.record(DECLARED)
    init.write_text(pristine)  # restored: the original set holds again, under its own key
    restored = DiscoveredDeps(tmp_path / "cache", FileDigestIndex(None)).resolve(DECLARED)
    assert restored.key == pristine_key == full_key(DECLARED, deps) != patched_key


def test_files_the_model_read_are_keyed_by_content(user_code: Path, tmp_path: Path) -> None:
    from hyperexport.engine import opened

    data = user_code / "table.txt"
    data.write_text("1 2 3")
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x")
    reads = opened.Reads()
    with opened.recording(reads):
        data.read_text()
        with open(outside, "rb"):
            pass
        (user_code / "written.txt").write_text("not a dependency")
    files = opened.regular_files(reads, exclude=())
    assert str(data.resolve()) in files and str(outside.resolve()) in files
    assert str((user_code / "written.txt").resolve()) not in files
    index = FileDigestIndex(None)
    deps = snapshot(index, files)
    assert deps["files"]["table.txt"]  # relative to its sys.path folder
    assert changes(deps, index) == []
    data.write_text("1 2 4")
    found = changes(deps, FileDigestIndex(None))
    assert found == ["file:table.txt"]
    assert describe(found) == "file read by the model changed (table.txt)"


def test_a_file_in_the_temporary_directory_is_keyed_like_any_other(tmp_path: Path) -> None:
    """Issue 32: a model reading /tmp/x/gain.json got an empty record, which matched anywhere."""
    from hyperexport.engine import opened

    assert tmp_path.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    gain = tmp_path / "gain.json"
    gain.write_text('{"gain": 1.0}')
    time.sleep(0.05)  # its status predates the recording
    reads = opened.Reads()
    with opened.recording(reads):
        gain.read_text()
    files = opened.regular_files(reads, exclude=())
    assert files == [str(gain.resolve())]
    index = FileDigestIndex(None)
    deps = snapshot(index, files)
    assert list(deps["files"].values()) == [index.digest(gain)]
    gain.write_text('{"gain": 4.75}')
    assert changes(deps, FileDigestIndex(None)) == [f"file:{next(iter(deps['files']))}"]


def test_what_the_stage_wrote_itself_is_not_a_dependency(tmp_path: Path) -> None:
    """Its own scratch: opened for writing, or made after the recording began (as native code
    does, without an audit event), then read back."""
    from hyperexport.engine import opened

    reads = opened.Reads()
    with opened.recording(reads):
        # File status times come from the kernel's coarse clock, up to a tick (a few ms) behind
        # the start's time.time_ns(): a file made within that tick counts as older than the
        # start, so it is keyed as a dependency (a key too many, the safe side). Made a tick
        # later, it is the stage's own, which is what this test proves (a fresh clone's run hit
        # the tick once without this wait).
        time.sleep(0.02)
        written = tmp_path / "written.onnx"
        written.write_bytes(b"model")
        written.read_bytes()
        native = tmp_path / "native.bin"  # written where no audit event is raised
        subprocess.run(["sh", "-c", f"printf model > '{native}'"], check=True)
        native.read_bytes()
    assert str(written) in reads.written
    assert str(native) in reads.read and str(native) not in reads.written
    assert opened.regular_files(reads, exclude=()) == []


def test_system_and_excluded_folders_are_not_recorded(tmp_path: Path) -> None:
    from hyperexport.engine import opened

    cache, pycache = tmp_path / "cache", tmp_path / "__pycache__"
    for folder in (cache, pycache):
        folder.mkdir()
    paths = {tmp_path / "kept.txt", cache / "blob", pycache / "m.pyc"}
    for path in paths:
        path.write_text("x")
    time.sleep(0.05)
    reads = opened.Reads(read={*map(str, paths), "/proc/self/status", "libm.so.6"})
    reads.since_ns = time.time_ns()
    assert opened.regular_files(reads, (str(cache),)) == [str((tmp_path / "kept.txt").resolve())]


def test_an_editable_install_finder_is_not_recorded(tmp_path: Path) -> None:
    """setuptools' editable finder names the checkout's absolute path: keyed, it made every
    checkout of one tree a different key (found by the slow test of one remote, two machines)."""
    folder = tmp_path / "site"
    folder.mkdir()
    finder = "__editable___hxd_model_1_0_finder"
    (folder / f"{finder}.py").write_text(f"MAPPING = {{'hxd_model': {str(tmp_path)!r}}}\n")
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(finder)
        deps = snapshot(FileDigestIndex(None))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(finder, None)
    assert not [name for name in deps["modules"] if name.startswith("__editable__")]


def test_files_read_are_resolved_as_realpath_resolves_them(tmp_path: Path) -> None:
    """Folders resolved once, then the last part: the same answer as ``os.path.realpath``,
    through a linked folder, a linked file, a link to a link, ``..`` and a dangling link."""
    import os

    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "a.py").write_text("A = 1\n")
    (real / "b.py").write_text("B = 1\n")
    (tmp_path / "folder_link").symlink_to(real / "sub")
    (real / "file_link.py").symlink_to(real / "sub" / "a.py")
    (real / "link_to_link.py").symlink_to(real / "file_link.py")
    (real / "dangling.py").symlink_to(real / "gone.py")
    paths = [
        str(tmp_path / "folder_link" / "a.py"),
        str(real / "file_link.py"),
        str(real / "link_to_link.py"),
        str(tmp_path / "folder_link" / ".." / "b.py"),
        str(real / "sub" / ".."),
        str(real / "dangling.py"),
        str(real / "b.py"),
    ]
    resolve = opened._resolver()
    assert [resolve(p) for p in paths] == [os.path.realpath(p) for p in paths]
    reads = opened.Reads()
    reads.read.update(paths)
    assert opened.regular_files(reads) == sorted(
        {os.path.realpath(p) for p in paths if os.path.isfile(os.path.realpath(p))}
    )
