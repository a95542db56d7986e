"""``target.onnxruntime``: what that ONNX Runtime release cannot load is refused at validation,
before anything runs (exit 2, one line naming the field); unset, nothing changes."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hyperexport.base import versions
from hyperexport.base.errors import RecipeError
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.product.config import compose_recipe
from hyperexport.product.config.validate import written_opsets
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION, NEEDS_OPSET_18


def _refusal(*overrides: str) -> str:
    with pytest.raises(RecipeError) as caught:
        compose_recipe(["recipe=tiny_llama", *overrides])
    return str(caught.value)


def test_unset_means_the_installed_runtime_and_changes_nothing() -> None:
    recipe, _ = compose_recipe(["recipe=tiny_llama"])
    assert recipe.config.target.onnxruntime is None
    assert recipe.data["target"] == {"onnxruntime": None}


@pytest.mark.parametrize(
    ("overrides", "written"),
    [
        pytest.param(["opset=20"], "writes opset 20 at IR 9", marks=NEEDS_OPSET_18),
        pytest.param(
            ["rewrite.fuse=standard", "attention.implementation=hyperexport"],
            "writes opset 24 at IR 12 (rewrite.fuse=standard re-declares the model at it)",
            marks=[NEEDS_OPSET_18, NEEDS_HYPEREXPORT_ATTENTION],
        ),
    ],
)
def test_an_opset_1_16_cannot_load_is_refused(overrides: list[str], written: str) -> None:
    message = _refusal(*overrides, "target.onnxruntime=1.16.3")
    assert "target.onnxruntime" in message and "\n" not in message
    assert "onnxruntime 1.16.3 loads opsets up to 19 at IR versions up to 9" in message
    assert written in message


@pytest.mark.parametrize(
    "opset", [17, pytest.param(18, marks=NEEDS_OPSET_18), pytest.param(19, marks=NEEDS_OPSET_18)]
)
def test_what_1_16_loads_passes(opset: int) -> None:
    recipe, _ = compose_recipe([f"opset={opset}", "target.onnxruntime=1.16.3"])
    assert recipe.config.target.onnxruntime == "1.16.3"


def test_a_release_below_the_table_is_refused() -> None:
    assert "onnxruntime 1.15.1 is older than" in _refusal("target.onnxruntime=1.15.1")


def test_a_number_is_refused_with_how_to_quote_it() -> None:
    """YAML and Hydra read ``1.20`` as the number 1.2: never taken for a release."""
    message = _refusal("target.onnxruntime=1.20")
    assert "1.2 is a number, not a release" in message and "1.16.3" in message
    recipe, _ = compose_recipe(["target.onnxruntime='1.18'"])  # quoted: a string
    assert recipe.config.target.onnxruntime == "1.18"


def test_what_cannot_be_told_is_said_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    past = versions.ONNXRUNTIME_LOADS[-1].release.split(".")
    newer = f"{past[0]}.{int(past[1]) + 1}.0"
    with caplog.at_level(logging.WARNING):
        compose_recipe([f"target.onnxruntime={newer}"])
    assert f"target.onnxruntime={newer} is newer than the releases" in caplog.text


def test_onnxruntimes_kernels_count_as_its_domain() -> None:
    recipe, _ = compose_recipe(["quantize.method=int4_block", "target.onnxruntime=1.18.0"])
    default = versions.torchscript_opset(DEFAULT_OPSET)  # tiny_llama leaves opset unset
    assert written_opsets(recipe.config) == {"": default, "hyperexport.fn": 1, "com.microsoft": 1}


@NEEDS_OPSET_18  # asks opset 20
def test_the_command_line_refuses_it_before_any_stage_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperexport",
            "opset=20",
            "target.onnxruntime=1.16.3",
            f"build.cache_dir={tmp_path}/cache",
            f"build.outputs_dir={tmp_path}/out",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "target.onnxruntime" in line]
    assert len(errors) == 1 and "loads opsets up to 19" in errors[0]
    assert not (tmp_path / "cache" / "actions").exists()  # no stage ran
    assert not (tmp_path / "out").exists()
