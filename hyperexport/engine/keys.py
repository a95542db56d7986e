"""Stage keys and the human reason a stage has to run (doit-style).

A key is the full sha256 of the canonical JSON of the stage's *key material*: its name and
version, its slice of the build's configuration, the digests of its upstream outputs, the
versions of the libraries it declares, the digests of the keyed package's modules it runs
(computed from the import graph), and, for a stage that runs user code, the model fingerprint.
Such a stage's outputs are stored under a second-level key that adds the modules it loaded
(:mod:`.discovered`). The material of each build's last run is kept, so that a rerun can say
what changed (``opset 18→17``) instead of only that something did.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .code_closure import ModuleSource, stage_code
from .environment import environment_fingerprint
from .hashing import canonical_json, sha256_text

if TYPE_CHECKING:
    from .stage import Stage

_MAX_CHANGES = 3
_MAX_VALUE = 40


def key_material(
    *,
    stage: str,
    version: int,
    params: Mapping[str, Any],
    upstream: Mapping[str, Mapping[str, str]],
    env: Mapping[str, Any],
    model: Mapping[str, Any],
    code: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything a stage declares its result depends on, as JSON-compatible data.

    Args:
        stage: Stage name.
        version: Stage version.
        params: The stage's slice of the configuration (as keyed: see :func:`key_params`).
        upstream: ``{stage: {file: digest}}`` of the upstream outputs it reads.
        env: Python version and the versions of the stage's libraries.
        model: The model fingerprint (empty for stages that do not run user code).
        code: ``{relative path: digest}`` of the keyed package's modules the stage runs.
    """
    return {
        "stage": stage,
        "version": version,
        "params": dict(params),
        "upstream": {name: dict(digests) for name, digests in upstream.items()},
        "env": dict(env),
        "model": dict(model),
        "code": dict(code or {}),
    }


def declared_material(
    stage: Stage,
    params: Mapping[str, Any],
    upstream: Mapping[str, Mapping[str, str]],
    *,
    model: Mapping[str, Any],
    code_roots: Iterable[str],
    sources: dict[str, ModuleSource],
) -> dict[str, Any]:
    """The declared key material of ``stage``: only what it reads and runs.

    The one place that says what a stage's key covers: the runner keys builds with it, and a
    lock file can record it, without building, for every variant it locks.

    Args:
        stage: The stage.
        params: Its slice of the configuration (:func:`~.stage.config_slice`).
        upstream: ``{stage: {file: digest}}`` of the upstream outputs it reads (empty where
            they are not known: a dry run's later stages, the lock).
        model: The model fingerprint; keyed only by a stage that runs the model.
        code_roots: Modules of the keyed package the configuration names for the model (a
            factory inside it): code the stages running the model run besides their own.
        sources: The keyed package's modules (:func:`~.code_closure.package_sources`).
    """
    keyed_model = model if stage.needs_model else {}
    return key_material(
        stage=stage.name,
        version=stage.version,
        params=key_params(params, keyed_model.get("files", {})),
        upstream=upstream,
        env=environment_fingerprint(stage.libraries),
        model=keyed_model,
        code=stage_code(
            type(stage).__module__, tuple(code_roots) if stage.needs_model else (), sources
        ),
    )


#: What replaces a path-valued param in the key: the file's digests are keyed instead (under
#: ``model.files``), so moving a checkpoint directory is no change.
FILE_PARAM = "<file: keyed by content>"


def key_params(params: Mapping[str, Any], file_fields: Iterable[str]) -> dict[str, Any]:
    """``params`` with the dotted fields ``file_fields`` (``model.path``) replaced by
    :data:`FILE_PARAM`; list items are addressed by index (``model.files.0``)."""
    out: Any = copy.deepcopy(dict(params))
    for dotted in file_fields:
        *parents, last = dotted.split(".")
        target: Any = out
        for part in parents:
            target = _child(target, part)
        if isinstance(target, dict) and last in target:
            target[last] = FILE_PARAM
        elif isinstance(target, list) and last.isdigit() and int(last) < len(target):
            target[int(last)] = FILE_PARAM
    return dict(out)


def _child(value: Any, part: str) -> Any:
    if isinstance(value, dict):
        return value.get(part)
    if isinstance(value, list) and part.isdigit() and int(part) < len(value):
        return value[int(part)]
    return None


