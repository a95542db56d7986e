"""A build's model differs from what it wrote before this release only in its IR version: the
lowest that carries its opsets (``model_file.stamped_proto``). On the dynamo path, whose
exporter says IR 10, the published bytes are the old ones with that one field changed."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
import pytest

from hyperexport.library import model_file
from tests.helpers.cli import run_here, write_toy


def _published(tmp_path: Path) -> bytes:
    return (tmp_path / "outputs" / "toy" / "dynamo=true" / "model.onnx").read_bytes()


@pytest.mark.slow  # two builds (about 45 s); tests/library/test_model_file.py shows it on the save alone
def test_a_dynamo_build_changes_only_the_ir_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = write_toy(tmp_path)
    args = [f"recipe_file={recipe}", "dynamo=true"]
    assert run_here(args, tmp_path).returncode == 0
    now = _published(tmp_path)

    # The same build, its rewrite rerun with the save as it was: the model's own IR version.
    monkeypatch.setattr(model_file, "stamped_proto", ir.to_proto)
    assert run_here([*args, "build.force=[rewrite]"], tmp_path).returncode == 0
    before = _published(tmp_path)

    old, new = onnx.load_from_string(before), onnx.load_from_string(now)
    assert (old.ir_version, new.ir_version) == (10, 8)  # torch's dynamo exporter said 10
    assert now != before
    old.ir_version = new.ir_version
    assert old.SerializeToString() == now  # nothing else moved, byte for byte
