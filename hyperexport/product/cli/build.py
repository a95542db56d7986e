"""The build command: Hydra composes the recipe, this module validates it and runs the build.

``python -m hyperexport [recipe=NAME] [FIELD=VALUE ...] [build.*=...]`` ends up in :func:`main`.
The Hydra task function lives here (not in ``__main__``) so that launchers running jobs in other
processes (joblib/loky, submitit, Ray) pickle it by reference: a worker imports this module,
which registers the resolvers and finds the recipe files the same way the launching process did.

Refusals are exit code 2 (:data:`hyperexport.base.exit_codes.INVALID`) with one line naming the field
or value, whether hyperexport or Hydra refuses; Ctrl-C is one line and exit code 130.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hyperexport.base import exit_codes
from hyperexport.base.cache_dir import default_cache_dir
from hyperexport.base.errors import RecipeError, StageError
from hyperexport.product.builds import sweep
from hyperexport.product.builds.session import BuildOutcome, run_build, variant_dir
from hyperexport.product.cli.sweep_check import MULTIRUN_FLAGS, refused_jobs, sweep_jobs
from hyperexport.product.cli.threads import parallel_jobs, share_cores, with_default_n_jobs
from hyperexport.product.cli.usage import UnusableDirectory, check_dir
from hyperexport.product.config import (
    BUILD_KEYS,
    CONF_DIR,
    check_override_keys,
    check_recipe_choice,
    recipe_file_of,
    register_configs,
    validate_build,
    validate_recipe,
)
from hyperexport.product.config.hydra import recipes_named, register_resolvers
from hyperexport.product.config.paths import DEFAULT_RECIPE
from hyperexport.product.config.schema import _outputs_root
from hyperexport.product.stages import PIPELINE, model_loader

log = logging.getLogger("hyperexport")

_FULL_ERROR = "HYDRA_FULL_ERROR"
#: Flags that run builds; any other Hydra flag gets every recipe registered.
_SWEEP_FLAGS = (*MULTIRUN_FLAGS, "-r", "--run")
# Exit codes of the jobs run in this process, and of the sweeps that ended in it.
_exit_codes: list[int] = []

# Workers of process-based launchers unpickle the task function, importing this module: the
# resolvers used in hydra.run.dir / hydra.sweep.dir must exist before Hydra resolves them.
register_resolvers()


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
    """Validate the composed config and build it; returns the exit code.

    In a multirun the job also leaves its record in the sweep folder (see
    :mod:`hyperexport.product.builds.sweep`).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    sweep_dir = Path(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    num = int(hydra_cfg.job.num) if sweep_dir is not None else 0
    if sweep_dir is not None:
        sweep.write_job_record(sweep_dir, sweep.started_record(num, overrides))
        launcher: Any = OmegaConf.to_container(hydra_cfg.launcher, resolve=True)
        share_cores(parallel_jobs(launcher, os.cpu_count() or 1))
    start = time.perf_counter()
    code, outcome, error = _validate_and_build(cfg, hydra_cfg.runtime.choices.get("recipe"))
    if sweep_dir is not None:
        report = outcome.report if outcome is not None else None
        if outcome is not None and report is None:  # a dry run: what would run
            report = {"stages": [s.to_json() for s in outcome.result.stages], "status": "dry run"}
        seconds = time.perf_counter() - start
        record = sweep.job_record(num, overrides, code, report, error=error, seconds=seconds)
        sweep.write_job_record(sweep_dir, record)
    return code


def _validate_and_build(
    cfg: DictConfig, choice: str | None
) -> tuple[int, BuildOutcome | None, str | None]:
    """Validate and build one composed config: (exit code, outcome, refusal message)."""
    recipe_file = cfg.get("recipe_file") or recipe_file_of(choice)
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
        return exit_codes.INVALID, None, str(e)
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task)
    outcome = run_build(
        recipe,
        settings,
        stages=PIPELINE,
        load_model=model_loader(recipe),
        variant=variant_dir(overrides),
        overrides=overrides,
    )
    for line in outcome.lines:
        print(line)
    sys.stdout.flush()
    error = outcome.result.error
    if error is not None and isinstance(error.cause, RecipeError):
        return exit_codes.INVALID, outcome, str(StageError.of(error))
    return outcome.exit_code, outcome, None


def _build_job(cfg: DictConfig) -> None:
    """The task of one job: build ``cfg``, keeping its exit code."""
    _exit_codes.append(build_from_config(cfg))


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_entry(cfg: DictConfig) -> None:
    _build_job(cfg)


def _is_single_run(args: Sequence[str]) -> bool:
    """Whether ``args`` is one build: overrides only, no Hydra flag and no ``hydra.mode=``."""
    return not any(a.startswith("-") or a.split("=", 1)[0] == "hydra.mode" for a in args)


