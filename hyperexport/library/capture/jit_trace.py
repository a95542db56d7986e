"""Running the model under ``torch.jit.trace`` for the TorchScript path's capture, so every
``torch.jit.is_tracing()`` branch takes the turn the export will take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hyperexport.library.capture import signature, tree
from hyperexport.library.capture.torch_hooks import quiet_torchscript_exporter, resume_tracing


def run_under_trace(
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

    with quiet_torchscript_exporter(), weights_without_grad(model):
        torch.jit.trace(call, tuple(tensors), check_trace=False, strict=False)
    return result[0]


@contextlib.contextmanager
def weights_without_grad(model: torch.nn.Module) -> Iterator[None]:
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
