"""What the fusion rules need to know about values the exporters leave unannotated.

Two facts decide whether a fused kernel may stand for a subgraph, and function bodies rarely
carry either:

* small constants (a slice's bounds, an epsilon, an Unsqueeze axis), which the TorchScript path
  computes through ``Unsqueeze``/``Concat``/``Cast`` of ``Constant`` nodes:
  :func:`constant_array` evaluates such chains (a few small ops, never a weight);
* shapes (a head count is an attribute of ``GroupQueryAttention``), which the TorchScript path
  writes on a function's inputs only (IR 8 has no value_info in functions):
  :func:`inferred_shapes` runs ONNX's shape inference on a copy of one body, its inputs typed as
  the function declares them, and :func:`annotated` puts the results on the values that lack
  them for the duration of a rewrite, then takes them off again, so the fusion adds no shapes
  to the model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.base.contracts.names import ATTENTION_DOMAIN
from hyperexport.library.tensor_slots import attribute_tensor

log = logging.getLogger(__name__)

#: Constants larger than this are not evaluated (a rule's constants are scalars and bounds).
MAX_CONSTANT_ELEMENTS = 64
_MAX_DEPTH = 8


def constant_array(value: ir.Value | None, _depth: int = 0) -> np.ndarray | None:
    """The value of ``value`` if small constants compute it, else None.

    Follows ``Constant``, initializers/constant-propagated values, static dims read with
    ``Shape`` (and ``Gather`` of them), and ``Identity``, ``Cast``, ``Unsqueeze``, ``Squeeze``,
    ``Reshape``, ``Concat`` and integer ``Add``/``Sub``/``Mul``/``Div`` of such values (the
    TorchScript path computes ``x.shape[-1] // 2`` so under dynamic axes).
    """
    if value is None or _depth > _MAX_DEPTH:
        return None
    const = value.const_value
    if const is not None:
        if const.size > MAX_CONSTANT_ELEMENTS:
            return None
        return np.asarray(const.numpy())
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Gather" and _is_shape(node.inputs[0]):
        return _static_dims(node)
    if node.op_type == "Shape":
        return _static_shape(node)
    inputs = [constant_array(v, _depth + 1) if v is not None else None for v in node.inputs]
    return _evaluate(node, inputs)


def _is_shape(value: ir.Value | None) -> bool:
    node = value.producer() if value is not None else None
    return node is not None and node.op_type == "Shape" and node.domain in ("", "ai.onnx")


def _shape_dims(node: ir.Node) -> list[int | None] | None:
    """The dims ``Shape`` gives (``start``/``end`` applied), ints where static."""
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    dims = [d if isinstance(d, int) else None for d in source.shape]
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get("end")
    return dims[start : end.as_int() if end is not None else None]


def _static_shape(node: ir.Node) -> np.ndarray | None:
    dims = _shape_dims(node)
    if dims is None or None in dims:
        return None
    return np.asarray(dims, dtype=np.int64)


def _static_dims(gather: ir.Node) -> np.ndarray | None:
    """``Gather(Shape(x), i)`` where the dims picked are static."""
    shape = gather.inputs[0].producer() if gather.inputs[0] is not None else None
    indices = constant_array(gather.inputs[1]) if len(gather.inputs) > 1 else None
    dims = _shape_dims(shape) if shape is not None else None
    if dims is None or indices is None or gather.attributes.get_int("axis", 0) != 0:
        return None
    picked = [dims[int(i)] for i in np.atleast_1d(indices) if -len(dims) <= int(i) < len(dims)]
    if len(picked) != indices.size or None in picked:
        return None
    return np.asarray(picked, dtype=np.int64).reshape(indices.shape)


#: Integer arithmetic on dims (ONNX ``Div`` of integers truncates, as ``//`` on non-negatives).
_ARITHMETIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": lambda a, b: np.trunc(a / b),
}


def _evaluate(node: ir.Node, inputs: list[np.ndarray | None]) -> np.ndarray | None:
    op = node.op_type
    if op == "Constant":
        return _constant_attribute(node)
    if not inputs or inputs[0] is None:
        return None
    data = inputs[0]
    if op == "Identity":
        return data
    if op == "Cast":
        to = node.attributes.get_int("to", 0)
        return data.astype(ir.DataType(to).numpy()) if to else None
    if op in ("Unsqueeze", "Squeeze"):
        axes = _axes(node, inputs)
        if axes is None:
            return np.squeeze(data) if op == "Squeeze" else None
        if op == "Squeeze":
            return np.squeeze(data, axis=tuple(axes))
        result = data
        for axis in sorted(a % (data.ndim + len(axes)) for a in axes):
            result = np.expand_dims(result, axis)
        return result
    if op == "Reshape" and len(inputs) > 1 and inputs[1] is not None:
        shape = [int(d) for d in inputs[1]]
        if 0 in shape:  # allowzero=0 copies the dim: not worth it for constants
            return None
        return data.reshape(shape)
    if op in _ARITHMETIC and len(inputs) == 2 and inputs[1] is not None:
        if not (
            np.issubdtype(data.dtype, np.integer) and np.issubdtype(inputs[1].dtype, np.integer)
        ):
            return None
        return np.asarray(_ARITHMETIC[op](data, inputs[1]), dtype=data.dtype)
    if op == "Concat" and all(i is not None for i in inputs):
        return np.concatenate(
            [np.atleast_1d(i) for i in inputs if i is not None],
            axis=node.attributes.get_int("axis", 0),
        )
    return None


def _axes(node: ir.Node, inputs: list[np.ndarray | None]) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(a) for a in np.atleast_1d(inputs[1])]
    attribute = node.attributes.get("axes")
    return list(attribute.as_ints()) if attribute is not None else None


def _constant_attribute(node: ir.Node) -> np.ndarray | None:
    for name, attribute in node.attributes.items():
        if name == "value":
            tensor = attribute_tensor(attribute)
            return np.asarray(tensor.numpy()) if tensor.size <= MAX_CONSTANT_ELEMENTS else None
        if name in ("value_int", "value_float"):
            return np.asarray(attribute.value)
        if name in ("value_ints", "value_floats"):
            return np.asarray(list(attribute.value))
    return None


def scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant, as a float, or None."""
    array = constant_array(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()))


