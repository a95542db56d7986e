"""A recipe's model fingerprint, computed without importing the libraries it describes.

* The environment fingerprint (Python and library versions) is the engine's
  (:mod:`hyperexport.engine.environment`); :data:`ENV_DISTRIBUTIONS` is what a report lists.
* The model fingerprint covers the model's *declared code*: the top-level modules the recipe
  names (installed distributions by name, version and a digest of the files they hold inside
  their own package, from their RECORD: never what the installer wrote for the machine, such as
  a console script naming the virtualenv's Python; local, non-installed packages by a digest of
  their source files, names relative); names inside
  hyperexport (a factory in ``hyperexport.zoo``) join the code the stage runs
  (:func:`package_modules`). The code those modules import in turn is found when the stage runs
  (:mod:`hyperexport.engine.discovered`). It also covers the model's *weights and files*: the
  seed, the checkpoint's file digests, and the digests of every file or directory a string
  argument of ``model:`` names (a ``from_pretrained`` directory, a config file). Digests go
  through a stat-keyed fast path so a no-op build does not re-hash large files. Nothing is keyed
  by an absolute path, so a cache moved to another checkout or machine still hits.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import importlib.metadata as metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import hyperexport
from hyperexport.base.contracts.names import CHECKPOINT_CONFIG, TOKENIZER_FILES
from hyperexport.base.versions import RECORDED_DISTRIBUTIONS
from hyperexport.engine.code_closure import CodePackage
from hyperexport.engine.environment import SITE_DIRS
from hyperexport.engine.hashing import FileDigestIndex, canonical_json, sha256_text

log = logging.getLogger(__name__)

#: The package whose code the stages' keys cover: hyperexport itself.
KEYED_PACKAGE = CodePackage.of(hyperexport)
PACKAGE = KEYED_PACKAGE.name

#: The distributions a build report lists (a stage's key holds only its own ``libraries``):
#: those a model records, and onnx-ir.
ENV_DISTRIBUTIONS = (*RECORDED_DISTRIBUTIONS, "onnx-ir")


def top_level_module(import_path: str) -> str:
    """``"pkg.mod:obj"`` or ``"pkg.mod.Obj"`` -> ``"pkg"``."""
    return import_path.split(":", 1)[0].split(".", 1)[0]


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _distribution_of(top: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(top)
    except metadata.PackageNotFoundError:
        pass
    for name in _packages_distributions().get(top, []):
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _source_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _local_digest(root: Path, index: FileDigestIndex) -> str:
    base = root.parent if root.is_file() else root
    entries = sorted((p.relative_to(base).as_posix(), index.digest(p)) for p in _source_files(root))
    return sha256_text(canonical_json(entries))


def module_fingerprint(top: str, index: FileDigestIndex) -> dict[str, Any]:
    """Fingerprint of one top-level module or package, found without importing it.

    Args:
        top: A top-level module name (``"transformers"``, ``"my_models"``).
        index: File digest index used for local source files.

    Returns:
        ``{"kind": "dist", name, version, record}`` for an installed distribution,
        ``{"kind": "local", digest}`` for source files outside site-packages (an editable install
        counts as local), ``{"kind": "stdlib"}``, or ``{"kind": "missing"}``.
    """
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return {"kind": "stdlib"}
    spec = importlib.util.find_spec(top)
    if spec is None:
        return {"kind": "missing"}
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        origin = Path(spec.origin)
        root = origin.parent if origin.name == "__init__.py" else origin
    elif spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
    else:
        return {"kind": "missing"}
    if any(part in SITE_DIRS for part in root.parts):
        dist = _distribution_of(top)
        if dist is not None:
            return {
                "kind": "dist",
                "name": dist.metadata["Name"],
                "version": dist.version,
                "files": package_files_digest(dist, root, index),
            }
        log.warning("no distribution owns installed module %r; hashing its sources", top)
    return {"kind": "local", "digest": _local_digest(root, index)}


def package_files_digest(dist: metadata.Distribution, root: Path, index: FileDigestIndex) -> str:
    """A digest of the files an installed distribution holds inside its own package ``root``.

    From the hashes its ``RECORD`` lists for them, which the wheel carried: what the installer
    wrote for itself (console scripts, whose first line names the virtualenv's Python, the
    ``.dist-info`` folder, ``.pth`` files) lies outside the package and does not count, and
    neither do compiled ``__pycache__`` files. Without a ``RECORD`` (another installer), the
    package's source files are hashed instead.
    """
    record = dist.read_text("RECORD")
    site = dist.locate_file("")
    try:
        prefix = Path(root).resolve().relative_to(Path(str(site)).resolve()).as_posix()
    except ValueError:
        prefix = None
    if record is None or prefix is None:
        return _local_digest(root, index)
    inside = prefix if root.is_file() else f"{prefix}/"
    entries = []
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not row[1]:
            continue
        path = row[0]
        if (path == inside or path.startswith(inside)) and "__pycache__" not in path:
            entries.append((path, row[1]))
    return sha256_text(canonical_json(sorted(entries)))


def code_fingerprint(import_paths: Iterable[str], index: FileDigestIndex) -> dict[str, Any]:
    """Fingerprints of the top-level modules behind ``import_paths``, hyperexport excepted.

    The hyperexport code a stage runs is in its key already; modules a recipe names inside
    hyperexport (:func:`package_modules`) are added to that code by the runner.
    """
    tops = sorted({top_level_module(p) for p in import_paths} - {PACKAGE})
    return {top: module_fingerprint(top, index) for top in tops}


def package_modules(import_paths: Iterable[str]) -> tuple[str, ...]:
    """The hyperexport modules that ``import_paths`` name (``hyperexport.zoo.tiny_llama`` ->
    ``hyperexport.zoo``): code a stage running the model runs besides its own."""
    return tuple(sorted({_module_of(p) for p in import_paths if top_level_module(p) == PACKAGE}))


def _module_of(import_path: str) -> str:
    if ":" in import_path:
        return import_path.split(":", 1)[0]
    return import_path.rpartition(".")[0] or import_path


def weights_fingerprint(
    seed: Any, checkpoint: Path | None, index: FileDigestIndex
) -> dict[str, Any]:
    """The seed and, when a checkpoint is used, the digests of the file(s) its loader reads
    (``stages/model.py``: a file, or a folder's ``*.safetensors``; names relative)."""
    if checkpoint is None:
        return {"seed": seed, "checkpoint": None}
    if checkpoint.is_dir():
        files = sorted(checkpoint.glob("*.safetensors"))
        return {
            "seed": seed,
            "checkpoint": {p.name: index.digest(p) for p in files if p.is_file()},
        }
    return {"seed": seed, "checkpoint": path_digests(checkpoint, index)}


#: The files of a ``from_pretrained`` folder that transformers' loaders read (model, config,
#: weights and their index, tokenizer, processors, generation config, custom code), as the
#: names transformers defines them (``transformers.utils``: CONFIG_NAME, SAFE_WEIGHTS_NAME,
#: ...; tokenizer files by their class's ``vocab_files_names``). Kept as patterns so that a
#: no-op build need not import transformers; ``tests/product/builds/test_fingerprint.py`` checks them
#: against transformers' own constants. A README or an image beside them is not read.
PRETRAINED_FILES = (
    CHECKPOINT_CONFIG,
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "*.py",
    "tokenizer*",
    *TOKENIZER_FILES,
    "chat_template*",
    "vocab*",
    "*.model",
    "*.tiktoken",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "feature_extractor_config.json",
)


def _is_pretrained_folder(path: Path) -> bool:
    return path.is_dir() and (path / CHECKPOINT_CONFIG).is_file()


def path_digests(path: Path, index: FileDigestIndex) -> dict[str, str]:
    """``{relative name: digest}`` of a file, of the loader's files of a ``from_pretrained``
    folder (one holding ``config.json``: :data:`PRETRAINED_FILES`), or of every file under any
    other folder (a factory may read any of them)."""
    if path.is_file():
        files, base = [path], path.parent
    elif _is_pretrained_folder(path):
        files = sorted(
            p
            for p in path.iterdir()
            if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in PRETRAINED_FILES)
        )
        base = path
    else:
        files, base = sorted(p for p in path.rglob("*") if p.is_file()), path
    return {p.relative_to(base).as_posix(): index.digest(p) for p in files}


