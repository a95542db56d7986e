"""Recipe and build settings: structured-config schemas, recipe registration, and validation.

Layout (documented in outputs/README.md):

* ``conf/config.yaml`` is the primary config. Its ``build:`` section holds the build settings
  (``cache_dir``, ``outputs_dir``, ``dry_run``, ``force``); nothing else lives there.
* ``recipes/<name>.yaml`` are the options of the ``recipe`` config group, with package
  ``_global_``: a recipe's keys sit at the top level, so ``opset=17`` overrides the recipe's
  opset. They are registered in Hydra's ConfigStore from the package location (never the working
  directory), on top of ``recipe_defaults``: the defaults of :class:`RecipeConfig`, so that every
  field can be overridden by its short name even when a recipe does not mention it.
* ``recipe_file=/abs/path.yaml`` builds a recipe kept outside the repository (see
  ``hyperexport.__main__``).

Hydra composes without a strict schema so that this module, not Hydra, reports a bad recipe: one
:class:`~hyperexport.errors.RecipeError` naming the recipe file and the field, with close matches
for typos. Validation never imports torch: importability of classes is checked statically.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import logging
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING as DC_MISSING
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from hyperexport.errors import RecipeError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _data_root() -> Path:
    """Where conf/ and recipes/ are: the repository (editable install, checkout), else the
    ``share/hyperexport`` folder a regular install puts them in (see pyproject's data-files)."""
    if (REPO_ROOT / "conf" / "config.yaml").is_file():
        return REPO_ROOT
    import sys

    return Path(sys.prefix) / "share" / "hyperexport"


CONF_DIR = _data_root() / "conf"
RECIPES_DIR = _data_root() / "recipes"
# In a checkout (editable install) the outputs go to <repo>/outputs; a regular install has no
# repository, so they go to a per-user directory instead (never the working directory).
DEFAULT_OUTPUTS_DIR = (
    REPO_ROOT / "outputs"
    if _data_root() == REPO_ROOT
    else Path.home() / ".local" / "share" / "hyperexport" / "outputs"
)

DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
FUNCTION_MODES = ("per_instance", "per_type")
FUNCTION_SCOPES = ("all", "first_instance", "none")
# Default-domain opsets each export path can produce (as hyperexport.capture.torch_bridge says;
# kept here as numbers because validation must not import torch).
OPSET_RANGES = {False: (7, 20), True: (7, 24)}
# Lowest export opset attention promotion accepts: promotion re-declares the model at opset 24
# without converting other ops, and the Reduce* ops changed signature at 18 (axes attribute ->
# input), so an older export would become an invalid model.
PROMOTE_MIN_OPSET = 18
# transformers' own attention implementations: hyperexport registers its entry under another name.
BUILTIN_ATTENTION = ("eager", "sdpa", "flex_attention", "paged_attention")
BUILD_KEYS = ("build", "recipe_file")


# --------------------------------------------------------------------------------------------
# Schemas (stored in the ConfigStore; field defaults are the recipe defaults)
# --------------------------------------------------------------------------------------------
@dataclass
class InputSpec:
    """One example input, generated deterministically from ``seed``.

    Floats are uniform in ``[low, high)``; integers uniform in ``[low, high)`` (so token ids
    need ``high`` = vocabulary size); bools are ``x < 0.5`` of a uniform draw.

    ``dynamic`` names the axes that stay symbolic in the exported model (``{0: batch, 1: seq}``).
    The model then also runs at a second shape, and the check stage compares the export with
    torch there too: ``check_shape`` (same rank as ``shape``, different only on dynamic axes),
    or by default each dynamic axis grown by a small amount.
    """

    shape: list[int] = MISSING
    dtype: str = "float32"
    low: float = 0.0
    high: float = 1.0
    seed: int = 0
    dynamic: dict[int, str] = field(default_factory=dict)
    check_shape: list[int] | None = None


@dataclass
class ToleranceSpec:
    """A per-output tolerance override; an unset value inherits ``check.atol``/``check.rtol``."""

    atol: float | None = None
    rtol: float | None = None


@dataclass
class CheckSpec:
    """What the check stage verifies.

    ``expect_ops`` maps a default-domain op type to the exact number of nodes of that type the
    final model *executes*: nodes of the main graph, plus each function's nodes times the number
    of times the function is called (nested calls multiply). ``{Attention: 4}`` on a 4-layer
    model holds whether the layers share one function (per_type) or have one each.
    """

    atol: float = 1e-4
    rtol: float = 1e-3
    per_output: dict[str, ToleranceSpec] = field(default_factory=dict)
    function_scope: str = "all"
    expect_ops: dict[str, int] = field(default_factory=dict)


@dataclass
class AttentionSpec:
    """``implementation``: the transformers attention entry to export with (``hyperexport``
    exports each attention call as one node). ``promote_opset24`` rewrites those nodes to
    default-domain ``Attention`` and makes the final model opset 24 whatever ``opset`` says:
    ``opset`` is then only the export opset."""

    implementation: str | None = None
    promote_opset24: bool = False


@dataclass
class RewriteSpec:
    """Optional rewrite passes; all off by default, as in the library's ``RewriteOptions``
    (fusing constants freezes masks and position embeddings at the traced shape; the optimizer
    costs several times the export)."""

    fold_leftovers: bool = False
    fuse_constants: bool = False
    optimize: bool = False


@dataclass
class CustomOpSpec:
    name: str = MISSING
    symbolic: str = MISSING
    opset: int = MISSING


@dataclass
class RecipeConfig:
    """One model to export. ``model`` is ``{_target_: factory, **kwargs}``; the factory's module
    (and a local ``checkpoint``, if any, resolved relative to the recipe file) define the model.

    ``fallback: true`` lets the export stage retry on the other path (``dynamo``) when the chosen
    one fails; it is logged at WARNING and recorded in the model's metadata and the report.
    """

    name: str = MISSING
    model: dict[str, Any] = MISSING
    checkpoint: str | None = None
    inputs: dict[str, InputSpec] = MISSING
    hiera: list[str] = MISSING
    method: str = "forward"
    opset: int = 18
    dynamo: bool = False
    fallback: bool = False
    functions: str = "per_instance"
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    rewrite: RewriteSpec = field(default_factory=RewriteSpec)
    check: CheckSpec = field(default_factory=CheckSpec)
    custom_ops: list[CustomOpSpec] = field(default_factory=list)
    external_data: bool = False
    external_data_threshold: int = 1024


@dataclass
class BuildConfig:
    """Build settings (``build.*``); they never change what is built, only where and whether."""

    cache_dir: str | None = None
    outputs_dir: str | None = None
    dry_run: bool = False
    force: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Validated, frozen results
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """A validated recipe.

    Attributes:
        name: ``name`` field (used in the outputs path).
        file: The recipe file it came from (for messages).
        data: The recipe with every default filled in, as JSON-compatible data.
        checkpoint: Absolute checkpoint path, if the recipe has one.
    """

    name: str
    file: str
    data: Mapping[str, Any]
    checkpoint: Path | None = None


@dataclass(frozen=True)
class BuildSettings:
    """Validated ``build.*`` settings."""

    cache_dir: str | None
    outputs_dir: Path
    dry_run: bool
    force: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------
_RECIPE_FILES: dict[str, Path] = {}


def _outputs_root(value: str | None = None) -> str:
    return str(Path(value).expanduser().resolve()) if value else str(DEFAULT_OUTPUTS_DIR)


def _hydra_dir(outputs_dir: str | None, dry_run: Any, sub: str = "") -> str:
    """Hydra's own run/sweep directory: the outputs root, or a temp dir in a dry run.

    Hydra always creates its job directory (and a sweep writes ``multirun.yaml`` there); a dry
    run must not write into the outputs, so it points Hydra at the system temp directory.
    """
    if str(dry_run).lower() == "true":
        import tempfile

        return str(Path(tempfile.gettempdir()) / "hyperexport-dry-run")
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

    if not OmegaConf.has_resolver("hx_hydra_dir"):
        OmegaConf.register_new_resolver("hx_hydra_dir", _hydra_dir)
    cs = ConfigStore.instance()
    cs.store(name="recipe_schema", node=_schema())
    cs.store(name="build_schema", node=BuildConfig)
    cs.store(name="recipe_defaults", node=recipe_defaults())
    files = sorted(RECIPES_DIR.glob("*.yaml"))
    if extra_recipe is not None:
        files.append(extra_recipe.resolve())
    for path in files:
        cs.store(group="recipe", name=path.stem, node=load_recipe_yaml(path), package="_global_")
        _RECIPE_FILES[path.stem] = path
    return dict(_RECIPE_FILES)


def recipe_file_of(option: str | None) -> str:
    """The file registered for recipe option ``option`` (the option itself if unknown)."""
    if option and option in _RECIPE_FILES:
        return str(_RECIPE_FILES[option])
    return str(option or "<no recipe>")


@functools.lru_cache(maxsize=1)
def _schema() -> Any:
    # Building a structured config is slow (tens of ms); the schema is built once per process.
    schema = OmegaConf.structured(RecipeConfig)
    OmegaConf.set_readonly(schema, True)
    return schema


def recipe_defaults() -> dict[str, Any]:
    """The schema defaults as plain data (``???`` for required fields)."""
    data = OmegaConf.to_container(_schema())
    assert isinstance(data, dict)
    return typing.cast("dict[str, Any]", data)


def load_recipe_yaml(path: Path) -> Any:
    """Load one recipe file as an OmegaConf node; a syntax error becomes a RecipeError."""
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml and OmegaConf raise several unrelated types
        raise RecipeError(str(path), "<file>", f"cannot be read: {e}") from e
    if not isinstance(node, Mapping):
        raise RecipeError(str(path), "<file>", "must be a mapping of recipe fields")
    return node


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------
def _suggest(word: str, options: Sequence[str]) -> str:
    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {matches[0]!r}?" if matches else ""


class _Checker:
    """Checks a recipe against a schema dataclass, raising RecipeError on the first problem."""

    def __init__(self, recipe_file: str) -> None:
        self.file = recipe_file

    def fail(self, where: str, reason: str) -> typing.NoReturn:
        raise RecipeError(self.file, where, reason)

    def dataclass_(self, schema: type, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            self.fail(where or "<recipe>", f"must be a mapping, got {type(data).__name__}")
        hints = typing.get_type_hints(schema)
        names = [f.name for f in fields(schema)]
        for key in data:
            if key not in names:
                path = f"{where}.{key}" if where else str(key)
                self.fail(path, f"unknown key{_suggest(str(key), names)}")
        for f in fields(schema):
            path = f"{where}.{f.name}" if where else f.name
            required = f.default is MISSING or (
                f.default is DC_MISSING and f.default_factory is DC_MISSING
            )
            if f.name not in data or data[f.name] == "???":
                if required:
                    self.fail(path, "missing required field")
                continue
            self.value(hints[f.name], data[f.name], path)

    def value(self, tp: Any, value: Any, where: str) -> None:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            if value is None and type(None) in args:
                return
            tp = next(a for a in args if a is not type(None))
            origin, args = typing.get_origin(tp), typing.get_args(tp)
        if isinstance(tp, type) and is_dataclass(tp):
            self.dataclass_(tp, value, where)
        elif origin is list:
            if not isinstance(value, list):
                self.fail(where, f"must be a list, got {value!r}")
            for i, item in enumerate(value):
                self.value(args[0], item, f"{where}[{i}]")
        elif origin is dict:
            if not isinstance(value, Mapping):
                self.fail(where, f"must be a mapping, got {value!r}")
            for k, item in value.items():
                self.value(args[0], k, f"{where} key {k!r}")
                self.value(args[1], item, f"{where}.{k}")
        elif tp is bool:
            if not isinstance(value, bool):
                self.fail(where, f"must be true or false, got {value!r}")
        elif tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(where, f"must be an integer, got {value!r}")
        elif tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(where, f"must be a number, got {value!r}")
        elif tp is str and not isinstance(value, str):
            self.fail(where, f"must be a string, got {value!r}")


def validate_recipe(data: Mapping[str, Any], recipe_file: str) -> Recipe:
    """Validate a composed recipe and fill in its defaults.

    Args:
        data: The recipe fields (top-level keys of the composed config, build keys removed).
        recipe_file: Recipe file named in errors; relative checkpoints resolve against its folder.

    Returns:
        The validated recipe.

    Raises:
        RecipeError: On the first problem found, naming ``recipe_file`` and the field.
    """
    check = _Checker(recipe_file)
    check.dataclass_(RecipeConfig, data, "")
    container = OmegaConf.to_container(OmegaConf.merge(_schema(), dict(data)))
    assert isinstance(container, dict)
    merged = typing.cast("dict[str, Any]", container)
    _check_semantics(check, merged)
    checkpoint = None
    if merged.get("checkpoint"):
        checkpoint = Path(merged["checkpoint"]).expanduser()
        if not checkpoint.is_absolute():
            checkpoint = Path(recipe_file).resolve().parent / checkpoint
        if not checkpoint.exists():
            check.fail("checkpoint", f"{checkpoint} does not exist")
    return Recipe(name=merged["name"], file=recipe_file, data=merged, checkpoint=checkpoint)


def _check_semantics(check: _Checker, r: dict[str, Any]) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", r["name"]):
        check.fail("name", f"{r['name']!r} may only contain letters, digits, '_', '.', '-'")
    low, high = OPSET_RANGES[r["dynamo"]]
    if not low <= r["opset"] <= high:
        path = "dynamo=True" if r["dynamo"] else "dynamo=False (TorchScript)"
        check.fail("opset", f"{r['opset']} is out of range for {path}: supported {low}..{high}")
    if r["functions"] not in FUNCTION_MODES:
        check.fail(
            "functions",
            f"must be one of {FUNCTION_MODES}{_suggest(r['functions'], FUNCTION_MODES)}",
        )
    target = r["model"].get("_target_")
    if not isinstance(target, str) or not target:
        check.fail("model._target_", "missing required field (import path of the model factory)")
    _check_import(check, "model._target_", target)
    if not r["inputs"]:
        check.fail("inputs", "at least one input is required")
    for name, spec in r["inputs"].items():
        _check_input(check, f"inputs.{name}", spec)
    _check_dim_names(check, r["inputs"])
    if not r["hiera"]:
        check.fail("hiera", "at least one class is required")
    for i, path in enumerate(r["hiera"]):
        _check_import(check, f"hiera[{i}]", path)
    c = r["check"]
    for key in ("atol", "rtol"):
        if c[key] <= 0:
            check.fail(f"check.{key}", f"must be > 0, got {c[key]}")
    for out, tol in c["per_output"].items():
        for key in ("atol", "rtol"):
            if tol[key] is not None and tol[key] <= 0:
                check.fail(f"check.per_output.{out}.{key}", f"must be > 0, got {tol[key]}")
    if c["function_scope"] not in FUNCTION_SCOPES:
        check.fail(
            "check.function_scope",
            f"must be one of {FUNCTION_SCOPES}{_suggest(c['function_scope'], FUNCTION_SCOPES)}",
        )
    for op, count in c["expect_ops"].items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", op):
            check.fail(f"check.expect_ops.{op}", f"{op!r} is not an ONNX op type")
        if count < 0:
            check.fail(f"check.expect_ops.{op}", f"must be >= 0, got {count}")
    _check_attention(check, r["attention"])
    if r["attention"]["promote_opset24"] and r["opset"] < PROMOTE_MIN_OPSET:
        check.fail(
            "opset",
            f"{r['opset']} is too old for attention.promote_opset24: the export opset must be "
            f">= {PROMOTE_MIN_OPSET} (promotion re-declares the model at 24 without converting "
            "ops such as ReduceMean, whose signature changed at 18)",
        )
    for i, op in enumerate(r["custom_ops"]):
        if "::" not in op["name"]:
            check.fail(f"custom_ops[{i}].name", f"{op['name']!r} must look like 'domain::op'")
        _check_import(check, f"custom_ops[{i}].symbolic", op["symbolic"])
    if r["external_data_threshold"] < 0:
        check.fail("external_data_threshold", "must be >= 0")


def _check_input(check: _Checker, where: str, spec: Mapping[str, Any]) -> None:
    if spec["dtype"] not in DTYPES:
        check.fail(
            f"{where}.dtype", f"unknown dtype {spec['dtype']!r}{_suggest(spec['dtype'], DTYPES)}"
        )
    if any(d <= 0 for d in spec["shape"]):
        check.fail(f"{where}.shape", f"dimensions must be positive, got {spec['shape']}")
    if not spec["low"] < spec["high"]:
        check.fail(f"{where}.high", f"must be greater than low ({spec['low']}), got {spec['high']}")
    shape, dynamic, second = spec["shape"], spec["dynamic"], spec["check_shape"]
    for axis, dim in dynamic.items():
        if not 0 <= axis < len(shape):
            check.fail(
                f"{where}.dynamic",
                f"axis {axis} is outside the rank of shape {shape} (axes 0..{len(shape) - 1})",
            )
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", dim):
            check.fail(f"{where}.dynamic.{axis}", f"dim name {dim!r} must be an identifier")
    if second is None:
        return
    field_ = f"{where}.check_shape"
    if not dynamic:
        check.fail(field_, "needs dynamic axes (the second shape differs on dynamic axes only)")
    if len(second) != len(shape):
        check.fail(field_, f"{second} has rank {len(second)}, shape {shape} has {len(shape)}")
    if any(d <= 0 for d in second):
        check.fail(field_, f"dimensions must be positive, got {second}")
    for axis, (a, b) in enumerate(zip(shape, second, strict=True)):
        if axis not in dynamic and a != b:
            check.fail(field_, f"axis {axis} is not dynamic, so it must stay {a}, got {b}")
        if axis in dynamic and a == b:
            check.fail(
                field_,
                f"dynamic axis {axis} ({dynamic[axis]}) must differ from the traced size {a}, "
                "or the second run cannot tell it is dynamic",
            )


def _check_dim_names(check: _Checker, inputs: Mapping[str, Mapping[str, Any]]) -> None:
    """A dim name shared by several inputs has one size in the trace and one at check_shape."""
    traced: dict[str, tuple[str, int]] = {}
    second: dict[str, tuple[str, int | None]] = {}
    for name, spec in inputs.items():
        for axis, dim in sorted(spec["dynamic"].items()):
            size = spec["shape"][axis]
            other = traced.setdefault(dim, (name, size))
            if other[1] != size:
                check.fail(
                    f"inputs.{name}.shape",
                    f"dim {dim!r} is {size} on axis {axis} but {other[1]} in inputs.{other[0]}",
                )
            probe = spec["check_shape"][axis] if spec["check_shape"] is not None else None
            first = second.setdefault(dim, (name, probe))
            if first[1] != probe:
                check.fail(
                    f"inputs.{name}.check_shape",
                    f"dim {dim!r} is {probe} here but {first[1]} in inputs.{first[0]}.check_shape"
                    " (give every input sharing a dim the same check size)",
                )


def _check_attention(check: _Checker, attention: Mapping[str, Any]) -> None:
    implementation = attention["implementation"]
    if attention["promote_opset24"] and implementation is None:
        check.fail(
            "attention.implementation",
            "missing: attention.promote_opset24 needs an implementation to promote "
            "(e.g. 'hyperexport')",
        )
    if implementation in BUILTIN_ATTENTION:
        check.fail(
            "attention.implementation",
            f"{implementation!r} is a transformers built-in; hyperexport registers its "
            "attention under another name (e.g. 'hyperexport')",
        )


# --------------------------------------------------------------------------------------------
# Static import checks (no import: validation must not load torch)
# --------------------------------------------------------------------------------------------
def split_import_path(path: str) -> tuple[str, str]:
    """``"a.b:C"`` or ``"a.b.C"`` -> ``("a.b", "C")``."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return module, attr
    module, _, attr = path.rpartition(".")
    return module, attr


def _check_import(check: _Checker, where: str, path: str) -> None:
    module, attr = split_import_path(path)
    if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
        check.fail(where, f"{path!r} is not an import path like 'package.module.Name'")
    located = _locate_module(module)
    if isinstance(located, str):
        check.fail(where, f"cannot import {path!r}: {located}")
    if located is None:  # not statically resolvable (extension module, ...): checked at import
        return
    names = _top_level_names(located)
    if attr in names:
        return
    hint = _suggest(attr, sorted(names))
    if hint:
        check.fail(where, f"cannot import {path!r}: module {module} has no {attr!r}{hint}")
    log.debug("%s: %r not found statically in %s; checked at import time", where, attr, located)


def _locate_module(module: str) -> Path | str | None:
    """The source file of ``module`` found without importing it (or its parents).

    Returns:
        The file; an error message naming the missing part (with a close match); or None when
        the module exists but has no Python source to inspect.
    """
    parts = module.split(".")
    if module in sys.modules:
        origin = getattr(sys.modules[module], "__file__", None)
        return Path(origin) if origin and origin.endswith(".py") else None
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        return f"no module named {parts[0]!r}"
    if len(parts) == 1:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        found: Path | None = None
        siblings: set[str] = set()
        for loc in locations:
            base = Path(loc)
            if (base / part / "__init__.py").is_file() or (base / part).is_dir():
                found = base / part
                break
            if (base / f"{part}.py").is_file():
                found = base / f"{part}.py"
                break
            if base.is_dir():
                siblings |= {p.stem for p in base.iterdir() if p.suffix == ".py" or p.is_dir()}
        if found is None:
            prefix = ".".join(parts[:i])
            candidates = sorted(f"{prefix}.{s}" for s in siblings)
            missing = ".".join(parts[: i + 1])
            return f"no module named {missing!r}{_suggest(missing, candidates)}"
        if found.suffix == ".py":
            return found if i == len(parts) - 1 else f"{found} is not a package"
        locations = [str(found)]
        if i == len(parts) - 1:
            init = found / "__init__.py"
            return init if init.is_file() else None
    return None


@functools.lru_cache(maxsize=64)
def _top_level_names(path: Path) -> frozenset[str]:
    """Names bound at the top level of a Python source file (classes, defs, imports, assigns)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()
    for node in ast.walk(tree) if path.name == "__init__.py" else tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def validate_build(
    data: Mapping[str, Any] | None, recipe_file: str, stage_names: Sequence[str]
) -> BuildSettings:
    """Validate the ``build:`` section; ``force`` may be a name, a list, or ``all``."""
    data = dict(data or {})
    check = _Checker(recipe_file)
    check.dataclass_(
        BuildConfig,
        {k: v for k, v in data.items() if not (k == "force" and isinstance(v, str))},
        "build",
    )
    force = data.get("force") or []
    if isinstance(force, str):
        force = [force]
    if "all" in force:
        force = list(stage_names)
    for name in force:
        if name not in stage_names:
            check.fail("build.force", f"unknown stage {name!r}{_suggest(name, stage_names)}")
    return BuildSettings(
        cache_dir=data.get("cache_dir"),
        outputs_dir=Path(_outputs_root(data.get("outputs_dir"))),
        dry_run=bool(data.get("dry_run", False)),
        force=tuple(force),
    )


def compose_recipe(
    overrides: Sequence[str] = (),
    *,
    recipe_file: Path | None = None,
    stage_names: Sequence[str] = ("trace", "export", "rewrite", "check"),
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


def check_override_keys(overrides: Sequence[str], recipe_file: str) -> None:
    """Reject a command-line override of an unknown recipe field before Hydra sees it.

    Hydra would refuse it too, but with a generic message and exit code 1; this names the field
    and the close match. ``+key=`` (append), ``~key`` (delete), ``hydra.*`` and free-form
    sections (``model.*``, ``inputs.*``, ``check.per_output.*``) are left to Hydra.

    Raises:
        RecipeError: The key is not a recipe field, a build setting or ``recipe``/``recipe_file``.
    """
    top = {f.name for f in fields(RecipeConfig)} | {"build", "recipe", "recipe_file", "hydra"}
    nested: dict[str, type] = {
        "build": BuildConfig,
        "check": CheckSpec,
        "attention": AttentionSpec,
        "rewrite": RewriteSpec,
    }
    for item in overrides:
        if item.startswith(("-", "+", "~")) or "=" not in item:
            continue
        key = item.split("=", 1)[0]
        head, _, rest = key.partition(".")
        if head not in top:
            raise RecipeError(recipe_file, key, f"unknown key{_suggest(head, sorted(top))}")
        schema = nested.get(head)
        if schema is not None and rest:
            names = [f.name for f in fields(schema)]
            sub = rest.split(".", 1)[0]
            if sub not in names:
                raise RecipeError(recipe_file, key, f"unknown key{_suggest(sub, names)}")
