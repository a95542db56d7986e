"""Issue 7: one function per module structure, with identity proven from what forward reads."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from hyperexport import ExportOptions, zoo
from tests.helpers.exports import export_bytes
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.ort import run_ort

PER_TYPE = ExportOptions(functions="per_type")


def _llama_layers(model: torch.nn.Module, proto: onnx.ModelProto) -> dict[str, int]:
    calls: dict[str, int] = {}
    for node in proto.graph.node:
        if node.domain == "hyperexport.fn":
            calls[node.op_type] = calls.get(node.op_type, 0) + 1
    return calls


def _export_llama(model: torch.nn.Module) -> tuple[bytes, onnx.ModelProto, torch.Tensor]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    data, _ = export_bytes(model, (ids,), hiera=[LlamaDecoderLayer], dynamo=False, options=PER_TYPE)
    want = model(input_ids=ids).last_hidden_state.detach().numpy()
    np.testing.assert_allclose(run_ort(data, [ids.numpy()])[0], want, atol=1e-4)
    return data, onnx.load_from_string(data), ids


def test_identical_layers_share_one_function_with_weights_as_inputs() -> None:
    model = zoo.tiny_llama(num_layers=4)
    _, proto, _ = _export_llama(model)
    assert [f.name for f in proto.functions] == ["LlamaDecoderLayer"]
    assert _llama_layers(model, proto) == {"LlamaDecoderLayer": 4}
    inputs = list(proto.functions[0].input)
    assert "self_attn.q_proj.weight" in inputs and "post_attention_layernorm.weight" in inputs
    # Each call site passes its own layer's weights.
    fed = [n.input[inputs.index("self_attn.q_proj.weight")] for n in proto.graph.node if n.domain]
    assert len(set(fed)) == 4


def test_a_layer_with_another_config_value_gets_its_own_function() -> None:
    model = zoo.tiny_llama(num_layers=3)
    # Same shapes and classes; only a value the forward reads differs.
    model.layers[1].input_layernorm.variance_epsilon = 1e-2
    _, proto, _ = _export_llama(model)
    assert sorted(f.name for f in proto.functions) == ["LlamaDecoderLayer", "LlamaDecoderLayer_v2"]
    assert _llama_layers(model, proto) == {"LlamaDecoderLayer": 2, "LlamaDecoderLayer_v2": 1}


def test_an_attribute_forward_never_reads_does_not_split_functions() -> None:
    model = zoo.tiny_llama(num_layers=3)
    assert len({layer.self_attn.layer_idx for layer in model.layers}) == 3  # differs per layer
    _, proto, _ = _export_llama(model)
    assert [f.name for f in proto.functions] == ["LlamaDecoderLayer"]


def test_per_type_is_smaller_than_per_instance() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=4)
    ids = torch.randint(0, 128, (1, 10))
    per_type, _ = export_bytes(
        model, (ids,), hiera=[LlamaDecoderLayer], dynamo=False, options=PER_TYPE
    )
    per_instance, _ = export_bytes(model, (ids,), hiera=[LlamaDecoderLayer], dynamo=False)
    proto = onnx.load_from_string(per_instance)
    assert len(proto.functions) == 4
    function_nodes = sum(len(f.node) for f in proto.functions)
    shared_nodes = sum(len(f.node) for f in onnx.load_from_string(per_type).functions)
    assert shared_nodes < function_nodes


def test_check_stage_catches_a_wrong_reuse(tmp_path, monkeypatch) -> None:
    """If identity ignored what forward reads, the per-function check names the wrong layer."""

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from hyperexport.library.api import capture_model, compose_model, export_units, save_model
    from hyperexport.library.check import CheckSettings, run_checks
    from hyperexport.library.export import unit_identity

    model = zoo.tiny_llama(num_layers=3)
    model.layers[1].input_layernorm.variance_epsilon = 0.5
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    capture = capture_model(model, (ids,), hiera=[LlamaDecoderLayer])
    honest = unit_identity._signature_data

    def ignoring_reads(*args, **kwargs):
        data = honest(*args, **kwargs)
        data["reads"] = []
        return data

    monkeypatch.setattr(unit_identity, "_signature_data", ignoring_reads)
    export_units(
        model, capture, opset=TEST_OPSET, dynamo=False, options=PER_TYPE, out_dir=tmp_path / "b"
    )
    onnx_model, manifest = compose_model(tmp_path / "b", options=PER_TYPE)
    assert [f.name for f in manifest.functions] == ["LlamaDecoderLayer"]  # the wrong reuse
    save_model(onnx_model, tmp_path / "m.onnx", external_data=False)
    report = run_checks(
        tmp_path / "m.onnx", manifest, capture.record, capture.arrays, CheckSettings()
    )
    assert not report.ok
    assert report.first_divergent_module == "layers.1"
