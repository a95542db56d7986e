"""build_manifest: the final model read back into which function each module call calls."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN, ExportManifest
from hyperexport.base.contracts.records import CaptureRecord, tree_tensor_keys
from hyperexport.base.errors import RewriteError
from hyperexport.library.options import ExportOptions
from hyperexport.library.passes.build_manifest import build_manifest
from hyperexport.library.passes.compose_functions import CHILD_INDEX
from hyperexport.library.passes.pipeline import PassInputs, run_passes
from tests.helpers.bundles import export_toy_bundle, load_root_and_units

Bundle = tuple[Path, ExportBundle, CaptureRecord]


@pytest.fixture(scope="module", params=["per_type", "per_instance"])
def bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    out = tmp_path_factory.mktemp(request.param)
    exported, record = export_toy_bundle(out, request.param)
    return out, exported, record


def _final(bundle: Bundle) -> tuple[ir.Model, ExportBundle, CaptureRecord]:
    bundle_dir, exported, record = bundle
    root, units = load_root_and_units(bundle_dir, exported)
    options = ExportOptions(functions=exported.function_mode)  # type: ignore[arg-type]
    run_passes(root, PassInputs(options, exported, record, units))
    return root, exported, record


def test_every_call_site_ties_a_module_call_to_its_function(bundle: Bundle) -> None:
    model, exported, record = _final(bundle)
    manifest = build_manifest(model, exported, record)
    assert [c.call_id for c in manifest.calls] == [c.call_id for c in record.calls]
    assert [c.module_path for c in manifest.calls] == [c.path for c in record.calls]
    for site in manifest.calls:
        function = model.functions[(site.domain, site.name, "")]
        call = record.call(site.call_id)
        assert set(site.data_inputs) <= set(tree_tensor_keys(call.inputs))
        assert len(site.data_inputs) + len(site.weight_inputs) == len(function.inputs)
        assert list(site.outputs) == list(tree_tensor_keys(call.outputs))
        assert all(w in model.graph.initializers for w in site.weight_inputs)
    assert manifest.graph_outputs == tuple(tree_tensor_keys(record.outputs))
    assert manifest.function_mode == exported.function_mode and not manifest.dynamo


def test_functions_list_the_instances_that_call_them(bundle: Bundle) -> None:
    model, exported, record = _final(bundle)
    functions = {f.name: f.module_paths for f in build_manifest(model, exported, record).functions}
    if exported.function_mode == "per_type":
        assert functions == {
            "Leaf": ("shared", "block.first"),
            "Block": ("block",),
            "Leaf_v2": ("block.second",),
        }
        weights = {
            c.call_id: c.weight_inputs for c in build_manifest(model, exported, record).calls
        }
        assert weights["shared#1"] == ("shared.proj.weight", "shared.proj.bias")
    else:
        assert sorted(functions.values()) == [
            ("block",),
            ("block.first",),
            ("block.second",),
            ("shared",),
        ]
        calls = build_manifest(model, exported, record).calls
        assert all(not c.weight_inputs for c in calls)  # weights baked in per instance


def test_the_manifest_round_trips_through_json(bundle: Bundle) -> None:
    manifest = build_manifest(*_final(bundle))
    assert ExportManifest.loads(manifest.dumps()) == manifest


def test_without_a_fusion_the_json_has_no_fusion_fields(bundle: Bundle) -> None:
    manifest = build_manifest(*_final(bundle))
    assert manifest.fusion == "none"
    data = json.loads(manifest.dumps())
    assert "fusion" not in data and not any("fused_ops" in f for f in data["functions"])


def test_a_fusion_and_each_functions_fused_kernels_round_trip(bundle: Bundle) -> None:
    model, exported, record = _final(bundle)
    [function, *_] = model.functions.values()
    node = ir.node("FastGelu", [function.inputs[0]], domain="com.microsoft")
    function.append(node)  # a kernel the onnxruntime fusion writes, in its body
    manifest = build_manifest(model, exported, record, "onnxruntime")
    assert manifest.fusion == "onnxruntime"
    entry = next(f for f in manifest.functions if f.name == function.name)
    assert entry.fused_ops == (("com.microsoft::FastGelu", 1),)
    data = json.loads(manifest.dumps())
    assert data["fusion"] == "onnxruntime"
    assert next(f for f in data["functions"] if f["name"] == function.name)["fused_ops"] == {
        "com.microsoft::FastGelu": 1
    }
    assert ExportManifest.loads(manifest.dumps()) == manifest


def test_a_call_without_a_call_site_is_named(bundle: Bundle) -> None:
    model, exported, record = _final(bundle)
    block_call = next(n for n in model.graph if n.domain == FUNCTION_DOMAIN and n.name == "block")
    del block_call.meta[CHILD_INDEX]  # the call no longer says which module call it stands for
    with pytest.raises(RewriteError, match=r"module calls \['block#0'"):
        build_manifest(model, exported, record)
