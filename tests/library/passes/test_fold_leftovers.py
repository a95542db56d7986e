"""FoldLeftoversPass on small ONNX-text models, and end to end with FuseConstantsIntoFunctionsPass."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn

from hyperexport import ExportOptions, export_hyper_onnx
from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN
from hyperexport.library.options import RewriteOptions
from hyperexport.library.passes.fold_leftovers import FoldLeftoversPass
from tests.helpers.ort import run_ort
from tests.helpers.passes import apply_preserving, parse, run_checked

HEADER = '<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>'
SCALE = """
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Scale (a, s) => (out) {
    out = Mul (a, s)
}
"""

BASIC = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y, float[2] z) <float[2] w = {1.0, 2.0}> {
    a = Add (x, w)
    b = Relu (a)
    h = hyperexport.fn.Scale (b, w)
    c = Constant <value: tensor = float[1] {3.0}> ()
    y = Mul (h, c)
    z = Sub (y, a)
}
"""
    + SCALE
)

ONLY_CALLS = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    h = hyperexport.fn.Scale (x, w)
    y = hyperexport.fn.Scale (h, w)
}
"""
    + SCALE
)

# The If's branches read x and w from the main graph and call a function.
SUBGRAPH = (
    HEADER
    + """
agraph (float[2] x, bool c) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    h = hyperexport.fn.Scale (x, w)
    y = If (c) <
        then_branch = then_g () => (float[2] t) { t = hyperexport.fn.Scale (h, w) },
        else_branch = else_g () => (float[2] e) { e = Sub (h, x) }
    >
}
"""
    + SCALE
)

# Relu's output is used by nothing: a dead run stays for RemoveUnusedNodesPass.
DEAD = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    h = hyperexport.fn.Scale (x, w)
    dead = Relu (h)
    y2 = hyperexport.fn.Scale (h, w)
    y = Neg (y2)
}
"""
    + SCALE
)

