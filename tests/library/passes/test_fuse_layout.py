"""``passes/fuse_layout.py``: a split-move-move-merge of heads goes only where the inferred shapes
prove it gives the value back. Small graphs as ONNX text, run in ONNX Runtime before and after."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.library.passes.fuse_layout import cancel_round_trips

ROUND_TRIP = """
<ir_version: 10, opset_import: ["" : 18]>
main (float[B, S, 8] x) => (float[B, S, 8] y) {{
    split = Constant <value_ints = [0, 0, 2, 4]> ()
    four = Reshape (x, split)
    moved = Transpose <perm = [0, 2, 1, 3]> (four)
    back = Transpose <perm = [{back}]> (moved)
    merge = Constant <value_ints = [{merge}]> ()
    merged = Reshape (back, merge)
    y = Add (merged, x)
}}
"""


def _model(back: str = "0, 2, 1, 3", merge: str = "0, 0, -1") -> ir.Model:
    return ir.serde.deserialize_model(
        onnx.parser.parse_model(ROUND_TRIP.format(back=back, merge=merge))
    )


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    data = ir.to_proto(model).SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_round_trip_of_heads_is_the_value_itself() -> None:
    model = _model()
    x = np.random.default_rng(0).standard_normal((2, 3, 8), dtype=np.float32)
    expected = _run(model, x)
    assert cancel_round_trips(model) == 1
    RemoveUnusedNodesPass()(model)
    assert [n.op_type for n in model.graph] == ["Add"]
    np.testing.assert_array_equal(_run(model, x), expected)


@pytest.mark.parametrize(
    ("back", "merge"),
    [
        ("0, 1, 3, 2", "0, 0, -1"),  # moved back along other axes: another order
        ("0, 2, 1, 3", "0, -1, 4"),  # merged into another shape, (B, 2S, 4)
    ],
    ids=["other-permutation", "other-merge"],
)
def test_what_is_not_proven_a_round_trip_stays(back: str, merge: str) -> None:
    model = _model(back, merge)
    before = [n.op_type for n in model.graph]
    assert cancel_round_trips(model) == 0
    assert [n.op_type for n in model.graph] == before
