"""``hyperexport.lock``: what CI builds, and what each build depends on and yields.

Like ``dvc.lock``, the file is committed; a pull request's diff of it shows which models the
change rebuilds. It holds one entry per variant CI builds (by default every recipe of
``recipes/`` at its default variant; ``conf/lock.yaml`` may list others), keyed
``<recipe>/<variant>``, and one table of the hyperexport sources those builds run. Everything in
it is the declared key material of the stages (:func:`hyperexport.engine.keys.
declared_material`, the function the build keys with), minus what only a build knows (the
upstream outputs), and nothing of the machine:

* ``sources`` (top level): ``{path: token digest}`` of every hyperexport module a locked stage
  runs;
* per variant, ``fields``: the recipe fields the stages read, as they are keyed (a checkpoint
  path is replaced by the digests of its files, so moving it is no change);
* ``model``: the model fingerprint (the code the recipe names, by distribution version and
  package-file digest or by source digest; the weights; the files ``model:`` arguments name),
  with the names of the environment variables it declares but never their values;
* ``stages``: each stage's version and the digest of the code it runs;
* ``versions``: the libraries the stages declare, and Python's major.minor (``constraints.txt``
  pins each of them, so the lock holds on any machine that installs it);
* ``artifacts``: the sha256 of each published file, when the variant was built by ``lock``.

The file is JSON with sorted keys and one value per line, so it diffs well. :func:`compare`
says what differs, in the build's own words: the field, the model's module and its digest or
version, the checkpoint file, the hyperexport source.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.errors import RecipeError
from hyperexport.engine.hashing import canonical_json, sha256_text
from hyperexport.product.config.paths import CONF_DIR, RECIPES_DIR, REPO_ROOT

log = logging.getLogger(__name__)

#: The lock file, at the repository root.
LOCK_FILE = REPO_ROOT / "hyperexport.lock"
#: The optional list of variants CI builds.
LOCK_CONFIG = CONF_DIR / "lock.yaml"
#: Format version of the file (2: sources, model and stages itemised, so reasons name them).
LOCK_FORMAT = 2


@dataclass(frozen=True)
class Variant:
    """One variant CI builds: a recipe of ``recipes/`` and its overrides."""

    recipe: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``<recipe>/<variant folder>``, as the outputs are laid out."""
        from hyperexport.product.builds.session import variant_dir

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
            **{k: v for k, v in self.inputs.items() if k != SOURCES},
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


#: The inputs' key of the sources a variant's stages run (``{path: digest}``); the file keeps one
#: table of them at the top level, and each entry its stages' code digests.
SOURCES = "sources"


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
    """What ``variant``'s build depends on, machine-independent, computed without building:
    each stage's declared key material (:func:`hyperexport.engine.keys.declared_material`),
    gathered into ``fields``, ``model``, ``stages``, ``versions`` and ``sources``.

    Raises:
        RecipeError: The recipe or its overrides are invalid.
    """
    from hyperexport.engine.code_closure import package_sources
    from hyperexport.engine.hashing import FileDigestIndex
    from hyperexport.engine.keys import declared_material
    from hyperexport.engine.stage import config_slice
    from hyperexport.product.builds import fingerprint
    from hyperexport.product.config.hydra import compose_recipe
    from hyperexport.product.stages import PIPELINE

    recipe, _ = compose_recipe(
        [f"recipe={variant.recipe}", *variant.overrides], stage_names=[s.name for s in PIPELINE]
    )
    model = fingerprint.model_fingerprint(
        recipe.data, recipe.file, recipe.checkpoint, FileDigestIndex(None)
    )
    roots = fingerprint.package_modules(fingerprint.model_imports(recipe.data))
    package = package_sources(fingerprint.KEYED_PACKAGE)
    fields: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for stage in PIPELINE:
        material = declared_material(
            stage,
            config_slice(recipe.data, stage.reads),
            {},
            model=model,
            code_roots=roots,
            sources=package,
        )
        # Merged, not updated: stages read parts of one group (quantize the whole section,
        # evaluate quantize.method), and the group's fields are the union.
        _merge(fields, material["params"])
        stages[stage.name] = {
            "version": material["version"],
            "code": sha256_text(canonical_json(material["code"])),
        }
        sources.update(material["code"])
        versions["python"] = material["env"]["python"]
        versions.update(material["env"]["packages"])
    return {
        "fields": fields,
        "model": _without_env_values(model),
        "stages": stages,
        "versions": dict(sorted(versions.items())),
        SOURCES: dict(sorted(sources.items())),
    }


