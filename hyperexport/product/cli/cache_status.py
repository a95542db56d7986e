"""``cache status``: for each recipe, which stages a build would run and why, without building.

It is the build's own dry run (:func:`hyperexport.product.builds.session.run_build` with
``dry_run=True``): the same keys, the same reasons, a read-only cache, and no torch import
(fingerprints are read from package metadata and source files).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from hyperexport.base.errors import RecipeError
from hyperexport.engine.runner import StageResult
from hyperexport.engine.store import HIT
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import RECIPES_DIR, compose_recipe
from hyperexport.product.stages import PIPELINE


@dataclass(frozen=True)
class RecipeStatus:
    """The plan of one recipe.

    Attributes:
        recipe: The recipe's name (its ``name`` field, or the file stem when it is invalid).
        file: The recipe file.
        stages: One result per stage: ``hit`` or ``would_run`` with its reason.
        error: Why the recipe could not be planned (invalid recipe or override), else None.
    """

    recipe: str
    file: str
    stages: tuple[StageResult, ...] = ()
    error: str | None = None

    @property
    def up_to_date(self) -> bool:
        return self.error is None and all(s.status == HIT for s in self.stages)


def repository_recipes() -> list[str]:
    """The recipe options of ``recipes/`` (file stems), sorted."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def plan_recipe(
    cache_dir: Path,
    *,
    recipe: str | None = None,
    recipe_file: Path | None = None,
    overrides: Sequence[str] = (),
) -> RecipeStatus:
    """Compose one recipe like the CLI does and dry-run its build against ``cache_dir``."""
    label = recipe or (recipe_file.stem if recipe_file else "?")
    file = str(recipe_file or RECIPES_DIR / f"{recipe}.yaml")
    chosen = [f"recipe={recipe}"] if recipe else []
    try:
        composed, settings = compose_recipe(
            [*chosen, *overrides], recipe_file=recipe_file, stage_names=[s.name for s in PIPELINE]
        )
    except (RecipeError, HydraException, OmegaConfBaseException) as e:
        return RecipeStatus(label, file, error=_one_line(e))
    settings = dataclasses.replace(settings, cache_dir=str(cache_dir), dry_run=True, force=())
    outcome = run_build(composed, settings, stages=PIPELINE, load_model=None)
    return RecipeStatus(composed.name, composed.file, tuple(outcome.result.stages))


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
