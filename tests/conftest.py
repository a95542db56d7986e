from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_support import write_toy


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """The toy model package and its recipe ``toy.yaml`` (outside the repository)."""
    return write_toy(tmp_path)
