from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.engine.store import CacheStore


@pytest.fixture
def store(tmp_path: Path) -> CacheStore:
    return CacheStore(tmp_path / "cache")