def ints(value: ir.Value | None) -> list[int] | None:
    """The integer elements of a small integer constant, or None."""
    array = constant_array(value)
    if array is None or not np.issubdtype(array.dtype, np.integer):
        return None
    return [int(v) for v in array.reshape(-1)]


def dtype(value: ir.Value | None) -> ir.DataType | None:
    """The element type of ``value``: declared, or that of the constant it holds."""
    if value is None:
        return None
    if value.dtype is not None:
        return value.dtype
    if value.const_value is not None:
        return value.const_value.dtype
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        attribute = node.attributes.get("value")
        if attribute is not None:
            return attribute_tensor(attribute).dtype
    return None


def static_dim(value: ir.Value | None, axis: int) -> int | None:
    """Dimension ``axis`` of ``value`` when its shape has it as an int, else None."""
    if value is None or value.shape is None:
        return None
    rank = value.shape.rank()
    if not -rank <= axis < rank:
        return None
    dim = value.shape[axis]
    return dim if isinstance(dim, int) else None


def rank(value: ir.Value | None) -> int | None:
    """The rank of ``value`` when known."""
    return None if value is None or value.shape is None else value.shape.rank()


# --------------------------------------------------------------------------------------------
# Shapes of the main graph and of function bodies
# --------------------------------------------------------------------------------------------
def call_arguments(model: ir.Model) -> dict[ir.OperatorIdentifier, list[ir.Value | None]]:
    """For each called function, the arguments of its first call (main graph, then bodies)."""
    found: dict[ir.OperatorIdentifier, list[ir.Value | None]] = {}
    owners: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for owner in owners:
        for node in ir.traversal.RecursiveGraphIterator(owner):
            if node.op_identifier() in model.functions:
                found.setdefault(node.op_identifier(), list(node.inputs))
    return found


def _for_inference(nodes: Iterable[onnx.NodeProto]) -> None:
    """An exported attention node as ``Identity`` of its query: the same shape when values have
    the head size of keys (every transformers model), so that what follows it is typed too."""
    for node in nodes:
        if node.domain == ATTENTION_DOMAIN:
            del node.input[1:]
            del node.attribute[:]
            node.domain, node.op_type = "", "Identity"


def _inference_functions(model: ir.Model) -> list[onnx.FunctionProto]:
    protos = [ir.serde.serialize_function(f) for f in model.functions.values()]
    for proto in protos:
        _for_inference(proto.node)
    return protos


