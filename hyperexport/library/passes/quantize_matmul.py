"""Quantize the weights of MatMuls where they are, inside local functions included.

Each MatMul with a constant weight (``passes/matmul_weights.py`` says which, and how the
quantized tensors reach it through functions and call sites) becomes ONNX Runtime's
``MatMulNBits`` (int4 blocks) or ``DynamicQuantizeMatMul`` (int8 columns), both in
``com.microsoft``; the numbers are ``passes/quantize_weights.py``'s. A function shared by 16
layers stays one function with 16 calls, its body holding the quantized op and each call passing
its layer's quantized weights. Excluded MatMuls (``exclude``) stay in float.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.names import META_MODULE_CLASS, META_MODULE_PATH, QUANTIZED_DOMAIN
from hyperexport.library.defaults import ACCURACY_LEVELS, DEFAULT_ACCURACY_LEVEL
from hyperexport.library.passes.matmul_weights import (
    Candidate,
    MatMulWeightsPass,
    function_of,
    under,
)
from hyperexport.library.passes.quantize_weights import (
    INT4_BLOCK,
    INT8_DYNAMIC,
    METHODS,
    check_block_size,
    quantize_int4_blocks,
    quantize_int8_columns,
)

MS_DOMAIN = QUANTIZED_DOMAIN
#: The op each method makes, in :data:`MS_DOMAIN`.
QUANTIZED_OPS = {INT4_BLOCK: "MatMulNBits", INT8_DYNAMIC: "DynamicQuantizeMatMul"}


class QuantizeMatMulsPass(MatMulWeightsPass):
    """Replace MatMuls with constant weights by ONNX Runtime's quantized ops (com.microsoft).

    Args:
        method: ``int4_block`` (``MatMulNBits``, uint4 in blocks along K) or
            ``int8_dynamic`` (``DynamicQuantizeMatMul``, int8 per output column).
        block_size: Block length along K for ``int4_block`` (a power of two ≥ 16).
        exclude: Module paths or function names whose MatMuls stay in float.
        accuracy_level: ``MatMulNBits``' ``accuracy_level``: the least precision of its
            activations (0 unset, 1 float32, 2 float16, 3 bfloat16, 4 int8); 4 is what
            onnxruntime-genai's builder sets on CPU, where ONNX Runtime then multiplies int8
            blocks. ``int4_block`` only.
        symmetric: Symmetric int4 blocks, without zero points (the builder's CPU default;
            ``quantize_weights``). ``int4_block`` only.
        shared_embedding: A main-graph ``Gather`` (axis 0) of a weight that a quantized
            ``MatMul`` of the main graph reads as ``[N, K]`` (tied embeddings: the table and
            ``lm_head``) gathers the quantized rows instead (``GatherBlockQuantized``, the
            builder's ``shared_embeddings``), and the float table leaves the model.
            ``int4_block`` only.
    """

    label = "quantize"

    def __init__(
        self,
        method: str,
        block_size: int = 32,
        exclude: Collection[str] = (),
        accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
        symmetric: bool = False,
        shared_embedding: bool = False,
    ) -> None:
        super().__init__(exclude)
        if method not in METHODS:
            raise ValueError(f"quantize method {method!r} is not one of {', '.join(METHODS)}")
        check_block_size(block_size)
        if accuracy_level not in ACCURACY_LEVELS:
            raise ValueError(
                f"accuracy_level {accuracy_level} is not one of "
                f"{', '.join(map(str, ACCURACY_LEVELS))}"
            )
        self.method = method
        self.block_size = block_size
        self.accuracy_level = accuracy_level
        self.symmetric = symmetric and method == INT4_BLOCK
        if shared_embedding and method != INT4_BLOCK:
            raise ValueError(f"shared_embedding needs int4_block, not {method!r}")
        self.shared_embedding = shared_embedding
        # Main-graph weights read as [N, K], by id: the weight and its quantized operands.
        self._main_rows: dict[int, tuple[ir.Value, list[ir.Value]]] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._main_rows = {}
        result = super().call(model)
        if result.modified:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            if self.shared_embedding:
                share_quantized_rows(model, self._main_rows, self.block_size, self._fresh)
        return result

    def _tensors(self, tensor: ir.TensorProtocol, transposed: bool) -> list[np.ndarray]:
        arrays = self._quantized(tensor.numpy(), transposed)
        if isinstance(tensor, ir.ExternalTensor):
            # Unmap the float weight once it is quantized (read again if a later use needs it,
            # as a tied embedding's Gather does): otherwise every weight the pass reads stays
            # mapped and resident until the model is dropped, 1x the float weights at 1B.
            tensor.release()
        return arrays

    def _quantized(self, weight: np.ndarray, transposed: bool) -> list[np.ndarray]:
        if self.method == INT4_BLOCK:
            q = quantize_int4_blocks(
                weight if transposed else weight.T, self.block_size, self.symmetric
            )
            return q.arrays()
        c = quantize_int8_columns(weight.T if transposed else weight)
        return [c.weight, c.scales, c.zero_points]

    def _names(self, base: str) -> list[str]:
        tag = "q4" if self.method == INT4_BLOCK else "q8"
        names = [f"{base}.{tag}", f"{base}.{tag}_scales", f"{base}.{tag}_zero_points"]
        return names[:2] if self.symmetric else names

    def _replace(self, model: ir.Model, candidate: Candidate, operands: list[ir.Value]) -> None:
        source = candidate.source
        if candidate.graph is model.graph and candidate.transposed and source.is_initializer():
            self._main_rows[id(source)] = (source, operands)  # for shared_embedding
        node = candidate.node
        shape = candidate.leaves[0].tensor.shape.numpy()
        n, k = shape if candidate.transposed else shape[::-1]
        attributes: list[ir.Attr] = []
        if self.method == INT4_BLOCK:
            ints = {"K": int(k), "N": int(n), "bits": 4, "block_size": self.block_size}
            if self.accuracy_level:  # 0: ONNX Runtime's default, the attribute left out
                ints["accuracy_level"] = self.accuracy_level
            attributes = [ir.AttrInt64(name, value) for name, value in ints.items()]
        # ir.Node, not ir.node: no attribute type inference (a tenth of the pass's time).
        new = ir.Node(
            MS_DOMAIN,
            QUANTIZED_OPS[self.method],
            [node.inputs[0], *operands],
            attributes,
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
            function = function_of(model)[id(candidate.graph)]
            function.opset_imports.setdefault(MS_DOMAIN, 1)


def names_a_module(model: ir.Model, name: str) -> bool:
    """Whether ``exclude`` entry ``name`` names something in ``model``: a function (by name or
    module class), or a module path that a function or a weight lies under."""
    for function in model.functions.values():
        short_class = function.metadata_props.get(META_MODULE_CLASS, "").rsplit(".", 1)[-1]
        path = function.metadata_props.get(META_MODULE_PATH, "")
        if name in (function.name, short_class) or (path and under(path, name)):
            return True
    return any(under(weight, name) for weight in model.graph.initializers)


def share_quantized_rows(
    model: ir.Model,
    rows: dict[int, tuple[ir.Value, list[ir.Value]]],
    block_size: int,
    fresh: Callable[[str, ir.Graph], str],
) -> int:
    """Make each main-graph ``Gather`` (axis 0) of a weight in ``rows`` (a float ``[N, K]``
    table whose int4 blocks ``MatMulNBits`` reads) a ``GatherBlockQuantized`` of those blocks,
    and drop the float table when nothing else reads it. Returns how many were replaced.

    ``MatMulNBits``' blocks are ``[N, K / block, block / 2]`` uint8 (two values a byte, along
    K) with scales ``[N * blocks]`` (and zero points ``[N * ceil(blocks / 2)]``): the same rows
    as ``GatherBlockQuantized`` reads with ``quantize_axis=1`` once reshaped to ``[N, ...]``
    (``Reshape`` nodes over the shared initializers, which ONNX Runtime folds at load). Where K
    is not a whole number of blocks the gathered rows are sliced back to K.
    """
    graph = model.graph
    replaced = 0
    for node in list(graph):
        table = node.inputs[0] if node.op_type == "Gather" and node.domain == "" else None
        axis = node.attributes.get("axis")
        if table is None or id(table) not in rows or (axis is not None and axis.as_int() != 0):
            continue
        operands = rows[id(table)][1]
        assert table.const_value is not None  # an initializer's (``_thread``)
        n, k = (int(d) for d in table.const_value.shape.numpy())
        shaped = [
            _reshaped(graph, node, operand, [n, -1], f"{table.name}/shared{i}", fresh)
            for i, operand in enumerate(operands)
        ]
        gathered = ir.Node(
            MS_DOMAIN,
            "GatherBlockQuantized",
            [shaped[0], node.inputs[1], *shaped[1:]],
            [
                ir.AttrInt64("bits", 4),
                ir.AttrInt64("block_size", block_size),
                ir.AttrInt64("gather_axis", 0),
                ir.AttrInt64("quantize_axis", 1),
            ],
            name=f"{node.name or table.name}/GatherBlockQuantized",
        )
        graph.insert_before(node, gathered)
        result = gathered.outputs[0]
        if k % block_size:  # the blocks pad K: slice the rows back
            ends = _constant(graph, node, np.array([k], np.int64), f"{table.name}/shared_k", fresh)
            starts = _constant(
                graph, node, np.array([0], np.int64), f"{table.name}/shared_0", fresh
            )
            axes = _constant(
                graph, node, np.array([-1], np.int64), f"{table.name}/shared_axis", fresh
            )
            sliced = ir.Node("", "Slice", [result, starts, ends, axes])
            graph.insert_before(node, sliced)
            result = sliced.outputs[0]
        old = node.outputs[0]
        name, type_, shape = old.name, old.type, old.shape
        old.replace_all_uses_with(result, replace_graph_outputs=True)
        old.name = None
        result.name, result.type, result.shape = name, type_, shape
        graph.remove(node, safe=True)
        replaced += 1
    for table, _ in rows.values():
        if not table.uses() and table.name is not None and table.name in graph.initializers:
            del graph.initializers[table.name]
    return replaced


def _constant(
    graph: ir.Graph,
    before: ir.Node,
    array: np.ndarray,
    name: str,
    fresh: Callable[[str, ir.Graph], str],
) -> ir.Value:
    node = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.Tensor(array, name=name))])
    node.outputs[0].name = fresh(name, graph)
    graph.insert_before(before, node)
    return node.outputs[0]


def _reshaped(
    graph: ir.Graph,
    before: ir.Node,
    value: ir.Value,
    shape: list[int],
    name: str,
    fresh: Callable[[str, ir.Graph], str],
) -> ir.Value:
    target = _constant(graph, before, np.array(shape, np.int64), f"{name}_shape", fresh)
    node = ir.Node("", "Reshape", [value, target])
    node.outputs[0].name = fresh(name, graph)
    graph.insert_before(before, node)
    return node.outputs[0]
