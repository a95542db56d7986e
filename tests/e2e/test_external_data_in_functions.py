"""``recipe=llama`` (per_instance functions) with ``external_data: true`` and int4: weights held
as ``Constant`` values, in the functions (and, with transformers 5, in the main graph: the rotary
table), live in external data. Every later stage reads them from beside the model it loads
(``model_file.load_model``), and the quantized model's data file holds all it reads
(``model_file.save_compact``). Before, the quantize stage failed (``No such file or directory:
'model.onnx.data'``: ``ir.load`` left function bodies' tensors relative to the working
directory), and then evaluate (the quantized model's main-graph ``Constant`` still pointed into
the float model's data file, which ``ir.save`` does not rewrite)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.helpers.builds import build_composed


def _external(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(where, location) of every external tensor held by a ``Constant`` or an initializer."""
    found = [("initializer", t) for t in model.graph.initializer]
    found += [("main", a.t) for n in model.graph.node for a in n.attribute if a.HasField("t")]
    for f in model.functions:
        found += [("function", a.t) for n in f.node for a in n.attribute if a.HasField("t")]
    return [
        (where, next(e.value for e in t.external_data if e.key == "location"))
        for where, t in found
        if t.data_location == onnx.TensorProto.EXTERNAL
    ]


def test_per_instance_weights_in_external_data_are_quantized_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the folder of any model file
    overrides = ["recipe=llama", "dynamo=false", "quantize.method=int4_block"]
    overrides += ["external_data=true", "external_data_threshold=1024"]
    outcome = build_composed(overrides, tmp_path)
    assert outcome.exit_code == 0, outcome.result.error
    assert outcome.report is not None and outcome.report["check"]["ok"] is True
    float_model = onnx.load(outcome.out_dir / "model.onnx", load_external_data=False)
    assert "function" in {where for where, _ in _external(float_model)}  # per_instance weights
    quantized = onnx.load(outcome.out_dir / "model.quantized.onnx", load_external_data=False)
    assert {loc for _, loc in _external(quantized)} == {"model.quantized.onnx.data"}
    assert sum(n.op_type == "MatMulNBits" for f in quantized.functions for n in f.node) > 0
