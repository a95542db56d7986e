"""Hydra registration: schemas, recipe defaults and every recipe in the ConfigStore; composing a recipe without the CLI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hyperexport.config.fields import defaults_of
from hyperexport.config.paths import CONF_DIR, RECIPES_DIR
from hyperexport.config.schema import (
    BUILD_KEYS,
    BuildConfig,
    BuildSettings,
    Recipe,
    RecipeConfig,
    _outputs_root,
)
from hyperexport.config.validate import validate_build, validate_recipe
from hyperexport.contracts.names import STAGE_NAMES
from hyperexport.errors import RecipeError

# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------
_RECIPE_FILES: dict[str, Path] = {}


def _hydra_dir(outputs_dir: str | None, dry_run: Any, sub: str = "") -> str:
    """Hydra's own run/sweep directory: the outputs root, or a temp dir in a dry run.

    Hydra always creates its job directory (and a sweep writes ``multirun.yaml`` there); a dry
    run must not write into the outputs, so it points Hydra at the system temp directory.
    """
    if str(dry_run).lower() == "true":
        import tempfile

        base = Path(tempfile.gettempdir()) / "hyperexport-dry-run"
        return str(base / sub if sub else base)
    root = Path(_outputs_root(outputs_dir))
    return str(root / sub if sub else root)


def register_configs(extra_recipe: Path | None = None) -> dict[str, Path]:
    """Store schemas, recipe defaults and every recipe in Hydra's ConfigStore.

    Args:
        extra_recipe: A recipe file outside ``recipes/``; registered under its file stem
            (shadowing an in-repo recipe of the same name).

    Returns:
        ``{recipe option name: recipe file}``.
    """
    from hydra.core.config_store import ConfigStore

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="build_schema", node=BuildConfig)
    cs.store(name="recipe_defaults", node=recipe_defaults())
    files = sorted(RECIPES_DIR.glob("*.yaml"))
    if extra_recipe is not None:
        files.append(extra_recipe.resolve())
    for path in files:
        cs.store(group="recipe", name=path.stem, node=load_recipe_yaml(path), package="_global_")
        _RECIPE_FILES[path.stem] = path
    # Shared bases (recipes/base/<name>.yaml): a recipe starts from one with
    # `defaults: [{/recipe_base: decoder}, _self_]` and overrides only what differs.
    for path in sorted((RECIPES_DIR / "base").glob("*.yaml")):
        node = load_recipe_yaml(path)
        cs.store(group="recipe_base", name=path.stem, node=node, package="_global_")
    return dict(_RECIPE_FILES)


def register_resolvers() -> None:
    """Register the OmegaConf resolvers conf/config.yaml uses (``hx_hydra_dir``); idempotent.

    Called by :func:`register_configs`, and when the build command's module is imported: a
    launcher's worker process resolves ``hydra.sweep.dir`` before it runs the job.
    """
    if not OmegaConf.has_resolver("hx_hydra_dir"):
        OmegaConf.register_new_resolver("hx_hydra_dir", _hydra_dir)


def recipe_file_of(option: str | None) -> str:
    """The file of recipe option ``option``: as registered, else ``recipes/<option>.yaml``.

    A launcher's worker process may not have registered anything itself (the ConfigStore
    travels to it, this module's table does not), so the recipes folder is looked up directly.
    Returns the option itself if no file is known.
    """
    if option and option in _RECIPE_FILES:
        return str(_RECIPE_FILES[option])
    if option and "/" not in option and (RECIPES_DIR / f"{option}.yaml").is_file():
        return str(RECIPES_DIR / f"{option}.yaml")
    return str(option or "<no recipe>")


def recipe_defaults() -> dict[str, Any]:
    """The schema defaults as plain data (``???`` for required fields)."""
    return defaults_of(RecipeConfig)


def load_recipe_yaml(path: Path) -> Any:
    """Load one recipe file as an OmegaConf node; a syntax error becomes a RecipeError."""
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml and OmegaConf raise several unrelated types
        raise RecipeError(str(path), "<file>", f"cannot be read: {e}") from e
    if not isinstance(node, Mapping):
        raise RecipeError(str(path), "<file>", "must be a mapping of recipe fields")
    return node


def compose_recipe(
    overrides: Sequence[str] = (),
    *,
    recipe_file: Path | None = None,
    stage_names: Sequence[str] = STAGE_NAMES,
) -> tuple[Recipe, BuildSettings]:
    """Compose and validate a recipe the way the CLI does, without running anything.

    For tests, benchmarks and programs that drive builds without the command line.

    Args:
        overrides: Hydra overrides, e.g. ``["recipe=llama", "opset=17"]``.
        recipe_file: A recipe file outside ``recipes/`` (like ``recipe_file=`` on the CLI).
        stage_names: Valid names for ``build.force``.

    Raises:
        RecipeError: The recipe or the build settings are invalid.
    """
    from hydra import compose, initialize_config_dir

    register_configs(recipe_file)
    overrides = list(overrides)
    if recipe_file is not None:
        overrides += [f"recipe={recipe_file.stem}", f"recipe_file={recipe_file.resolve()}"]
    with initialize_config_dir(
        version_base="1.3", config_dir=str(CONF_DIR), job_name="hyperexport"
    ):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choice = cfg.hydra.runtime.choices.get("recipe")
    file = cfg.get("recipe_file") or recipe_file_of(choice)
    data: Any = OmegaConf.to_container(cfg, resolve=False)
    data.pop("hydra", None)
    data = OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    recipe = validate_recipe({k: v for k, v in data.items() if k not in BUILD_KEYS}, file)
    return recipe, validate_build(data.get("build"), file, stage_names)
