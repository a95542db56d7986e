"""Run the model once with forward hooks and record every call of every hiera module.

The result is a :class:`~hyperexport.library.capture.container.Capture`. With dynamic axes the model runs
a second time at another shape (:mod:`.probe`); for the TorchScript path it runs under
``torch.jit.trace`` (:mod:`.jit_trace`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, Tree
from hyperexport.base.errors import (
    InputError,
    ModelForwardError,
    RecipeError,
)
from hyperexport.library.capture import signature, tree
from hyperexport.library.capture.attribute_reads import record_reads
from hyperexport.library.capture.container import Capture
from hyperexport.library.capture.hiera_classes import resolve_hiera
from hyperexport.library.capture.hooks import Recorder, hiera_hooks
from hyperexport.library.capture.jit_trace import run_under_trace
from hyperexport.library.capture.model_patches import attention_reached, export_context
from hyperexport.library.capture.probe import PROBE, require_same_calls, resize_inputs
from hyperexport.library.capture.root import RootHolder

log = logging.getLogger(__name__)


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
    with attention_reached(model, attention):
        rec, inputs, outputs, instances = run.record(bound, Recorder(names))
    calls = tuple(c for c in rec.calls if c is not None)
    _require_every_class_ran(classes, calls, instances, strict_hiera)
    probe_inputs = probe_outputs = None
    if dynamic_axes:
        probe_bound = resize_inputs(bound, dynamic_axes, probe_shapes)
        probe, probe_inputs, probe_outputs, _ = run.record(
            probe_bound, Recorder(names, PROBE, keep_calls=False)
        )
        require_same_calls(calls, [c for c in probe.calls if c is not None])
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


@dataclass(frozen=True)
class _Run:
    """How to run the model once with hooks (shared by the capture and the probe run)."""

    model: torch.nn.Module
    fn: Any
    classes: tuple[type, ...]
    dynamo: bool
    attention: str | None

    def record(self, bound: dict[str, Any], rec: Recorder) -> tuple[Recorder, Tree, Tree, int]:
        inputs = rec.store(bound, "in.", "model input")
        with (
            export_context(self.model, self.dynamo, self.attention),
            record_reads(self.model, lambda m: isinstance(m, self.classes), rec.reads),
            hiera_hooks(self.model, self.classes, rec) as instances,
            torch.no_grad(),
        ):
            try:
                if self.dynamo:
                    args, kwargs = signature.split(self.fn, bound)
                    output = self.fn(*args, **kwargs)
                else:
                    output = run_under_trace(self.model, self.fn, bound, rec.paused)
            except InputError:
                raise
            except Exception as e:
                path = next((p for p in reversed(rec.stack) if p), "")
                raise ModelForwardError(path, e) from e
        outputs = rec.store(output, "out.", "model output")
        return rec, inputs, outputs, instances


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
