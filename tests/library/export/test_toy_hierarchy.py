"""The toy hierarchy exported end to end (mostly TorchScript): structure, ORT parity, options."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hyperexport import (
    ExportOptions,
    OpsetError,
    export_hyper_onnx,
)
from tests.helpers.exports import export_bytes
from tests.helpers.ort import flat_outputs, run_ort
from tests.helpers.toys import Block, Leaf, toy_inputs, toy_net


def test_nested_loop_kwargs_dict_outputs_match_torch(function_mode: str) -> None:
    model, args = toy_net(), toy_inputs()
    data, manifest = export_bytes(
        model,
        args,
        hiera=[Block, Leaf],
        dynamo=False,
        options=ExportOptions(functions=function_mode),
    )
    proto = onnx.load_from_string(data)
    names = sorted(f.name for f in proto.functions)
    if function_mode == "per_instance":
        assert names == ["Block_block", "Leaf_block_first", "Leaf_block_second", "Leaf_shared"]
    else:
        # second differs (scale constant, gate input): its own body; shared and first share one.
        assert names == ["Block", "Leaf", "Leaf_v2"]
    top_calls = [n.op_type for n in proto.graph.node if n.domain == "hyperexport.fn"]
    assert len(top_calls) == 4  # three loop calls of `shared`, one `block`
    assert [c.call_id for c in manifest.calls] == [
        "shared#0",
        "shared#1",
        "shared#2",
        "block#0",
        "block.first#0",
        "block.second#0",
    ]
    got = run_ort(data, [a.numpy() for a in args])
    want = flat_outputs(model(*args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_same_model_exported_twice_is_byte_identical() -> None:
    model, args = toy_net(), toy_inputs()
    first, _ = export_bytes(model, args, hiera=[Block, Leaf], dynamo=False)
    second, _ = export_bytes(model, args, hiera=[Block, Leaf], dynamo=False)
    assert first == second


def test_external_data_with_low_threshold(tmp_path) -> None:
    model, args = toy_net(), toy_inputs()
    path = tmp_path / "model.onnx"
    export_hyper_onnx(
        model,
        args,
        path,
        hiera=[Leaf],
        dynamo=False,
        external_data=True,
        options=ExportOptions(external_data_threshold=64),
    )
    assert (tmp_path / "model.onnx.data").stat().st_size > 0
    onnx.checker.check_model(str(path), full_check=True)
    got = run_ort(path, [a.numpy() for a in args])
    np.testing.assert_allclose(got[0], flat_outputs(model(*args))[0], atol=1e-5)


def test_opset_beyond_torchscript_path() -> None:
    with pytest.raises(OpsetError, match="21"):
        export_hyper_onnx(
            toy_net(), toy_inputs(), io.BytesIO(), hiera=[Leaf], opset_version=21, dynamo=False
        )


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="verbose_mode"):
        export_hyper_onnx(toy_net(), toy_inputs(), io.BytesIO(), dynamo=False, verbose_mode=True)


class TwoHeads(nn.Module):
    """A model whose useful entry point is a method other than forward."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("not the entry point")

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * 3


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_method_other_than_forward_is_exported(dynamo: bool) -> None:
    torch.manual_seed(0)
    model, x = TwoHeads().eval(), torch.randn(2, 8)
    data, manifest = export_bytes(
        model, (x,), hiera=[Leaf], dynamo=dynamo, options=ExportOptions(method="encode")
    )
    assert [c.call_id for c in manifest.calls] == ["encoder#0"]
    np.testing.assert_allclose(
        run_ort(data, [x.numpy()])[0], model.encode(x).detach().numpy(), atol=1e-5
    )


def test_no_hiera_gives_a_flat_model_that_matches_torch() -> None:
    model, args = toy_net(), toy_inputs()
    data, manifest = export_bytes(model, args, dynamo=False)
    assert manifest.calls == () and not onnx.load_from_string(data).functions
    np.testing.assert_allclose(
        run_ort(data, [a.numpy() for a in args])[0], flat_outputs(model(*args))[0], atol=1e-5
    )


def test_functions_say_which_module_they_are() -> None:
    model, args = toy_net(), toy_inputs()
    data, _ = export_bytes(model, args, hiera=[Block, Leaf], dynamo=False)
    functions = {f.name: f for f in onnx.load_from_string(data).functions}
    props = {p.key: p.value for p in functions["Leaf_block_first"].metadata_props}
    assert props["hyperexport.module_class"] == "tests.helpers.toys.Leaf"
    assert props["hyperexport.module_path"] == "block.first"
    assert "block.first" in functions["Leaf_block_first"].doc_string


def test_hyperonnx_keywords_are_understood(tmp_path, caplog) -> None:
    """A HyperONNX user switches by changing the import: its keywords keep working."""
    import logging

    model, args = toy_net(), toy_inputs()
    buffer = io.BytesIO()
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        export_hyper_onnx(
            model,
            args,
            buffer,
            hiera=[Block, Leaf],
            dynamo=False,
            do_optimization=False,
            fold_nodes_to_functions=True,
            fuse_constants_to_function=False,
            external_directory=tmp_path,
            module_spec={},
        )
    proto = onnx.load_from_string(buffer.getvalue())
    # fold_nodes_to_functions: every top-level node is a function call.
    assert all(n.domain == "hyperexport.fn" for n in proto.graph.node)
    assert (tmp_path / "units" / "root.onnx").is_file()  # external_directory keeps the units
    assert any("module_spec" in r.getMessage() for r in caplog.records)
    got = run_ort(buffer.getvalue(), [a.numpy() for a in args])
    for g, w in zip(got, flat_outputs(model(*args))):
        np.testing.assert_allclose(g, w, atol=1e-5)
