"""The declared pass list (hyperexport.library.passes.pipeline): which passes run, in which order, that
each one's ``modified`` is honest, and how a failing pass is reported."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import RewriteError
from hyperexport.library.options import AttentionOptions, ExportOptions, RewriteOptions
from hyperexport.library.passes import pipeline
from hyperexport.library.passes.pipeline import (
    PASSES,
    PassEntry,
    PassInputs,
    run_passes,
    selected_passes,
)
from tests.helpers.bundles import export_toy_bundle, load_root_and_units
from tests.helpers.ort import flat_outputs, run_ort
from tests.helpers.toys import toy_inputs, toy_net

Bundle = tuple[Path, ExportBundle, CaptureRecord]

ALWAYS = [
    "compose",
    "prune_function_io",
    "remove_unused_nodes",
    "remove_unused_functions",
    "remove_unused_opsets",
    "topological_sort",
]
EVERYTHING = ExportOptions(
    rewrite=RewriteOptions(
        fold_leftovers=True,
        fuse_constants=True,
        optimize=True,
        weights_as_initializers=True,
        fuse="standard",
    ),
    attention=AttentionOptions("hyperexport"),
)


@pytest.fixture(scope="module", params=["per_type", "per_instance"])
def bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    out = tmp_path_factory.mktemp(request.param)
    exported, record = export_toy_bundle(out, request.param)
    return out, exported, record


def _inputs(bundle: Bundle, options: ExportOptions) -> tuple[ir.Model, PassInputs]:
    bundle_dir, exported, record = bundle
    root, units = load_root_and_units(bundle_dir, exported)
    return root, PassInputs(options, exported, record, units)


def test_the_list_is_declared_once_with_unique_names() -> None:
    names = [entry.name for entry in PASSES]
    assert len(names) == len(set(names))
    assert names[0] == "compose"
    assert names[-1] == "topological_sort"


def test_default_options_run_only_the_passes_every_model_needs(bundle: Bundle) -> None:
    _, inputs = _inputs(bundle, ExportOptions())
    names = [name for name, _ in selected_passes(inputs)]
    specialize = ["specialize_instances"] if bundle[1].function_mode == "per_instance" else []
    assert names == [ALWAYS[0], *specialize, *ALWAYS[1:]]


def test_every_option_adds_its_pass_in_the_declared_place(bundle: Bundle) -> None:
    _, inputs = _inputs(bundle, EVERYTHING)
    names = [name for name, _ in selected_passes(inputs)]
    # pack_matmuls, share_kv_buffer, rotary_in_attention, rotary_tables, shared_sizes,
    # attention_sizes, padding_mask, load_time_fusions and hoist_invariants follow fuse only with fuse=onnxruntime
    # (EVERYTHING fuses standard), and rotary_tables only with a context length.
    skipped = {
        "pack_matmuls", "share_kv_buffer", "shared_sizes", "padding_mask", "rotary_in_attention",
        "rotary_tables", "attention_sizes", "load_time_fusions", "hoist_invariants",
    }  # fmt: skip
    if bundle[1].function_mode != "per_instance":
        skipped.add("specialize_instances")
    assert names == [entry.name for entry in PASSES if entry.name not in skipped]
    assert names.index("optimize") < names.index("fuse_constants") < names.index("fold_leftovers")
    rewrite = dataclasses.replace(EVERYTHING.rewrite, fuse="onnxruntime")
    _, inputs = _inputs(bundle, dataclasses.replace(EVERYTHING, rewrite=rewrite))
    names = [name for name, _ in selected_passes(inputs)]
    assert names.index("pack_matmuls") == names.index("fuse") + 1
    assert names.index("share_kv_buffer") == names.index("pack_matmuls") + 1
    # the rotations fold before the sizes move, so the sizes they read move too
    assert names.index("rotary_in_attention") == names.index("share_kv_buffer") + 1
    assert names.index("shared_sizes") == names.index("rotary_in_attention") + 1
    # the attention's sizes are rebuilt once shared_sizes read them off the mask
    assert names.index("attention_sizes") == names.index("shared_sizes") + 1
    assert names.index("padding_mask") == names.index("attention_sizes") + 1
    # what ONNX Runtime fuses at load, then what every layer computes alike moves out: last,
    # once nothing else reads shapes through the bodies or rewrites them
    assert names.index("load_time_fusions") == names.index("padding_mask") + 1
    assert names.index("hoist_invariants") == names.index("load_time_fusions") + 1
    assert "rotary_tables" not in names  # no context length: the rows stay per-token
    known = dataclasses.replace(EVERYTHING, rewrite=rewrite, context_length=64)
    _, inputs = _inputs(bundle, known)
    names = [name for name, _ in selected_passes(inputs)]
    # the tables replace the rows the rotations folded, before the sizes move off them
    assert names.index("rotary_tables") == names.index("rotary_in_attention") + 1
    assert names.index("shared_sizes") == names.index("rotary_tables") + 1


@pytest.mark.parametrize("options", [ExportOptions(), EVERYTHING], ids=["default", "everything"])
def test_each_pass_reports_no_change_when_run_again_at_once(
    bundle: Bundle, options: ExportOptions
) -> None:
    model, inputs = _inputs(bundle, options)
    first = dict(selected_passes(inputs))
    second = dict(selected_passes(inputs))  # fresh instances, as a new pipeline would make
    changed = {}
    for name, step in first.items():
        changed[name] = step(model).modified
        before = ir.to_proto(model).SerializeToString()
        assert not second[name](model).modified, name
        assert ir.to_proto(model).SerializeToString() == before, name
    assert changed["compose"]
    net, args = toy_net(), toy_inputs()
    got = run_ort(ir.to_proto(model), [a.numpy() for a in args])
    for g, w in zip(got, flat_outputs(net(*args)), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_the_pipeline_reports_a_change_then_none_for_a_composed_default_model(
    bundle: Bundle,
) -> None:
    model, inputs = _inputs(bundle, ExportOptions())
    assert run_passes(model, inputs).modified
    assert not run_passes(model, inputs).modified


def test_a_failing_pass_is_a_rewrite_error_naming_it_and_the_passes_before(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refuses(ir.passes.InPlacePass):
        def requires(self, model: ir.Model) -> None:
            raise ir.passes.PreconditionError("the model is not what this pass takes")

        def call(self, model: ir.Model) -> ir.passes.PassResult:
            raise AssertionError("never called: the precondition failed")

    refusing = PassEntry("refuses", lambda i: True, lambda i: Refuses())
    monkeypatch.setattr(pipeline, "PASSES", (*PASSES[:1], refusing, *PASSES[1:]))
    model, inputs = _inputs(bundle, ExportOptions())
    with pytest.raises(RewriteError, match=r"'refuses' failed \(after \['compose'\]\)") as info:
        run_passes(model, inputs)
    assert "not what this pass takes" in str(info.value)
    assert isinstance(info.value.__cause__, ir.passes.PreconditionError)
