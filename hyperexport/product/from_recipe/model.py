"""Loading a recipe's model and generating its example inputs (torch imported lazily)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperexport.base.contracts.names import SAFETENSORS
from hyperexport.base.errors import HieraError, RecipeError
from hyperexport.product.config.imports import split_import_path
from hyperexport.product.from_recipe.instantiate import instantiate_model

if TYPE_CHECKING:
    from hyperexport.product.config.schema import Recipe

log = logging.getLogger(__name__)


def model_loader(recipe: Recipe) -> Callable[[], Any]:
    """A callable that instantiates the recipe's model (and loads its checkpoint, if any)."""

    def load() -> Any:
        from hyperexport.product.from_recipe.weights import load_streamed, streaming_source

        config = recipe.config
        streamed = streaming_source(
            config.weights,
            config.model,
            recipe.checkpoint,
            recipe.file,
            config.task,
            fallback=config.fallback,
        )
        if streamed is not None:
            return load_streamed(*streamed, recipe.data["model"], recipe.file)
        return load_model(recipe.data["model"], recipe.checkpoint, recipe.file)

    return load


def load_model(model_cfg: Mapping[str, Any], checkpoint: Path | None, recipe_file: str = "") -> Any:
    """Instantiate ``model_cfg`` (``_target_`` + kwargs) and load ``checkpoint`` into it.

    A checkpoint is a ``.safetensors`` file, a directory of them, or a torch state dict file
    loaded with ``weights_only=True`` (no arbitrary unpickling).
    """
    model = instantiate_model(model_cfg, recipe_file)
    if checkpoint is not None:
        log.info("Loading checkpoint %s", checkpoint)
        model.load_state_dict(_read_state_dict(checkpoint), strict=True)
    return model.eval()


def _read_state_dict(checkpoint: Path) -> dict[str, Any]:
    import torch

    files = sorted(checkpoint.glob(f"*{SAFETENSORS}")) if checkpoint.is_dir() else [checkpoint]
    state: dict[str, Any] = {}
    for f in files:
        if f.suffix == SAFETENSORS:
            from safetensors.torch import load_file

            state.update(load_file(str(f)))
        else:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def resolve_classes(paths: list[str], recipe_file: str, field: str = "hiera") -> list[type]:
    """Import the classes named by ``paths`` with the library's one hiera resolver
    (:func:`~hyperexport.library.capture.hiera_classes.resolve_hiera`); a failure is a RecipeError
    naming the entry, with a close match."""
    from hyperexport.library.capture.hiera_classes import resolve_hiera

    classes: list[type] = []
    for i, path in enumerate(paths):
        module_name, attr = split_import_path(path)
        try:
            classes += resolve_hiera([f"{module_name}.{attr}"])
        except HieraError as e:
            raise RecipeError(recipe_file, f"{field}[{i}]", str(e)) from e
    return classes