def _run_once(args: Sequence[str]) -> None:
    """Run one build, composing its config once.

    ``hydra.main`` composes the config twice: first to learn whether it asks for a multirun
    (``hydra.mode``), then for the run. Overrides without a flag or ``hydra.mode=`` are a run, so
    this goes straight to the second step with the override Hydra would add (``hydra.mode=RUN``):
    the same config, logging set-up, run directory and callbacks, and exceptions propagate as
    under ``hydra.main`` with ``HYDRA_FULL_ERROR=1``.
    """
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    # job_name: what hydra.main derives from this module's name (hydra.job.name)
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR), job_name="build"):
        runner = GlobalHydra.instance().hydra
        assert runner is not None  # initialize_config_dir just made it
        runner.run(
            config_name="config",
            task_function=_build_job,
            overrides=[*args, "hydra.mode=RUN"],
        )


class SweepResult(Callback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): the table and ``sweep.json``.

    Runs in the launching process when the multirun ends, whatever launcher ran the jobs.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        result = sweep.finish(sweep_dir)
        print(f"sweep: {len(result['jobs'])} jobs, exit code {result['exit_code']}")
        for line in sweep.render_table(result):
            print(f"  {line}")
        print(f"sweep report: {sweep_dir / sweep.SWEEP_JSON}")
        sys.stdout.flush()
        _exit_codes.append(int(result["exit_code"]))


def main(argv: Sequence[str]) -> int:
    """Run the build command with ``argv`` (overrides and Hydra flags); returns the exit code."""
    try:
        args, extra = prepare_argv(argv)
        # Hydra's own flags (--cfg, --info, --hydra-help, ...) may list the recipe group
        inspect = any(a.startswith("-") and a not in _SWEEP_FLAGS for a in args)
        named = None if inspect else recipes_named(args)
        files = register_configs(extra, named)
        check_recipe_choice(args, files)
        chosen = next((a.split("=", 1)[1] for a in args if a.startswith("recipe=")), DEFAULT_RECIPE)
        check_override_keys(args, str(files.get(chosen.split(",")[0], chosen)))
    except RecipeError as e:
        _log_refusal("%s", e)
        return exit_codes.INVALID
    jobs = sweep_jobs(args)
    if jobs is not None and len(jobs) > 1:  # every job valid before the first one runs
        refused = refused_jobs(jobs, extra)
        if refused:
            for line in refused:
                _log_refusal("%s", line)
            _log_refusal("%d of %d jobs refused; none was run", len(refused), len(jobs))
            return exit_codes.INVALID
    args = with_default_n_jobs(args, len(jobs) if jobs is not None else None)
    try:
        _check_directories(args)
    except UnusableDirectory as e:
        _log_refusal("%s", e)
        return exit_codes.UNAVAILABLE
    saved_argv, saved_full_error = sys.argv, os.environ.get(_FULL_ERROR)
    sys.argv = [saved_argv[0], *args]
    # Hydra's refusals then raise (handled below) instead of printing a traceback, exit code 1.
    os.environ[_FULL_ERROR] = "1"
    _exit_codes.clear()
    try:
        if _is_single_run(args):
            _run_once(args)
        else:
            _hydra_entry()
    except (HydraException, OmegaConfBaseException) as e:
        _log_refusal("invalid command line: %s", " ".join(str(e).split()))
        return exit_codes.INVALID
    except OSError as e:  # the filesystem refused (outputs or cache): not a build failure
        _log_refusal("cannot use %s: %s", e.filename or "the outputs or cache", e.strerror or e)
        return exit_codes.UNAVAILABLE
    finally:
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop(_FULL_ERROR, None)
        else:
            os.environ[_FULL_ERROR] = saved_full_error
    return exit_codes.worst(_exit_codes)


def _check_directories(args: Sequence[str]) -> None:
    """Refuse an outputs or cache directory that is a file, or outputs that cannot be written.

    Only the values given on the command line (or the defaults) are checked, before Hydra runs;
    a sweep over directories is left to the builds.

    Raises:
        UnusableDirectory: naming the directory and what is wrong.
    """
    given = {}
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("build.outputs_dir", "build.cache_dir") and "," not in value:
            given[key] = value or None
    dry_run = any(a.lower() == "build.dry_run=true" for a in args)
    check_dir(Path(_outputs_root(given.get("build.outputs_dir"))), "outputs", writable=not dry_run)
    check_dir(default_cache_dir(given.get("build.cache_dir")), "cache", writable=False)


def _log_refusal(message: str, *args: object) -> None:
    logging.basicConfig(format="[%(levelname)s] %(message)s")
    log.error(message, *args)
