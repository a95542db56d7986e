"""Hydra registration reads only the recipes a command line selects, and a build composes once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from hyperexport.base import versions
from hyperexport.base.errors import RecipeError
from hyperexport.product.config import hydra as registration
from hyperexport.product.config.paths import CONF_DIR, DEFAULT_RECIPE, RECIPES_DIR


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([], {DEFAULT_RECIPE}),
        (["opset=17", "recipe=llama"], {"llama"}),
        (
            ["recipe=llama,zoo_bert"],
            {"llama", "zoo_bert", DEFAULT_RECIPE},
        ),  # a sweep composes the default first
        (["recipe_file=/x/toy.yaml", "recipe=toy"], {"toy"}),
        (["recipe=glob(zoo_*)"], None),  # a sweep function lists the whole group
        (["+recipe=llama"], None),
        (["recipe@other=llama"], None),
    ],
)
def test_the_recipes_a_command_line_selects(overrides: list[str], named: set[str] | None) -> None:
    assert registration.recipes_named(overrides) == named


def test_the_default_recipe_is_the_one_conf_config_names() -> None:
    config: Any = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    assert {"recipe": DEFAULT_RECIPE} in config["defaults"]


def _loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    loaded: list[Path] = []
    real = registration.load_recipe_yaml

    def spy(path: Path) -> Any:
        loaded.append(path)
        return real(path)

    monkeypatch.setattr(registration, "load_recipe_yaml", spy)
    return loaded


def test_only_the_selected_recipe_and_its_chain_of_bases_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = _loads(monkeypatch)
    files = registration.register_configs(None, {"zoo_qwen3_generate"})
    # every recipe is known (for `recipe=` checks and messages), one is read
    assert {p.stem for p in RECIPES_DIR.glob("*.yaml")} <= set(files)
    base = RECIPES_DIR / "base"
    assert sorted(loaded) == sorted(
        [
            RECIPES_DIR / "zoo_qwen3_generate.yaml",
            base / "generate.yaml",  # the recipe's base
            base / "decoder.yaml",  # generate's
            base / "transformer.yaml",  # decoder's
        ]
    )


def test_a_lazily_registered_recipe_composes_with_its_bases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = _loads(monkeypatch)
    if missing := versions.decoding_task_missing("text-generation"):
        # composed with its bases, then refused at validation (a transformers before 4.57)
        with pytest.raises(RecipeError, match=re.escape(missing)):
            registration.compose_recipe(["recipe=zoo_qwen3_generate"])
    else:
        recipe, _ = registration.compose_recipe(["recipe=zoo_qwen3_generate"])
        assert recipe.data["task"] == "text-generation"  # from base/generate.yaml
        assert recipe.data["model"]["_target_"] == "hyperexport.zoo.random_transformer"
    assert len(loaded) == 4


def test_none_registers_every_recipe_and_base(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _loads(monkeypatch)
    registration.register_configs(None, None)
    every = [*RECIPES_DIR.glob("*.yaml"), *(RECIPES_DIR / "base").glob("*.yaml")]
    assert sorted(loaded) == sorted(every)


def test_a_defaults_entry_of_another_form_registers_every_base(tmp_path: Path) -> None:
    bases = {p.stem: p for p in (RECIPES_DIR / "base").glob("*.yaml")}
    node = OmegaConf.create({"defaults": [{"override /recipe_base": "decoder"}, "_self_"]})
    assert sorted(registration._bases_named([node], bases)) == sorted(bases)
    plain = OmegaConf.create({"defaults": [{"/recipe_base": "vision"}, "_self_"]})
    assert registration._bases_named([plain], bases) == ["vision"]


def test_an_extra_recipe_registered_earlier_is_gone_from_a_later_registration(
    tmp_path: Path,
) -> None:
    """In one process, a recipe file outside ``recipes/`` registered for one composition is no
    option of the next (a sweep's ``glob(*)`` over the group listed it: order-dependent under
    xdist, after tests/library/tasks/test_checkpoint_generate.py)."""
    from hydra.core.config_store import ConfigStore

    extra = tmp_path / "an_extra_recipe.yaml"
    extra.write_text((RECIPES_DIR / f"{DEFAULT_RECIPE}.yaml").read_text())
    assert "an_extra_recipe" in registration.register_configs(extra)
    assert "an_extra_recipe.yaml" in ConfigStore.instance().repo["recipe"]
    files = registration.register_configs(None)
    assert "an_extra_recipe" not in files
    assert "an_extra_recipe.yaml" not in ConfigStore.instance().repo["recipe"]
    assert DEFAULT_RECIPE in files
