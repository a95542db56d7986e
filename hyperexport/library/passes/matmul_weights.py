"""What the passes that rewrite MatMul weights share: finding them, and threading a derived
form of each weight to where it is read, through functions and their call sites.

A MatMul's weight is its ``B`` when that is a constant, seen through at most one 2-D
``Transpose`` (torch's ``Linear`` exports ``MatMul(x, Transpose(W))``). Where it comes from
decides where the derived tensors go:

* a main-graph initializer: new initializers;
* a ``Constant`` node in a function (per_instance's baked weights): new ``Constant`` nodes there,
  or, with ``lift_constants``, new main-graph initializers passed down as function inputs;
* a function input: new function inputs, one per derived tensor, fed at every call site from
  the caller's own source of that weight, recursively (an MLP nested in a decoder layer gets its
  weights through the layer's inputs). Only when every call site reaches a constant of the same
  shape is the weight rewritten, so a function shared by 16 layers stays one function with 16
  calls.

The old weights that no longer have a reader go, walking back from each rewritten MatMul's old
weight: the ``Transpose`` and ``Constant`` nodes that fed only it, initializers, and function
inputs with the call sites' arguments (recursively, through nested calls). Only what the pass
made dead is visited, not the whole model (the quantize stage's time, issue 35).

``exclude`` keeps MatMuls as they are by module path (``lm_head``, ``layers.0.mlp``: a weight
whose dotted name is the path or lies under it, at any call site) or by function name (every
MatMul in the body of a function of that name, ``LlamaMLP``, or of that module class's short
name).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.names import META_MODULE_CLASS, META_MODULE_PATH
from hyperexport.library.passes.call_sites import call_sites, drop_inputs
from hyperexport.library.passes.ir_build import fresh_name, unique_name, value_names
from hyperexport.library.tensor_slots import attribute_tensor

log = logging.getLogger(__name__)

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class _Leaf:
    """One constant a weight value can be at run time: its dotted module name and tensor."""

    name: str
    tensor: ir.TensorProtocol
    constant: bool = False  # a Constant node's value (else a main-graph initializer)


@dataclass
class Candidate:
    node: ir.Node
    graph: ir.Graph
    source: ir.Value  # the weight as it enters this graph: [N, K] if transposed, else [K, N]
    transposed: bool
    leaves: list[_Leaf] = field(default_factory=list)


def function_of(model: ir.Model) -> dict[int, ir.Function]:
    return {id(f.graph): f for f in model.functions.values()}


def _is_transpose_2d(node: ir.Node | None) -> bool:
    if node is None or node.op_type != "Transpose" or node.domain != "":
        return False
    perm = node.attributes.get("perm")
    rank = node.inputs[0].shape.rank() if node.inputs[0] and node.inputs[0].shape else None
    return (perm is None and rank == 2) or (perm is not None and list(perm.as_ints()) == [1, 0])


class MatMulWeightsPass(ir.passes.InPlacePass):
    """Base of the passes that replace MatMul weights by tensors derived from them.

    Subclasses say what the derived tensors are (``_tensors``, ``_names``) and what replaces the
    MatMul (``_replace``); ``_skip`` may leave candidates alone.

    Args:
        exclude: Module paths or function names whose MatMuls stay as they are.
    """

    #: Constant weights in functions become main-graph initializers fed through inputs.
    lift_constants = False
    #: What log lines call the pass.
    label = "matmul weights"
    #: The weight dtypes the pass rewrites; None: any.
    weight_dtypes: frozenset[ir.DataType] | None = frozenset(_FLOATS)

    def __init__(self, exclude: Collection[str] = ()) -> None:
        super().__init__()
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
            return [_Leaf(name, attribute_tensor(attribute), constant=True)]
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

    def _candidates(
        self,
        model: ir.Model,
        sites: dict[ir.OperatorIdentifier, list[ir.Node]],
        functions: dict[int, ir.Function],
    ) -> Iterator[Candidate]:
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
                if not leaves or not self._usable(leaves, node):
                    continue
                candidate = Candidate(node, graph, source, transposed, leaves)
                if self._wanted(candidate):
                    yield candidate

    def _excluded_function(self, function: ir.Function) -> bool:
        short_class = function.metadata_props.get(META_MODULE_CLASS, "").rsplit(".", 1)[-1]
        path = function.metadata_props.get(META_MODULE_PATH)
        return any(
            e in (function.name, short_class) or (path and under(path, e)) for e in self.exclude
        )

    def _usable(self, leaves: list[_Leaf], node: ir.Node) -> bool:
        excluded = [leaf.name for leaf in leaves if any(under(leaf.name, e) for e in self.exclude)]
        if excluded:
            log.info("%s: %s left as it is (excluded: %s)", self.label, node.name, excluded[0])
            return False
        shapes = {tuple(leaf.tensor.shape.numpy()) for leaf in leaves}
        dtypes = {leaf.tensor.dtype for leaf in leaves}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2 or len(dtypes) != 1:
            log.info("%s: %s left as it is (weights of several shapes)", self.label, node.name)
            return False
        if self.weight_dtypes is not None and next(iter(dtypes)) not in self.weight_dtypes:
            log.info("%s: %s left as it is (weight dtype %s)", self.label, node.name, dtypes)
            return False
        return True

    # -- rewriting ------------------------------------------------------------------------------
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sites = call_sites(model)
        functions = function_of(model)
        candidates = list(self._candidates(model, sites, functions))
        if not candidates:
            return ir.passes.PassResult(model, modified=False)
        threaded: dict[tuple[int, int, bool], list[ir.Value]] = {}
        self._taken: dict[int, set[str]] = {}
        old_weights: list[tuple[ir.Graph, ir.Value]] = []
        for candidate in candidates:
            weight = candidate.node.inputs[1]
            assert weight is not None  # a candidate's MatMul has its two inputs
            old_weights.append((candidate.graph, weight))
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
        _remove_dead(old_weights, sites, functions)
        return ir.passes.PassResult(model, modified=True)

    def _fresh(self, name: str, graph: ir.Graph) -> str:
        """``ir_build.fresh_name``, with the graph's names gathered once per call of the pass."""
        taken = self._taken.get(id(graph))
        if taken is None:
            taken = self._taken[id(graph)] = value_names(graph)
        fresh = unique_name(name, taken)
        taken.add(fresh)
        return fresh

    def _wanted(self, candidate: Candidate) -> bool:
        """Whether to rewrite ``candidate`` (a subclass leaves ones already in its form)."""
        return True

    def _tensors(self, tensor: ir.TensorProtocol, transposed: bool) -> list[np.ndarray]:
        """The arrays that stand for weight ``tensor`` (``[N, K]`` if ``transposed``)."""
        raise NotImplementedError

    def _names(self, base: str) -> list[str]:
        """Their names, from the weight's name ``base``."""
        raise NotImplementedError

    def _replace(self, model: ir.Model, candidate: Candidate, operands: list[ir.Value]) -> None:
        """Replace ``candidate``'s MatMul by what reads ``operands``."""
        raise NotImplementedError

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
        """The derived form of weight ``value`` as values of ``graph`` (made once per value)."""
        key = (id(graph), id(value), transposed)
        if key in done:
            return done[key]
        names = self._names(value.name or "weight")
        if value.is_initializer() and value.const_value is not None:
            arrays = self._tensors(value.const_value, transposed)
            made = _initializers(graph, names, arrays, self._fresh)
        elif (producer := value.producer()) is not None and self.lift_constants:
            weight = attribute_tensor(producer.attributes["value"])
            made = self._provide(graph, self._tensors(weight, transposed), names, sites, functions)
        elif producer is not None:  # a Constant node: new Constant nodes beside it
            arrays = self._tensors(attribute_tensor(producer.attributes["value"]), transposed)
            made = []
            for name, array in zip(names, arrays, strict=True):
                tensor = ir.Tensor(array, name=name)
                node = ir.Node(
                    "", "Constant", [], [ir.AttrTensor("value", tensor)], name=f"{name}/Constant"
                )
                node.outputs[0].name = self._fresh(name, graph)
                node.outputs[0].type = ir.TensorType(tensor.dtype)
                node.outputs[0].shape = ir.Shape(array.shape)
                graph.insert_after(producer, node)
                made.append(node.outputs[0])
        else:  # a function input: new inputs, fed at every call site
            function = functions[id(graph)]
            index = function.inputs.index(value)
            made = [ir.Value(name=self._fresh(name, graph)) for name in names]
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

    def _provide(
        self,
        graph: ir.Graph,
        arrays: list[np.ndarray],
        names: list[str],
        sites: dict[ir.OperatorIdentifier, list[ir.Node]],
        functions: dict[int, ir.Function],
        absolute: bool = False,
    ) -> list[ir.Value]:
        """``arrays`` as values of ``graph``: main-graph initializers, passed down as new inputs
        of every function on the way (``lift_constants``). The initializers' names are the
        weight's module path (``names`` are local to ``graph`` until ``absolute``)."""
        function = functions.get(id(graph))
        if function is None:  # the main graph
            return _initializers(graph, names, arrays, self._fresh)
        path = "" if absolute else function.metadata_props.get(META_MODULE_PATH, "")
        outer = [f"{path}.{name}" for name in names] if path else names
        made = [ir.Value(name=self._fresh(name, graph)) for name in names]
        graph.inputs.extend(made)
        for call in sites[function.identifier()]:
            assert call.graph is not None
            arguments = self._provide(
                call.graph, arrays, outer, sites, functions, absolute or bool(path)
            )
            count = len(call.inputs)
            call.resize_inputs(count + len(arguments))
            for offset, argument in enumerate(arguments):
                call.replace_input_with(count + offset, argument)
            for new, argument in zip(made, arguments, strict=True):
                new.type, new.shape = argument.type, argument.shape
        return made


