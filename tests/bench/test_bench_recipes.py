"""bench/recipes/ files that need no checkpoint validate as recipes (CI builds none of them)."""

from __future__ import annotations

from pathlib import Path

from hyperexport.product.config.hydra import compose_recipe

BENCH_RECIPES = Path(__file__).resolve().parents[2] / "bench" / "recipes"


def test_the_qwen2_0_5b_quantize_recipe_validates_with_the_bench_s_overrides() -> None:
    recipe, _ = compose_recipe(
        ["quantize.method=int4_block", "quantize.block_size=32"],
        recipe_file=BENCH_RECIPES / "qwen2_0_5b_quantize.yaml",
    )
    assert recipe.data["name"] == "qwen2_0_5b_quantize"
    assert recipe.data["model"]["shape"] == "qwen2_0_5b"
    assert recipe.data["quantize"]["method"] == "int4_block"
    assert recipe.data["external_data"] is True
