"""Loading a recipe's model and generating its example inputs (torch imported lazily)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperexport.base.contracts.names import SAFETENSORS
from hyperexport.base.errors import HieraError, RecipeError, relayed
from hyperexport.product.config.hydra import recipe_file_of
from hyperexport.product.config.imports import split_import_path

if TYPE_CHECKING:
    from hyperexport.product.config.schema import Recipe

log = logging.getLogger(__name__)


def model_loader(recipe: Recipe) -> Callable[[], Any]:
    """A callable that instantiates the recipe's model (and loads its checkpoint, if any)."""

    def load() -> Any:
        return load_model(recipe.data["model"], recipe.checkpoint, recipe.file)

    return load


def load_model(model_cfg: Mapping[str, Any], checkpoint: Path | None, recipe_file: str = "") -> Any:
    """Instantiate ``model_cfg`` (``_target_`` + kwargs) and load ``checkpoint`` into it.

    A checkpoint is a ``.safetensors`` file, a directory of them, or a torch state dict file
    loaded with ``weights_only=True`` (no arbitrary unpickling).
    """
    from hydra.utils import instantiate

    log.info("Instantiating model <%s>", model_cfg["_target_"])
    try:
        model = instantiate(dict(model_cfg), _convert_="all")
    except Exception as e:
        file = recipe_file or recipe_file_of(None)
        if isinstance(e.__cause__, RecipeError):  # the factory named the field (model.path, ...)
            raise RecipeError(file, e.__cause__.field, e.__cause__.reason) from e
        raise RecipeError(
            file, "model", f"cannot instantiate: {relayed(e, with_type=False)}"
        ) from e
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
    (:func:`~hyperexport.capture.hiera_classes.resolve_hiera`); a failure is a RecipeError
    naming the entry, with a close match."""
    from hyperexport.capture.hiera_classes import resolve_hiera

    classes: list[type] = []
    for i, path in enumerate(paths):
        module_name, attr = split_import_path(path)
        try:
            classes += resolve_hiera([f"{module_name}.{attr}"])
        except HieraError as e:
            raise RecipeError(recipe_file, f"{field}[{i}]", str(e)) from e
    return classes
