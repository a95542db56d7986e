"""Command line: ``python -m hyperexport [recipe=NAME] [FIELD=VALUE ...] [build.*=...]``.

Examples::

    python -m hyperexport                                 # the embedded tiny Llama recipe
    python -m hyperexport recipe=llama opset=17           # short overrides of recipe fields
    python -m hyperexport -m recipe=llama opset=17,18     # a sweep: one build per value
    python -m hyperexport recipe_file=/abs/my_recipe.yaml # a recipe outside the repository
    python -m hyperexport build.dry_run=true              # what would run, and why
    python -m hyperexport build.force=[export]            # rerun named stages

Subcommands (``python -m hyperexport <command> ...``) that are not builds:

    python -m hyperexport cache status|ls|show|verify|gc|clean ...   # hyperexport.cli.cache
    python -m hyperexport show model.onnx                            # hyperexport.cli.show
    python -m hyperexport --version

The ``hyperexport`` console script is the same entry point. Exit codes are those of
:mod:`hyperexport.exit_codes`: 0 built, 1 a stage failed, 2 the recipe or an override is invalid,
3 the cache or outputs cannot be used, 130 interrupted.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hyperexport import exit_codes
from hyperexport.config import (
    BUILD_KEYS,
    CONF_DIR,
    check_override_keys,
    recipe_file_of,
    register_configs,
    validate_build,
    validate_recipe,
)
from hyperexport.errors import RecipeError
from hyperexport.runner.session import run_build, variant_dir
from hyperexport.stages import PIPELINE, model_loader

log = logging.getLogger("hyperexport")

EXIT_OK, EXIT_FAILED, EXIT_RECIPE = exit_codes.OK, exit_codes.FAILED, exit_codes.INVALID
_exit_codes: list[int] = []


def prepare_argv(argv: Sequence[str]) -> tuple[list[str], Path | None]:
    """Turn ``recipe_file=/abs/path.yaml`` into a recipe option Hydra can select.

    The file is registered (by :func:`register_configs`) as recipe option ``<file stem>``; the
    argument list gets ``recipe=<stem>`` and keeps ``recipe_file=<absolute path>`` for messages.

    Raises:
        RecipeError: The file does not exist, or ``recipe=`` is given too.
    """
    out: list[str] = []
    extra: Path | None = None
    for arg in argv:
        if arg.startswith("recipe_file="):
            value = arg.split("=", 1)[1]
            path = Path(value).expanduser().resolve()
            if "," in value or not path.is_file():
                raise RecipeError(
                    value, "recipe_file", "must be the path of one existing YAML file"
                )
            extra = path
            out += [f"recipe={path.stem}", f"recipe_file={path}"]
        else:
            out.append(arg)
    if extra is not None and any(a.startswith("recipe=") for a in argv):
        raise RecipeError(str(extra), "recipe", "give either recipe= or recipe_file=, not both")
    return out, extra


def build_from_config(cfg: DictConfig) -> int:
    """Validate the composed config and build it; returns the exit code."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    recipe_file = cfg.get("recipe_file") or recipe_file_of(hydra_cfg.runtime.choices.get("recipe"))
    try:
        try:
            container: Any = OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as e:
            raise RecipeError(
                recipe_file, str(getattr(e, "full_key", "") or "<config>"), str(e)
            ) from e
        recipe = validate_recipe(
            {k: v for k, v in container.items() if k not in BUILD_KEYS}, recipe_file
        )
        settings = validate_build(container.get("build"), recipe_file, [s.name for s in PIPELINE])
    except RecipeError as e:
        log.error("%s", e)
        return EXIT_RECIPE
    outcome = run_build(
        recipe,
        settings,
        stages=PIPELINE,
        load_model=model_loader(recipe),
        variant=variant_dir(list(hydra_cfg.overrides.task)),
    )
    for line in outcome.lines:
        print(line)
    sys.stdout.flush()
    error = outcome.result.error
    if error is not None and isinstance(error.__cause__, RecipeError):
        return EXIT_RECIPE
    return outcome.exit_code


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_entry(cfg: DictConfig) -> None:
    _exit_codes.append(build_from_config(cfg))


#: Subcommands: ``{name: module}``; each module has ``main(argv: list[str]) -> int``.
SUBCOMMANDS = {"cache": "hyperexport.cli.cache", "show": "hyperexport.cli.show"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hyperexport")
    except PackageNotFoundError:
        from hyperexport import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m hyperexport`` and of the ``hyperexport`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:
        print(f"hyperexport {_version()}")
        sys.exit(EXIT_OK)
    if args and args[0] in SUBCOMMANDS:
        import importlib

        command = importlib.import_module(SUBCOMMANDS[args[0]])
        sys.exit(command.main(args[1:]))
    try:
        args, extra = prepare_argv(args)
        files = register_configs(extra)
        chosen = next((a.split("=", 1)[1] for a in args if a.startswith("recipe=")), "tiny_llama")
        check_override_keys(args, str(files.get(chosen, chosen)))
    except RecipeError as e:
        logging.basicConfig(format="[%(levelname)s] %(message)s")
        log.error("%s", e)
        sys.exit(EXIT_RECIPE)
    sys.argv = [sys.argv[0], *args]
    _exit_codes.clear()
    _hydra_entry()
    sys.exit(max(_exit_codes, default=EXIT_OK))


if __name__ == "__main__":
    main()
