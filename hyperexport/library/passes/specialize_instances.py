"""Per-instance mode: give every module instance its own function with its weights baked in.

The export makes one body per module *structure*, with weights as function inputs (see
``capture/units.py``). This pass clones that body for each instance, replaces the weight inputs
by Constant nodes holding the instance's own weights, and points the call site at the clone, so
the result is HyperONNX-style self-contained functions without exporting every instance.

Call sites are visited top-down: the main graph first, where weights arrive as initializers,
then the bodies of the clones, where the inner calls' weights now arrive as Constant nodes. Calls
of one instance with the same weights share one clone (a module called in a loop).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import onnx_ir as ir

from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN
from hyperexport.base.errors import RewriteError
from hyperexport.library.passes import naming
from hyperexport.library.passes.call_sites import drop_inputs
from hyperexport.library.passes.compose_functions import CHILD_INDEX, META_MODULE_PATH
from hyperexport.library.tensor_slots import attribute_tensor

log = logging.getLogger(__name__)

#: ``node.meta`` key: absolute module path of the instance a call node calls.
MODULE_PATH = META_MODULE_PATH  # compose_functions' (contracts/names.py)


def _absolute(parent: str, node: ir.Node) -> str:
    relative = (node.name or "").split("#", 1)[0]
    return f"{parent}.{relative}" if parent else relative


def _constant_tensor(value: ir.Value | None, graph: ir.Graph, model: ir.Model) -> ir.TensorProtocol:
    """The tensor a weight input receives: a main-graph initializer or a Constant node."""
    if value is None:
        raise RewriteError("specialize: a weight input of a call is missing")
    if graph is model.graph and value.is_initializer() and value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain == "":
        return attribute_tensor(producer.attributes["value"])
    raise RewriteError(
        f"specialize: weight {value.name!r} of a call in {graph.name or 'the main graph'} is "
        "not a constant; per-instance functions need each instance's weights"
    )


class SpecializePerInstancePass(ir.passes.InPlacePass):
    """Clone shared bodies per instance and bake each instance's weights in.

    Args:
        weights: Function name -> the names of its weight inputs (the rest are data inputs).
        classes: Function name -> qualified class name of its module.
    """

    def __init__(self, weights: Mapping[str, frozenset[str]], classes: Mapping[str, str]) -> None:
        super().__init__()
        self.weights = weights
        self.classes = classes

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        clones: dict[tuple[str, str, tuple[int, ...]], ir.Function] = {}
        variants: dict[str, int] = {}
        queue: list[tuple[ir.Graph, str]] = [(model.graph, "")]
        modified = False
        while queue:
            graph, parent = queue.pop(0)
            for node in graph:
                if node.domain != FUNCTION_DOMAIN or CHILD_INDEX not in node.meta:
                    continue
                shared = model.functions[node.op_identifier()]
                if shared.name not in self.weights:  # already specialised
                    continue
                weight_names = self.weights.get(shared.name, frozenset())
                positions = [i for i, v in enumerate(shared.graph.inputs) if v.name in weight_names]
                tensors = [_constant_tensor(node.inputs[i], graph, model) for i in positions]
                path = _absolute(parent, node)
                key = (shared.name, path, tuple(id(t) for t in tensors))
                clone = clones.get(key)
                if clone is None:
                    variant = variants.get(path, 0)
                    variants[path] = variant + 1
                    name = naming.instance_function_name(self.classes[shared.name], path, variant)
                    clone = _specialize(shared, name, positions, tensors)
                    clone.doc_string = f"{shared.doc_string} at {path}".strip()
                    clone.metadata_props.update(shared.metadata_props)
                    clone.metadata_props[META_MODULE_PATH] = path
                    model.functions[clone.identifier()] = clone
                    clones[key] = clone
                    queue.append((clone.graph, path))
                drop_inputs(node, positions)
                node.op_type = clone.name
                node.meta[MODULE_PATH] = path
                modified = True
        if modified:
            _order_functions(model)
        return ir.passes.PassResult(model, modified=modified)


def _specialize(
    shared: ir.Function, name: str, positions: list[int], tensors: list[ir.TensorProtocol]
) -> ir.Function:
    graph = shared.graph.clone()
    graph.name = name
    constants = []
    for index, tensor in zip(positions, tensors):
        value = graph.inputs[index]
        node = ir.node("Constant", [], attributes={"value": tensor}, name=f"{value.name}/Constant")
        out = node.outputs[0]
        value.replace_all_uses_with(out)
        out.name = value.name
        constants.append(node)
    for index in reversed(positions):
        graph.inputs.pop(index)
    if constants:
        if len(graph):
            graph.insert_before(graph[0], constants)
        else:
            graph.extend(constants)
    if "" not in graph.opset_imports:
        raise RewriteError(f"specialize: function {shared.name} imports no default opset")
    return ir.Function(FUNCTION_DOMAIN, name, graph=graph, attributes=[])


def _order_functions(model: ir.Model) -> None:
    """Callees before callers, then by name: a stable order for byte-identical output."""
    functions = dict(model.functions)
    depth: dict[ir.OperatorIdentifier, int] = {}

    def height(ident: ir.OperatorIdentifier) -> int:
        if ident not in depth:
            calls = [
                n.op_identifier() for n in functions[ident].graph if n.op_identifier() in functions
            ]
            depth[ident] = 1 + max((height(c) for c in calls), default=0)
        return depth[ident]

    model.functions.clear()
    for ident in sorted(functions, key=lambda i: (height(i), i)):
        model.functions[ident] = functions[ident]
