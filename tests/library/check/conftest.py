"""Fixtures of the check tests: toy hierarchical models saved to a temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from check_toys import Toy, save

SaveToy = Callable[[Toy], Path]


@pytest.fixture
def save_toy(tmp_path: Path) -> SaveToy:
    """Save a toy's model to ``tmp_path/model.onnx`` and return the path."""

    def _save(toy: Toy) -> Path:
        path = tmp_path / "model.onnx"
        save(toy.model, str(path))
        return path

    return _save
