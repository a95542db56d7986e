"""ComposeFunctionsPass: unit graphs become local functions, placeholders become their calls."""

from __future__ import annotations

import importlib.metadata
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    META_FALLBACK,
    META_FUNCTION_MODE,
    PLACEHOLDER_DOMAIN,
)
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import RewriteError
from hyperexport.library.passes.compose_functions import (
    CHILD_INDEX,
    META_MODULE_CLASS,
    ComposeFunctionsPass,
    function_names,
)
from tests.helpers.bundles import export_toy_bundle, load_root_and_units
from tests.helpers.ort import flat_outputs, run_ort
from tests.helpers.toys import toy_inputs, toy_net

Bundle = tuple[Path, ExportBundle, CaptureRecord]


@pytest.fixture(scope="module")
def per_type(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    out = tmp_path_factory.mktemp("per_type")
    bundle, record = export_toy_bundle(out, "per_type")
    return out, bundle, record


def _compose(bundle_dir: Path, bundle: ExportBundle, record: CaptureRecord) -> ir.Model:
    root, units = load_root_and_units(bundle_dir, bundle)
    assert ComposeFunctionsPass(units, bundle, record)(root).modified
    return root


def _every_node(model: ir.Model) -> list[ir.Node]:
    graphs = [model.graph, *(f.graph for f in model.functions.values())]
    return [n for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)]


def test_placeholders_become_calls_of_one_function_per_structure(per_type: Bundle) -> None:
    model = _compose(*per_type)
    assert not [n for n in _every_node(model) if n.domain == PLACEHOLDER_DOMAIN]
    assert PLACEHOLDER_DOMAIN not in model.opset_imports
    assert model.opset_imports[FUNCTION_DOMAIN] == 1
    # Leaf with scale=2.0 and a gate is another structure: a function of its own (Leaf_v2).
    assert sorted(f.name for f in model.functions.values()) == ["Block", "Leaf", "Leaf_v2"]
    calls = [(n.name, n.op_type) for n in model.graph if n.domain == FUNCTION_DOMAIN]
    assert calls == [
        ("shared", "Leaf"),
        ("shared#1", "Leaf"),
        ("shared#2", "Leaf"),
        ("block", "Block"),
    ]
    block = model.functions[(FUNCTION_DOMAIN, "Block", "")]
    inner = [(n.name, n.op_type) for n in block.graph if n.domain == FUNCTION_DOMAIN]
    assert inner == [("first", "Leaf"), ("second", "Leaf_v2")]
    assert [n.meta[CHILD_INDEX] for n in block.graph if n.domain == FUNCTION_DOMAIN] == [0, 1]


def test_callees_come_before_callers(per_type: Bundle) -> None:
    names = [f.name for f in _compose(*per_type).functions.values()]
    assert names.index("Block") > max(names.index("Leaf"), names.index("Leaf_v2"))


def test_weights_become_inputs_and_other_initializers_constants(per_type: Bundle) -> None:
    model = _compose(*per_type)
    leaf = model.functions[(FUNCTION_DOMAIN, "Leaf", "")]
    assert [v.name for v in leaf.inputs][-2:] == ["proj.weight", "proj.bias"]
    assert not leaf.graph.initializers
    assert leaf.metadata_props[META_MODULE_CLASS] == "tests.helpers.toys.Leaf"
    # The main graph's weights lose the export wrapper's "inner." prefix.
    assert "shared.proj.weight" in model.graph.initializers
    assert not [n for n in model.graph.initializers if n.startswith("inner.")]


def test_the_composed_model_matches_torch(per_type: Bundle) -> None:
    model = _compose(*per_type)
    net, args = toy_net(), toy_inputs()
    got = run_ort(ir.to_proto(model), [a.numpy() for a in args])
    for g, w in zip(got, flat_outputs(net(*args)), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_metadata_records_path_mode_and_fallback(per_type: Bundle) -> None:
    bundle_dir, bundle, record = per_type
    fell_back = replace(bundle, fallback_from="dynamo=True: ModuleExportError: no")
    model = _compose(bundle_dir, fell_back, record)
    assert model.metadata_props[META_EXPORT_PATH] == "dynamo=False"
    assert model.metadata_props[META_FUNCTION_MODE] == "per_type"
    assert model.metadata_props[META_FALLBACK] == fell_back.fallback_from
    assert model.producer_name == "hyperexport"
    assert model.producer_version == importlib.metadata.version("hyperexport")  # not torch's


def test_a_second_run_changes_nothing(per_type: Bundle) -> None:
    bundle_dir, bundle, record = per_type
    root, units = load_root_and_units(bundle_dir, bundle)
    assert ComposeFunctionsPass(units, bundle, record)(root).modified
    before = ir.to_proto(root).SerializeToString()
    assert not ComposeFunctionsPass(units, bundle, record)(root).modified
    assert ir.to_proto(root).SerializeToString() == before


def test_a_missing_unit_fails_the_precondition(per_type: Bundle) -> None:
    bundle_dir, bundle, record = per_type
    root, units = load_root_and_units(bundle_dir, bundle)
    names = function_names(bundle, record)
    dropped = next(n for n, f in names.items() if f == "Leaf_v2")
    del units[dropped]
    with pytest.raises(ir.passes.PreconditionError, match=dropped):
        ComposeFunctionsPass(units, bundle, record)(root)


def test_a_placeholder_without_a_recorded_call_is_named(per_type: Bundle) -> None:
    bundle_dir, bundle, record = per_type
    root, units = load_root_and_units(bundle_dir, bundle)
    placeholder = next(n for n in root.graph if n.domain == PLACEHOLDER_DOMAIN)
    placeholder.op_type = "P999"
    with pytest.raises(RewriteError, match="P999 in unit 'root'"):
        ComposeFunctionsPass(units, bundle, record)(root)
