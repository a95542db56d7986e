"""Recipe and build settings: schemas (``schema``), validation (``validate``), static import
resolution (``imports``), Hydra registration (``hydra``) and data paths (``paths``).

Layout (documented in outputs/README.md):

* ``conf/config.yaml`` is the primary config. Its ``build:`` section holds the build settings
  (``cache_dir``, ``outputs_dir``, ``dry_run``, ``force``); nothing else lives there.
* ``recipes/<name>.yaml`` are the options of the ``recipe`` config group, with package
  ``_global_``: a recipe's keys sit at the top level, so ``opset=17`` overrides the recipe's
  opset. They are registered in Hydra's ConfigStore from the package location (never the working
  directory), on top of ``recipe_defaults``: the defaults of :class:`RecipeConfig`, so that every
  field can be overridden by its short name even when a recipe does not mention it.
* ``recipe_file=/abs/path.yaml`` builds a recipe kept outside the repository (see
  ``hyperexport.__main__``).

Hydra composes without a strict schema so that this module, not Hydra, reports a bad recipe: one
:class:`~hyperexport.errors.RecipeError` naming the recipe file and the field, with close matches
for typos. Validation never imports torch: importability of classes is checked statically.
"""

from __future__ import annotations

from hyperexport.config.hydra import (
    compose_recipe,
    load_recipe_yaml,
    recipe_defaults,
    recipe_file_of,
    register_configs,
)
from hyperexport.config.imports import split_import_path
from hyperexport.config.paths import CONF_DIR, DEFAULT_OUTPUTS_DIR, RECIPES_DIR, REPO_ROOT
from hyperexport.config.schema import (
    BUILD_KEYS,
    BUILTIN_ATTENTION,
    DTYPES,
    FUNCTION_MODES,
    FUNCTION_SCOPES,
    OPSET_RANGES,
    PROMOTE_MIN_OPSET,
    AttentionSpec,
    BuildConfig,
    BuildSettings,
    CheckSpec,
    CustomOpSpec,
    InputSpec,
    Recipe,
    RecipeConfig,
    RewriteSpec,
    ToleranceSpec,
)
from hyperexport.config.validate import (
    check_override_keys,
    check_recipe_choice,
    validate_build,
    validate_recipe,
)

__all__ = [
    "BUILD_KEYS",
    "BUILTIN_ATTENTION",
    "CONF_DIR",
    "DEFAULT_OUTPUTS_DIR",
    "DTYPES",
    "FUNCTION_MODES",
    "FUNCTION_SCOPES",
    "OPSET_RANGES",
    "PROMOTE_MIN_OPSET",
    "RECIPES_DIR",
    "REPO_ROOT",
    "AttentionSpec",
    "BuildConfig",
    "BuildSettings",
    "CheckSpec",
    "CustomOpSpec",
    "InputSpec",
    "Recipe",
    "RecipeConfig",
    "RewriteSpec",
    "ToleranceSpec",
    "check_override_keys",
    "check_recipe_choice",
    "compose_recipe",
    "load_recipe_yaml",
    "recipe_defaults",
    "recipe_file_of",
    "register_configs",
    "split_import_path",
    "validate_build",
    "validate_recipe",
]