def recorded_material(material: Mapping[str, Any], secret: bytes | None) -> dict[str, Any]:
    """``material`` as a record keeps it: the digest of each declared environment value
    (``model.env``) replaced by its HMAC-SHA256 under the cache's ``secret``
    (:mod:`.record_secret`).

    The key is computed over the material itself, so it stays the same on every machine; a
    record holds no plain digest of a value (which a guess could be checked against), yet two
    records of one cache still show whether a value changed (``env NAME changed``). Without a
    secret (a read-only cache that has none) the material is returned as it is, to compare
    only: such a cache writes no record.
    """
    model = material.get("model")
    env = model.get("env") if isinstance(model, Mapping) else None
    if secret is None or not isinstance(model, Mapping) or not isinstance(env, Mapping):
        return dict(material)
    keyed = {
        name: None
        if value is None
        else hmac.new(secret, str(value).encode("utf-8"), hashlib.sha256).hexdigest()
        for name, value in env.items()
    }
    return {**material, "model": {**model, "env": keyed}}


def stage_key(material: Mapping[str, Any]) -> str:
    """Full-length hex sha256 of the canonical JSON of ``material``."""
    return sha256_text(canonical_json(material))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    text = canonical_json(value) if not isinstance(value, str) else value
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 1] + "…"


def _show_pair(old: Any, new: Any) -> str:
    """``old→new``, each cut to :data:`_MAX_VALUE`; two long strings that share a beginning
    show from the last ``.`` (or ``/``) before they part, so the cut never hides the change."""
    if isinstance(old, str) and isinstance(new, str) and max(len(old), len(new)) > _MAX_VALUE:
        common = 0
        while common < min(len(old), len(new)) and old[common] == new[common]:
            common += 1
        start = max(old.rfind(".", 0, common), old.rfind("/", 0, common)) + 1
        if start > 0:
            return f"…{_show(old[start:])}→…{_show(new[start:])}"
    return f"{_show(old)}→{_show(new)}"


def _diff_lists(name: str, old: list[Any], new: list[Any]) -> str:
    """The first difference of two lists: ``hiera[1] …A→…B``, ``hiera[2] added (X)``."""
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if isinstance(a, Mapping) and isinstance(b, Mapping):
                return diff_values(a, b, label=f"{name}[{i}]")[0]
            return f"{name}[{i}] {_show_pair(a, b)}"
    if len(new) > len(old):
        return f"{name}[{len(old)}] added ({_show(new[len(old)])})"
    return f"{name}[{len(new)}] removed ({_show(old[len(new)])})"


def diff_values(old: Any, new: Any, *, label: str = "") -> list[str]:
    """``["a.b 1→2", "c added", ...]`` for the leaves that differ between ``old`` and ``new``.

    A list is one leaf; where two lists differ, the first differing element is named
    (``hiera[0] …LlamaDecoderLayer→…LlamaMLP``).
    """
    before, after = _flatten(old, label), _flatten(new, label)
    changes = []
    for path in sorted(set(before) | set(after)):
        name = path or label or "value"
        if path not in before:
            changes.append(f"{name} added")
        elif path not in after:
            changes.append(f"{name} removed")
        elif before[path] != after[path]:
            a, b = before[path], after[path]
            if isinstance(a, list) and isinstance(b, list):
                changes.append(_diff_lists(name, a, b))
            else:
                changes.append(f"{name} {_show_pair(a, b)}")
    return changes


