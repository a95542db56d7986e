"""``hyperexport.lock``: what CI builds, and what each build depends on and yields.

Like ``dvc.lock``, the file is committed; a pull request's diff of it shows which models the
change rebuilds. It holds one entry per variant CI builds (by default every recipe of
``recipes/`` at its default variant; ``conf/lock.yaml`` may list others), keyed
``<recipe>/<variant>``. Each entry records only what does not depend on the machine:

* ``fields``: the recipe fields the stages read, as they are keyed (a checkpoint path is
  replaced by the digests of its files, so moving it is no change);
* ``digests``: sha256 of the hyperexport code the stages run (with the stage versions), of the
  model (its code, weights and files) and of the recipe slice;
* ``versions``: the libraries the stages declare, and Python's major.minor;
* ``artifacts``: the sha256 of each published file, when the variant was built by ``lock``.

The file is JSON with sorted keys and one value per line, so it diffs well. The inputs are
computed the way the build computes its stage keys, without building and without torch
(:func:`variant_inputs`); :func:`compare` says what differs between two entries, in the same
words as a build's reasons.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_text
from hyperexport.config.paths import CONF_DIR, RECIPES_DIR, REPO_ROOT
from hyperexport.engine.hashing import canonical_json, sha256_text
from hyperexport.errors import RecipeError

log = logging.getLogger(__name__)

#: The lock file, at the repository root.
LOCK_FILE = REPO_ROOT / "hyperexport.lock"
#: The optional list of variants CI builds.
LOCK_CONFIG = CONF_DIR / "lock.yaml"
#: Format version of the file.
LOCK_FORMAT = 1


@dataclass(frozen=True)
class Variant:
    """One variant CI builds: a recipe of ``recipes/`` and its overrides."""

    recipe: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``<recipe>/<variant folder>``, as the outputs are laid out."""
        from hyperexport.builds.session import variant_dir

        return f"{self.recipe}/{variant_dir(self.overrides)}"


@dataclass
class LockEntry:
    """One variant's entry: its inputs (machine-independent) and published artifacts."""

    recipe: str
    overrides: list[str]
    inputs: dict[str, Any]
    artifacts: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "overrides": list(self.overrides),
            **self.inputs,
            "artifacts": dict(sorted(self.artifacts.items())),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LockEntry:
        inputs = {k: v for k, v in data.items() if k not in ("recipe", "overrides", "artifacts")}
        return cls(
            str(data.get("recipe")),
            [str(o) for o in data.get("overrides") or []],
            inputs,
            {str(k): str(v) for k, v in (data.get("artifacts") or {}).items()},
        )


def locked_variants(config: Path = LOCK_CONFIG, recipes_dir: Path = RECIPES_DIR) -> list[Variant]:
    """The variants CI builds: ``config``'s ``variants`` list, else every recipe's default.

    Raises:
        RecipeError: ``config`` is malformed or names a recipe that does not exist.
    """
    known = sorted(p.stem for p in recipes_dir.glob("*.yaml"))
    listed: Any = None
    if config.is_file():
        from omegaconf import OmegaConf

        listed = OmegaConf.to_container(OmegaConf.load(config)).get("variants")  # type: ignore[union-attr]
    if not listed:
        return [Variant(name) for name in known]
    if not isinstance(listed, list):
        raise RecipeError(str(config), "variants", "must be a list of {recipe, overrides}")
    out = []
    for i, item in enumerate(listed):
        if not isinstance(item, Mapping) or item.get("recipe") not in known:
            raise RecipeError(
                str(config), f"variants[{i}].recipe", f"must name a recipe of {recipes_dir}"
            )
        overrides = item.get("overrides") or []
        if not isinstance(overrides, list):
            raise RecipeError(str(config), f"variants[{i}].overrides", "must be a list")
        out.append(Variant(str(item["recipe"]), tuple(str(o) for o in overrides)))
    return out


