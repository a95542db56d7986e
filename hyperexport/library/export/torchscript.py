"""The TorchScript path (``dynamo=False``): one ``torch.onnx.export`` per unit.

Its placeholder is a duck-typed ``autograd.Function`` whose ``symbolic`` emits the node.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import onnx
import onnx_ir as ir
import torch

from hyperexport.base.contracts.manifest import PLACEHOLDER_DOMAIN
from hyperexport.base.contracts.names import OPSET_RANGES
from hyperexport.base.errors import HyperExportError, ModuleExportError
from hyperexport.base.versions import torchscript_export_keywords, torchscript_opset_cap
from hyperexport.library import progress
from hyperexport.library.capture.container import Capture
from hyperexport.library.capture.model_patches import export_context
from hyperexport.library.capture.torch_hooks import quiet_torchscript_exporter
from hyperexport.library.export.jobs import UnitJob
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.placeholders import Dim, ShapeFunction, replace_children
from hyperexport.library.export.torch_exporter import (
    SDPA_OP,
    WHERE_OP,
    repaired_sdpa_symbolic,
    repaired_where_symbolic,
    set_symbolic_output_type,
    weights_out_of_shape_inference,
)
from hyperexport.library.export.weights import attach_torch_weights
from hyperexport.library.options import CustomOpSymbolic, ExportOptions


class TorchScriptPath(ExportPath):
    """``dynamo=False``: each unit through ``torch.onnx.export(dynamo=False)`` on its own.

    Units are exported one at a time and yielded as each is done, so only one unit's model is
    held at once.
    """

    name = "torchscript"
    dynamo = False
    one_program = False
    #: Up to the installed torch's cap (:func:`~hyperexport.base.versions.torchscript_opset_cap`).
    opsets = range(
        OPSET_RANGES[False][0], min(OPSET_RANGES[False][1], torchscript_opset_cap() or 1 << 30) + 1
    )

    def apply_placeholder(
        self,
        op_type: str,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        output_dims: Sequence[tuple[Dim, ...]] = (),
        derived: ShapeFunction | None = None,
    ) -> Sequence[torch.Tensor]:
        # The tracer reads sizes off the node's outputs in the graph, so a derived dimension
        # needs no shape function: it is typed unknown, like any dynamic one.
        return apply_placeholder(op_type, inputs, outputs, output_dims)

    def export(
        self,
        jobs: Sequence[UnitJob],
        *,
        model: torch.nn.Module,
        modules: Mapping[str, torch.nn.Module],
        capture: Capture,
        opset: int,
        options: ExportOptions,
    ) -> Iterator[tuple[str, ir.Model]]:
        for job in progress.track(jobs, "exporting units", unit="units", memory=True):
            yield job.name, self._export_one(job, model, modules, capture, opset, options)

    def _export_one(
        self,
        job: UnitJob,
        model: torch.nn.Module,
        modules: Mapping[str, torch.nn.Module],
        capture: Capture,
        opset: int,
        options: ExportOptions,
    ) -> ir.Model:
        try:
            with (
                export_context(model, False, options.attention.implementation),
                replace_children(modules, job.specs, capture, self.apply_placeholder),
                _repaired_symbolic(options.custom_ops, SDPA_OP, repaired_sdpa_symbolic),
                _repaired_symbolic(options.custom_ops, WHERE_OP, repaired_where_symbolic),
                custom_op_symbolics(options.custom_ops),
            ):
                return export_torchscript(
                    job.wrapper,
                    job.inputs,
                    opset=opset,
                    input_names=list(job.input_names),
                    output_names=list(job.output_names),
                    weights_as_inputs=True,
                    dynamic_axes=job.dynamic_axes,
                )
        except HyperExportError:
            raise
        except Exception as e:
            raise ModuleExportError(job.module_path, False, e) from e


log = logging.getLogger(__name__)


def apply_placeholder(
    op_type: str,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    output_dims: Sequence[tuple[Dim, ...]] = (),
) -> Sequence[torch.Tensor]:
    """Apply a duck-typed autograd.Function whose ``symbolic()`` emits the placeholder node.

    Its ``forward`` returns the captured outputs; the tracer records the call as one op, and the
    ONNX conversion asks ``symbolic`` for the node: ``hyperexport.placeholder::<op_type>``.

    The outputs must be tensors that existed before the trace started and are returned as they
    are: the tracer of torch 2.13 loses track of tensors created inside ``forward`` (a later op
    that consumes one fails with ``unordered_map::at``).

    With ``output_dims`` (dynamic axes), the dynamic dimensions of the node's outputs are typed
    as unknown, so that nothing downstream in the parent's trace takes the captured sizes as
    constants.
    """
    captured = tuple(outputs)

    def forward(ctx: Any, *args: torch.Tensor) -> Any:
        return captured if len(captured) != 1 else captured[0]

    def symbolic(g: Any, *args: Any) -> Any:
        out = g.op(f"{PLACEHOLDER_DOMAIN}::{op_type}", *args, outputs=len(captured))
        values = (out,) if len(captured) == 1 else tuple(out)
        for index, (value, like) in enumerate(zip(values, captured)):
            dims = output_dims[index] if output_dims else tuple(like.shape)
            sizes = [d if isinstance(d, int) else None for d in dims]
            set_symbolic_output_type(value, like, sizes)
        return out

    function: Any = type(
        f"Placeholder_{op_type}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "symbolic": staticmethod(symbolic)},
    )
    result = function.apply(*inputs)
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def _import_symbol(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def custom_op_symbolics(custom_ops: Sequence[CustomOpSymbolic]) -> Iterator[None]:
    """Register the user's symbolics for the duration of the export, then unregister them."""
    registered: list[CustomOpSymbolic] = []
    try:
        for op in custom_ops:
            torch.onnx.register_custom_op_symbolic(op.name, _import_symbol(op.symbolic), op.opset)
            registered.append(op)
        yield
    finally:
        for op in registered:
            torch.onnx.unregister_custom_op_symbolic(op.name, op.opset)


