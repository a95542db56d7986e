"""Quantize the weights of MatMuls where they are, inside local functions included.

A MatMul is quantized when its ``B`` is a constant weight, seen through at most one 2-D
``Transpose`` (torch's ``Linear`` exports ``MatMul(x, Transpose(W))``). Where the weight comes
from decides where the quantized tensors go:

* a main-graph initializer (per_type's weights, and MatMuls of the main graph): new initializers;
* a ``Constant`` node in a function (per_instance's baked weights): new ``Constant`` nodes there;
* a function input: new function inputs, one per quantized tensor, fed at every call site from
  the caller's own source of that weight, recursively (an MLP nested in a decoder layer gets its
  weights through the layer's inputs). Only when every call site reaches a constant of the same
  shape is the weight quantized, so a function shared by 16 layers stays one function with 16
  calls, its body holding ``MatMulNBits`` and each call passing its layer's quantized weights.

The float weights that no longer have a reader go with their function inputs
(``PruneFunctionIOPass``) and unused nodes and initializers (onnx_ir's cleanup).

``exclude`` keeps MatMuls in float by module path (``lm_head``, ``layers.0.mlp``: a weight whose
dotted name is the path or lies under it, at any call site) or by function name (every MatMul in
the body of a function of that name, ``LlamaMLP``, or of that module class's short name).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.contracts.names import META_MODULE_CLASS, META_MODULE_PATH, QUANTIZED_DOMAIN
from hyperexport.passes.call_sites import call_sites
from hyperexport.passes.prune_function_io import PruneFunctionIOPass
from hyperexport.passes.quantize_weights import (
    INT4_BLOCK,
    INT8_DYNAMIC,
    METHODS,
    check_block_size,
    quantize_int4_blocks,
    quantize_int8_columns,
)

log = logging.getLogger(__name__)

MS_DOMAIN = QUANTIZED_DOMAIN
#: The op each method makes, in :data:`MS_DOMAIN`.
QUANTIZED_OPS = {INT4_BLOCK: "MatMulNBits", INT8_DYNAMIC: "DynamicQuantizeMatMul"}
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class _Leaf:
    """One constant a weight value can be at run time: its dotted module name and tensor."""

    name: str
    tensor: ir.TensorProtocol


@dataclass
class _Candidate:
    node: ir.Node
    graph: ir.Graph
    source: ir.Value  # the weight as it enters this graph: [N, K] if transposed, else [K, N]
    transposed: bool
    leaves: list[_Leaf] = field(default_factory=list)


def _function_of(model: ir.Model) -> dict[int, ir.Function]:
    return {id(f.graph): f for f in model.functions.values()}


def _is_transpose_2d(node: ir.Node | None) -> bool:
    if node is None or node.op_type != "Transpose" or node.domain != "":
        return False
    perm = node.attributes.get("perm")
    rank = node.inputs[0].shape.rank() if node.inputs[0] and node.inputs[0].shape else None
    return (perm is None and rank == 2) or (perm is not None and list(perm.as_ints()) == [1, 0])


class QuantizeMatMulsPass(ir.passes.InPlacePass):
    """Replace MatMuls with constant weights by ONNX Runtime's quantized ops (com.microsoft).

    Args:
        method: ``int4_block`` (``MatMulNBits``, asymmetric uint4 in blocks along K) or
            ``int8_dynamic`` (``DynamicQuantizeMatMul``, int8 per output column).
        block_size: Block length along K for ``int4_block`` (a power of two ≥ 16).
        exclude: Module paths or function names whose MatMuls stay in float.
    """

    def __init__(self, method: str, block_size: int = 32, exclude: Collection[str] = ()) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"quantize method {method!r} is not one of {', '.join(METHODS)}")
        check_block_size(block_size)
        self.method = method
        self.block_size = block_size
        self.exclude = tuple(exclude)

    # -- finding the weights --------------------------------------------------------------------
    def _leaves(
        self,
        model: ir.Model,
        graph: ir.Graph,
        value: ir.Value,
        sites: dict[ir.OperatorIdentifier, list[ir.Node]],
        functions: dict[int, ir.Function],
    ) -> list[_Leaf] | None:
        """Every constant ``value`` can be, over all call chains; None if one is not constant."""
        if value.is_initializer() and value.const_value is not None:
            return [_Leaf(value.name or "", value.const_value)]
        function = functions.get(id(graph))
        producer = value.producer()
        if producer is not None:
            if producer.op_type != "Constant" or producer.domain != "":
                return None
            attribute = producer.attributes.get("value")
            if attribute is None:
                return None
            path = function.metadata_props.get(META_MODULE_PATH, "") if function else ""
            name = f"{path}.{value.name}" if path else (value.name or "")
            return [_Leaf(name, attribute.as_tensor())]
        if function is None or not value.is_graph_input():
            return None
        index = function.inputs.index(value)
        calls = sites.get(function.identifier(), [])
        if not calls:
            return None
        leaves: list[_Leaf] = []
        for call in calls:
            argument = call.inputs[index] if index < len(call.inputs) else None
            if argument is None or call.graph is None:
                return None
            found = self._leaves(model, call.graph, argument, sites, functions)
            if found is None:
                return None
            leaves.extend(found)
        return leaves

    def _candidates(self, model: ir.Model) -> Iterator[_Candidate]:
        sites = call_sites(model)
        functions = _function_of(model)
        graphs: list[tuple[ir.Graph, ir.Function | None]] = [(model.graph, None)]
        graphs += [(f.graph, f) for f in model.functions.values()]
        for graph, function in graphs:
            if function is not None and self._excluded_function(function):
                continue
            for node in graph:
                if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
                    continue
                b = node.inputs[1]
                if b is None or node.inputs[0] is None:
                    continue
                transposed = _is_transpose_2d(b.producer())
                source = b.producer().inputs[0] if transposed else b  # type: ignore[union-attr]
                if source is None:
                    continue
                leaves = self._leaves(model, graph, source, sites, functions)
                if leaves and self._usable(leaves, node):
                    yield _Candidate(node, graph, source, transposed, leaves)

    def _excluded_function(self, function: ir.Function) -> bool:
        short_class = function.metadata_props.get(META_MODULE_CLASS, "").rsplit(".", 1)[-1]
        path = function.metadata_props.get(META_MODULE_PATH)
        return any(
            e in (function.name, short_class) or (path and _under(path, e)) for e in self.exclude
        )

    def _usable(self, leaves: list[_Leaf], node: ir.Node) -> bool:
        excluded = [leaf.name for leaf in leaves if any(_under(leaf.name, e) for e in self.exclude)]
        if excluded:
            log.info("quantize: %s stays in float (excluded: %s)", node.name, excluded[0])
            return False
        shapes = {tuple(leaf.tensor.shape.numpy()) for leaf in leaves}
        dtypes = {leaf.tensor.dtype for leaf in leaves}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2 or len(dtypes) != 1:
            log.info("quantize: %s stays in float (weights of several shapes)", node.name)
            return False
        if next(iter(dtypes)) not in _FLOATS:
            log.info("quantize: %s stays in float (weight dtype %s)", node.name, dtypes)
            return False
        return True

    # -- rewriting ------------------------------------------------------------------------------
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        candidates = list(self._candidates(model))
        if not candidates:
            return ir.passes.PassResult(model, modified=False)
        threaded: dict[tuple[int, int, bool], list[ir.Value]] = {}
        sites = call_sites(model)
        functions = _function_of(model)
        for candidate in candidates:
            operands = self._thread(
                model,
                candidate.graph,
                candidate.source,
                candidate.transposed,
                threaded,
                sites,
                functions,
            )
            self._replace(model, candidate, operands)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
        PruneFunctionIOPass()(model)  # the float weights' inputs, then dead nodes and initializers
        RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified=True)

    def _tensors(self, tensor: ir.TensorProtocol, transposed: bool) -> list[np.ndarray]:
        weight = tensor.numpy()
        if self.method == INT4_BLOCK:
            q = quantize_int4_blocks(weight if transposed else weight.T, self.block_size)
            return [q.packed, q.scales, q.zero_points]
        c = quantize_int8_columns(weight.T if transposed else weight)
        return [c.weight, c.scales, c.zero_points]

    def _names(self, base: str) -> list[str]:
        tag = "q4" if self.method == INT4_BLOCK else "q8"
        return [f"{base}.{tag}", f"{base}.{tag}_scales", f"{base}.{tag}_zero_points"]

    def _thread(
        self,
        model: ir.Model,
        graph: ir.Graph,
        value: ir.Value,
        transposed: bool,
        done: dict[tuple[int, int, bool], list[ir.Value]],
        sites: dict[ir.OperatorIdentifier, list[ir.Node]],
        functions: dict[int, ir.Function],
    ) -> list[ir.Value]:
        """The quantized form of weight ``value`` as values of ``graph`` (made once per value)."""
        key = (id(graph), id(value), transposed)
        if key in done:
            return done[key]
        names = self._names(value.name or "weight")
        if value.is_initializer() and value.const_value is not None:
            arrays = self._tensors(value.const_value, transposed)
            made = []
            for name, array in zip(names, arrays, strict=True):
                tensor = ir.Tensor(array, name=name)
                new = ir.Value(name=_fresh(name, graph), const_value=tensor)
                new.type, new.shape = ir.TensorType(tensor.dtype), ir.Shape(array.shape)
                graph.register_initializer(new)
                made.append(new)
        elif (producer := value.producer()) is not None:  # a Constant node
            arrays = self._tensors(producer.attributes["value"].as_tensor(), transposed)
            made = []
            for name, array in zip(names, arrays, strict=True):
                tensor = ir.Tensor(array, name=name)
                node = ir.node(
                    "Constant", [], attributes={"value": tensor}, name=f"{name}/Constant"
                )
                node.outputs[0].name = _fresh(name, graph)
                node.outputs[0].type = ir.TensorType(tensor.dtype)
                node.outputs[0].shape = ir.Shape(array.shape)
                graph.insert_after(producer, node)
                made.append(node.outputs[0])
        else:  # a function input: new inputs, fed at every call site
            function = functions[id(graph)]
            index = function.inputs.index(value)
            made = [ir.Value(name=_fresh(name, graph)) for name in names]
            graph.inputs.extend(made)
            for call in sites[function.identifier()]:
                assert call.graph is not None
                outer = call.inputs[index]
                assert outer is not None
                arguments = self._thread(
                    model, call.graph, outer, transposed, done, sites, functions
                )
                count = len(call.inputs)
                call.resize_inputs(count + len(arguments))
                for offset, argument in enumerate(arguments):
                    call.replace_input_with(count + offset, argument)
                for new, outer_value in zip(made, arguments, strict=True):
                    new.type, new.shape = outer_value.type, outer_value.shape
        done[key] = made
        return made

    def _replace(self, model: ir.Model, candidate: _Candidate, operands: list[ir.Value]) -> None:
        node = candidate.node
        shape = candidate.leaves[0].tensor.shape.numpy()
        n, k = shape if candidate.transposed else shape[::-1]
        attributes: dict[str, int] = {}
        if self.method == INT4_BLOCK:
            attributes = {"K": int(k), "N": int(n), "bits": 4, "block_size": self.block_size}
        new = ir.node(
            QUANTIZED_OPS[self.method],
            [node.inputs[0], *operands],
            attributes=attributes,
            domain=MS_DOMAIN,
            name=f"{node.name}/{QUANTIZED_OPS[self.method]}" if node.name else None,
        )
        old = node.outputs[0]
        name, type_, out_shape = old.name, old.type, old.shape
        old.replace_all_uses_with(new.outputs[0], replace_graph_outputs=True)
        old.name = None
        new.outputs[0].name, new.outputs[0].type, new.outputs[0].shape = name, type_, out_shape
        new.meta.update(node.meta)
        new.metadata_props.update(node.metadata_props)
        candidate.graph.insert_before(node, new)
        candidate.graph.remove(node, safe=True)
        if candidate.graph is not model.graph:
            function = _function_of(model)[id(candidate.graph)]
            function.opset_imports.setdefault(MS_DOMAIN, 1)


def _under(path: str, prefix: str) -> bool:
    """True when dotted ``path`` is ``prefix`` or lies under it."""
    return path == prefix or path.startswith(prefix + ".")


def _fresh(name: str, graph: ir.Graph) -> str:
    """``name``, or ``name`` with a suffix when the graph already has a value of that name."""
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    taken |= {o.name for node in graph for o in node.outputs}
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}.{i}", i + 1
    return candidate


def names_a_module(model: ir.Model, name: str) -> bool:
    """Whether ``exclude`` entry ``name`` names something in ``model``: a function (by name or
    module class), or a module path that a function or a weight lies under."""
    for function in model.functions.values():
        short_class = function.metadata_props.get(META_MODULE_CLASS, "").rsplit(".", 1)[-1]
        path = function.metadata_props.get(META_MODULE_PATH, "")
        if name in (function.name, short_class) or (path and _under(path, name)):
            return True
    return any(_under(weight, name) for weight in model.graph.initializers)
