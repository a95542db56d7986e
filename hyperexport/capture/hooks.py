"""Run the model once with forward hooks and record every call of every hiera module.

The result is a :class:`Capture`: a plain :class:`CaptureRecord` plus the tensors it refers to,
as numpy arrays. Nothing in it refers to live modules, so it can be saved, hashed and cached.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperexport.atomic import atomic_write_text
from hyperexport.capture import signature, tree
from hyperexport.capture.attribute_reads import ReadLog, original_class, record_reads
from hyperexport.capture.model_patches import export_context
from hyperexport.capture.root import RootHolder
from hyperexport.capture.tensor_store import load_arrays, raw_dtype, save_arrays
from hyperexport.contracts.names import CAPTURE_JSON, PROBE_PREFIX, TENSORS_NPZ
from hyperexport.contracts.records import CaptureRecord, ModuleCall, TensorMeta, Tree
from hyperexport.errors import (
    CorruptRecordError,
    HieraError,
    InputError,
    ModelForwardError,
    OptionsError,
    RecipeError,
    did_you_mean,
)
from hyperexport.versions import (
    is_tracing,
    pause_tracing,
    quiet_torchscript_exporter,
    resume_tracing,
    torch_dtype,
    torch_dtype_name,
)

log = logging.getLogger(__name__)


def to_array(t: torch.Tensor) -> np.ndarray:
    """A detached CPU numpy copy of ``t`` (bfloat16 kept as raw bits).

    Under ``torch.jit.trace`` (the TorchScript path's capture) the tracer is paused meanwhile:
    it cannot record the dtype view of a bfloat16 tensor (an internal assert in torch 2.13).
    """
    paused = pause_tracing() if is_tracing() else None
    try:
        t = t.detach().cpu()
        bits = raw_dtype(torch_dtype_name(t.dtype))
        if bits is not None:
            return t.view(torch.int16).numpy().view(bits).copy()
        return t.numpy().copy()
    finally:
        if paused is not None:
            resume_tracing(paused)


def from_array(array: np.ndarray, dtype: str) -> torch.Tensor:
    """Inverse of :func:`to_array`."""
    if raw_dtype(dtype) is not None:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch_dtype(dtype))
    return torch.from_numpy(array.copy())


@dataclass(frozen=True)
class Capture:
    """A capture record plus its tensors (numpy arrays keyed like the record's trees)."""

    record: CaptureRecord
    arrays: Mapping[str, np.ndarray] = field(repr=False)

    def tensor(self, key: str) -> torch.Tensor:
        """The captured tensor ``key`` as a fresh torch tensor."""
        meta = self._meta[key]
        return from_array(self.arrays[key], meta.dtype)

    @property
    def _meta(self) -> dict[str, TensorMeta]:
        return {t.key: t for t in self.record.tensors}

    def save(self, directory: Path) -> None:
        """Write ``capture.json`` and ``tensors.npz`` into ``directory`` (atomically each)."""
        directory.mkdir(parents=True, exist_ok=True)
        save_arrays(directory / TENSORS_NPZ, self.arrays)
        atomic_write_text(directory / CAPTURE_JSON, self.record.dumps())

    @classmethod
    def load(cls, directory: Path) -> Capture:
        """Read a capture saved by :meth:`save`.

        Raises:
            CorruptRecordError: ``capture.json`` or ``tensors.npz`` is malformed (a build
                treats the cache entry holding them as corrupt and rebuilds it).
        """
        try:
            record = CaptureRecord.loads((directory / CAPTURE_JSON).read_text(encoding="utf-8"))
            return cls(record, load_arrays(directory / TENSORS_NPZ))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CorruptRecordError(
                f"capture in {directory}", f"unreadable: {type(e).__name__}: {e}"
            ) from e


class _Recorder:
    """Collects module calls and tensors while the model runs."""

    def __init__(self, names: Mapping[int, str], prefix: str = "", keep_calls: bool = True) -> None:
        self.names = names
        self.prefix = prefix  # "" for the capture, PROBE for the run at the second shape
        self.keep_calls = keep_calls  # False: keep only shapes of the calls' tensors
        self.calls: list[ModuleCall | None] = []
        self.pending: list[tuple[int, str, Tree]] = []  # (slot, call_id, inputs) of open calls
        self.counts: dict[str, int] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.meta: dict[str, TensorMeta] = {}
        self.stack: list[str] = []  # module paths of every open forward, for error messages
        self.reads = ReadLog()
        # Hiera modules with no hiera module inside run with tracing paused during a traced
        # capture: their own export traces them again, and nothing recorded inside them depends
        # on tracing, so recording their ops would only cost time.
        self.leaves: set[int] = set()
        self.paused: list[object] = []

    def store(self, value: Any, prefix: str, where: str, keep: bool = True) -> Tree:
        prefix = f"{self.prefix}{prefix}"
        tensors: list[torch.Tensor] = []
        t = tree.flatten(value, where, tensors)
        for i, tensor in enumerate(tensors):
            key = f"{prefix}{i}"
            if keep:
                self.arrays[key] = to_array(tensor)
            shape = tuple(int(d) for d in tensor.shape)
            self.meta[key] = TensorMeta(key, shape, torch_dtype_name(tensor.dtype))
        return tree.rekey(t, prefix)

    def enter(self, module: torch.nn.Module, args: Any) -> None:
        self.stack.append(self.names.get(id(module), ""))

    def leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()

    def pre_hook(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        path = self.names[id(module)]
        index = self.counts.get(path, 0)
        self.counts[path] = index + 1
        call_id = f"{path}#{index}"
        bound = signature.bind(module.forward, args, kwargs)
        inputs = self.store(bound, f"{call_id}/in.", f"module {path!r} input", self.keep_calls)
        self.pending.append((len(self.calls), call_id, inputs))
        self.calls.append(None)
        self.reads.open.append((path, set()))
        if id(module) in self.leaves and is_tracing():
            self.paused.append(pause_tracing())

    def post_hook(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if id(module) in self.leaves and self.paused:
            resume_tracing(self.paused.pop())
        slot, call_id, inputs = self.pending.pop()
        path, _, index = call_id.rpartition("#")
        outputs = self.store(output, f"{call_id}/out.", f"module {path!r} output", self.keep_calls)
        parent = self.pending[-1][1] if self.pending else None
        _, reads = self.reads.open.pop()
        self.calls[slot] = ModuleCall(
            path=path,
            class_name=tree.qualified_name(original_class(module)),
            call_index=int(index),
            order=slot,
            parent=parent,
            inputs=inputs,
            outputs=outputs,
            reads=tuple(sorted(reads)),
        )


@contextlib.contextmanager
def _hooks(model: torch.nn.Module, hiera: tuple[type, ...], rec: _Recorder) -> Iterator[int]:
    handles = []
    try:
        count = 0
        for module in model.modules():
            if isinstance(module, hiera) and module is not model:
                inner = (m for m in module.modules() if m is not module)
                if not any(isinstance(m, hiera) for m in inner):
                    rec.leaves.add(id(module))
                handles.append(module.register_forward_pre_hook(rec.pre_hook, with_kwargs=True))
                handles.append(module.register_forward_hook(rec.post_hook, with_kwargs=True))
                count += 1
        handles.append(torch.nn.modules.module.register_module_forward_pre_hook(rec.enter))
        handles.append(torch.nn.modules.module.register_module_forward_hook(rec.leave))
        yield count
    finally:
        for handle in handles:
            handle.remove()


def _import_hiera_class(name: str) -> Any:
    """Import ``package.module.Class`` (the caller's code, never data read back from disk)."""
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj: Any = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            qual = f"{head}.{qual}"
            continue
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def resolve_hiera(hiera: Sequence[type | str]) -> tuple[type, ...]:
    """Turn class objects or import paths into module classes, with clear errors."""
    classes = []
    for item in hiera:
        cls: Any = item
        if isinstance(item, str):
            try:
                cls = _import_hiera_class(item)
            except (ImportError, AttributeError) as e:
                raise HieraError(
                    f"hiera class {item!r} cannot be imported: {e}{_close_match(item)}"
                ) from e
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise HieraError(f"hiera entry {item!r} is not a torch.nn.Module subclass")
        classes.append(cls)
    return tuple(classes)


def _close_match(path: str) -> str:
    """``"; did you mean 'x'?"`` for the last part of ``path`` among its module's names."""
    module, _, name = path.rpartition(".")
    try:
        owner = importlib.import_module(module) if module else None
    except ImportError:
        return ""
    return did_you_mean(name, [n for n in dir(owner) if not n.startswith("_")]) if owner else ""


def capture_model(
    model: torch.nn.Module,
    args: Any,
    kwargs: Mapping[str, Any] | None = None,
    *,
    hiera: Sequence[type | str] = (),
    method: str = "forward",
    dynamo: bool = False,
    attention: str | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    probe_shapes: Mapping[str, Sequence[int]] | None = None,
    strict_hiera: str | None = None,
) -> Capture:
    """Run ``model`` once and record its inputs, outputs and every hiera module call.

    With ``dynamic_axes``, the model runs a second time at another shape (the *probe*): every
    tensor dimension that differs between the two runs is dynamic, for the root and for each
    hiera call's inputs and outputs, and the probe's inputs and outputs become the reference
    for checking the exported model at a shape it was not traced at.

    Args:
        model: The root module (put in eval mode by the caller).
        args: Positional example inputs (a tuple, or a single tensor).
        kwargs: Keyword example inputs.
        hiera: Classes (or import paths) whose calls become functions.
        method: The model method to call.
        dynamo: The export path the capture is for. For the TorchScript path the model runs
            under ``torch.jit.trace``, so every ``torch.jit.is_tracing()`` branch (transformers'
            mask creation has several) takes the same turn as during the export, and the
            recorded module inputs match what the exporter will see.
        attention: The attention implementation the export will use (see ExportOptions).
        dynamic_axes: ``{input leaf name: {axis: dim name}}`` of the root inputs.
        probe_shapes: ``{input leaf name: shape}`` of the second run; by default each dynamic
            dimension grows by 1 + the rank of its name in sorted order.
        strict_hiera: The recipe file, for a build: a hiera class that never runs is then a
            RecipeError (there it is almost always a mistake). None (the library): a WARNING
            naming the class, and the export goes on without it.

    Raises:
        InputError: An example input cannot cross the ONNX boundary, or a dynamic axis names
            an unknown input.
        OptionsError: A dynamic axis is beyond its input's rank.
        HieraError: A hiera class cannot be imported or is not a module class.
        RecipeError: With ``strict_hiera``, a hiera class never runs in forward.
        ModelForwardError: The forward raised; names the innermost module that was running.
    """
    if not isinstance(args, tuple):
        args = (args,)
    if model.training:
        log.warning(
            "%s is in training mode: dropout and batch-norm statistics make the captured "
            "reference outputs differ from the eval-mode export; call model.eval() first",
            type(model.root if isinstance(model, RootHolder) else model).__name__,
        )
    classes = resolve_hiera(hiera)
    fn = getattr(model, method)
    names = {id(m): name for name, m in model.named_modules()}
    bound = signature.bind(fn, args, dict(kwargs or {}))
    run = _Run(model, fn, classes, dynamo, attention)
    rec, inputs, outputs, instances = run.record(bound, _Recorder(names))
    calls = tuple(c for c in rec.calls if c is not None)
    _require_every_class_ran(classes, calls, instances, strict_hiera)
    probe_inputs = probe_outputs = None
    if dynamic_axes:
        probe_bound = resize_inputs(bound, dynamic_axes, probe_shapes)
        probe, probe_inputs, probe_outputs, _ = run.record(
            probe_bound, _Recorder(names, PROBE, keep_calls=False)
        )
        _require_same_calls(calls, [c for c in probe.calls if c is not None])
        rec.arrays.update(probe.arrays)
        rec.meta.update(probe.meta)
    record = CaptureRecord(
        model_class=tree.qualified_name(type(model)),
        inputs=inputs,
        outputs=outputs,
        calls=calls,
        tensors=tuple(rec.meta[k] for k in sorted(rec.meta)),
        hiera=tuple(tree.qualified_name(c) for c in classes),
        probe_inputs=probe_inputs,
        probe_outputs=probe_outputs,
    )
    log.info("captured %d hiera calls over %d tensors", len(calls), len(rec.meta))
    return Capture(record, rec.arrays)


#: Key prefix of the tensors of the run at the second (probe) shape.
PROBE = PROBE_PREFIX


@dataclass(frozen=True)
class _Run:
    """How to run the model once with hooks (shared by the capture and the probe run)."""

    model: torch.nn.Module
    fn: Any
    classes: tuple[type, ...]
    dynamo: bool
    attention: str | None

    def record(self, bound: dict[str, Any], rec: _Recorder) -> tuple[_Recorder, Tree, Tree, int]:
        inputs = rec.store(bound, "in.", "model input")
        with (
            export_context(self.model, self.dynamo, self.attention),
            record_reads(self.model, lambda m: isinstance(m, self.classes), rec.reads),
            _hooks(self.model, self.classes, rec) as instances,
            torch.no_grad(),
        ):
            try:
                if self.dynamo:
                    args, kwargs = signature.split(self.fn, bound)
                    output = self.fn(*args, **kwargs)
                else:
                    output = _run_under_trace(self.model, self.fn, bound, rec.paused)
            except InputError:
                raise
            except Exception as e:
                path = next((p for p in reversed(rec.stack) if p), "")
                raise ModelForwardError(path, e) from e
        outputs = rec.store(output, "out.", "model output")
        return rec, inputs, outputs, instances


def resize_inputs(
    bound: dict[str, Any],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    probe_shapes: Mapping[str, Sequence[int]] | None,
) -> dict[str, Any]:
    """The root inputs at the probe shape: each dynamic axis tiled or cut to its new size.

    Tiling keeps the values meaningful (token ids stay in the vocabulary, an all-ones mask
    stays all ones).
    """
    tensors: list[torch.Tensor] = []
    structure = tree.flatten(bound, "model input", tensors)
    leaves = tree.leaf_names(structure)
    unknown = sorted(set(dynamic_axes) - set(leaves))
    if unknown:
        raise InputError(f"dynamic_axes {unknown}", f"not among the model inputs {leaves}")
    dim_names = sorted({n for axes in dynamic_axes.values() for n in axes.values()})
    grow = {n: 1 + i for i, n in enumerate(dim_names)}
    resized = []
    for name, tensor in zip(leaves, tensors):
        axes = dynamic_axes.get(name, {})
        beyond = sorted(a for a in axes if a >= tensor.dim())
        if beyond:
            raise OptionsError(
                f"dynamic_axes[{name!r}]",
                f"axis {beyond[0]} is beyond the input's rank {tensor.dim()} "
                f"(shape {tuple(tensor.shape)})",
            )
        target = list(tensor.shape)
        for axis, dim in axes.items():
            target[axis] = tensor.shape[axis] + grow[dim]
        if probe_shapes and name in probe_shapes:
            target = list(probe_shapes[name])
        for axis, size in enumerate(target):
            if size != tensor.shape[axis]:
                index = torch.arange(size) % tensor.shape[axis]
                tensor = tensor.index_select(axis, index)
        resized.append(tensor)
    return tree.unflatten(structure, lambda k: resized[int(k)])


def _require_same_calls(calls: Sequence[ModuleCall], probe: Sequence[ModuleCall]) -> None:
    first = [c.call_id for c in calls]
    second = [c.call_id for c in probe]
    if first != second:
        diff = sorted(set(first) ^ set(second))
        raise InputError(
            "dynamic_axes",
            f"the hiera calls differ between the traced and the second shape ({diff[:5]}); "
            "the model's module structure depends on the dynamic dimensions",
        )


def _run_under_trace(
    model: torch.nn.Module, fn: Any, bound: dict[str, Any], paused: list[object]
) -> Any:
    """Call ``fn`` with ``bound`` arguments inside ``torch.jit.trace``; return its real output.

    The traced graph is thrown away: only the semantics (``is_tracing()`` is True) matter.
    A plain function is traced, not a module: tracing a module first compiles a ScriptModule
    for every submodule, twice the cost of the trace itself. The weights then enter the trace
    as constants, which the tracer accepts only when they do not require grad, so
    ``requires_grad`` is switched off for the duration and restored.
    """
    tensors: list[torch.Tensor] = []
    structure = tree.flatten(bound, "model input", tensors)
    positions = {str(i): i for i in range(len(tensors))}
    result: list[Any] = []

    def call(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = signature.split(fn, tree.unflatten(structure, lambda k: flat[positions[k]]))
        try:
            out = fn(*args, **kwargs)
        finally:
            if paused:  # a forward that raised inside a paused hiera call
                resume_tracing(paused[0])
                paused.clear()
        result.append(out)
        leaves: list[torch.Tensor] = []
        tree.flatten(out, "model output", leaves)
        return tuple(leaves)

    with quiet_torchscript_exporter(), _weights_without_grad(model):
        torch.jit.trace(call, tuple(tensors), check_trace=False, strict=False)
    return result[0]


@contextlib.contextmanager
def _weights_without_grad(model: torch.nn.Module) -> Iterator[None]:
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _require_every_class_ran(
    classes: tuple[type, ...],
    calls: tuple[ModuleCall, ...],
    instances: int,
    strict_recipe: str | None,
) -> None:
    """Report hiera classes that never ran: a WARNING, or with a recipe a RecipeError."""
    seen = {c.class_name for c in calls}
    for cls in classes:
        name = tree.qualified_name(cls)
        if name in seen:
            continue
        why = "" if instances else " (the model has no instance of any hiera class)"
        if strict_recipe is not None:
            raise RecipeError(strict_recipe, "hiera", f"class {name} never ran in forward{why}")
        log.warning("hiera class %s never ran in forward%s; it is ignored", name, why)
