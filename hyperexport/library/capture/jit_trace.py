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
    for every submodule, twice the cost of the trace itself.

    The model's parameters and buffers are given to the trace as inputs after the real ones
    (``call`` ignores them; the tracer maps each tensor the model reads to its input by
    identity). Otherwise every weight the traced code reads becomes a constant of the graph,
    and torch keeps the graph of a traced function in its global compilation unit for the rest
    of the process, even after the returned function is dropped: the weights outside the hiera
    calls (a 1B model's 1 GB embedding and its final norm) then outlived the model, and with
    them the whole memory-mapped checkpoint they are views of (4.9 GB resident through
    evaluate). The tracer accepts the weights only when they do not require grad, so
    ``requires_grad`` is switched off for the duration and restored.
    """
    tensors: list[torch.Tensor] = []
    structure = tree.flatten(bound, "model input", tensors)
    positions = {str(i): i for i in range(len(tensors))}
    result: list[Any] = []

    def call(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:  # flat: inputs, then weights
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

    inputs = (*tensors, *model_tensors(model))
    with quiet_torchscript_exporter(), weights_without_grad(model):
        torch.jit.trace(call, inputs, check_trace=False, strict=False)
    return result[0]


def model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``model``, each tensor once (tied weights are one)."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


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
