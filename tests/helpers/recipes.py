"""Which recipes the installed releases refuse, and in which words: a recipe naming a class of a
later transformers, a decoding task, hyperexport's attention, the dynamo path or ONNX's fusion
where the installed torch or transformers lacks what it needs (each keyed to a version fact of
``hyperexport/base/versions.py``). On the pinned stack no recipe is refused. And each recipe
composed and validated once per test process (:func:`composed`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import re
from typing import Any

from hyperexport.base import versions
from hyperexport.base.contracts.names import (
    PROMOTE_MIN_OPSET,
    STANDARD_FUSION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)
from hyperexport.product.config import RECIPES_DIR, BuildSettings, Recipe, compose_recipe

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def needs_later_transformers(name: str) -> str | None:
    """The one-line refusal recipe ``name`` gets here (it names a transformers class of a later
    release, ``versions.TRANSFORMERS_CLASSES_SINCE``), or None when it is usable."""
    text = (RECIPES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    for path in re.findall(r"transformers\.models\.[\w.]+", text):
        refusal = versions.missing_transformers_class(path)
        if refusal:
            return refusal
    return None


@functools.cache
def _composed(name: str) -> dict[str, Any]:
    """Recipe ``name`` as Hydra composes it (bases and schema defaults), not validated.

    The composing half of ``product/config/hydra.compose_recipe``, which validates too (and so
    refuses): splitting it there would move the export stage's key (``hydra.py`` is among its
    keyed sources), so that waits for the next key change."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hyperexport.product.config.hydra import register_configs
    from hyperexport.product.config.paths import CONF_DIR

    register_configs(None, {name})
    with initialize_config_dir(
        version_base="1.3", config_dir=str(CONF_DIR), job_name="hyperexport"
    ):
        cfg = compose(config_name="config", overrides=[f"recipe={name}"])
    data: Any = OmegaConf.to_container(cfg, resolve=True)
    return data


#: Whether the installed releases lack anything a field can ask for (False on the pinned
#: stack, where no recipe needs composing to know it is not refused).
_RELEASES_LACK_SOMETHING = bool(
    versions.decoding_task_missing(TEXT_GENERATION)
    or versions.decoding_task_missing(TEXT2TEXT_GENERATION)
    or versions.attention_registration_missing()
    or versions.unsupported(True)
    or versions.torchscript_opset(PROMOTE_MIN_OPSET) < PROMOTE_MIN_OPSET
)


def release_refusals(name: str) -> dict[str, str]:
    """``{field: words of its one-line refusal}`` of every field validation refuses in recipe
    ``name`` because of the installed releases (empty on the pinned stack); a recipe naming a
    later transformers' class is ``needs_later_transformers``'s, under the key ``"class"``."""
    if later := needs_later_transformers(name):
        return {"class": later}
    if not _RELEASES_LACK_SOMETHING:
        return {}
    from hyperexport.library.tasks.registry import TASKS

    data = _composed(name)
    found: dict[str, str] = {}
    task = TASKS.get(data["task"])
    decoding = data["task"] == TEXT_GENERATION or (task is not None and bool(task.graphs))
    if decoding and (missing := versions.decoding_task_missing(data["task"])):
        found["task"] = missing
    attention = data["attention"]["implementation"] is not None
    if attention and (missing := versions.attention_registration_missing()):
        found["attention.implementation"] = missing
    if data["dynamo"] and (problems := versions.unsupported(True)):
        # the one line: the opset a dynamo recipe leaves unset is the TorchScript default (17 on
        # torch 2.2), which validation then does not judge
        found["dynamo"] = problems[0]
    elif data["rewrite"]["fuse"] == STANDARD_FUSION and data["opset"] < PROMOTE_MIN_OPSET:
        found["opset"] = f"{data['opset']} is too old for rewrite.fuse=standard"
    return found


def model_missing(name: str) -> str | None:
    """Why recipe ``name``'s model cannot be made with the installed transformers though the
    recipe validates (a ``model_class`` of a later release, found only when instantiated), or
    None."""
    text = (RECIPES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    if re.search(r"model_class: Qwen3", text) and not importlib.util.find_spec(
        "transformers.models.qwen3"
    ):
        return f"transformers {versions.transformers_version()} has no Qwen3 (4.51 brought it)"
    return None


#: The recipes usable with the installed releases (all of them on the pinned stack).
USABLE = [name for name in RECIPES if not release_refusals(name)]
#: The recipes naming a later transformers' class, with their one-line refusal.
REFUSED = {name: refusal for name in RECIPES if (refusal := needs_later_transformers(name))}


@functools.cache
def _validated(name: str) -> tuple[Recipe, BuildSettings]:
    return compose_recipe([f"recipe={name}"])


def composed(name: str) -> tuple[Recipe, BuildSettings]:
    """``compose_recipe(["recipe=<name>"])``, composed and validated once per test process
    (Hydra takes a few tenths of a second a recipe, and several test modules compose all of
    them); each caller gets its own copy of the data."""
    recipe, build = _validated(name)
    return dataclasses.replace(recipe, data=copy.deepcopy(recipe.data)), build
