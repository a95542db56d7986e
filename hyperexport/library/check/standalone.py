"""Build a model that runs one function alone: its data inputs and its weights as graph inputs.

The weights are inputs, not initializers, so that the model holds no tensor and one session
serves every call of the function (each call fed its own weights, ``check/weight_feeds.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.manifest import CallSite
from hyperexport.base.errors import CheckError
from hyperexport.library.check.invariant_inputs import derive_invariants, invariant_positions

FunctionId = tuple[str, str, str]


def reachable_functions(model: ir.Model, root: FunctionId) -> list[ir.Function]:
    """``root`` and every local function it calls, directly or through nested calls."""
    seen: dict[FunctionId, ir.Function] = {}
    stack = [root]
    while stack:
        ident = stack.pop()
        if ident in seen or ident not in model.functions:
            continue
        function = model.functions[ident]
        seen[ident] = function
        stack.extend(
            (node.domain, node.op_type, node.overload)
            for node in ir.traversal.RecursiveGraphIterator(function)
        )
    return list(seen.values())


def input_signature(arrays: Sequence[np.ndarray]) -> tuple[tuple[str, int], ...]:
    """Dtype and rank of each data input: calls with equal signatures can share a standalone model."""
    return tuple((str(a.dtype), a.ndim) for a in arrays)


def weight_signature(model: ir.Model, site: CallSite) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Dtype and shape of each of ``site``'s weights: calls with equal ones share a session.

    Raises:
        CheckError: When a weight is not a main-graph initializer with a value.
    """
    return tuple(
        (int(tensor.dtype), tuple(tensor.shape.numpy())) for tensor in weight_tensors(model, site)
    )


def weight_tensors(model: ir.Model, site: CallSite) -> list[ir.TensorProtocol]:
    """The main-graph tensors ``site`` passes as its weights, in order.

    Raises:
        CheckError: When a weight is not a main-graph initializer with a value.
    """
    tensors = []
    for name in site.weight_inputs:
        source = model.graph.initializers.get(name)
        if source is None or source.const_value is None:
            raise CheckError(
                f"call {site.call_id}: weight {name!r} is not a main-graph initializer"
            )
        tensors.append(source.const_value)
    return tensors


def build_standalone(
    model: ir.Model, site: CallSite, signature: tuple[tuple[str, int], ...]
) -> ir.Model:
    """A model whose graph calls ``site``'s function once.

    Graph inputs are ``input_<i>`` (one per data input, dtype and rank from ``signature``, every
    dimension symbolic), then ``weight_<j>`` (one per weight input of the call, with the dtype
    and shape of ``site``'s weight); invariant inputs are computed from those by copies of the
    main graph's nodes (``check/invariant_inputs.py``); outputs are ``output_<i>``, one per
    function output. Any
    call of the same function with the same signatures runs on it.

    Args:
        model: The final model (its functions and main-graph initializers are reused, not copied).
        site: The call site.
        signature: ``input_signature`` of the call's data inputs.

    Raises:
        CheckError: When the function, a weight, or the input/output arity does not match.
    """
    ident = (site.domain, site.name, "")
    if ident not in model.functions:
        raise CheckError(f"function {site.domain}::{site.name} is not in the model")
    function = model.functions[ident]
    invariant = invariant_positions(function)
    n_inputs = len(site.data_inputs) + len(site.weight_inputs) + len(invariant)
    if n_inputs != len(function.inputs) or len(site.outputs) != len(function.outputs):
        raise CheckError(
            f"call {site.call_id} passes {n_inputs} inputs and expects {len(site.outputs)} "
            f"outputs; {site.domain}::{site.name} takes {len(function.inputs)} and returns "
            f"{len(function.outputs)}"
        )
    inputs = [
        ir.Value(
            name=f"input_{i}",
            type=ir.TensorType(ir.DataType.from_numpy(np.dtype(dtype))),
            shape=ir.Shape([f"input_{i}_d{d}" for d in range(rank)]),
        )
        for i, (dtype, rank) in enumerate(signature)
    ]
    weights = [
        ir.Value(
            name=f"weight_{j}",
            type=ir.TensorType(tensor.dtype),
            shape=ir.Shape(tensor.shape.numpy()),
        )
        for j, tensor in enumerate(weight_tensors(model, site))
    ]
    # Data inputs come first; weights fill the other positions in order, but for the invariant
    # inputs, which the main graph's nodes compute from the others (check/invariant_inputs.py).
    arguments: dict[int, ir.Value] = dict(enumerate(inputs))
    remaining = iter(weights)
    for position in range(len(inputs), len(function.inputs)):
        if position not in invariant:
            arguments[position] = next(remaining)
    derivation, derived = derive_invariants(model, function, arguments)
    arguments.update(derived)
    node = ir.Node(
        site.domain,
        site.name,
        inputs=[arguments[i] for i in range(len(function.inputs))],
        num_outputs=len(function.outputs),
    )
    for i, output in enumerate(node.outputs):
        output.name = f"output_{i}"
    opsets = dict(model.opset_imports)
    opsets.setdefault(site.domain, 1)
    graph = ir.Graph(
        [*inputs, *weights],
        node.outputs,
        nodes=[*derivation, node],
        opset_imports=opsets,
        name=f"check_{site.name}",
    )
    return ir.Model(graph, ir_version=model.ir_version, functions=reachable_functions(model, ident))
