"""One build of one validated recipe, end to end: fingerprints, runner, outputs, report.

This is what the CLI calls for every (sweep) job; tests call it directly with their own stages.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.base import exit_codes
from hyperexport.base.cache_dir import ENV_CACHE_DIR, default_cache_dir
from hyperexport.base.errors import CacheUnavailableError, ForeignPathError
from hyperexport.engine.environment import environment_fingerprint
from hyperexport.engine.hashing import FileDigestIndex, sha256_text
from hyperexport.engine.keyed_imports import default_bytecode_dir, keyed_imports
from hyperexport.engine.machinery import machinery
from hyperexport.engine.remote import remote_from_settings
from hyperexport.engine.runner import DEFAULT_VARIANT, REFUSED, BuildRequest, BuildResult, Runner
from hyperexport.engine.settings import READ_ONLY
from hyperexport.engine.stage import Stage
from hyperexport.engine.store import open_store
from hyperexport.product.builds import fingerprint
from hyperexport.product.builds.fingerprint import ENV_DISTRIBUTIONS
from hyperexport.product.builds.layout import FAILED_SUFFIX
from hyperexport.product.builds.publish import (
    CorruptBlobError,
    Publication,
    check_not_foreign,
    check_same_source,
    publish_build,
)
from hyperexport.product.builds.recipe_source import ForeignRecipeError
from hyperexport.product.config import BuildSettings, Recipe

log = logging.getLogger(__name__)

# Overrides that select *where* or *whether* to build, not *what*: not part of the outputs path.
_PATH_EXCLUDED = re.compile(r"^(build\.|hydra[./]|recipe$|recipe_file$)")
# A variant folder name longer than this is cut and given a digest suffix: with the publication
# id and ".failed" added (publish.py), a folder name stays well under the 255-byte limit.
MAX_VARIANT_BYTES = 160
_DIGEST_CHARS = 16
# A name made safe (characters replaced) ends with this many hex digits of the overrides' sha256,
# so two override sets that read alike never share a folder.
_SAFE_DIGEST_CHARS = 8


@dataclass(frozen=True)
class BuildOutcome:
    """What one build produced.

    Attributes:
        exit_code: 0 on success, 1 when a stage failed.
        out_dir: Where this build's report is: ``<recipe>/<variant>`` for a good build,
            ``<recipe>/<variant>.failed`` for a failed one.
        model_path: The model this build made, if any (under ``out_dir``).
        report: The report written (None in a dry run).
        result: The runner's result.
        lines: The summary (or, in a dry run, the plan) printed for the user.
    """

    exit_code: int
    out_dir: Path
    model_path: Path | None
    report: dict[str, Any] | None
    result: BuildResult
    lines: tuple[str, ...]


def variant_dir(overrides: Sequence[str]) -> str:
    """The swept-values part of the outputs path: ``"opset=17,dynamo=true"`` or ``"default"``.

    Overrides of build settings, Hydra settings and the recipe choice are left out; the rest are
    sorted so that the order on the command line does not matter. Separators and whitespace
    become ``_``, so the name is one path component; a name with other characters a shell or
    Hydra would need quoted (quotes, brackets, ``#``, ``*``) is made safe by :func:`_safe_name`
    and ends with ``~`` and 8 hex digits of the overrides' sha256 (two override sets that read
    alike never share a folder); a name over :data:`MAX_VARIANT_BYTES` is cut and ends with
    ``~`` and a digest of the full name (the report keeps every override).
    """
    kept = []
    for item in overrides:
        key = item.lstrip("+~").split("=", 1)[0]
        if not _PATH_EXCLUDED.match(key):
            kept.append(item.lstrip("+~"))
    full = ",".join(sorted(kept))
    name = re.sub(r"[/\\\s\x00]+", "_", full) or DEFAULT_VARIANT
    if not re.fullmatch(_SAFE, name):  # quotes, brackets, '#': made safe, and kept unique
        name = f"{_safe_name(full)}~{sha256_text(full)[:_SAFE_DIGEST_CHARS]}"
    raw = name.encode("utf-8")
    if len(raw) <= MAX_VARIANT_BYTES:
        return name
    head = raw[: MAX_VARIANT_BYTES - _DIGEST_CHARS - 1].decode("utf-8", errors="ignore")
    return f"{head}~{sha256_text(full)[:_DIGEST_CHARS]}"


#: What a variant folder name may hold as it is: no quoting needed in a shell, a URL or Hydra.
_SAFE = r"[A-Za-z0-9._=,+-]+"


def _safe_name(overrides: str) -> str:
    """``overrides`` as a file name that needs no quoting in a shell, a URL or Hydra: quotes and
    brackets dropped, any other character outside letters, digits and ``._=,+-`` a ``_``
    (``check.accept_vacuous=["a.step#0/out.2"]`` -> ``check.accept_vacuous=a.step_0_out.2``)."""
    unquoted = re.sub(r"[\"'\[\](){}]", "", overrides)
    return re.sub(r"[^A-Za-z0-9._=,+-]+", "_", unquoted).strip("_")


def model_fingerprint(recipe: Recipe, index: FileDigestIndex) -> dict[str, Any]:
    """Declared code, weights and argument files of a recipe's model, and the environment
    variables it reads (the recipe's ``env``), see :func:`fingerprint.model_fingerprint`."""
    return fingerprint.model_fingerprint(recipe.data, recipe.file, recipe.checkpoint, index)


def run_build(
    recipe: Recipe,
    settings: BuildSettings,
    *,
    stages: Sequence[Stage],
    load_model: Callable[[], Any] | None,
    variant: str = DEFAULT_VARIANT,
    overrides: Sequence[str] = (),
) -> BuildOutcome:
    """Build ``recipe`` (or plan it, in a dry run) and publish its outputs.

    Args:
        recipe: The validated recipe.
        settings: Build settings.
        stages: The pipeline, in dependency order.
        load_model: Loads the live model (called at most once, only if a stage needs it).
        variant: The swept-values directory name (see :func:`variant_dir`).
        overrides: The command-line overrides, recorded in full in the report.
    """
    recipe_dir = settings.outputs_dir / recipe.name
    try:  # the cache and the outputs: usable, or one line and exit 3 before any stage runs
        for name in (variant, variant + FAILED_SUFFIX):  # never a user's file or folder
            check_not_foreign(recipe_dir / name)
        check_same_source(recipe_dir, recipe.file)  # never another recipe's publications
        with machinery():  # what the remote tier imports is not the model's
            store = open_store(
                default_cache_dir(settings.cache_dir),
                configured_by=f"build.cache_dir / ${ENV_CACHE_DIR}",
                writable_hint="make it writable, or set build.cache_dir to a writable directory",
                dry_run=settings.dry_run,
                remote=remote_from_settings(
                    settings.remote,
                    READ_ONLY if settings.dry_run else settings.remote_mode,
                    settings.storage_options,
                ),
            )
    except CacheUnavailableError as e:
        return _unavailable(e, recipe_dir / variant)
    request = BuildRequest(
        name=recipe.name,
        config=recipe.data,
        source=recipe.file,
        stages=stages,
        env=environment_fingerprint(ENV_DISTRIBUTIONS),
        model=model_fingerprint(recipe, store.index),
        force=frozenset(settings.force),
        dry_run=settings.dry_run,
        code_roots=fingerprint.package_modules(fingerprint.model_imports(recipe.data)),
        not_discovered=(
            str(settings.outputs_dir),
            *(str(p) for p in fingerprint.keyed_paths(recipe.data, recipe.file, recipe.checkpoint)),
        ),
        variant=variant,
    )
    # Inside the block the last build's checkouts stay, for publishing to take (workspace.py).
    with Runner(store, load_model, package=fingerprint.KEYED_PACKAGE) as runner:
        try:
            # The user's compiled files and parsed imports, as the command line keeps them
            # (__main__.py): a build called in process into a new cache compiles nothing again.
            with keyed_imports(default_bytecode_dir(default_cache_dir())):
                result = runner.run(request)
        except CacheUnavailableError as e:  # a stage must run and the cache cannot be written
            return _unavailable(e, recipe_dir / variant)
        if settings.dry_run:
            lines = (
                f"recipe: {recipe.name} ({recipe.file})",
                *(s.line() for s in result.stages),
                f"outputs: {recipe_dir / variant} (dry run: nothing written)",
            )
            return BuildOutcome(0, recipe_dir / variant, None, None, result, lines)
        published = _publish(runner, request, result, recipe_dir, variant, overrides)
    if isinstance(published, BuildOutcome):
        return published
    result, publication = published
    if result.error is not None:
        log.error("%s", publication.report["error"])
        log.error(
            "the failed build is kept in %s; %s is unchanged",
            publication.link,
            recipe_dir / variant,
        )
    model = publication.report["artifacts"].get("model")
    return BuildOutcome(
        0 if result.ok else 1,
        publication.link,
        Path(model) if model else None,
        publication.report,
        result,
        publication.summary,
    )


def _publish(
    runner: Runner,
    request: BuildRequest,
    result: BuildResult,
    recipe_dir: Path,
    variant: str,
    overrides: Sequence[str],
) -> tuple[BuildResult, Publication] | BuildOutcome:
    """Publish ``result``; a blob found corrupt while cloned out rebuilds its stage, once.

    Returns the (possibly rebuilt) result and its publication, or the outcome of a build the
    cache cannot serve.
    """
    store = runner.store
    for attempt in range(2):
        try:
            publication = publish_build(
                store,
                request,
                result,
                recipe_dir,
                variant,
                overrides=overrides,
                local=runner.workspace,
            )
            return result, publication
        except (ForeignPathError, ForeignRecipeError) as e:  # appeared while it ran: untouched
            return _unavailable(e, recipe_dir / variant)
        except OSError as e:  # the outputs' filesystem refused (full, read-only, quota)
            if e.errno not in REFUSED:
                raise
            reason = e.strerror or str(e)
            error = CacheUnavailableError(f"outputs directory {recipe_dir.parent}: {reason}")
            return _unavailable(error, recipe_dir / variant)
        except CorruptBlobError as e:  # found while cloned out: rebuild the affected stage
            if attempt or store.read_only:  # a read-only cache cannot heal
                error = CacheUnavailableError(f"{e} in cache {store.root}")
                return _unavailable(error, recipe_dir / variant)
            log.warning("%s; rebuilding the affected stages", e)
            try:
                result = runner.run(request)
            except CacheUnavailableError as unavailable:
                return _unavailable(unavailable, recipe_dir / variant)
    raise AssertionError("unreachable: the second attempt returns")


def _unavailable(error: CacheUnavailableError, out_dir: Path) -> BuildOutcome:
    """The outcome of a build the cache cannot serve: one line, exit code 3, nothing published."""
    log.error("%s", error)
    return BuildOutcome(exit_codes.UNAVAILABLE, out_dir, None, None, BuildResult(), ())
