"""Run float16 and bfloat16 models upcast to float32 (the check's policy for low precision).

ONNX Runtime's CPU provider has no bfloat16 MatMul or Add (and float16 coverage varies by op),
so a bf16 or fp16 function cannot run there as exported. The check runs it upcast instead: every
low-precision type, weight, constant and ``Cast`` target of the standalone model becomes float32,
the captured inputs are fed as float32, and the float32 result is rounded back to the captured
dtype and compared with torch's output at that dtype's tolerance floor
(:data:`hyperexport.library.check.precision.TOLERANCE_FLOOR`).
What this proves: the exported graph computes the same function as the torch module, up to the
rounding of intermediate results that torch did in low precision. It does not prove that a
low-precision runtime reproduces torch bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hyperexport.library.tensor_slots import attribute_tensor

#: Types the check runs upcast to float32.
LOW_PRECISION = frozenset({ir.DataType.BFLOAT16, ir.DataType.FLOAT16})

_DTYPE_ATTRIBUTES = ("to", "dtype")


def _graphs(model: ir.Model) -> list[ir.Graph | ir.Function]:
    return [model.graph, *model.functions.values()]


def is_low_precision(model: ir.Model) -> bool:
    """Whether any graph input, output or weight of ``model`` is float16 or bfloat16."""
    graph = model.graph
    values = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    return any(v.dtype in LOW_PRECISION for v in values)


def _upcast_tensor(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    if tensor.dtype not in LOW_PRECISION:
        return tensor
    return ir.Tensor(tensor.numpy().astype(np.float32), name=tensor.name)


def _upcast_value(value: ir.Value) -> None:
    if value.dtype in LOW_PRECISION:
        value.dtype = ir.DataType.FLOAT
    if value.const_value is not None:
        value.const_value = _upcast_tensor(value.const_value)


def upcast_model(model: ir.Model) -> None:
    """Rewrite ``model`` in place so that it computes in float32 where it used fp16/bf16.

    Call it on a model of its own (a standalone check model with cloned functions): it replaces
    weights with float32 copies, read from their external data one tensor at a time.
    """
    for owner in _graphs(model):
        for value in owner.inputs:
            _upcast_value(value)
        for value in owner.outputs:
            _upcast_value(value)
        if isinstance(owner, ir.Graph):
            for value in owner.initializers.values():
                _upcast_value(value)
        for node in ir.traversal.RecursiveGraphIterator(owner):
            for value in node.outputs:
                _upcast_value(value)
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and attr.value is not None:
                    upcast = _upcast_tensor(attribute_tensor(attr))
                    if upcast is not attr.value:
                        node.attributes[name] = ir.AttrTensor(name, upcast)
                elif _is_low_precision_dtype_attribute(name, attr):
                    node.attributes[name] = ir.AttrInt64(name, int(ir.DataType.FLOAT))


def _is_low_precision_dtype_attribute(name: str, attr: ir.Attr) -> bool:
    """A ``to``/``dtype`` attribute (Cast, ConstantOfShape, ...) naming fp16 or bf16."""
    return (
        name in _DTYPE_ATTRIBUTES
        and attr.type == ir.AttributeType.INT
        and attr.as_int() in {int(d) for d in LOW_PRECISION}
    )


def session_payload(model: ir.Model, external_data_dir: str | None) -> tuple[bytes, bool]:
    """The serialized model ONNX Runtime runs, and whether it was upcast.

    A low-precision model is first copied (a protobuf round trip: external tensors stay
    references, re-rooted at ``external_data_dir``) and the copy upcast, so that the model it
    came from is left as it is.
    """
    from hyperexport.library.tensor_slots import tensor_slots

    if not is_low_precision(model):
        return ir.to_proto(model).SerializeToString(), False
    copy = ir.serde.deserialize_model(ir.to_proto(model))
    if external_data_dir is not None:
        for slot in tensor_slots(copy):
            if isinstance(slot.tensor, ir.ExternalTensor):
                slot.tensor.base_dir = external_data_dir
    upcast_model(copy)
    return ir.to_proto(copy).SerializeToString(), True