def variant_inputs(variant: Variant) -> dict[str, Any]:
    """What ``variant``'s build depends on, machine-independent, computed without building.

    Raises:
        RecipeError: The recipe or its overrides are invalid.
    """
    from hyperexport.builds import fingerprint
    from hyperexport.config.hydra import compose_recipe
    from hyperexport.engine.code_closure import package_sources, stage_code
    from hyperexport.engine.environment import environment_fingerprint
    from hyperexport.engine.hashing import FileDigestIndex
    from hyperexport.engine.keys import key_params
    from hyperexport.engine.stage import recipe_slice
    from hyperexport.stages import PIPELINE

    recipe, _ = compose_recipe(
        [f"recipe={variant.recipe}", *variant.overrides], stage_names=[s.name for s in PIPELINE]
    )
    model = fingerprint.model_fingerprint(
        recipe.data, recipe.file, recipe.checkpoint, FileDigestIndex(None)
    )
    roots = fingerprint.package_modules(fingerprint.model_imports(recipe.data))
    sources = package_sources()
    params: dict[str, Any] = {}
    code: dict[str, Any] = {}
    packages: dict[str, Any] = {}
    python = ""
    for stage in PIPELINE:
        # Merged section by section: a later stage reading one field of a section (check reads
        # rewrite.fuse) must not hide the fields an earlier one reads of it (rewrite reads all).
        _merge(params, key_params(recipe_slice(recipe.data, stage.reads), model.get("files", {})))
        code[stage.name] = {
            "version": stage.version,
            "code": stage_code(type(stage).__module__, roots if stage.needs_model else (), sources),
        }
        env = environment_fingerprint(stage.libraries)
        packages.update(env["packages"])
        python = env["python"]
    return {
        "fields": params,
        "digests": {
            "code": sha256_text(canonical_json(code)),
            "model": sha256_text(canonical_json(model)),
            "recipe": sha256_text(canonical_json(params)),
        },
        "versions": {"python": python, **dict(sorted(packages.items()))},
    }


def read_lock(path: Path = LOCK_FILE) -> dict[str, LockEntry]:
    """The entries of the lock file at ``path`` (empty if there is none).

    Raises:
        RecipeError: The file is not a lock file of this format.
    """
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise RecipeError(str(path), "hyperexport.lock", f"is not JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT:
        raise RecipeError(str(path), "format", f"must be {LOCK_FORMAT}; run `hyperexport lock`")
    variants = data.get("variants") or {}
    return {str(k): LockEntry.from_json(v) for k, v in variants.items() if isinstance(v, dict)}


def render_lock(entries: Mapping[str, LockEntry]) -> str:
    """The file's text: sorted keys, two-space indents, one value per line."""
    data = {
        "format": LOCK_FORMAT,
        "generated_by": "hyperexport lock",
        "variants": {name: entries[name].to_json() for name in sorted(entries)},
    }
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_lock(entries: Mapping[str, LockEntry], path: Path = LOCK_FILE) -> None:
    """Write the lock file atomically."""
    atomic_write_text(path, render_lock(entries))


def compare(locked: LockEntry | None, current: Mapping[str, Any]) -> str:
    """Why ``current`` (inputs) would rebuild against the ``locked`` entry; "" if it would not."""
    from hyperexport.engine.keys import diff_values

    if locked is None:
        return "not in hyperexport.lock"
    reasons = diff_values(locked.inputs.get("fields", {}), current.get("fields", {}))
    old_digests, new_digests = locked.inputs.get("digests", {}), current.get("digests", {})
    for part, what in (("code", "hyperexport code"), ("model", "model code, weights or files")):
        if old_digests.get(part) != new_digests.get(part):
            reasons.append(f"{what} changed")
    versions = diff_values(locked.inputs.get("versions", {}), current.get("versions", {}))
    reasons += versions
    if not reasons and old_digests.get("recipe") != new_digests.get("recipe"):
        reasons.append("recipe changed")
    more = len(reasons) - _MAX_REASONS
    return ", ".join(reasons[:_MAX_REASONS]) + (f", +{more} more" if more > 0 else "")


#: How many differences a stale entry's reason names before it counts the rest.
_MAX_REASONS = 4


def stale_entries(
    variants: Sequence[Variant], entries: Mapping[str, LockEntry]
) -> list[tuple[str, str]]:
    """``(variant name, reason)`` of every variant whose locked entry no longer holds, and of
    every entry no variant selects any more (``"no longer built"``)."""
    out = []
    names = set()
    for variant in variants:
        names.add(variant.name)
        try:
            reason = compare(entries.get(variant.name), variant_inputs(variant))
        except RecipeError as e:
            reason = f"invalid: {e}"
        if reason:
            out.append((variant.name, reason))
    out += [(name, "no longer built") for name in sorted(set(entries) - names)]
    return out


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """``more`` into ``into``, descending into mappings both hold."""
    for key, value in more.items():
        if isinstance(value, Mapping):
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _merge(into[key], value)
        else:
            into[key] = value
