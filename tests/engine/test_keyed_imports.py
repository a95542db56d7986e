"""The keyed loader runs the source whose digest is keyed, never a stale ``.pyc``.

The hazard is real first: a timestamp ``.pyc`` whose recorded mtime and size match an edited
source runs the old code under the default loader.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import py_compile
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperexport.engine import keyed_imports as ki

OLD = "GAIN = 1.0  # a tuned constant\n"
NEW = "GAIN = 4.0  # a tuned constant\n"  # the same size


def _stale(folder: Path, name: str) -> Path:
    """``<name>.py`` holding :data:`NEW`, beside a timestamp .pyc compiled from :data:`OLD`
    whose recorded mtime and size match it (an edit that kept both)."""
    source = folder / f"{name}.py"
    source.write_text(OLD)
    py_compile.compile(
        str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
    )
    stat = source.stat()
    source.write_text(NEW)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert source.stat().st_size == stat.st_size
    return source


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "mods"
    folder.mkdir()
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    yield folder
    sys.path.remove(str(folder))
    for name in [m for m in sys.modules if m.startswith("hxki_")]:
        del sys.modules[name]


def test_the_default_loader_runs_the_stale_bytecode(on_path: Path) -> None:
    _stale(on_path, "hxki_plain")
    out = subprocess.run(
        [sys.executable, "-c", "import hxki_plain; print(hxki_plain.GAIN)"],
        cwd=on_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.0"  # the old code, though the source says 4.0


def test_the_keyed_loader_runs_the_source_and_records_its_digest(
    on_path: Path, tmp_path: Path
) -> None:
    source = _stale(on_path, "hxki_keyed")
    with ki.keyed_imports(tmp_path / "bytecode"):
        module = importlib.import_module("hxki_keyed")
    assert module.GAIN == 4.0
    assert isinstance(module.__spec__.loader, ki.KeyedSourceLoader)
    assert ki.compiled_digest(module.__file__) == hashlib.sha256(NEW.encode()).hexdigest()
    assert ki.compiled_digest(source) == ki.compiled_digest(module.__file__)
    assert ki._finder is None and not any(isinstance(f, ki._KeyedFinder) for f in sys.meta_path)


def test_stored_bytecode_is_checked_against_the_source(on_path: Path, tmp_path: Path) -> None:
    source = on_path / "hxki_stored.py"
    source.write_text(NEW)
    store = tmp_path / "bytecode"
    with ki.keyed_imports(store):
        importlib.import_module("hxki_stored")
    pyc = ki._bytecode_path(store, str(source))
    assert pyc is not None and pyc.is_file()
    data = pyc.read_bytes()
    assert int.from_bytes(data[4:8], "little") == 0b11  # checked hash-based (PEP 552)
    assert data[8:16] == importlib.util.source_hash(NEW.encode())

    # It is what runs next time: plant a code object under the matching hash, and it loads.
    planted = compile("GAIN = 99.0\n", str(source), "exec")
    pyc.write_bytes(data[:16] + __import__("marshal").dumps(planted))
    del sys.modules["hxki_stored"]
    with ki.keyed_imports(store):
        assert importlib.import_module("hxki_stored").GAIN == 99.0
    # Once the source changes, the hash no longer matches and the source is compiled.
    del sys.modules["hxki_stored"]
    source.write_text("GAIN = 7.0  # a tuned constant\n")
    with ki.keyed_imports(store):
        assert importlib.import_module("hxki_stored").GAIN == 7.0
    assert pyc.read_bytes()[8:16] == importlib.util.source_hash(source.read_bytes())


def test_blocks_nest_and_the_outer_folder_wins(on_path: Path, tmp_path: Path) -> None:
    (on_path / "hxki_nested.py").write_text(NEW)
    with ki.keyed_imports(tmp_path / "outer"), ki.keyed_imports(tmp_path / "inner"):
        importlib.import_module("hxki_nested")
        assert ki._finder is not None
    assert ki._finder is None
    assert list((tmp_path / "outer").rglob("hxki_nested.*.pyc"))
    assert not (tmp_path / "inner").exists()
