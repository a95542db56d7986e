"""MatMuls that read one activation, packed into one (``rewrite.fuse: onnxruntime``).

A decoder layer's query, key and value projections (and its MLP's gate and up projections) each
multiply the same normalised hidden state by their own constant weight: three ``MatMul`` kernels
where one, over the three weights side by side, computes the same numbers, followed by a
``Split`` along the last axis. onnxruntime-genai's builder packs the projections the same way;
after the quantize stage each packed weight is one ``MatMulNBits``, which at small sizes costs
per call more than per weight (issue 35: 57 quantized MatMuls per decode step against the
builder's 41).

The weights are found as :mod:`matmul_weights` finds them: constants, seen through one 2-D
``Transpose``, in the main graph, as ``Constant`` nodes, or as function inputs fed at every call
site by constants of one shape. A group packs only when its members agree on where their weights
come from at every level (all initializers, all ``Constant`` nodes, or all inputs of the same
function fed by such at every call: :func:`_kind`), on dtype, transposition and the contracted
size ``K``. The
packed weight is a new initializer (or ``Constant``) per call chain; through a function it is
one new function input in place of the members' inputs, so a function shared by 16 layers stays
one function with 16 calls. The old weights go once nothing reads them.

Numbers: each output column is the same dot product over the same ``K`` values as before, so
the result differs from the unpacked model only by the kernel's blocking (float rounding); the
check compares every call site with torch.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from hyperexport.library.passes.call_sites import call_sites
from hyperexport.library.passes.matmul_weights import (
    Candidate,
    MatMulWeightsPass,
    _remove_dead,
    function_of,
)
from hyperexport.library.tensor_bytes import stacked
from hyperexport.library.tensor_slots import attribute_tensor

log = logging.getLogger(__name__)


def packed_name(names: list[str]) -> str:
    """The packed weight's name from its members' dotted names:
    ``a.q_proj.weight``, ``a.k_proj.weight`` -> ``a.q_proj+k_proj.weight``."""
    parts = [n.split(".") for n in names]
    prefix = 0
    while all(len(p) > prefix + 1 for p in parts) and len({p[prefix] for p in parts}) == 1:
        prefix += 1
    suffix = 0
    while (
        all(len(p) > prefix + suffix + 1 for p in parts)
        and len({p[-1 - suffix] for p in parts}) == 1
    ):
        suffix += 1
    middle = "+".join(".".join(p[prefix : len(p) - suffix]) for p in parts)
    head, tail = parts[0][:prefix], parts[0][len(parts[0]) - suffix :] if suffix else []
    return ".".join([*head, middle, *tail])


class PackMatMulsPass(MatMulWeightsPass):
    """Pack the MatMuls of a graph that read the same activation into one MatMul and a Split.

    Args:
        exclude: Module paths or function names whose MatMuls stay as they are.
    """

    label = "pack"
    weight_dtypes = None  # packing moves bytes: any dtype

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sites = call_sites(model)
        functions = function_of(model)
        self._taken = {}
        self._made: dict[tuple[int, ...], ir.Value] = {}
        groups: dict[tuple[object, ...], list[Candidate]] = {}
        for candidate in self._candidates(model, sites, functions):
            tensor = candidate.leaves[0].tensor
            k = int(tensor.shape.numpy()[1 if candidate.transposed else 0])
            a = candidate.node.inputs[0]
            kind = _kind(candidate.graph, candidate.source, sites, functions)
            key = (id(candidate.graph), id(a), candidate.transposed, tensor.dtype, k, kind)
            groups.setdefault(key, []).append(candidate)
        packed = 0
        old_weights: list[tuple[ir.Graph, ir.Value]] = []
        for group in groups.values():
            sources = [c.source for c in group]
            if len(group) < 2 or len({id(s) for s in sources}) < len(sources):
                continue
            weight = self._packed(group[0].graph, sources, group[0].transposed, sites, functions)
            old_weights.extend((c.graph, c.node.inputs[1]) for c in group)  # type: ignore[misc]
            self._replace_group(model, group, weight)
            packed += 1
        if not packed:
            return ir.passes.PassResult(model, modified=False)
        _remove_dead(old_weights, sites, functions)
        log.info("pack: %d groups of MatMuls on one input packed", packed)
        return ir.passes.PassResult(model, modified=True)

    # -- the packed weight ----------------------------------------------------------------------
    def _packed(
        self,
        graph: ir.Graph,
        values: list[ir.Value],
        transposed: bool,
        sites: dict[ir.OperatorIdentifier, list[ir.Node]],
        functions: dict[int, ir.Function],
    ) -> ir.Value:
        """The members' weights ``values`` side by side, as one value of ``graph``: along the
        output axis (0 of ``[N, K]`` when ``transposed``, else 1 of ``[K, N]``)."""
        key = (id(graph), *map(id, values))
        if key in self._made:  # the same weights, packed at another call site
            return self._made[key]
        axis = 0 if transposed else 1
        name = packed_name([v.name or "weight" for v in values])
        producers = [v.producer() for v in values]
        if all(v.is_initializer() for v in values):
            made = _lazy_initializer(graph, self._fresh(name, graph), values, axis)
        elif all(p is not None for p in producers):  # Constant nodes (per_instance's weights)
            made = _packed_constant(graph, self._fresh(name, graph), producers, axis)  # type: ignore[arg-type]
        else:  # inputs of this function, of one kind (_kind): one input, fed at every call
            function = functions[id(graph)]
            indices = [function.inputs.index(v) for v in values]
            made = ir.Value(name=self._fresh(name, graph))
            graph.inputs.append(made)
            for call in sites[function.identifier()]:
                assert call.graph is not None
                outer = [call.inputs[i] for i in indices]
                argument = self._packed(call.graph, outer, transposed, sites, functions)  # type: ignore[arg-type]
                count = len(call.inputs)
                call.resize_inputs(count + 1)
                call.replace_input_with(count, argument)
                made.type, made.shape = argument.type, argument.shape
        self._made[key] = made
        return made

    def _replace_group(self, model: ir.Model, group: list[Candidate], weight: ir.Value) -> None:
        """One MatMul over ``weight`` (through a Transpose when the members had one) and a Split
        of its last axis into the members' outputs, where the first member was."""
        graph, first = group[0].graph, group[0].node
        activation = first.inputs[0]
        assert activation is not None
        sizes = [int(c.leaves[0].tensor.shape.numpy()[0 if c.transposed else 1]) for c in group]
        base = first.name or "MatMul"
        nodes = []
        if group[0].transposed:
            transpose = ir.Node(
                "",
                "Transpose",
                [weight],
                [ir.AttrInt64s("perm", [1, 0])],
                name=f"{base}/packed_Transpose",
            )
            nodes.append(transpose)
            weight = transpose.outputs[0]
        matmul = ir.Node("", "MatMul", [activation, weight], name=f"{base}/packed")
        split_sizes = ir.Node(
            "",
            "Constant",
            [],
            [ir.AttrTensor("value", ir.Tensor(np.array(sizes, dtype=np.int64), name="split"))],
            name=f"{base}/packed_sizes",
        )
        split = ir.Node(
            "",
            "Split",
            [matmul.outputs[0], split_sizes.outputs[0]],
            [ir.AttrInt64("axis", -1)],
            num_outputs=len(group),
            name=f"{base}/packed_Split",
        )
        nodes += [matmul, split_sizes, split]
        matmul.outputs[0].type = first.outputs[0].type
        matmul.meta.update(first.meta)
        matmul.metadata_props.update(first.metadata_props)
        graph.insert_before(first, nodes)
        for candidate, out in zip(group, split.outputs, strict=True):
            old = candidate.node.outputs[0]
            name, type_, shape = old.name, old.type, old.shape
            old.replace_all_uses_with(out, replace_graph_outputs=True)
            old.name = None
            out.name, out.type, out.shape = name, type_, shape
            graph.remove(candidate.node, safe=True)


