"""The base of the pipeline's stages: ``reads`` from the schema, ``run`` and ``outputs`` on the
typed slice.

The runner hands a stage its recipe slice as JSON data (what it keys). :class:`RecipeStage`
types it once (:func:`~hyperexport.product.config.fields.from_json`, ``partial``) and calls
:meth:`RecipeStage.run_recipe`: a stage body reads ``recipe.opset``, never ``params["opset"]``,
and reading a field the stage does not declare raises
:class:`~hyperexport.product.config.fields.UnreadFieldError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.engine.stage import StageInputs
from hyperexport.product.config.fields import from_json
from hyperexport.product.config.schema import RecipeConfig


class RecipeStage:
    """Implements the stage protocol's ``run`` and ``outputs`` for a stage written against the
    typed recipe.

    A subclass sets ``name`` and ``reads = stage_reads(name)`` and implements
    :meth:`run_recipe` and :meth:`recipe_outputs`.
    """

    name: str

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        """Type ``params`` (this stage's slice) and run :meth:`run_recipe` on it."""
        self.run_recipe(from_json(RecipeConfig, params, partial=True), inputs, out_dir)

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        """Type ``params`` and return :meth:`recipe_outputs` of it (the protocol's ``outputs``)."""
        return self.recipe_outputs(from_json(RecipeConfig, params, partial=True))

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        """Produce the stage's outputs from the typed slice ``recipe`` (unread fields raise)."""
        raise NotImplementedError(type(self).__name__)

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """``{artifact name: relative path}``: what :meth:`run_recipe` writes for ``recipe`` and
        a cache entry must hold (:meth:`~hyperexport.engine.stage.Stage.outputs`)."""
        raise NotImplementedError(type(self).__name__)