def under(path: str, prefix: str) -> bool:
    """True when dotted ``path`` is ``prefix`` or lies under it."""
    return path == prefix or path.startswith(prefix + ".")


def _remove_dead(
    values: list[tuple[ir.Graph, ir.Value]],
    sites: dict[ir.OperatorIdentifier, list[ir.Node]],
    functions: dict[int, ir.Function],
) -> None:
    """Remove what computed ``values`` when nothing reads them any more, walking back: the
    nodes whose outputs all went unread, unread initializers, and unread function inputs with
    the argument at every call site (whose own source is then visited in the caller)."""
    stack = list(values)
    while stack:
        graph, value = stack.pop()
        if value.uses() or value.is_graph_output():
            continue
        producer = value.producer()
        if producer is not None:
            if producer.graph is graph and not any(
                o.uses() or o.is_graph_output() for o in producer.outputs
            ):
                feeding = [v for v in producer.inputs if v is not None]
                graph.remove(producer, safe=True)
                stack.extend((graph, v) for v in feeding)
        elif value.is_initializer():
            name = value.name
            if name is not None and graph.initializers.get(name) is value:
                del graph.initializers[name]
        elif value.is_graph_input() and (function := functions.get(id(graph))) is not None:
            index = graph.inputs.index(value)
            for call in sites[function.identifier()]:
                argument = call.inputs[index] if index < len(call.inputs) else None
                drop_inputs(call, (index,))
                if argument is not None and call.graph is not None:
                    stack.append((call.graph, argument))
            graph.inputs.pop(index)


def _initializers(
    graph: ir.Graph,
    names: list[str],
    arrays: list[np.ndarray],
    fresh: Callable[[str, ir.Graph], str] = fresh_name,
) -> list[ir.Value]:
    """``arrays`` as new initializers of the main graph ``graph``, named after ``names``
    (made unique by ``fresh``)."""
    made = []
    for name, array in zip(names, arrays, strict=True):
        tensor = ir.Tensor(array, name=name)
        new = ir.Value(name=fresh(name, graph), const_value=tensor)
        new.type, new.shape = ir.TensorType(tensor.dtype), ir.Shape(array.shape)
        graph.register_initializer(new)
        made.append(new)
    return made
