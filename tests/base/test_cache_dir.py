"""Where hyperexport's cache lives when no build setting says."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.base.cache_dir import default_cache_dir


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYPEREXPORT_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
    assert default_cache_dir(None) == tmp_path / "env"
    monkeypatch.delenv("HYPEREXPORT_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir(None) == Path.home().resolve() / ".cache" / "hyperexport"
