"""Validate every job of a sweep before the first one runs.

Hydra's sweeper composes a job's config only when the job starts, so an invalid value (say
``opset=17,99``) used to be found after the valid jobs were built. Here the command line is
expanded into its jobs the way Hydra's basic sweeper does, each job's recipe is composed and
validated (no model is loaded), and every refusal is reported at once, before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from hyperexport.base.errors import RecipeError
from hyperexport.product.config.schema import RECIPE_FILE

#: The flags that make the command line a multirun (Hydra's).
MULTIRUN_FLAGS = ("-m", "--multirun")


def sweep_jobs(args: Sequence[str]) -> list[list[str]] | None:
    """The overrides of each job of a multirun (None when ``args`` is not one)."""
    if not any(a in MULTIRUN_FLAGS for a in args):
        return None
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hyperexport.product.config.paths import CONF_DIR

    overrides = [a for a in args if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(overrides)
    # `recipe=glob(*)` lists the group's options: the parser needs a loader, as in the sweeper
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
    for override in parsed:
        override.config_loader = loader
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def refused_jobs(jobs: Sequence[Sequence[str]], recipe_file: Path | None) -> list[str]:
    """One line per job whose recipe is invalid: ``job 1 (opset=99): <why>``, naming the
    values that set the job apart from the others."""
    from hyperexport.product.config.hydra import compose_recipe
    from hyperexport.product.stages import PIPELINE

    names = [s.name for s in PIPELINE]
    common = set.intersection(*(set(job) for job in jobs)) if jobs else set()
    refused = []
    for num, job in enumerate(jobs):
        overrides = [
            o for o in job if not (recipe_file and o.split("=", 1)[0] in ("recipe", RECIPE_FILE))
        ]
        try:
            compose_recipe(overrides, recipe_file=recipe_file, stage_names=names)
        except (RecipeError, HydraException, OmegaConfBaseException) as e:
            shown = " ".join(o for o in job if o not in common)  # the job's own values
            refused.append(f"job {num} ({shown}): {str(e).strip().splitlines()[0]}")
    return refused
