"""Calling a recipe's model factory (``_target_`` + kwargs through Hydra)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hyperexport.base.errors import RecipeError, relayed
from hyperexport.product.config.hydra import recipe_file_of

log = logging.getLogger(__name__)


def instantiate_model(model_cfg: Mapping[str, Any], recipe_file: str = "") -> Any:
    """Call ``model_cfg``'s factory (``_target_`` + kwargs); a failure is a RecipeError."""
    from hydra.utils import instantiate

    log.info("Instantiating model <%s>", model_cfg["_target_"])
    try:
        return instantiate(dict(model_cfg), _convert_="all")
    except Exception as e:
        file = recipe_file or recipe_file_of(None)
        if isinstance(e.__cause__, RecipeError):  # the factory named the field (model.path, ...)
            raise RecipeError(file, e.__cause__.field, e.__cause__.reason) from e
        raise RecipeError(
            file, "model", f"cannot instantiate: {relayed(e, with_type=False)}"
        ) from e
