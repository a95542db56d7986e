"""The zoo (recipes/zoo_*.yaml): each recipe builds through the stage runner and passes the check
(ONNX Runtime against torch) on both export paths, or is an expected failure with its reason
(``hyperexport.zoo.EXPECTED_FAILURES``).

A fast subset runs by default; the whole zoo with ``python -m pytest -m zoo``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.base import versions
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import RECIPES_DIR, compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from hyperexport.zoo import EXPECTED_FAILURES, expected_failures, forward_zoo
from tests.helpers.recipes import model_missing, needs_later_transformers

#: The forward zoo; ``zoo_*_generate`` (task: text-generation) is tests/generation's.
#: The encoder-decoders (two graphs, checked by decoding) are tests/seq2seq's.
ZOO = forward_zoo(RECIPES_DIR)

#: One decoder, one encoder-decoder encoder, one mixture-of-experts: the default run's share.
FAST = {("zoo_qwen3", False), ("zoo_whisper_encoder", True), ("zoo_mixtral", False)}


def _cases() -> list[object]:
    cases = []
    for name in ZOO:
        for dynamo in (False, True):
            marks: list[pytest.MarkDecorator] = []
            if (name, dynamo) not in FAST:
                marks.append(pytest.mark.zoo)
            reason = EXPECTED_FAILURES.get((name, dynamo))
            if reason:
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            cases.append(pytest.param(name, dynamo, marks=marks, id=f"{name}-dynamo={dynamo}"))
    return cases


def test_the_zoo_covers_the_families() -> None:
    families = {
        "llama",
        "qwen3",
        "mistral",
        "gemma2",
        "phi3",
        "gpt2",
        "bert",
        "roberta",
        "vit",
        "resnet",
        "convnext",
        "swin",
        "whisper_encoder",
        "t5_encoder",
        "clip",
        "wav2vec2",
        "falcon",
        "gpt_neox",
        "xlm_roberta",
        "mixtral",
        "qwen2_moe",
        "olmoe",
    }
    assert {f"zoo_{f}" for f in families} <= set(ZOO) and len(ZOO) >= 12


def test_the_expected_failures_are_those_of_the_transformers_release() -> None:
    assert expected_failures() == EXPECTED_FAILURES
    old, new = expected_failures("4.57.6", "2.13.0"), expected_failures("5.24.0", "2.13.0")
    assert "unordered_map::at" in old[("zoo_cohere", False)]
    assert "Reshape" in new[("zoo_cohere", False)]
    # below torch 2.6, 4.57's masks are built without vmap: the rotary embedding's expand fails
    for torch in ("2.5.1", "2.4.1"):
        older_torch = expected_failures("4.57.6", torch)[("zoo_cohere", False)]
        assert "invalid expand shape" in older_torch and "unordered_map" not in older_torch
    assert "aten::__ior_" in older_torch
    assert set(old) | set(new) <= {(n, d) for n in ZOO for d in (False, True)}


@pytest.mark.parametrize(("name", "dynamo"), _cases())
def test_zoo_recipe_builds_and_matches_torch(name: str, dynamo: bool, tmp_path: Path) -> None:
    refusal = needs_later_transformers(name)
    if refusal:  # a class of a later transformers: refused in one line (tests/test_configs.py)
        pytest.skip(refusal)
    if missing := model_missing(name):  # a model class of a later transformers (Qwen3: 4.51)
        pytest.skip(missing)
    recipe, settings = compose_recipe(
        [
            f"recipe={name}",
            f"dynamo={str(dynamo).lower()}",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    error = str(outcome.result.error)
    if dynamo and outcome.exit_code != 0 and "layers take last_cache_position" in error:
        # transformers before 4.53 (versions.TRANSFORMERS_LAYERS_TAKE_LAST_CACHE_POSITION):
        # refused in one line naming both releases
        assert versions.release_in(
            str(versions.transformers_version()),
            versions.TRANSFORMERS_LAYERS_TAKE_LAST_CACHE_POSITION,
        ), error
        assert f"transformers {versions.transformers_version()}" in error
        assert f"torch {versions.torch_version()}" in error and "\n" not in error
        pytest.skip(error)
    assert outcome.exit_code == 0, outcome.result.error
    report = outcome.report
    assert report is not None and report["check"]["ok"]
    check = recipe.data["check"]
    outputs = report["check"]["end_to_end"]["outputs"]

    def atol(output: str) -> float:  # the recipe's, or its per_output one (zoo_t5's encoder)
        given = check["per_output"].get(output.split("@")[0], {})
        return float(given.get("atol", check["atol"]))

    assert outputs and all(o["max_abs"] <= max(atol(o["name"]), 1e-4) for o in outputs)
    assert any(o["name"].endswith("@second_shape") for o in outputs)  # dynamic: auto
    assert report["functions"] and all(f["calls"] >= 1 for f in report["functions"])
    assert report["export_path"]["dynamo"] is dynamo
