"""Hydra registration: schemas, recipe defaults and every recipe in the ConfigStore; composing a recipe without the CLI."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.base.errors import RecipeError
from hyperexport.product.config.fields import defaults_of
from hyperexport.product.config.paths import CONF_DIR, DEFAULT_RECIPE, RECIPES_DIR
from hyperexport.product.config.schema import (
    BUILD_KEYS,
    RECIPE_FILE,
    BuildConfig,
    BuildSettings,
    Recipe,
    RecipeConfig,
    _outputs_root,
)
from hyperexport.product.config.validate import validate_build, validate_recipe

# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------
_RECIPE_FILES: dict[str, Path] = {}


def _hydra_dir(outputs_dir: str | None, dry_run: Any, sub: str = "") -> str:
    """Hydra's sweep directory: under the outputs root, or the system temp dir in a dry run.

    A sweep writes ``multirun.yaml`` and its job records there; a dry run must not write into
    the outputs. (A single run's directory is the working directory: conf/config.yaml.)
    """
    if str(dry_run).lower() == "true":
        import tempfile

        base = Path(tempfile.gettempdir()) / "hyperexport-dry-run"
        return str(base / sub if sub else base)
    root = Path(_outputs_root(outputs_dir))
    return str(root / sub if sub else root)


def recipe_files(extra_recipe: Path | None = None) -> dict[str, Path]:
    """``{recipe option name: file}`` of ``recipes/*.yaml`` (and ``extra_recipe``), unread."""
    files = {path.stem: path for path in sorted(RECIPES_DIR.glob("*.yaml"))}
    if extra_recipe is not None:
        path = extra_recipe.resolve()
        files[path.stem] = path
    return files


def recipes_named(overrides: Sequence[str], default: str = DEFAULT_RECIPE) -> set[str] | None:
    """The recipe options a command line selects: ``recipe=a`` or a sweep ``recipe=a,b``.

    ``default`` when no ``recipe=`` is given, and with a sweep too: Hydra composes a multirun's
    own config (``hydra.sweep.*``, the launcher) from the defaults before it applies the sweep's
    values. None (meaning "every recipe") when the choice
    needs the whole group: a sweep function (``recipe=glob(*)``, ``choice(...)``) or an override
    of the group that is not a plain ``recipe=`` (``+recipe=``, ``recipe@pkg=``).
    """
    names: set[str] = set()
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+~")
        if not sep or key == RECIPE_FILE or not key.startswith("recipe"):
            continue
        if key != "recipe" or item.startswith(("+", "~")) or "(" in value:
            return None
        values = [v.strip() for v in value.split(",")]
        names.update(values)
        if len(values) > 1:
            names.add(default)
    return names or {default}


def register_configs(
    extra_recipe: Path | None = None, only: Collection[str] | None = None
) -> dict[str, Path]:
    """Store schemas, recipe defaults and recipes in Hydra's ConfigStore.

    Reading a recipe file costs more than Hydra's whole lookup of it, so a build registers the
    recipes it selects (``only``, see :func:`recipes_named`) and the bases they start from, not
    all of them.

    Args:
        extra_recipe: A recipe file outside ``recipes/``; registered under its file stem
            (shadowing an in-repo recipe of the same name).
        only: The recipe options to register; None registers every recipe. A name that is no
            recipe is skipped here (:func:`~hyperexport.product.config.validate.check_recipe_choice`
            refuses it).

    Returns:
        ``{recipe option name: recipe file}`` of every recipe, registered or not.
    """
    from hydra.core.config_store import ConfigStore

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="build_defaults", node={"build": build_defaults()})
    cs.store(name="recipe_defaults", node=recipe_defaults())
    files = recipe_files(extra_recipe)
    # what an earlier call registered beyond these (another call's extra recipe) is dropped: a
    # later composition in the same process must not list it (a sweep's glob over the group)
    _RECIPE_FILES.clear()
    _RECIPE_FILES.update(files)
    registered = cs.repo.get("recipe", {})
    for entry in [e for e in registered if e.removesuffix(".yaml") not in files]:
        del registered[entry]
    chosen = files if only is None else {n: files[n] for n in sorted(only) if n in files}
    nodes = {name: load_recipe_yaml(path) for name, path in chosen.items()}
    for name, node in nodes.items():
        cs.store(group="recipe", name=name, node=node, package="_global_")
    # Shared bases (recipes/base/<name>.yaml): a recipe starts from one with
    # `defaults: [{/recipe_base: decoder}, _self_]` and overrides only what differs.
    bases = {path.stem: path for path in sorted((RECIPES_DIR / "base").glob("*.yaml"))}
    pending = list(bases) if only is None else _bases_named(nodes.values(), bases)
    done: set[str] = set()
    while pending:
        name = pending.pop()
        if name in done or name not in bases:
            continue
        done.add(name)
        node = load_recipe_yaml(bases[name])
        cs.store(group="recipe_base", name=name, node=node, package="_global_")
        pending += _bases_named([node], bases, inside_base=True)
    return dict(_RECIPE_FILES)


def _bases_named(
    nodes: Iterable[Any], bases: Mapping[str, Path], inside_base: bool = False
) -> list[str]:
    """The ``recipe_base`` options that the defaults lists of ``nodes`` name.

    In a recipe a base is ``{/recipe_base: NAME}``; in a base, a plain ``NAME`` (same group).
    An entry of another form could name any base, so it selects them all.
    """
    names: list[str] = []
    for node in nodes:
        for entry in node.get("defaults") or []:
            if entry == "_self_":
                continue
            if inside_base and isinstance(entry, str):
                names.append(entry)
            elif isinstance(entry, Mapping) and len(entry) == 1:
                ((key, value),) = entry.items()
                if str(key).lstrip("/") == "recipe_base" and isinstance(value, str):
                    names.append(value)
                else:
                    return list(bases)
            else:
                return list(bases)
    return names


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


def build_defaults() -> dict[str, Any]:
    """:class:`BuildConfig`'s defaults as plain data (untyped: ``build.force=all`` is a string
    until validation makes it the stage list)."""
    return dataclasses.asdict(BuildConfig())


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

    overrides = list(overrides)
    only = recipes_named(overrides)
    if recipe_file is not None:
        only = {recipe_file.resolve().stem}
    register_configs(recipe_file, only)
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
