"""Hand-made hierarchical models for the check tests, with matching manifests, captures, arrays.

The toy network, in execution order of its hiera calls::

    block      (toy.Block)   h  = relu(block.lin(x))        calls nested block.lin
    block.lin  (toy.Linear)  t  = x @ W0 + B0
    head       (toy.Linear)  l1 = h @ W1 + B1               first call of head
    head       (toy.Linear)  y  = l1 @ W1 + B1              second call of head
    main graph               z  = -l1

Two styles: ``per_type`` (functions ``Block`` and ``Linear`` take their weights as inputs, which
are main-graph initializers) and ``per_instance`` (one function per instance, weights in Constant
nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir

from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    CallSite,
    ExportManifest,
    FunctionEntry,
)
from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, TensorMeta

FN = FUNCTION_DOMAIN
BLOCK = "toy.Block"
LINEAR = "toy.Linear"
OPSET = 18


@dataclass(frozen=True)
class Weights:
    """The toy's parameters: block.lin is (W0, B0), head is (W1, B1)."""

    w0: np.ndarray
    b0: np.ndarray
    w1: np.ndarray
    b1: np.ndarray


def make_weights(seed: int = 0) -> Weights:
    rng = np.random.default_rng(seed)

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return Weights(w0=f(4, 3), b0=f(3), w1=f(3, 3), b1=f(3))


@dataclass(frozen=True)
class Toy:
    """A toy model and everything the check needs about it."""

    model: ir.Model
    manifest: ExportManifest
    capture: CaptureRecord
    arrays: dict[str, np.ndarray]


def _literal(array: np.ndarray) -> str:
    dims = ",".join(str(d) for d in array.shape)
    values = ", ".join(repr(float(v)) for v in array.ravel())
    return f"float[{dims}] {{{values}}}"


def _linear_body(weights: tuple[np.ndarray, np.ndarray] | None) -> str:
    if weights is None:
        return "m = MatMul(x, w)\n y = Add(m, b)"
    w, b = weights
    return (
        f"w = Constant <value = {_literal(w)}> ()\n"
        f" b = Constant <value = {_literal(b)}> ()\n"
        " m = MatMul(x, w)\n y = Add(m, b)"
    )


def _text_per_type() -> str:
    return f"""
<ir_version: 10, opset_import: ["": {OPSET}, "{FN}": 1]>
toy (float[2,4] x) => (float[2,3] y, float[2,3] z) {{
  h = {FN}.Block(x, W0, B0)
  l1 = {FN}.Linear(h, W1, B1)
  y = {FN}.Linear(l1, W1, B1)
  z = Neg(l1)
}}
<domain: "{FN}", opset_import: ["": {OPSET}, "{FN}": 1]>
Block (x, w, b) => (y) {{
  t = {FN}.Linear(x, w, b)
  y = Relu(t)
}}
<domain: "{FN}", opset_import: ["": {OPSET}]>
Linear (x, w, b) => (y) {{
  {_linear_body(None)}
}}
"""


def _text_per_instance(weights: Weights) -> str:
    return f"""
<ir_version: 10, opset_import: ["": {OPSET}, "{FN}": 1]>
toy (float[2,4] x) => (float[2,3] y, float[2,3] z) {{
  h = {FN}.Block_block(x)
  l1 = {FN}.Linear_head(h)
  y = {FN}.Linear_head(l1)
  z = Neg(l1)
}}
<domain: "{FN}", opset_import: ["": {OPSET}, "{FN}": 1]>
Block_block (x) => (y) {{
  t = {FN}.Linear_block_lin(x)
  y = Relu(t)
}}
<domain: "{FN}", opset_import: ["": {OPSET}]>
Linear_block_lin (x) => (y) {{
  {_linear_body((weights.w0, weights.b0))}
}}
<domain: "{FN}", opset_import: ["": {OPSET}]>
Linear_head (x) => (y) {{
  {_linear_body((weights.w1, weights.b1))}
}}
"""


def _reference(weights: Weights, x: np.ndarray) -> dict[str, np.ndarray]:
    block_lin = x @ weights.w0 + weights.b0
    block = np.maximum(block_lin, 0)
    head0 = block @ weights.w1 + weights.b1
    head1 = head0 @ weights.w1 + weights.b1
    values = {
        "in.0": x,
        "out.0": head1,
        "out.1": -head0,
        "block#0/in.0": x,
        "block#0/out.0": block,
        "block.lin#0/in.0": x,
        "block.lin#0/out.0": block_lin,
        "head#0/in.0": block,
        "head#0/out.0": head0,
        "head#1/in.0": head0,
        "head#1/out.0": head1,
    }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in values.items()}


