"""Validation of a composed recipe and of the build settings: one RecipeError naming the file and the field, with close matches."""

from __future__ import annotations

import dataclasses
import logging
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from hyperexport.base.contracts.names import (
    ATTENTION_DOMAIN,
    CHECKPOINT_SUFFIXES,
    FUNCTION_DOMAIN,
    NO_FUSION,
    OPSET_RANGES,
    PROMOTED_OPSET,
    QUANTIZED_DOMAIN,
    SAFETENSORS,
    STANDARD_FUSION,
    TEXT_GENERATION,
)
from hyperexport.base.errors import RecipeError, RecipeErrors, did_you_mean
from hyperexport.base.versions import (
    ONNXRUNTIME_LOADS,
    attention_registration_missing,
    decoding_task_missing,
    installed_version,
    lowest_ir_version,
    missing_transformers_class,
    onnxruntime_beyond_table,
    onnxruntime_older_than_installed,
    onnxruntime_refusal,
    torch_version,
    torchscript_opset_cap,
    unsupported,
)
from hyperexport.engine.machinery import machinery
from hyperexport.library.defaults import INT4_BLOCK
from hyperexport.library.tasks.registry import TASKS
from hyperexport.product.config.fields import (
    REQUIRED,
    Invalid,
    from_json,
    hints,
    is_required,
    section_type,
    spec_of,
    to_json,
    typed_value,
)
from hyperexport.product.config.imports import (
    _locate_module,
    _top_level_names,
    split_import_path,
    static_parameters,
)
from hyperexport.product.config.schema import (
    AUTO,
    FORCE_ALL,
    NO_QUANTIZATION,
    PROMOTE_MIN_OPSET,
    REMOTE_MODES,
    RETIRED_FIELDS,
    BuildConfig,
    BuildSettings,
    InputSpec,
    Recipe,
    RecipeConfig,
    _outputs_root,
    name_from_file,
)
from hyperexport.product.config.task_inference import TaskNotInferable, infer_task
from hyperexport.product.config.weights_source import refusal, weights_source

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    """How an error names type ``tp`` ("must be {description}")."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict or section_type(tp) is not None:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )


class _Checker:
    """Checks data against a schema dataclass, raising RecipeError on the first problem: the
    field's type, then its declared ``choices`` and ``check`` (config/fields.py)."""

    def __init__(self, recipe_file: str) -> None:
        self.file = recipe_file
        #: Why a missing field has no stand-in, by path (replaces "missing required field").
        self.missing: dict[str, str] = {}

    def fail(self, where: str, reason: str) -> typing.NoReturn:
        raise RecipeError(self.file, where, reason)

    def each_field(self, schema: type, data: Any) -> None:
        """``data`` against ``schema`` as :meth:`dataclass_` checks it, but every unknown key
        and every missing or invalid field reported together (``RecipeErrors``): a recipe is
        fixed in one try."""
        if not isinstance(data, Mapping):
            self.fail("<recipe>", f"must be a mapping, got {type(data).__name__}")
        names = [f.name for f in fields(schema)]
        found: list[RecipeError] = []
        for key in data:
            if key not in names:
                found.append(
                    RecipeError(self.file, str(key), f"unknown key{did_you_mean(str(key), names)}")
                )
        for f in fields(schema):
            try:
                self.field_(f, hints(schema)[f.name], data, f.name)
            except RecipeError as e:
                found.append(e)
        if found:
            raise RecipeErrors(found)

    def dataclass_(self, schema: type, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            self.fail(where or "<recipe>", f"must be a mapping, got {type(data).__name__}")
        types_ = hints(schema)
        names = [f.name for f in fields(schema)]
        for key in data:
            if key not in names:
                path = f"{where}.{key}" if where else str(key)
                if path in RETIRED_FIELDS:
                    self.fail(path, f"retired: replaced by {RETIRED_FIELDS[path]}")
                self.fail(path, f"unknown key{did_you_mean(str(key), names)}")
        for f in fields(schema):
            self.field_(f, types_[f.name], data, f"{where}.{f.name}" if where else f.name)

    def field_(self, f: Any, tp: Any, data: Mapping[str, Any], path: str) -> None:
        """Field ``f`` (of type ``tp``) of ``data``: present when required, then well-typed."""
        if f.name not in data or data[f.name] == REQUIRED:
            if path in self.missing:
                self.fail(path, self.missing[path])
            if is_required(f):
                hint = f" ({_describe(tp)})" if tp is bool else ""
                self.fail(path, f"missing required field{hint}")
            return
        self.value(tp, data[f.name], path)
        self.declared(f, tp, data[f.name], path)

    def declared(self, f: Any, tp: Any, value: Any, where: str) -> None:
        """The field's declared ``choices`` and ``check`` on a well-typed ``value``."""
        spec = spec_of(f)
        if spec.choices is not None and value not in spec.choices:
            hint = (
                did_you_mean(value, [str(c) for c in spec.choices])
                if isinstance(value, str)
                else ""
            )
            self.fail(where, f"must be one of {spec.choices}, got {value!r}{hint}")
        if spec.check is not None:
            try:
                spec.check(typed_value(tp, value))
            except Invalid as e:
                self.fail(f"{where}{e.at}", e.reason)

    def value(self, tp: Any, value: Any, where: str) -> None:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in args:
                return
            members = [a for a in args if a is not type(None)]
            match = next((a for a in members if _shape_of(a, value)), None)
            if match is None:
                if len(members) == 1:
                    match = members[0]
                else:
                    wanted = " or ".join(_describe(a) for a in members)
                    self.fail(where, f"must be {wanted}, got {value!r}")
            tp = match
            origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is Literal:
            if value not in args:
                self.fail(where, f"must be {_describe(tp)}, got {value!r}")
        elif section_type(tp) is not None:
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


def _shape_of(tp: Any, value: Any) -> bool:
    """Whether ``value`` is the kind of data ``tp`` describes (which Union member to check)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return isinstance(value, str) and all(isinstance(a, str) for a in typing.get_args(tp))
    if origin is list:
        return isinstance(value, list)
    if origin is dict or section_type(tp) is not None:
        return isinstance(value, Mapping)
    if tp in (str, float):
        return isinstance(value, tp)
    return False


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
    data = _named(check, data)
    check.each_field(RecipeConfig, data)
    config = from_json(RecipeConfig, data)
    if config.task == AUTO:  # resolved here, from the checkpoint's config.json (data only)
        try:
            task = infer_task(config.model, recipe_file)
        except TaskNotInferable as e:
            check.fail("task", str(e))
        log.info("task: auto is %s (from the checkpoint's config.json)", task)
        config = dataclasses.replace(config, task=task)
    _check_semantics(check, config)
    checkpoint = None
    if config.checkpoint:
        checkpoint = Path(config.checkpoint).expanduser()
        if not checkpoint.is_absolute():
            checkpoint = Path(recipe_file).resolve().parent / checkpoint
        if not checkpoint.exists():
            check.fail("checkpoint", f"{checkpoint} does not exist")
        _check_checkpoint(check, checkpoint)
    refused = refusal(
        config.weights,
        weights_source(config.model, checkpoint, recipe_file, config.task, config.fallback),
    )
    if refused is not None:
        check.fail("weights", refused)
    return Recipe(name=config.name, file=recipe_file, data=to_json(config), checkpoint=checkpoint)


def _named(check: _Checker, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with ``name`` set to the recipe file's stem when it has none; an unsafe stem
    is recorded as the reason ``name`` is missing."""
    if not isinstance(data, Mapping) or data.get("name", REQUIRED) != REQUIRED:
        return data
    try:
        stem = name_from_file(check.file)
    except Invalid as e:
        check.missing["name"] = e.reason
        return data
    if stem is None:
        return data
    log.info("name: %s (the recipe file's stem)", stem)
    return {**data, "name": stem}


def _check_checkpoint(check: _Checker, checkpoint: Path) -> None:
    """A ``.safetensors`` file, a folder holding some, or a torch state dict file."""
    if checkpoint.is_dir():
        if not any(checkpoint.glob(f"*{SAFETENSORS}")):
            check.fail("checkpoint", f"folder {checkpoint} holds no .safetensors file")
    elif checkpoint.suffix not in CHECKPOINT_SUFFIXES:
        check.fail(
            "checkpoint",
            f"{checkpoint} is not a checkpoint: expected a .safetensors file, a folder of them, "
            f"or a torch state dict ({', '.join(CHECKPOINT_SUFFIXES[1:])})",
        )


def _check_semantics(check: _Checker, r: RecipeConfig) -> None:
    """Relations between fields, and what only the environment can tell (importability)."""
    low, high = OPSET_RANGES[r.dynamo]
    dynamo_refused = unsupported(True) if r.dynamo else []
    if dynamo_refused:
        # the torch (or library) cannot take the dynamo path at all: that is the one line, not
        # the opset, whose default there is the TorchScript one (17 on torch 2.2)
        check.fail("dynamo", dynamo_refused[0])
    elif not low <= r.opset <= high:
        path = "dynamo=True" if r.dynamo else "dynamo=False (TorchScript)"
        check.fail("opset", f"{r.opset} is out of range for {path}: supported {low}..{high}")
    elif not r.dynamo and (cap := torchscript_opset_cap()) is not None and r.opset > cap:
        check.fail(
            "opset",
            f"{r.opset} is above what torch {torch_version()}'s TorchScript exporter supports "
            f"(dynamo=False: {low}..{cap}); use opset={cap} or a newer torch",
        )
    target = r.model.get("_target_")
    if not isinstance(target, str) or not target:
        check.fail("model._target_", "missing required field (import path of the model factory)")
    _check_targets(check, "model", r.model)
    task = TASKS.get(r.task)
    decoding = r.task == TEXT_GENERATION or (task is not None and bool(task.graphs))
    if decoding and (missing := decoding_task_missing(r.task)):
        check.fail("task", missing)
    if r.task == TEXT_GENERATION and not r.generation.prompts:
        check.fail("generation.prompts", f"task {TEXT_GENERATION} needs at least one prompt")
    if task is not None and task.graphs:  # the encoder-decoders: an encoder and a decoder graph
        if not r.generation.prompts:
            check.fail("generation.prompts", f"task {r.task} needs at least one prompt")
        if r.hiera != AUTO:
            check.fail(
                "hiera",
                f"task {r.task} makes the encoder and decoder layers functions itself: "
                "set hiera: auto",
            )
        if r.quantize.method != NO_QUANTIZATION:  # no single model.onnx to quantize
            check.fail(
                "quantize.method",
                f"{r.quantize.method}: task {r.task} is not quantized yet (its encoder and "
                "decoder graphs); set quantize.method: none",
            )
    if r.quantize.shared_embedding and r.quantize.method != INT4_BLOCK:
        check.fail(
            "quantize.shared_embedding",
            f"gathers int4 blocks (GatherBlockQuantized): it needs quantize.method: "
            f"{INT4_BLOCK}, not {r.quantize.method}",
        )
    if r.dynamic == AUTO and r.inputs != AUTO:
        check.fail(
            "dynamic",
            "auto applies to inputs: auto; explicit inputs name their axes in inputs.<name>.dynamic",
        )
    if not isinstance(r.inputs, str):
        if not r.inputs:
            check.fail("inputs", "at least one input is required")
        for name, spec in r.inputs.items():
            _check_input(check, f"inputs.{name}", spec)
        _check_dim_names(check, r.inputs)
    if not isinstance(r.hiera, str):
        if not r.hiera:
            check.fail("hiera", "at least one class is required")
        for i, path in enumerate(r.hiera):
            _check_import(check, f"hiera[{i}]", path)
    fuse = r.rewrite.fuse
    if r.attention.implementation is not None and (missing := attention_registration_missing()):
        check.fail("attention.implementation", missing)
    elif r.attention.implementation is not None and fuse == NO_FUSION:
        check.fail(
            "attention.implementation",
            f"{r.attention.implementation}: each attention call exports as one "
            f"{ATTENTION_DOMAIN}::Attention node, which no runtime runs until rewrite.fuse "
            "(standard: ONNX Attention; onnxruntime: ONNX Runtime's kernels) replaces it; set "
            "rewrite.fuse, or leave attention.implementation unset",
        )
    if fuse != NO_FUSION and r.attention.implementation is None:
        log.warning(
            "%s: rewrite.fuse=%s leaves attention unfused: it fuses attention exported as one "
            "node per call (attention.implementation: hyperexport)",
            check.file,
            fuse,
        )
    if fuse == STANDARD_FUSION and r.opset < PROMOTE_MIN_OPSET and not dynamo_refused:
        check.fail(
            "opset",
            f"{r.opset} is too old for rewrite.fuse=standard: the export opset must be "
            f">= {PROMOTE_MIN_OPSET} (the fusion re-declares the model at 24 without converting "
            "ops such as ReduceMean, whose signature changed at 18)",
        )
    for i, op in enumerate(r.custom_ops):
        _check_import(check, f"custom_ops[{i}].symbolic", op.symbolic)
    if r.target.onnxruntime is not None:  # a string: a number is refused by its check
        _check_target_runtime(check, r, str(r.target.onnxruntime))


def written_opsets(r: RecipeConfig) -> dict[str, int]:
    """The opset imports the recipe's published models carry: the default domain (24 with
    ``rewrite.fuse: standard``, which re-declares the model), the functions', ONNX Runtime's
    (its fused kernels, its quantized MatMuls) and each custom op's."""
    opsets = {
        "": PROMOTED_OPSET if r.rewrite.fuse == STANDARD_FUSION else r.opset,
        FUNCTION_DOMAIN: 1,
    }
    if r.rewrite.fuse not in (NO_FUSION, STANDARD_FUSION) or r.quantize.method != NO_QUANTIZATION:
        opsets[QUANTIZED_DOMAIN] = 1
    for op in r.custom_ops:
        domain = op.name.partition("::")[0]
        opsets[domain] = max(op.opset, opsets.get(domain, op.opset))
    return opsets


def _check_target_runtime(check: _Checker, r: RecipeConfig, release: str) -> None:
    """Refuse what ONNX Runtime ``release`` cannot load (``target.onnxruntime``), before the
    export; say at WARNING what cannot be told."""
    opsets = written_opsets(r)
    ir_version = lowest_ir_version(opsets, functions=True)
    refused = onnxruntime_refusal(release, opsets[""], ir_version)
    if refused is not None:
        why = (
            " (rewrite.fuse=standard re-declares the model at it)" if opsets[""] != r.opset else ""
        )
        check.fail("target.onnxruntime", f"{refused}{why}")
    if onnxruntime_beyond_table(release):
        log.warning(
            "%s: target.onnxruntime=%s is newer than the releases whose limits hyperexport knows "
            "(up to %s): opset %d at IR %d is not checked against it",
            check.file,
            release,
            ONNXRUNTIME_LOADS[-1].release,
            opsets[""],
            ir_version,
        )
    if QUANTIZED_DOMAIN in opsets and onnxruntime_older_than_installed(release):
        log.warning(
            "%s: target.onnxruntime=%s is older than the installed onnxruntime %s, which chooses "
            "the ONNX Runtime kernels the build writes (rewrite.fuse=%s, quantize.method=%s) "
            "and runs them; whether %s has them is not checked",
            check.file,
            release,
            installed_version("onnxruntime"),
            r.rewrite.fuse,
            r.quantize.method,
            release,
        )


#: Keys of a ``_target_`` mapping that Hydra reads itself: not arguments of the target.
_HYDRA_KEYS = frozenset({"_target_", "_args_", "_recursive_", "_convert_", "_partial_"})


def _check_targets(check: _Checker, where: str, node: Any) -> None:
    """Every ``_target_`` in ``node`` (``model:`` and what it holds, at any depth), before
    anything is instantiated: the import path as :func:`_check_import` checks it, then the
    arguments beside it against the parameters its source declares."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            target = node["_target_"]
            if not isinstance(target, str) or not target:
                check.fail(f"{where}._target_", f"must be an import path, got {target!r}")
            _check_import(check, f"{where}._target_", target)
            _check_arguments(check, where, target, node)
        for key, value in node.items():
            _check_targets(check, f"{where}.{key}", value)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _check_targets(check, f"{where}[{i}]", item)


def _check_arguments(check: _Checker, where: str, target: str, node: Mapping[str, Any]) -> None:
    """The arguments beside ``_target_`` fit what its source declares (when it can be read:
    :func:`~hyperexport.product.config.imports.static_parameters`), as the call would require."""
    params = static_parameters(target)
    if params is None:
        return
    args = node.get("_args_", [])
    given = [str(k) for k in node if k not in _HYDRA_KEYS]
    count = len(args) if isinstance(args, list) else 0
    if count > len(params.positional) and not params.var_positional:
        check.fail(
            f"{where}._args_",
            f"{target} takes {len(params.positional)} positional arguments, {count} given",
        )
    by_position = set(params.positional[:count])
    for name in given:
        if name in by_position:
            check.fail(f"{where}.{name}", f"{target} is given {name!r} twice (by position too)")
        if name not in params.keyword and not params.var_keyword:
            known = sorted(params.keyword)
            hint = did_you_mean(name, known) or f" (it takes: {', '.join(known) or 'nothing'})"
            check.fail(f"{where}.{name}", f"not a parameter of {target}{hint}")
    if node.get("_partial_") is True:
        return
    missing = sorted(params.required - by_position - set(given))
    if missing:
        check.fail(where, f"{target} needs {', '.join(repr(m) for m in missing)}: missing")


def _check_input(check: _Checker, where: str, spec: InputSpec) -> None:
    if any(d <= 0 for d in spec.shape):
        check.fail(f"{where}.shape", f"dimensions must be positive, got {spec.shape}")
    if not spec.low < spec.high:
        check.fail(f"{where}.high", f"must be greater than low ({spec.low}), got {spec.high}")
    shape, dynamic, second = spec.shape, spec.dynamic, spec.check_shape
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


def _check_dim_names(check: _Checker, inputs: Mapping[str, InputSpec]) -> None:
    """A dim name shared by several inputs has one size in the trace and one at check_shape."""
    traced: dict[str, tuple[str, int]] = {}
    second: dict[str, tuple[str, int | None]] = {}
    for name, spec in inputs.items():
        for axis, dim in sorted(spec.dynamic.items()):
            size = spec.shape[axis]
            other = traced.setdefault(dim, (name, size))
            if other[1] != size:
                check.fail(
                    f"inputs.{name}.shape",
                    f"dim {dim!r} is {size} on axis {axis} but {other[1]} in inputs.{other[0]}",
                )
            probe = spec.check_shape[axis] if spec.check_shape is not None else None
            first = second.setdefault(dim, (name, probe))
            if first[1] != probe:
                check.fail(
                    f"inputs.{name}.check_shape",
                    f"dim {dim!r} is {probe} here but {first[1]} in inputs.{first[0]}.check_shape"
                    " (give every input sharing a dim the same check size)",
                )


def _check_import(check: _Checker, where: str, path: str) -> None:
    module, attr = split_import_path(path)
    if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
        check.fail(where, f"{path!r} is not an import path like 'package.module.Name'")
    located = _locate_module(module)
    if isinstance(located, str):
        check.fail(where, f"cannot import {path!r}: {located}")
    if located is None:  # nothing to read: a built-in or compiled module, a namespace package
        check.fail(
            where,
            f"cannot check {path!r} without importing it: module {module} has no Python source "
            "(built into Python, compiled, or a namespace package); name a function or class "
            "defined in a .py file",
        )
    names = _top_level_names(located)
    if attr in names:
        return
    too_old = missing_transformers_class(path)
    if too_old:
        check.fail(where, too_old)
    hint = did_you_mean(attr, sorted(names))
    if hint:
        check.fail(where, f"cannot import {path!r}: module {module} has no {attr!r}{hint}")
    log.debug("%s: %r not found statically in %s; checked at import time", where, attr, located)


def validate_build(
    data: Mapping[str, Any] | None, recipe_file: str, stage_names: Sequence[str]
) -> BuildSettings:
    """Validate the ``build:`` section; ``force`` may be a name, a list, or ``all``. A setting
    left out has :class:`BuildConfig`'s default."""
    data = {**dataclasses.asdict(BuildConfig()), **(data or {})}
    check = _Checker(recipe_file)
    check.dataclass_(
        BuildConfig,
        {k: v for k, v in data.items() if not (k == "force" and isinstance(v, str))},
        "build",
    )
    force = data.get("force") or []
    if isinstance(force, str):
        force = [force]
    if FORCE_ALL in force:
        force = list(stage_names)
    for name in force:
        if name not in stage_names:
            check.fail("build.force", f"unknown stage {name!r}{did_you_mean(name, stage_names)}")
    remote = data["remote"] or None
    mode = data["remote_mode"]
    if mode not in REMOTE_MODES:
        check.fail("build.remote_mode", f"must be one of {list(REMOTE_MODES)}, got {mode!r}")
    if remote is not None:
        _check_remote_url(check, remote)
    return BuildSettings(
        cache_dir=data["cache_dir"],
        outputs_dir=Path(_outputs_root(data["outputs_dir"])),
        dry_run=bool(data["dry_run"]),
        force=tuple(force),
        remote=remote,
        remote_mode=mode,
        storage_options=dict(data["storage_options"] or {}),
    )


def _check_remote_url(check: _Checker, url: str) -> None:
    """``build.remote`` names a filesystem fsspec knows, whose package is installed."""
    try:
        with machinery():  # the remote tier's, not the model's: never keyed
            import fsspec
    except ImportError:
        check.fail("build.remote", "needs fsspec: pip install 'hyperexport[remote]'")
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    try:
        with machinery():
            fsspec.get_filesystem_class(protocol)
    except ValueError:
        check.fail("build.remote", f"unknown filesystem {protocol!r} in {url!r}")
    except ImportError as e:
        check.fail("build.remote", f"{protocol}:// needs a package: {e}")


def check_override_keys(overrides: Sequence[str], recipe_file: str) -> None:
    """Reject a command-line override of an unknown recipe field before Hydra sees it.

    Hydra would refuse it too, but with a generic message; this names the field and the close
    match. Left to Hydra (whose refusals the CLI also turns into exit code 2): ``+key=``
    (append), ``~key`` (delete), ``hydra.*`` settings, Hydra's own config groups
    (``hydra/launcher=joblib``, ``hydra/sweeper=...``) and free-form sections (``model.*``,
    ``inputs.*``, ``check.per_output.*``).

    Raises:
        RecipeError: The key is not a recipe field, a build setting or ``recipe``/``recipe_file``.
    """
    top = {f.name for f in fields(RecipeConfig)} | {"build", "recipe", "recipe_file", "hydra"}
    sections = {name: tp for name, tp in hints(RecipeConfig).items() if section_type(tp)}
    nested: dict[str, type] = {"build": BuildConfig, **sections}
    for item in overrides:
        if item.startswith(("-", "+", "~")) or "=" not in item:
            continue
        key = item.split("=", 1)[0]
        if key.startswith("hydra/"):
            continue  # a Hydra config group (launcher, sweeper, ...): Hydra checks the option
        head, _, rest = key.partition(".")
        if head not in top:
            raise RecipeError(recipe_file, key, f"unknown key{did_you_mean(head, sorted(top))}")
        schema = nested.get(head)
        if schema is not None and rest:
            names = [f.name for f in fields(schema)]
            sub = rest.split(".", 1)[0]
            if sub not in names:
                raise RecipeError(recipe_file, key, f"unknown key{did_you_mean(sub, names)}")


def check_recipe_choice(overrides: Sequence[str], recipes: Mapping[str, Path]) -> None:
    """Reject ``recipe=NAME`` (or a sweep ``recipe=a,b``) naming no registered recipe.

    Args:
        overrides: The command-line overrides.
        recipes: ``{recipe option: file}`` as registered (``recipes/`` and ``recipe_file=``).

    Raises:
        RecipeError: A value is not a recipe name (``recipe=nope``, ``recipe=../x``); the
            message lists the close match or the known recipes.
    """
    for item in overrides:
        if not item.startswith("recipe="):
            continue
        value = item.split("=", 1)[1]
        if "(" in value:
            continue  # a sweep function (choice(), glob()): Hydra expands and checks it
        for name in (v.strip() for v in value.split(",")):
            if name not in recipes:
                hint = did_you_mean(name, sorted(recipes)) or (
                    f"; known recipes: {', '.join(sorted(recipes))}"
                )
                raise RecipeError(
                    "<command line>", "recipe", f"no recipe named {name!r} in recipes/{hint}"
                )
