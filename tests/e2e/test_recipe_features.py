"""Recipe features end to end through the real stages: attention promotion, dynamic axes, fallback.

Each test builds a recipe from ``recipes/`` (or a small local model) in process and asserts from
``report.json``, as a user would read it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from hyperexport.product.config import compose_recipe, validate_recipe
from tests.helpers.builds import blocks_net_source, build, package_in
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH
from tests.helpers.rebuilds import reran_from
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION, NEEDS_OPSET_18
from tests.helpers.statuses import statuses


def report_of(outcome: Any) -> dict[str, Any]:
    return json.loads((outcome.out_dir / "report.json").read_text())


def structural(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in report["check"]["structural"]}


@pytest.fixture(scope="module")
def fallback_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    source = blocks_net_source(
        "torch.diff(x, dim=-1)",
        "aten::diff has no TorchScript symbolic at opset 18; torch.export decomposes it.",
    )
    with package_in(tmp_path_factory.mktemp("fallback"), "hx_fallback", source) as pkg:
        yield pkg


def fallback_recipe(pkg: Path, *, fallback: bool) -> Any:
    data = {
        "name": "fallback",
        "model": {"_target_": "hx_fallback.net.make", "seed": 0},
        "inputs": {"x": {"shape": [2, 8], "dtype": "float32", "low": -1.0, "high": 1.0}},
        "hiera": ["hx_fallback.net.Block"],
        "dynamo": False,
        "fallback": fallback,
    }
    return validate_recipe(data, str(pkg.parent / "fallback.yaml"))


@NEEDS_DYNAMO_PATH
def test_fallback_builds_on_the_other_path_and_is_recorded(
    fallback_package: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = build(fallback_recipe(fallback_package, fallback=False), tmp_path)
    assert refused.exit_code == 1
    assert refused.report is not None and refused.report["failed_stage"] == "export"
    assert "aten::diff" in refused.report["error"]

    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        outcome = build(fallback_recipe(fallback_package, fallback=True), tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("falling back to dynamo=True" in w for w in warnings), warnings
    report = report_of(outcome)
    assert statuses(outcome) == reran_from("export")
    assert report["export_path"]["dynamo"] is True
    assert report["export_path"]["fallback_from"].startswith("dynamo=False: ModuleExportError")
    assert report["check"]["ok"] is True
    assert structural(report)["metadata"]["detail"] == "hyperexport.export_path=dynamo=True"
    assert any(line.startswith("fallback: ") for line in outcome.lines)
    assert outcome.model_path is not None
    meta = {p.key: p.value for p in onnx.load(str(outcome.model_path)).metadata_props}
    assert meta["hyperexport.fallback_from"].startswith("dynamo=False:")


def test_llama_dynamic_recipe_matches_torch_at_both_shapes(tmp_path: Path) -> None:
    recipe, _ = compose_recipe(["recipe=llama_dynamic"])
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    report = report_of(outcome)
    outputs = {o["name"]: o for o in report["check"]["end_to_end"]["outputs"]}
    assert set(outputs) == {"last_hidden_state", "last_hidden_state@second_shape"}
    assert all(o["ok"] for o in outputs.values())
    assert outputs["last_hidden_state"]["size"] == 1 * 16 * 64
    assert outputs["last_hidden_state@second_shape"]["size"] == 2 * 7 * 64
    assert outcome.model_path is not None
    graph_input = onnx.load(str(outcome.model_path)).graph.input[0]
    assert [d.dim_param for d in graph_input.type.tensor_type.shape.dim] == ["batch", "seq"]


@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_OPSET_18
def test_attention_promotion_makes_opset24_with_one_attention_per_layer(tmp_path: Path) -> None:
    recipe, _ = compose_recipe(["recipe=llama_attention"])
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    checks = structural(report_of(outcome))
    assert checks["opsets"]["detail"].endswith("default domain at opset 24")
    assert checks["op_counts"] == {
        "name": "op_counts",
        "ok": True,
        "detail": "executed nodes as expected: Attention=4",
    }
    # Sweeping the export opset under promotion: the final model is opset 24 all the same, and
    # the trace is reused.
    swept, _ = compose_recipe(["recipe=llama_attention", "opset=20"])
    again = build(swept, tmp_path)
    assert again.exit_code == 0, again.lines
    # quantize (method none) reads the rewrite's model only, and promotion made it the same.
    assert statuses(again) == {**reran_from("export"), "quantize": "hit"}
    assert structural(report_of(again))["opsets"]["detail"].endswith("at opset 24")


@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_OPSET_18
def test_expect_ops_mismatch_fails_the_check(tmp_path: Path) -> None:
    recipe, _ = compose_recipe(["recipe=llama_attention", "check.expect_ops.Attention=3"])
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 1
    report = report_of(outcome)
    assert report["failed_stage"] == "check"
    assert structural(report)["op_counts"]["detail"] == "Attention: 4 executed, expected 3"


@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_OPSET_18
@pytest.mark.parametrize("name", ["qwen2", "gpt2"])
def test_other_attention_recipes_pass_the_check(name: str, tmp_path: Path) -> None:
    recipe, _ = compose_recipe([f"recipe={name}"])
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    checks = structural(report_of(outcome))
    assert checks["op_counts"]["ok"] and checks["opsets"]["detail"].endswith("opset 24")