def _strings(value: Any, prefix: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            if not str(key).startswith("_"):  # _target_, _convert_, ...: Hydra's, not data
                yield from _strings(value[key], f"{prefix}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, f"{prefix}.{i}")
    elif isinstance(value, str):
        yield prefix, value


def model_argument_files(model_cfg: Mapping[str, Any], recipe_file: str) -> dict[str, Path]:
    """``{dotted field: path}`` of the string arguments of ``model:`` that name a file or folder.

    A relative value is looked up beside the recipe file, then in the working directory (where
    a factory opening it would look). Values that are only dots (``.``, ``..``) name no data.
    """
    base = Path(recipe_file).resolve().parent if recipe_file else None
    found: dict[str, Path] = {}
    for field, value in _strings(model_cfg, "model"):
        if not value or not value.strip(".") or "\0" in value:
            continue
        path = Path(value).expanduser()
        candidates = [path] if path.is_absolute() else [c / path for c in (base, Path.cwd()) if c]
        for candidate in candidates:
            try:
                exists = candidate.exists()
            except OSError:  # a name too long for the filesystem, for example: not a path
                exists = False
            if exists:
                found[field] = candidate
                break
    return found


def keyed_paths(data: Mapping[str, Any], recipe_file: str, checkpoint: Path | None) -> list[Path]:
    """The checkpoint and the files or folders ``model:`` arguments name: keyed by content
    here, so their reads are not discovered dependencies too (those would be absolute)."""
    return [
        *([checkpoint] if checkpoint is not None else []),
        *model_argument_files(data["model"], recipe_file).values(),
    ]


def model_imports(data: Mapping[str, Any]) -> list[str]:
    """The import paths a recipe names for its model: the factory and every ``_target_`` nested
    in ``model:`` (a config object built for it), hiera classes, symbolics."""
    return [
        *_targets(data["model"]),
        *(data["hiera"] if isinstance(data.get("hiera"), list) else ()),  # not "auto"
        *(op["symbolic"] for op in data.get("custom_ops", ())),
    ]


def _targets(value: Any) -> Iterator[str]:
    """Every ``_target_`` in ``value``, outermost first."""
    if isinstance(value, Mapping):
        if isinstance(value.get("_target_"), str):
            yield value["_target_"]
        for key in sorted(value, key=str):
            if key != "_target_":
                yield from _targets(value[key])
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _targets(item)


def model_fingerprint(
    data: Mapping[str, Any], recipe_file: str, checkpoint: Path | None, index: FileDigestIndex
) -> dict[str, Any]:
    """The declared code, the weights and the argument files of a validated recipe's model.

    Returns:
        ``{"code": ..., "weights": ..., "files": {dotted field: {name: digest}}}``, and
        ``"env": {name: digest of the value, or None if unset}`` when the recipe's ``env``
        names variables.
    """
    files = model_argument_files(data["model"], recipe_file)
    found = {
        "code": code_fingerprint(model_imports(data), index),
        "weights": weights_fingerprint(data["model"].get("seed"), checkpoint, index),
        "files": {field: path_digests(path, index) for field, path in sorted(files.items())},
    }
    if data.get("env"):
        found["env"] = env_fingerprint(data["env"])
    return found


def env_fingerprint(names: Iterable[str]) -> dict[str, str | None]:
    """``{name: sha256 of its value, or None when unset}`` of the environment variables the
    model reads (the recipe's ``env``). Values are hashed: a secret never lands in the cache."""
    return {
        name: None if os.environ.get(name) is None else sha256_text(os.environ[name])
        for name in sorted(names)
    }