def _capture(arrays: dict[str, np.ndarray]) -> CaptureRecord:
    def call(path: str, cls: str, index: int, order: int, parent: str | None) -> ModuleCall:
        cid = f"{path}#{index}"
        return ModuleCall(
            path=path,
            class_name=cls,
            call_index=index,
            order=order,
            parent=parent,
            inputs=("dict", (("x", ("tensor", f"{cid}/in.0")),)),
            outputs=("tensor", f"{cid}/out.0"),
        )

    return CaptureRecord(
        model_class="toy.Toy",
        inputs=("dict", (("x", ("tensor", "in.0")),)),
        outputs=("tuple", (("tensor", "out.0"), ("tensor", "out.1"))),
        calls=(
            call("block", BLOCK, 0, 0, None),
            call("block.lin", LINEAR, 0, 1, "block#0"),
            call("head", LINEAR, 0, 2, None),
            call("head", LINEAR, 1, 3, None),
        ),
        tensors=tuple(
            TensorMeta(k, tuple(a.shape), str(a.dtype)) for k, a in sorted(arrays.items())
        ),
        hiera=(BLOCK, LINEAR),
    )


def _site(call_id: str, name: str, weights: tuple[str, ...]) -> CallSite:
    return CallSite(
        call_id=call_id,
        module_path=call_id.split("#")[0],
        domain=FN,
        name=name,
        data_inputs=(f"{call_id}/in.0",),
        weight_inputs=weights,
        outputs=(f"{call_id}/out.0",),
    )


def _manifest(mode: str) -> ExportManifest:
    if mode == "per_type":
        functions = (
            FunctionEntry(FN, "Block", BLOCK, ("block",)),
            FunctionEntry(FN, "Linear", LINEAR, ("block.lin", "head")),
        )
        calls = (
            _site("block#0", "Block", ("W0", "B0")),
            _site("block.lin#0", "Linear", ("W0", "B0")),
            _site("head#0", "Linear", ("W1", "B1")),
            _site("head#1", "Linear", ("W1", "B1")),
        )
    else:
        functions = (
            FunctionEntry(FN, "Block_block", BLOCK, ("block",)),
            FunctionEntry(FN, "Linear_block_lin", LINEAR, ("block.lin",)),
            FunctionEntry(FN, "Linear_head", LINEAR, ("head",)),
        )
        calls = (
            _site("block#0", "Block_block", ()),
            _site("block.lin#0", "Linear_block_lin", ()),
            _site("head#0", "Linear_head", ()),
            _site("head#1", "Linear_head", ()),
        )
    return ExportManifest(
        dynamo=False,
        opset=OPSET,
        function_mode=mode,
        graph_inputs=("in.0",),
        graph_outputs=("out.0", "out.1"),
        functions=functions,
        calls=calls,
    )


def make_toy(
    mode: str = "per_type",
    *,
    model_weights: Weights | None = None,
    reference_weights: Weights | None = None,
) -> Toy:
    """Build the toy in ``mode``; ``model_weights`` (default: the reference's) go into the model.

    Passing weights different from the reference's makes a model that diverges from torch.
    """
    reference = reference_weights or make_weights()
    weights = model_weights or reference
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    text = _text_per_type() if mode == "per_type" else _text_per_instance(weights)
    proto = onnx.parser.parse_model(text)
    if mode == "per_type":
        for name, value in (
            ("W0", weights.w0),
            ("B0", weights.b0),
            ("W1", weights.w1),
            ("B1", weights.b1),
        ):
            proto.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    model = ir.from_proto(proto)
    _constants_as_raw_data(model)
    model.metadata_props[META_EXPORT_PATH] = "dynamo=False"
    arrays = _reference(reference, x)
    return Toy(model=model, manifest=_manifest(mode), capture=_capture(arrays), arrays=arrays)


def _constants_as_raw_data(model: ir.Model) -> None:
    """Re-create Constant values from numpy, so that they serialize as raw_data (which onnx's
    external-data conversion needs)."""
    for function in model.functions.values():
        for node in function:
            if node.op_type == "Constant":
                array = node.attributes["value"].as_tensor().numpy()
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(array))


def edited(weights: Weights, field: str, delta: float = 0.5) -> Weights:
    """``weights`` with ``delta`` added to element 0 of ``field``."""
    array = getattr(weights, field).copy()
    array.flat[0] += delta
    return replace(weights, **{field: array})


def save(model: ir.Model, path: str) -> None:
    """Save ``model`` (no external data)."""
    ir.save(model, path)