def _infer(
    model: ir.Model,
    graph: onnx.GraphProto,
    opsets: Mapping[str, int],
    functions: list[onnx.FunctionProto],
    where: str,
) -> dict[str, onnx.TypeProto]:
    _for_inference(graph.node)
    scratch = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=max(model.ir_version, 10),
    )
    scratch.functions.extend(functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(scratch, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        log.warning("fusion: no shape inference in %s (%s)", where, e)
        return {}
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {info.name: info.type for info in infos if info.type.HasField("tensor_type")}


def inferred_shapes(
    model: ir.Model,
    function: ir.Function,
    arguments: list[ir.Value | None] | None = None,
    functions: list[onnx.FunctionProto] | None = None,
) -> dict[str, onnx.TypeProto]:
    """ONNX shape inference over one function body, its inputs typed as the function declares
    them or, where it does not, as ``arguments`` (a call's) are.

    The body is copied into a graph of a scratch model (the model's functions ride along, so
    nested calls infer too); nothing of ``model`` changes. Exported attention nodes stand there
    as ``Identity`` of their query. Values inference cannot type are absent from the result.
    """
    proto = ir.serde.serialize_function(function)
    graph = onnx.GraphProto(name=f"{function.name}_body", node=proto.node)
    for i, value in enumerate(function.inputs):
        argument = arguments[i] if arguments is not None and i < len(arguments) else None
        typed = value if value.type is not None or argument is None else argument
        graph.input.append(_value_info(typed, value.name or ""))
    graph.output.extend(onnx.ValueInfoProto(name=v.name or "") for v in function.outputs)
    graph.value_info.extend(proto.value_info)
    functions = _inference_functions(model) if functions is None else functions
    return _infer(model, graph, function.opset_imports, functions, str(function.identifier()))


def inferred_graph_shapes(
    model: ir.Model, functions: list[onnx.FunctionProto] | None = None
) -> dict[str, onnx.TypeProto]:
    """ONNX shape inference over the main graph; its initializers enter as typed inputs (their
    data stays where it is)."""
    graph = onnx.GraphProto(name="main", node=[ir.serde.serialize_node(n) for n in model.graph])
    values = [*model.graph.inputs, *model.graph.initializers.values()]
    graph.input.extend(_value_info(v, v.name or "") for v in values)
    graph.output.extend(onnx.ValueInfoProto(name=v.name or "") for v in model.graph.outputs)
    functions = _inference_functions(model) if functions is None else functions
    return _infer(model, graph, model.graph.opset_imports, functions, "the main graph")


def _value_info(value: ir.Value, name: str) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=name)
    if value.type is not None or value.shape is not None:
        ir.serde.serialize_value_into(info, value)
        info.name = name
    return info


@contextlib.contextmanager
def annotated(model: ir.Model) -> Iterator[None]:
    """Inferred types and shapes on every value of the main graph and of every function body
    (function inputs included) that lacks them, while inside; taken off again on exit."""
    functions = _inference_functions(model)
    arguments = call_arguments(model)
    added: list[tuple[ir.Value, bool, bool]] = []
    owners: list[tuple[ir.Graph | ir.Function, dict[str, onnx.TypeProto]]] = [
        (model.graph, inferred_graph_shapes(model, functions))
    ]
    for function in model.functions.values():
        types = inferred_shapes(model, function, arguments.get(function.identifier()), functions)
        owners.append((function, types))
    for owner, types in owners:
        for value in [*owner.inputs, *(v for node in owner for v in node.outputs)]:
            tensor = types.get(value.name or "")
            if tensor is None or (value.shape is not None and value.type is not None):
                continue
            added.append((value, value.type is None, value.shape is None))
            _apply(tensor, value)
    try:
        yield
    finally:
        for value, had_no_type, had_no_shape in added:
            if had_no_shape:
                value.shape = None
            if had_no_type:
                value.type = None


def _apply(tensor: onnx.TypeProto, value: ir.Value) -> None:
    elem = tensor.tensor_type.elem_type
    if elem and value.type is None:
        value.dtype = ir.DataType(elem)
    if tensor.tensor_type.HasField("shape") and value.shape is None:
        dims: list[int | str | None] = []
        for dim in tensor.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            else:
                dims.append(dim.dim_param or None)
        value.shape = ir.Shape(dims)
