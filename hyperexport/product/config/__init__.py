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
:class:`~hyperexport.base.errors.RecipeError` naming the recipe file and the field, with close matches
for typos. Validation never imports torch: importability of classes is checked statically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyperexport import lazy_attributes

if TYPE_CHECKING:
    from hyperexport.product.config.hydra import (
        compose_recipe,
        load_recipe_yaml,
        recipe_defaults,
        recipe_file_of,
        register_configs,
    )
    from hyperexport.product.config.imports import split_import_path
    from hyperexport.product.config.paths import (
        CONF_DIR,
        DEFAULT_OUTPUTS_DIR,
        RECIPES_DIR,
        REPO_ROOT,
    )
    from hyperexport.product.config.schema import (
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
    from hyperexport.product.config.validate import (
        check_override_keys,
        check_recipe_choice,
        validate_build,
        validate_recipe,
    )

# Loaded on first access: a stage imports ``config.schema`` (its ``reads`` come from the schema),
# and its key covers the modules it loads (engine/code_closure.py). Importing the schema must not
# load validation and Hydra registration, or editing an error message would rebuild every stage.
_LAZY = {
    "AttentionSpec": "hyperexport.product.config.schema",
    "BUILD_KEYS": "hyperexport.product.config.schema",
    "BUILTIN_ATTENTION": "hyperexport.product.config.schema",
    "BuildConfig": "hyperexport.product.config.schema",
    "BuildSettings": "hyperexport.product.config.schema",
    "CONF_DIR": "hyperexport.product.config.paths",
    "CheckSpec": "hyperexport.product.config.schema",
    "CustomOpSpec": "hyperexport.product.config.schema",
    "DEFAULT_OUTPUTS_DIR": "hyperexport.product.config.paths",
    "DTYPES": "hyperexport.product.config.schema",
    "FUNCTION_MODES": "hyperexport.product.config.schema",
    "FUNCTION_SCOPES": "hyperexport.product.config.schema",
    "InputSpec": "hyperexport.product.config.schema",
    "OPSET_RANGES": "hyperexport.product.config.schema",
    "PROMOTE_MIN_OPSET": "hyperexport.product.config.schema",
    "RECIPES_DIR": "hyperexport.product.config.paths",
    "REPO_ROOT": "hyperexport.product.config.paths",
    "Recipe": "hyperexport.product.config.schema",
    "RecipeConfig": "hyperexport.product.config.schema",
    "RewriteSpec": "hyperexport.product.config.schema",
    "ToleranceSpec": "hyperexport.product.config.schema",
    "check_override_keys": "hyperexport.product.config.validate",
    "check_recipe_choice": "hyperexport.product.config.validate",
    "compose_recipe": "hyperexport.product.config.hydra",
    "load_recipe_yaml": "hyperexport.product.config.hydra",
    "recipe_defaults": "hyperexport.product.config.hydra",
    "recipe_file_of": "hyperexport.product.config.hydra",
    "register_configs": "hyperexport.product.config.hydra",
    "split_import_path": "hyperexport.product.config.imports",
    "validate_build": "hyperexport.product.config.validate",
    "validate_recipe": "hyperexport.product.config.validate",
}

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


__getattr__ = lazy_attributes(__name__, _LAZY)