TAKEN = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    a = hyperexport.fn.Leftover_0 (x)
    y = Mul (a, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Leftover_0 (v) => (out) {
    out = Neg (v)
}
"""
)

FEEDS = {"x": np.array([1.0, -5.0], dtype=np.float32)}


def _fold(text: str, feeds: dict[str, np.ndarray] = FEEDS) -> tuple[ir.Model, bool]:
    """Run the pass, check the model and ORT parity, and that a second run is a no-op."""
    return apply_preserving(FoldLeftoversPass, text, feeds)


def _function(model: ir.Model, name: str) -> ir.Function:
    return model.functions[(FUNCTION_DOMAIN, name, "")]


def _names(values: object) -> list[str | None]:
    return [v.name if v is not None else None for v in values]  # type: ignore[attr-defined]


def test_runs_between_calls_become_functions():
    model, modified = _fold(BASIC)
    assert modified
    assert [node.op_type for node in model.graph] == ["Leftover_0", "Scale", "Leftover_1"]
    assert {node.domain for node in model.graph} == {FUNCTION_DOMAIN}
    first, second = _function(model, "Leftover_0"), _function(model, "Leftover_1")
    # The initializer is passed in, not copied: the function stays weight-free.
    assert _names(first.inputs) == ["x", "w"]
    assert _names(first.outputs) == ["a", "b"]
    assert [node.op_type for node in first] == ["Add", "Relu"]
    assert _names(second.inputs) == ["h", "a"]
    assert _names(second.outputs) == ["y", "z"]
    assert [node.op_type for node in second] == ["Constant", "Mul", "Sub"]
    assert dict(first.opset_imports) == {"": 18}
    assert _names(model.graph.outputs) == ["y", "z"]
    assert list(model.graph.initializers) == ["w"]
    assert _names(model.graph[0].inputs) == ["x", "w"]
    assert _names(model.graph[2].inputs) == ["h", "a"]
    assert all("hyperexport.child_index" not in node.meta for node in model.graph)


def test_only_calls_is_untouched():
    model, modified = _fold(ONLY_CALLS)
    assert not modified
    assert [f.name for f in model.functions.values()] == ["Scale"]


def test_subgraph_reads_from_outside_become_inputs():
    feeds = {**FEEDS, "c": np.array(False)}
    model, modified = _fold(SUBGRAPH, feeds)
    run_checked(model, {**feeds, "c": np.array(True)})
    assert modified
    assert [node.op_type for node in model.graph] == ["Scale", "Leftover_0"]
    leftover = _function(model, "Leftover_0")
    assert _names(leftover.inputs) == ["c", "h", "w", "x"]
    assert _names(leftover.outputs) == ["y"]
    assert dict(leftover.opset_imports) == {"": 18, FUNCTION_DOMAIN: 1}


def test_true_branch_matches_after_folding():
    model = parse(SUBGRAPH)
    feeds = {**FEEDS, "c": np.array(True)}
    before = run_checked(model, feeds)
    FoldLeftoversPass()(model)
    np.testing.assert_array_equal(before[0], run_checked(model, feeds)[0])


def test_dead_run_is_left_for_dead_code_removal():
    model, modified = _fold(DEAD)
    assert modified
    assert [node.op_type for node in model.graph] == ["Scale", "Relu", "Scale", "Leftover_0"]
    assert [node.op_type for node in _function(model, "Leftover_0")] == ["Neg"]


def test_names_already_taken_are_skipped():
    model, modified = _fold(TAKEN)
    assert modified
    assert [node.op_type for node in model.graph] == ["Leftover_0", "Leftover_1"]
    assert _names(_function(model, "Leftover_1").inputs) == ["a", "w"]


def test_unsorted_graph_fails_precondition():
    model = parse(BASIC)
    relu = model.graph[1]
    model.graph.remove(relu)
    model.graph.append(relu)
    with pytest.raises(ir.passes.PreconditionError, match="not topologically sorted"):
        FoldLeftoversPass()(model)


class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * self.scale + bias


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Leaf()
        self.b = Leaf()

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x, bias), bias)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.tail = Leaf()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bias = torch.full((8,), 0.25)  # a constant in the graph, fed to every call
        h = self.block(torch.tanh(x) + 1, bias)
        h = self.tail(h * 2, bias)
        return self.head(h).softmax(-1), h.sum(-1)


@pytest.mark.parametrize("functions", ["per_instance", "per_type"])
def test_export_with_fused_constants_and_folded_leftovers(functions: str) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 8)
    buffer = io.BytesIO()
    rewrite = RewriteOptions(fuse_constants=True, fold_leftovers=True)
    manifest = export_hyper_onnx(
        model,
        (x,),
        buffer,
        hiera=[Block, Leaf],
        dynamo=False,
        options=ExportOptions(functions=functions, rewrite=rewrite),  # type: ignore[arg-type]
    )
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    top = [node.op_type for node in proto.graph.node]
    assert all(node.domain == FUNCTION_DOMAIN for node in proto.graph.node)
    assert [t for t in top if t.startswith("Leftover_")] == [
        "Leftover_0",
        "Leftover_1",
        "Leftover_2",
    ]
    inputs = {f.name: list(f.input) for f in proto.functions}
    if functions == "per_instance":
        assert top == ["Leftover_0", "Block_block", "Leftover_1", "Leaf_tail", "Leftover_2"]
        # bias (the same constant at every call) and the scale buffer now live in the bodies.
        assert inputs["Block_block"] == ["x"]
        assert inputs["Leaf_block_a"] == ["x"]
        assert [c.data_inputs for c in manifest.calls] == [
            ("block#0/in.0",),
            ("block.a#0/in.0",),
            ("block.b#0/in.0",),
            ("tail#0/in.0",),
        ]
    else:
        assert top == ["Leftover_0", "Block", "Leftover_1", "Leaf", "Leftover_2"]
        # Each instance's weights differ between the three Leaf calls: still inputs, all the way
        # from the main graph; the equal scale buffers and bias were fused.
        assert inputs["Leaf"] == ["x", "proj.weight", "proj.bias"]
        assert inputs["Block"] == [
            "x",
            "a.proj.weight",
            "a.proj.bias",
            "b.proj.weight",
            "b.proj.bias",
        ]
        weights = {c.module_path: c.weight_inputs for c in manifest.calls}
        assert weights["tail"] == ("tail.proj.weight", "tail.proj.bias")
        assert weights["block.a"] == ("block.a.proj.weight", "block.a.proj.bias")
    assert {c.name for c in manifest.calls}.isdisjoint({"Leftover_0", "Leftover_1", "Leftover_2"})
    got = run_ort(buffer.getvalue(), [x.numpy()])
    with torch.no_grad():
        expected = model(x)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b.numpy(), atol=1e-5)