def _lazy_initializer(graph: ir.Graph, name: str, values: list[ir.Value], axis: int) -> ir.Value:
    """A main-graph initializer holding ``values``' tensors side by side along ``axis``,
    computed only when read: saving writes it from the members' tensors one packed weight at a
    time, so the pass holds no copy of the weights (at 1B, gate and up alone are half of them).
    Along axis 0 (``[N, K]`` weights, torch's layout) its bytes are the members' bytes in
    order: where those are consecutive in the export's data file (they are, as the export
    writes them) the packed weight is that range of the file and nothing is written for it;
    else saving copies the members' ranges inside the kernel
    (:func:`~hyperexport.library.tensor_bytes.stacked`)."""
    members: list[ir.TensorProtocol] = [v.const_value for v in values if v.const_value is not None]
    assert len(members) == len(values)  # initializers with values (_kind)
    tensor: ir.TensorProtocol
    if axis == 0:
        tensor = stacked(members, name)
    else:
        shape: list[int] = [int(d) for d in members[0].shape.numpy()]
        shape[axis] = sum(int(m.shape.numpy()[axis]) for m in members)

        def packed() -> ir.TensorProtocol:
            return ir.tensor(np.concatenate([m.numpy() for m in members], axis=axis), name=name)

        tensor = ir.LazyTensor(packed, dtype=members[0].dtype, shape=ir.Shape(shape), name=name)
    value = ir.Value(name=name, const_value=tensor)
    value.type, value.shape = ir.TensorType(tensor.dtype), ir.Shape(tensor.shape.numpy())
    graph.register_initializer(value)
    return value


def _packed_constant(graph: ir.Graph, name: str, producers: list[ir.Node], axis: int) -> ir.Value:
    """One ``Constant`` node holding the ``producers``' constants side by side along ``axis``,
    after the last of them."""
    arrays = [attribute_tensor(p.attributes["value"]).numpy() for p in producers]
    tensor = ir.Tensor(np.concatenate(arrays, axis=axis), name=name)
    node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=f"{name}/Constant")
    node.outputs[0].name = name
    node.outputs[0].type = ir.TensorType(tensor.dtype)
    node.outputs[0].shape = ir.Shape(tensor.shape.numpy())
    graph.insert_after(producers[-1], node)
    return node.outputs[0]


def _kind(
    graph: ir.Graph,
    value: ir.Value,
    sites: dict[ir.OperatorIdentifier, list[ir.Node]],
    functions: dict[int, ir.Function],
) -> tuple[object, ...]:
    """Where weight ``value`` comes from, at every level of every call chain: an initializer, a
    ``Constant`` node, or a function input (with the kinds of its argument at each call site).
    Weights of one kind in one graph can be packed into one value of that graph."""
    if value.is_initializer():
        return ("initializer",)
    if value.producer() is not None:
        return ("constant",)
    function = functions[id(graph)]
    index = function.inputs.index(value)
    return (
        "input",
        tuple(
            _kind(call.graph, call.inputs[index], sites, functions)  # type: ignore[arg-type]
            for call in sites[function.identifier()]
        ),
    )
