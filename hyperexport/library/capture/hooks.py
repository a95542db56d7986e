"""The forward hooks of a capture: what every hiera module call received and returned, recorded
as trees over a tensor store while the model runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from hyperexport.base.contracts.records import ModuleCall, TensorMeta, Tree
from hyperexport.library.capture import signature, tree
from hyperexport.library.capture.attribute_reads import ReadLog, original_class
from hyperexport.library.capture.container import to_array
from hyperexport.library.capture.torch_hooks import (
    is_tracing,
    pause_tracing,
    resume_tracing,
    torch_dtype_name,
)


class Recorder:
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
def hiera_hooks(model: torch.nn.Module, hiera: tuple[type, ...], rec: Recorder) -> Iterator[int]:
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
