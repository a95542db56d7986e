"""Move constants that every call of a function passes into the function body.

A local function input is *fusable* when, at every call site of the function (in the main graph,
in other functions, and in subgraphs of either), the value passed is a constant:

* an initializer that is not also a graph input (a graph input with a default may be overridden
  at run time, so it is not a constant), or
* the output of a default-domain ``Constant`` node.

With one call site any constant qualifies; with several, all of them must hold the same tensor
(same dtype, shape and bytes). The constant then becomes a ``Constant`` node at the top of the
function body, and the input is removed from the function and from every call site. Initializers
and ``Constant`` nodes that no longer have a consumer are removed.

Why: a function whose input is always the same constant (a mask, a scale, a shape) is easier to
read, to optimise and to run on its own when the constant lives inside it. Per-type functions
take each instance's weights as inputs; those differ between call sites and are left alone.
Weights that happen to be identical at every call site (freshly initialised norms are all ones)
are fused like any other constant: the model computes the same thing either way.

The pass repeats until nothing changes, so a constant fused into an outer function that passes it
on to an inner function is fused into the inner function in a later round. An input that the
body hands on to another function is fused only if that function's input will be fused too
(judged through the whole call chain first): otherwise the constant would merely move from one
call site to another, and in per-type mode a weight would be cut off from the main-graph
initializer that the manifest resolves it to.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from hyperexport.base.errors import RewriteError
from hyperexport.library.passes.call_sites import call_sites, drop_inputs

log = logging.getLogger(__name__)

FunctionId = tuple[str, str, str]


def _is_constant_node(node: ir.Node | None) -> bool:
    return (
        node is not None
        and node.domain == ""
        and node.op_type == "Constant"
        and len(node.outputs) == 1
        and len(node.attributes) == 1
        and not next(iter(node.attributes.values())).is_ref()
    )


def _constant(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor ``value`` always holds, or None if it is not a constant."""
    if value is None:
        return None
    if value.is_initializer():
        if value.is_graph_input():
            return None  # an overridable default, not a constant
        return value.const_value
    if not _is_constant_node(value.producer()):
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except ValueError:  # e.g. sparse_value: not something we can compare or move
        return None


def _same(a: ir.TensorProtocol, b: ir.TensorProtocol) -> bool:
    if a is b:
        return True
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.dtype == ir.DataType.STRING:
        return bool(a.numpy().tolist() == b.numpy().tolist())
    return a.tobytes() == b.tobytes()


def _discard_if_unused(value: ir.Value) -> None:
    """Remove the initializer or Constant node behind ``value`` once nothing reads it."""
    if value.uses() or value.is_graph_output() or value.is_graph_input():
        return
    graph = value.graph
    if value.is_initializer():
        if graph is not None and value.name is not None:
            graph.initializers.pop(value.name, None)
        return
    producer = value.producer()
    if producer is not None and producer.graph is not None:
        producer.graph.remove(producer, safe=True)


Slot = tuple[FunctionId, int]


class _ConstantSlots:
    """Which function inputs hold one constant at every call, seen through the call chain.

    A call site's argument counts as constant if it is a constant, or if it is an input of the
    enclosing function that is itself constant at every call of that function. This sees through
    fusions that later rounds would make, so :meth:`fusable` can refuse a fusion that would leave
    a constant passed on to a function input that stays an input.
    """

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.sites = call_sites(model)
        self.owner = {id(f.graph): ident for ident, f in model.functions.items()}
        self._memo: dict[Slot, ir.TensorProtocol | None] = {}

    def value(self, slot: Slot) -> ir.TensorProtocol | None:
        """The tensor input ``slot`` holds whenever the function runs, or None."""
        if slot in self._memo:
            return self._memo[slot]
        self._memo[slot] = None  # the call graph is acyclic; this only guards malformed models
        ident, index = slot
        first: ir.TensorProtocol | None = None
        for node in self.sites[ident]:
            tensor = self._argument(node, index)
            if tensor is None or (first is not None and not _same(first, tensor)):
                return None
            if first is None:
                first = tensor
        self._memo[slot] = first
        return first

    def _argument(self, node: ir.Node, index: int) -> ir.TensorProtocol | None:
        if index >= len(node.inputs):
            return None
        actual = node.inputs[index]
        tensor = _constant(actual)
        if tensor is not None or actual is None or not actual.is_graph_input():
            return tensor
        ident = self.owner.get(id(actual.graph))
        if ident is None:  # an input of the main graph
            return None
        return self.value((ident, self.model.functions[ident].inputs.index(actual)))

    def fusable(self) -> set[Slot]:
        """Constant inputs whose every use as a call argument is itself fusable.

        Fusing an input that the body hands on to another function, whose input stays (its call
        sites disagree), would only move the constant from one call site to another. In per-type
        mode it would also cut a weight off from the main-graph initializer that the manifest
        resolves it to.
        """
        slots = {
            (ident, index)
            for ident, function in self.model.functions.items()
            for index in range(len(function.inputs))
            if self.value((ident, index)) is not None
        }
        while True:
            refused = {slot for slot in slots if not self._uses_fusable(slot, slots)}
            if not refused:
                return slots
            slots -= refused

    def _uses_fusable(self, slot: Slot, slots: set[Slot]) -> bool:
        ident, index = slot
        formal = self.model.functions[ident].inputs[index]
        for use in formal.uses():
            callee = use.node.op_identifier()
            if callee in self.model.functions and (callee, use.idx) not in slots:
                return False
        return True