def _repaired_symbolic(
    custom_ops: Sequence[CustomOpSymbolic],
    op_name: str,
    repaired: Callable[[], contextlib.AbstractContextManager[None]],
) -> contextlib.AbstractContextManager[None]:
    """``repaired()`` (torch's symbolic of ``op_name`` with hyperexport's repairs), unless the
    user registers their own symbolic for that op."""
    if any(op.name == op_name for op in custom_ops):
        return contextlib.nullcontext()
    return repaired()


def export_torchscript(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    *,
    opset: int,
    input_names: list[str],
    output_names: list[str],
    weights_as_inputs: bool,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None,
) -> ir.Model:
    """``torch.onnx.export(..., dynamo=False)`` of one unit, into onnx_ir.

    With ``weights_as_inputs`` the weights are exported as graph inputs *without their data*
    (``export_params=False``): the exporter never copies them into a protobuf. They are given
    back as references to the module's own tensors (``ir.TorchTensor`` initializers), which
    the unit export writes once to its external data file (``weights.py``).
    """
    buffer = io.BytesIO()
    with (
        quiet_torchscript_exporter(),
        weights_out_of_shape_inference(),
        torch.no_grad(),
    ):
        torch.onnx.export(
            module,
            inputs,
            buffer,  # type: ignore[arg-type]
            **torchscript_export_keywords(),
            opset_version=opset,
            input_names=input_names,
            output_names=output_names,
            # With weights as function inputs (per-type mode), the exporter must neither fold
            # (it folds weight transposes into new constants, baking one instance's weights into
            # a body that every instance shares) nor deduplicate equal-valued weights (two freshly
            # initialised norm scales would then be read from one initializer).
            do_constant_folding=not weights_as_inputs,
            keep_initializers_as_inputs=weights_as_inputs,
            export_params=not weights_as_inputs,
            dynamic_axes={k: dict(v) for k, v in (dynamic_axes or {}).items()} or None,
        )
    model = ir.serde.deserialize_model(onnx.load_from_string(buffer.getvalue()))
    _repair_sdpa_bfloat16_casts(model.graph)
    if weights_as_inputs:
        tensors = dict(
            [
                *module.named_parameters(remove_duplicate=False),
                *module.named_buffers(remove_duplicate=False),
            ]
        )
        attach_torch_weights(model.graph, tensors)
    return model


def _repair_sdpa_bfloat16_casts(graph: ir.Graph) -> None:
    """Fix the casts torch 2.13's TorchScript SDPA symbolic emits for bfloat16 inputs.

    The symbolic casts the scale (a ``Sqrt`` of the head size) to the query's dtype, but writes
    torch's ScalarType number of bfloat16 (15) where ONNX expects its own (16): ONNX reads 15 as
    complex128, and neither the checker nor ONNX Runtime accepts the graph. A ``Cast`` of a
    ``Sqrt`` to complex128 has no other source, so it is cast to bfloat16 as torch meant.
    """
    repaired = 0
    for node in ir.traversal.RecursiveGraphIterator(graph):
        to = node.attributes.get("to")
        producer = node.inputs[0].producer() if node.inputs and node.inputs[0] else None
        if (
            node.op_type == "Cast"
            and to is not None
            and to.as_int() == ir.DataType.COMPLEX128
            and producer is not None
            and producer.op_type == "Sqrt"
        ):
            node.attributes["to"] = ir.AttrInt64("to", int(ir.DataType.BFLOAT16))
            repaired += 1
    if repaired:
        log.info(
            "repaired %d bfloat16 SDPA scale cast(s) of torch's TorchScript exporter", repaired
        )
