"""Structural checks: each broken property fails its own check, with a message saying what."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx_ir as ir
import pytest
from check_toys import BLOCK, FN, LINEAR, Toy, make_toy

from hyperexport.base.contracts.manifest import META_EXPORT_PATH, PLACEHOLDER_DOMAIN, FunctionEntry
from hyperexport.base.errors import CheckError
from hyperexport.library.check import CheckSettings, StructuralResult, run_checks
from hyperexport.library.check.structure import executed_op_counts


def structural(
    toy: Toy, path: Path, settings: CheckSettings | None = None
) -> dict[str, StructuralResult]:
    settings = settings or CheckSettings(expected_classes=(BLOCK, LINEAR), expected_opset=18)
    report = run_checks(path, toy.manifest, toy.capture, toy.arrays, settings)
    return {s.name: s for s in report.structural}


def node_of(graph_like: ir.Graph | ir.Function, op_type: str) -> ir.Node:
    return next(n for n in graph_like if n.op_type == op_type)


def only_failure(results: dict[str, StructuralResult]) -> StructuralResult:
    failed = [r for r in results.values() if not r.ok]
    assert len(failed) == 1, failed
    return failed[0]


def test_correct_model_is_structurally_sound(save_toy) -> None:
    toy = make_toy("per_type")
    results = structural(toy, save_toy(toy))
    assert all(r.ok for r in results.values()), results


def test_leftover_placeholder_node_fails(save_toy) -> None:
    toy = make_toy("per_type")
    node_of(toy.model.graph, "Neg").domain = PLACEHOLDER_DOMAIN
    toy.model.opset_imports[PLACEHOLDER_DOMAIN] = 1
    path = save_toy(toy)
    failure = structural(toy, path)["domains"]
    assert not failure.ok and "placeholder" in failure.detail and "Neg" in failure.detail
    report = run_checks(path, toy.manifest, toy.capture, toy.arrays, CheckSettings())
    with pytest.raises(CheckError, match="structure domains: placeholder"):
        report.raise_for_failure()


def test_private_custom_domain_fails_but_com_microsoft_is_allowed(save_toy) -> None:
    toy = make_toy("per_type")
    node_of(toy.model.graph, "Neg").domain = "com.example"
    toy.model.opset_imports["com.example"] = 1
    failure = structural(toy, save_toy(toy))["domains"]
    assert not failure.ok and "'com.example'" in failure.detail

    toy = make_toy("per_type")
    node_of(toy.model.graph, "Neg").domain = "com.microsoft"
    toy.model.opset_imports["com.microsoft"] = 1
    assert structural(toy, save_toy(toy))["domains"].ok


def test_call_of_undefined_function_fails(save_toy) -> None:
    toy = make_toy("per_type")
    block = toy.model.functions[(FN, "Block", "")]
    node_of(block, "Linear").op_type = "Linear2"
    failure = structural(toy, save_toy(toy))["domains"]
    assert not failure.ok and "undefined function" in failure.detail


@pytest.mark.parametrize(
    ("recorded", "expected_dynamo", "fails"),
    [
        ("dynamo=False", False, False),
        ("dynamo=False", None, False),
        ("dynamo=False", True, True),
        ("dynamo=True", None, True),  # the manifest says dynamo=False
        ("torchscript", None, True),
        (None, None, True),
    ],
)
def test_metadata_export_path(
    recorded: str | None, expected_dynamo: bool | None, fails: bool, save_toy
) -> None:
    toy = make_toy("per_type")
    if recorded is None:
        del toy.model.metadata_props[META_EXPORT_PATH]
    else:
        toy.model.metadata_props[META_EXPORT_PATH] = recorded
    result = structural(toy, save_toy(toy), CheckSettings(expected_dynamo=expected_dynamo))
    assert result["metadata"].ok is not fails, result["metadata"].detail
    if fails:
        assert only_failure(result).name == "metadata"


def test_wrong_default_opset_fails(save_toy) -> None:
    toy = make_toy("per_type")
    result = structural(toy, save_toy(toy), CheckSettings(expected_opset=24))
    assert "opset is 18, expected 24" in only_failure(result).detail


def test_function_that_does_not_import_a_used_domain_fails(save_toy) -> None:
    toy = make_toy("per_type")
    del toy.model.functions[(FN, "Block", "")].opset_imports[FN]
    result = structural(toy, save_toy(toy))
    assert not result["opsets"].ok
    assert "Block uses domain 'hyperexport.fn' without importing it" in result["opsets"].detail


def test_function_importing_another_default_opset_fails(save_toy) -> None:
    toy = make_toy("per_type")
    toy.model.functions[(FN, "Linear", "")].opset_imports[""] = 17
    result = structural(toy, save_toy(toy))
    assert "imports '' at 17, the model at 18" in result["opsets"].detail


def test_expected_class_without_function_fails(save_toy) -> None:
    toy = make_toy("per_type")
    settings = CheckSettings(expected_classes=(BLOCK, "toy.Missing"))
    result = structural(toy, save_toy(toy), settings)
    assert "toy.Missing" in only_failure(result).detail


def test_manifest_function_absent_from_model_fails(save_toy) -> None:
    toy = make_toy("per_type")
    ghost = FunctionEntry(FN, "Ghost", "toy.Ghost", ("ghost",))
    manifest = replace(toy.manifest, functions=(*toy.manifest.functions, ghost))
    bad = Toy(toy.model, manifest, toy.capture, toy.arrays)
    result = structural(bad, save_toy(toy), CheckSettings(expected_classes=("toy.Ghost",)))
    assert "hyperexport.fn::Ghost (toy.Ghost) missing" in only_failure(result).detail


def test_uncalled_function_fails(save_toy) -> None:
    toy = make_toy("per_instance")
    main = toy.model.graph
    for node in list(main):
        if node.op_type == "Linear_head":
            node.op_type = "Linear_block_lin"
    result = structural(toy, save_toy(toy))
    assert "Linear_head is never called" in result["functions"].detail


def test_onnx_checker_failure_is_reported(save_toy) -> None:
    toy = make_toy("per_type")
    node_of(toy.model.graph, "Neg").attributes["bogus"] = ir.AttrInt64("bogus", 1)
    result = structural(toy, save_toy(toy))
    assert not result["checker"].ok and "bogus" in result["checker"].detail


@pytest.mark.parametrize("mode", ["per_type", "per_instance"])
def test_op_counts_count_each_function_body_once_per_executed_call(mode: str, save_toy) -> None:
    # Linear runs three times: nested once in Block, and twice as head from the main graph.
    toy = make_toy(mode)
    counts = executed_op_counts(toy.model)
    assert (counts["MatMul"], counts["Add"], counts["Relu"], counts["Neg"]) == (3, 3, 1, 1)
    settings = CheckSettings(expected_ops=(("MatMul", 3), ("Relu", 1)))
    result = structural(toy, save_toy(toy), settings)["op_counts"]
    assert result.ok
    assert result.detail == "executed nodes as expected: MatMul=3, Relu=1"


def test_op_count_mismatch_fails_with_both_numbers(save_toy) -> None:
    toy = make_toy("per_type")
    settings = CheckSettings(expected_ops=(("MatMul", 2), ("Attention", 1)))
    failure = only_failure(structural(toy, save_toy(toy), settings))
    assert failure.name == "op_counts"
    assert failure.detail == "MatMul: 3 executed, expected 2; Attention: 0 executed, expected 1"


def test_op_counts_run_only_when_expected(save_toy) -> None:
    toy = make_toy("per_type")
    assert "op_counts" not in structural(toy, save_toy(toy))