class FuseConstantsIntoFunctionsPass(ir.passes.InPlacePass):
    """Fuse function inputs that are the same constant at every call site into the function.

    Args:
        default_opset: Default-domain opset a function gets if it does not import the default
            domain yet (it needs it for the ``Constant`` node). ``None`` takes the model's.
    """

    def __init__(self, default_opset: int | None = None) -> None:
        super().__init__()
        self.default_opset = default_opset

    def requires(self, model: ir.Model) -> None:
        for ident, nodes in call_sites(model).items():
            expected = len(model.functions[ident].inputs)
            for node in nodes:
                if len(node.inputs) > expected:
                    raise ir.passes.PreconditionError(
                        f"FuseConstantsIntoFunctionsPass: node {node.name!r} passes "
                        f"{len(node.inputs)} inputs to function {ident[1]!r}, which has {expected}"
                    )
        if self.default_opset is None and "" not in model.opset_imports and model.functions:
            raise ir.passes.PreconditionError(
                "FuseConstantsIntoFunctionsPass: the model does not import the default domain; "
                "give default_opset"
            )

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        total = 0
        while True:
            fused = self._fuse_round(model)
            if not fused:
                break
            total += fused
        if total:
            log.debug("fuse_constants: moved %d constant inputs into function bodies", total)
        return ir.passes.PassResult(model, modified=bool(total))

    def _fuse_round(self, model: ir.Model) -> int:
        fused = 0
        if not model.functions:
            return 0
        opset = self.default_opset or model.opset_imports.get("")
        if opset is None:  # requires() rules this out; keeps the type checker informed
            raise RewriteError("FuseConstantsIntoFunctionsPass: no default-domain opset")
        slots = _ConstantSlots(model)
        fusable = slots.fusable()
        for ident, function in model.functions.items():
            nodes = slots.sites[ident]
            for index in reversed(range(len(function.inputs))):
                if (ident, index) not in fusable:
                    continue
                tensor = self._shared_constant(nodes, index)
                if tensor is None:
                    continue
                self._fuse(function, index, tensor, nodes, opset)
                fused += 1
        return fused

    @staticmethod
    def _shared_constant(nodes: list[ir.Node], index: int) -> ir.TensorProtocol | None:
        """The tensor every call site passes at ``index``, or None if they do not agree."""
        first: ir.TensorProtocol | None = None
        for node in nodes:
            if index >= len(node.inputs):
                return None
            tensor = _constant(node.inputs[index])
            if tensor is None or (first is not None and not _same(first, tensor)):
                return None
            if first is None:
                first = tensor
        return first

    @staticmethod
    def _fuse(
        function: ir.Function,
        index: int,
        tensor: ir.TensorProtocol,
        nodes: list[ir.Node],
        opset: int,
    ) -> None:
        graph = function.graph
        formal = graph.inputs[index]
        name = formal.name
        constant = ir.node(
            "Constant", [], attributes={"value": tensor}, name=f"{name or index}/Constant"
        )
        out = constant.outputs[0]
        out.type, out.shape = ir.TensorType(tensor.dtype), ir.Shape(tensor.shape.numpy())
        if len(graph):
            graph.insert_before(graph[0], constant)
        else:
            graph.append(constant)
        formal.replace_all_uses_with(out, replace_graph_outputs=True)
        graph.inputs.pop(index)
        formal.name = None
        out.name = name
        if "" not in graph.opset_imports:
            graph.opset_imports[""] = opset
        actuals = [node.inputs[index] for node in nodes]
        for node in nodes:
            drop_inputs(node, (index,))
        for value in {id(v): v for v in actuals if v is not None}.values():
            _discard_if_unused(value)
        log.debug(
            "fuse_constants: input %r of function %s is a constant at all %d call sites",
            name,
            function.name,
            len(nodes),
        )
