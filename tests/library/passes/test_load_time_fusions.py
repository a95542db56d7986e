"""``passes/load_time_fusions.py``: what ONNX Runtime would fuse at load is in the model: a
standalone RMSNorm as ``SimplifiedLayerNormalization`` (ONNX Runtime's, in the default domain,
which onnx's checker knows only while the check stage tells it), SiLU as ``QuickGelu``; ONNX
Runtime computes the same."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hyperexport.base.contracts.names import op_id
from hyperexport.library.check.onnxruntime_schemas import known_to_checker
from hyperexport.library.passes.fuse_ops import FuseOpsPass
from hyperexport.library.passes.load_time_fusions import LoadTimeFusionsPass
from tests.helpers.passes import HEADER, RMS, parse, run_checked

SILU = (
    HEADER
    + """
main (float[2, 5, 16] x) => (float[2, 5, 16] y) {
    h = hyperexport.fn.Act (x)
    y = hyperexport.fn.Act (h)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Act (x) => (out) {
    gate = Sigmoid (x)
    out = Mul (x, gate)
}
"""
)


def _ops(owner: ir.Graph | ir.Function) -> Counter[str]:
    return Counter(op_id(n.domain, n.op_type) for n in owner if n.op_type != "Constant")


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_standalone_rms_norm_becomes_simplified_layer_normalization() -> None:
    feeds = {"x": _rand(2, 5, 16), "w": _rand(16, seed=1)}
    model = parse(RMS)
    FuseOpsPass("onnxruntime")(model)  # what runs before it: no-op casts gone, constants second
    assert LoadTimeFusionsPass()(model).modified
    [norm] = model.functions.values()
    assert _ops(norm) == {"SimplifiedLayerNormalization": 1}
    assert _ops(model.graph) == {"hyperexport.fn::Norm": 2, "SimplifiedLayerNormalization": 1}
    node = next(n for n in norm if n.op_type == "SimplifiedLayerNormalization")
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-6)
    assert node.attributes.get_int("axis") == -1
    proto = ir.to_proto(model)
    with pytest.raises(onnx.checker.ValidationError, match="SimplifiedLayerNormalization"):
        onnx.checker.check_model(proto, full_check=True)
    with known_to_checker("onnxruntime"):
        fused = run_checked(model, feeds)[0]
    # a portable model's check does not know the op; nor does onnx after the check
    with known_to_checker("standard"), pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(proto, full_check=True)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(proto, full_check=True)
    np.testing.assert_allclose(fused, run_checked(parse(RMS), feeds)[0], rtol=1e-5, atol=1e-6)
    assert not LoadTimeFusionsPass()(model).modified


def test_silu_becomes_quick_gelu_with_alpha_one() -> None:
    feeds = {"x": _rand(2, 5, 16)}
    model = parse(SILU)
    before = run_checked(model, feeds)[0]
    assert LoadTimeFusionsPass()(model).modified
    [act] = model.functions.values()
    assert _ops(act) == {"com.microsoft::QuickGelu": 1}
    assert next(iter(act)).attributes.get_float("alpha") == 1.0
    np.testing.assert_allclose(run_checked(model, feeds)[0], before, rtol=1e-5, atol=1e-6)


def test_a_half_precision_silu_stays_where_the_cpu_kernel_takes_no_such_type() -> None:
    silu = parse(SILU.replace("float[", "float16["))
    assert not LoadTimeFusionsPass()(silu).modified
    assert _ops(next(iter(silu.functions.values()))) == {"Sigmoid": 1, "Mul": 1}
