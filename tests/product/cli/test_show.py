"""``hyperexport show model.onnx``: the function tree of any ONNX model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from hyperexport import ExportOptions, export_hyper_onnx
from hyperexport.base import exit_codes
from hyperexport.product.cli import show

REPO = Path(__file__).resolve().parents[3]


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def nested_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("show") / "net.onnx"
    export_hyper_onnx(
        Net().eval(),
        (torch.randn(2, 8),),
        str(path),
        input_names=["x"],
        hiera=[Block, Inner],
        dynamo=False,
        dynamic_axes={"x": {0: "batch"}},
        options=ExportOptions(functions="per_type"),
    )
    return path


def test_tree_names_classes_calls_nodes_and_shapes(
    nested_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show.main([str(nested_model)]) == exit_codes.OK
    lines = capsys.readouterr().out.splitlines()
    proto = onnx.load(nested_model)
    nodes = {f.name: len(f.node) for f in proto.functions}
    block = next(line for line in lines if line.lstrip().startswith("Block -> "))
    inner = next(line for line in lines if line.lstrip().startswith("Inner -> "))
    # per_type: one Block function run 3 times, its Inner nested under it (deeper indent).
    assert ": x3 (3 call sites)" in block and ": x3 (1 call sites)" in inner
    assert len(inner) - len(inner.lstrip()) > len(block) - len(block.lstrip())
    block_name = block.split("::", 1)[1].split(":", 1)[0]
    assert f"{nodes[block_name]} nodes" in block
    assert any(line.startswith("inputs:  x: float[batch, 8]") for line in lines)
    assert "main graph: " in "\n".join(lines) and "hyperexport.fn 1" in lines[0]


def test_json_output_matches_the_model(
    nested_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show.main([str(nested_model), "--json"]) == exit_codes.OK
    data = json.loads(capsys.readouterr().out)
    proto = onnx.load(nested_model)
    assert data["main_nodes"] == len(proto.graph.node)
    assert {f["id"].split("::")[1] for f in data["functions"]} == {f.name for f in proto.functions}
    assert {f["module_class"].rsplit(".", 1)[-1] for f in data["functions"]} == {"Block", "Inner"}


def test_a_flat_model_and_bad_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    flat = tmp_path / "flat.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), flat)
    assert show.main([str(flat)]) == exit_codes.OK
    out = capsys.readouterr().out
    assert "functions: none" in out and "main graph: 1 nodes" in out
    assert show.main([str(tmp_path / "missing.onnx")]) == exit_codes.INVALID
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model at all")
    assert show.main([str(junk)]) == exit_codes.INVALID
    assert "not a readable ONNX model" in capsys.readouterr().err


def test_metadata_keys_agree_with_the_passes() -> None:
    from hyperexport.library.passes import compose_functions

    assert show.META_MODULE_CLASS == compose_functions.META_MODULE_CLASS
    assert show.META_MODULE_PATH == compose_functions.META_MODULE_PATH


def test_the_subcommand_is_dispatched(nested_model: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hyperexport", "show", str(nested_model), "--no-io"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Block -> hyperexport.fn::" in result.stdout and "in:" not in result.stdout


def test_the_model_records_and_show_prints_the_versions_it_was_built_with(
    nested_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyperexport.base.contracts.names import META_VERSION_PREFIX
    from hyperexport.base.versions import RECORDED_DISTRIBUTIONS, installed_version

    props = {p.key: p.value for p in onnx.load(nested_model).metadata_props}
    for name in RECORDED_DISTRIBUTIONS:
        version = installed_version(name)
        if version is not None:  # transformers is optional
            assert props[f"{META_VERSION_PREFIX}{name}"] == version
    assert {"torch", "onnx", "onnxscript", "onnxruntime", "hyperexport"} <= {
        k.removeprefix(META_VERSION_PREFIX) for k in props if k.startswith(META_VERSION_PREFIX)
    }
    assert show.main([str(nested_model)]) == exit_codes.OK
    built_with = next(
        line for line in capsys.readouterr().out.splitlines() if "built with:" in line
    )
    assert f"torch {installed_version('torch')}" in built_with
    assert f"onnx {installed_version('onnx')}" in built_with


def test_show_counts_quantized_ops_per_function(tmp_path: Path) -> None:
    import numpy as np
    import onnx_ir as ir

    from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass

    text = """
    <ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
    main (float[2,32] x, float[16,32] w) => (float[2,16] y) {
      y = hyperexport.fn.Layer (x, w)
    }
    <domain: "hyperexport.fn", opset_import: ["" : 18]>
    Layer (h, weight) => (out) {
      t = Transpose <perm = [1, 0]> (weight)
      out = MatMul (h, t)
    }
    """
    model = ir.from_proto(onnx.parser.parse_model(text))
    w = model.graph.inputs.pop(1)
    w.const_value = ir.Tensor(np.ones((16, 32), dtype=np.float32), name="w")
    model.graph.register_initializer(w)
    QuantizeMatMulsPass("int4_block", block_size=16)(model)
    path = tmp_path / "q.onnx"
    ir.save(model, path)
    info = show.describe_model(path)
    assert info.functions[0].quantized == {"MatMulNBits": 1}
    assert "Layer: x1 (1 call sites), 1 nodes, MatMulNBits x1" in "\n".join(show.render(info))


def test_show_lists_fused_kernels_per_function(tmp_path: Path) -> None:
    import onnx_ir as ir

    text = """
    <ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
    main (float[2,8,16] x) => (float[2,8,16] y) {
      y = hyperexport.fn.Mlp (x)
    }
    <domain: "hyperexport.fn", opset_import: ["" : 18, "com.microsoft" : 1]>
    Mlp (h) => (out) {
      g = com.microsoft.FastGelu (h)
      out = com.microsoft.QuickGelu <alpha: float = 1.702> (g)
    }
    """
    path = tmp_path / "f.onnx"
    ir.save(ir.from_proto(onnx.parser.parse_model(text)), path)
    info = show.describe_model(path)
    assert info.functions[0].fused == {"com.microsoft::FastGelu": 1, "com.microsoft::QuickGelu": 1}
    lines = [line.strip() for line in show.render(info)]
    assert "fused: com.microsoft::FastGelu x1, com.microsoft::QuickGelu x1" in lines


def test_a_build_folder_shows_each_of_its_graphs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for graph, op in (("encoder", "Relu"), ("decoder", "Sigmoid")):
        body = helper.make_graph(
            [helper.make_node(op, ["x"], ["y"])],
            graph,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        )
        model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 18)])
        onnx.save(model, tmp_path / f"{graph}_model.onnx")
    assert show.main([str(tmp_path)]) == exit_codes.OK
    out = capsys.readouterr().out
    assert out.index("== decoder_model.onnx") < out.index("== encoder_model.onnx")
    assert out.count("main graph: 1 nodes") == 2
    assert show.main([str(tmp_path), "--json"]) == exit_codes.OK
    trees = json.loads(capsys.readouterr().out)
    assert sorted(trees) == ["decoder_model.onnx", "encoder_model.onnx"]
    assert show.main([str(tmp_path / "missing")]) == exit_codes.INVALID
    (tmp_path / "empty").mkdir()
    assert show.main([str(tmp_path / "empty")]) == exit_codes.INVALID