def _without_env_values(model: Mapping[str, Any]) -> dict[str, Any]:
    """The model fingerprint with the environment variables it declares named, not hashed: a
    value is the CI machine's, and a digest of it is never written down (docs/cache.md, "Environment values")."""
    out = {k: v for k, v in model.items() if k != "env"}
    if "env" in model:
        out["env"] = sorted(model["env"])
    return out


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Add ``more`` to ``into``, recursing into the mappings both hold."""
    for name, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        else:
            into[name] = copy.deepcopy(value)


def read_lock(path: Path = LOCK_FILE) -> dict[str, LockEntry]:
    """The entries of the lock file at ``path`` (empty if there is none); each entry's inputs
    hold the file's source table under :data:`SOURCES`.

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
    sources = {str(k): str(v) for k, v in (data.get(SOURCES) or {}).items()}
    variants = data.get("variants") or {}
    entries = {}
    for name, value in variants.items():
        if isinstance(value, dict):
            entry = LockEntry.from_json(value)
            entry.inputs[SOURCES] = sources
            entries[str(name)] = entry
    return entries


def render_lock(entries: Mapping[str, LockEntry]) -> str:
    """The file's text: sorted keys, two-space indents, one value per line; the sources of
    every entry in one table."""
    sources: dict[str, str] = {}
    for entry in entries.values():
        sources.update(entry.inputs.get(SOURCES) or {})
    data = {
        "format": LOCK_FORMAT,
        "generated_by": "hyperexport lock",
        SOURCES: dict(sorted(sources.items())),
        "variants": {name: entries[name].to_json() for name in sorted(entries)},
    }
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_lock(entries: Mapping[str, LockEntry], path: Path = LOCK_FILE) -> None:
    """Write the lock file atomically."""
    atomic_write_text(path, render_lock(entries))


def compare(locked: LockEntry | None, current: Mapping[str, Any]) -> str:
    """Why ``current`` (inputs) would rebuild against the ``locked`` entry; "" if it would not.

    In the build's words (:mod:`hyperexport.engine.keys`): ``opset 18→17``, ``model code changed
    (transformers files 30e8a68b→5c0d3606)``, ``files of model.path changed (config.json)``,
    ``hyperexport code changed (check/judge.py)``, ``onnx 1.19.0→1.23.2``.
    """
    from hyperexport.engine.keys import diff_values, model_reasons

    if locked is None:
        return "not in hyperexport.lock"
    old = locked.inputs
    reasons = diff_values(old.get("fields", {}), current.get("fields", {}))
    reasons += model_reasons(old.get("model", {}), current.get("model", {}))
    reasons += _stage_reasons(old, current)
    reasons += diff_values(old.get("versions", {}), current.get("versions", {}))
    more = len(reasons) - _MAX_REASONS
    return ", ".join(reasons[:_MAX_REASONS]) + (f", +{more} more" if more > 0 else "")


def _stage_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Stage versions that moved, and the hyperexport sources that changed among those the
    stages whose code digest moved run now."""
    reasons = []
    old_stages, new_stages = old.get("stages", {}), new.get("stages", {})
    code_moved = False
    for name in [*new_stages, *(n for n in old_stages if n not in new_stages)]:
        before, after = old_stages.get(name) or {}, new_stages.get(name) or {}
        if before.get("version") != after.get("version"):
            reasons.append(f"stage {name} version {before.get('version')}→{after.get('version')}")
        code_moved = code_moved or before.get("code") != after.get("code")
    if code_moved:
        old_src, new_src = old.get(SOURCES, {}), new.get(SOURCES, {})
        changed = sorted(p for p in new_src if old_src.get(p) != new_src[p])
        shown = [p.removeprefix("hyperexport/") for p in changed[:3]]
        more = f", +{len(changed) - 3} more" if len(changed) > 3 else ""
        what = f" ({', '.join(shown)}{more})" if shown else " (imports between its modules)"
        reasons.append(f"hyperexport code changed{what}")
    return reasons


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
