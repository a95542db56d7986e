"""A build whose torch outputs prove nothing fails its check, unless the recipe accepts them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.product.config import validate_recipe
from tests.helpers.builds import blocks_net_source, build, package_in


@pytest.fixture(scope="module")
def zero_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    source = blocks_net_source(
        "x * 0", "A real model whose output is multiplied by 0: every comparison with it passes."
    )
    with package_in(tmp_path_factory.mktemp("zero"), "hx_zero", source) as pkg:
        yield pkg


def zero_recipe(pkg: Path, accept: list[str] | None = None) -> Any:
    data: dict[str, Any] = {
        "name": "zero",
        "model": {"_target_": "hx_zero.net.make", "seed": 0},
        "inputs": {"x": {"shape": [2, 8], "dtype": "float32", "low": -1.0, "high": 1.0}},
        "hiera": ["hx_zero.net.Block"],
        "dynamo": False,
    }
    if accept is not None:
        data["check"] = {"accept_vacuous": accept}
    return validate_recipe(data, str(pkg.parent / "zero.yaml"))


def test_an_all_zero_output_fails_the_check_then_passes_when_accepted(
    zero_package: Path, tmp_path: Path
) -> None:
    refused = build(zero_recipe(zero_package), tmp_path)
    assert refused.exit_code == 1
    assert refused.report is not None and refused.report["failed_stage"] == "check"
    error = refused.report["error"]
    assert "\n" not in error
    output = refused.report["check"]["end_to_end"]["outputs"][0]
    assert output["mismatched"] == 0 and output["vacuous"].startswith(
        "is within the tolerance of zero (max |x| = 0,"
    )
    assert (
        f"output {output['name']} [out.0]: FAIL: the torch reference is within the tolerance "
        "of zero"
    ) in error
    assert f"""'check.accept_vacuous=["{output["name"]}"]'""" in error
    assert all(f["ok"] for f in refused.report["check"]["functions"])  # the blocks are fine

    accepted = build(zero_recipe(zero_package, [output["name"]]), tmp_path)
    assert accepted.exit_code == 0, accepted.lines
    assert accepted.report is not None
    [judged] = accepted.report["check"]["end_to_end"]["outputs"]
    assert judged["ok"] and judged["accepted"]
    stages = {s["name"]: s["status"] for s in accepted.report["stages"]}
    assert stages["trace"] == stages["evaluate"] == "hit" and stages["check"] == "ran"


def test_an_accepted_name_that_is_no_output_is_refused(zero_package: Path, tmp_path: Path) -> None:
    outcome = build(zero_recipe(zero_package, ["logits"]), tmp_path)
    assert outcome.result.error is not None
    cause = outcome.result.error.__cause__
    assert isinstance(cause, RecipeError)
    assert cause.field == "check.accept_vacuous[0]"
    assert "'logits' names no graph output or capture key of this model" in str(cause)


@pytest.mark.slow
def test_a_mobilenet_checkpoint_of_vanishing_outputs_fails_then_passes_when_accepted(
    tmp_path: Path,
) -> None:
    """transformers' own initialisation of a tiny MobileNetV2 gives outputs of ~1e-26 (issue 22),
    and every block's output is within the tolerance of zero too."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.25)
    transformers.MobileNetV2Model(config).eval().save_pretrained(tmp_path / "ckpt")

    def recipe(**check: Any) -> Any:
        data = {
            "name": "mobilenet",
            "model": {"_target_": "hyperexport.models.pretrained", "path": str(tmp_path / "ckpt")},
            "inputs": "auto",
            "hiera": "auto",
            "dynamo": False,
            "check": check,
        }
        return validate_recipe(data, str(tmp_path / "mobilenet.yaml"))

    refused = build(recipe(), tmp_path)
    assert refused.exit_code == 1 and refused.report is not None
    error = refused.report["error"]
    assert "\n" not in error and "first divergent" not in error
    assert "output last_hidden_state [out.0]: FAIL: the torch reference is within the " in error
    outputs = refused.report["check"]["end_to_end"]["outputs"]
    assert {o["name"] for o in outputs} == {"last_hidden_state", "pooler_output"}
    assert all(o["vacuous"] and o["mismatched"] == 0 for o in outputs)
    functions = refused.report["check"]["functions"]
    assert functions and all(not f["ok"] and f["outputs"][0]["vacuous"] for f in functions)

    accept = ["last_hidden_state", "pooler_output", "layer.*/out.*"]
    accepted = build(recipe(accept_vacuous=accept), tmp_path)
    assert accepted.exit_code == 0, accepted.lines
    assert accepted.report is not None and accepted.report["check"]["ok"]