def explain(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> str:
    """Why a stage whose key missed has to run, comparing with the previous build's material.

    Args:
        previous: The material of this build's last run of the stage, or None.
        current: This build's material.

    Returns:
        A short reason such as ``"opset 18→17"``, ``"trace output changed"``,
        ``"numpy 1.26.4→2.0.0"``, ``"pkg code changed (a/b.py)"`` or
        ``"model code changed (my_models)"``.
    """
    if previous is None:
        return "no previous build"
    reasons: list[str] = []
    if previous.get("version") != current.get("version"):
        reasons.append(f"stage version {previous.get('version')}→{current.get('version')}")
    reasons += diff_values(previous.get("params", {}), current.get("params", {}))
    prev_up, cur_up = previous.get("upstream", {}), current.get("upstream", {})
    for name in sorted(set(prev_up) | set(cur_up)):
        if prev_up.get(name) != cur_up.get(name):
            reasons.append(f"{name} output changed")
    prev_env, cur_env = previous.get("env", {}), current.get("env", {})
    if prev_env != cur_env:
        reasons += [c.removeprefix("packages.") for c in diff_values(prev_env, cur_env)]
    reasons += model_reasons(previous.get("model", {}), current.get("model", {}))
    reasons += _code_reasons(previous.get("code", {}), current.get("code", {}))
    if not reasons:
        return "same inputs as the last build"
    shown = reasons[:_MAX_CHANGES]
    if len(reasons) > _MAX_CHANGES:
        shown.append(f"+{len(reasons) - _MAX_CHANGES} more")
    return ", ".join(shown)


def model_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What changed of a model fingerprint, as reasons (the build's, and the lock file's)."""
    reasons = []
    old_code, new_code = old.get("code", {}), new.get("code", {})
    changed = sorted(m for m in set(old_code) | set(new_code) if old_code.get(m) != new_code.get(m))
    if changed:
        shown = [_code_change(m, old_code.get(m), new_code.get(m)) for m in changed]
        reasons.append(f"model code changed ({', '.join(shown)})")
    if old.get("weights") != new.get("weights"):
        reasons += diff_values(old.get("weights"), new.get("weights"), label="weights") or [
            "weights changed"
        ]
    old_env, new_env = _declared_env(old.get("env")), _declared_env(new.get("env"))
    for name in sorted(set(old_env) | set(new_env)):
        if name not in old_env:
            reasons.append(f"env {name} declared")
        elif name not in new_env:
            reasons.append(f"env {name} no longer declared")
        elif old_env[name] != new_env[name]:
            what = (
                "set" if old_env[name] is None else "unset" if new_env[name] is None else "changed"
            )
            reasons.append(f"env {name} {what}")
    old_files, new_files = old.get("files", {}), new.get("files", {})
    for name in sorted(set(old_files) | set(new_files)):
        if old_files.get(name) != new_files.get(name):
            which = changed_files(old_files.get(name) or {}, new_files.get(name) or {})
            reasons.append(
                f"files of {name} changed ({which})" if which else f"files of {name} changed"
            )
    return reasons


def _declared_env(value: Any) -> dict[str, Any]:
    """``{name: what is known of its value}``; a list names the variables only (the lock)."""
    if isinstance(value, Mapping):
        return dict(value)
    return {str(name): "declared" for name in value or ()}


def _short(value: Any) -> str:
    return str(value)[:8] if value else "none"


def _code_change(name: str, old: Any, new: Any) -> str:
    """``mylib 5.24.0→5.25.0``, ``mylib files 30e8a68b→5c0d3606``,
    ``my_models 1f2e3d4c→9a8b7c6d``, ``my_models added``: what changed of one top-level module
    the model's configuration names (its fingerprint: ``kind``, ``version``, ``files``,
    ``digest``)."""
    if not isinstance(old, Mapping):
        return f"{name} added"
    if not isinstance(new, Mapping):
        return f"{name} removed"
    if old.get("kind") != new.get("kind"):
        return f"{name} {old.get('kind')}→{new.get('kind')}"
    if old.get("version") != new.get("version"):
        return f"{name} {old.get('version')}→{new.get('version')}"
    if old.get("files") != new.get("files"):
        return f"{name} files {_short(old.get('files'))}→{_short(new.get('files'))}"
    return f"{name} {_short(old.get('digest'))}→{_short(new.get('digest'))}"


#: How many changed files of a checkpoint a reason names before it counts the rest.
_MAX_FILES = 5


def changed_files(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``"config.json, tokenizer.json added, +2 more"``: the files (``{name: digest}``) that
    differ, sorted, up to :data:`_MAX_FILES` and then a count."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return ""
    names = []
    for name in sorted(set(old) | set(new)):
        if name not in old:
            names.append(f"{name} added")
        elif name not in new:
            names.append(f"{name} removed")
        elif old[name] != new[name]:
            names.append(name)
    more = len(names) - _MAX_FILES
    return ", ".join(names[:_MAX_FILES]) + (f", +{more} more" if more > 0 else "")


def _code_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``pkg code changed (a/b.py, ...)``: the keyed package's files that changed (named by
    their path relative to it; ``pkg`` is the first part of their recorded paths)."""
    changed = sorted(m for m in set(old) | set(new) if old.get(m) != new.get(m))
    if not changed:
        return []
    package = changed[0].partition("/")[0]
    shown = [c.removeprefix(f"{package}/") for c in changed[:_MAX_CHANGES]]
    more = f", +{len(changed) - _MAX_CHANGES} more" if len(changed) > _MAX_CHANGES else ""
    return [f"{package} code changed ({', '.join(shown)}{more})"]
