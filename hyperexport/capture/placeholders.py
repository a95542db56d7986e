"""Replace child hiera modules by placeholders while their parent is exported.

A placeholder returns the outputs captured for that call (so the parent's trace sees the right
shapes and values) and appears in the exported graph as one custom-domain node, which the
compose pass later swaps for a function call. The export path (TorchScript or dynamo) only
supplies the op that stands in the graph: see ``torchscript.py`` and ``dynamo.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.capture import signature, tree
from hyperexport.capture.hooks import Capture
from hyperexport.capture.records import ModuleCall, tree_tensor_keys
from hyperexport.errors import InputError, ModuleExportError

#: ``make_op(op_type, inputs, outputs) -> outputs``: applies the path's stand-in op.
ApplyPlaceholder = Callable[
    [str, Sequence[torch.Tensor], Sequence[torch.Tensor]], Sequence[torch.Tensor]
]


@dataclass(frozen=True)
class PlaceholderSpec:
    """One child call to stand in for while exporting its parent."""

    op_type: str
    call: ModuleCall
    weight_names: tuple[str, ...]


def module_weights(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters then buffers of ``module``, by local state name, in registration order."""
    named: list[tuple[str, torch.Tensor]] = list(module.named_parameters())
    seen = {id(t) for _, t in named}
    named += [(n, b) for n, b in module.named_buffers() if id(b) not in seen]
    return named


@contextlib.contextmanager
def replace_children(
    modules: Mapping[str, torch.nn.Module],
    specs: Sequence[PlaceholderSpec],
    capture: Capture,
    apply: ApplyPlaceholder,
) -> Iterator[None]:
    """Patch each child's ``forward`` to emit its placeholder; restore everything on exit.

    Args:
        modules: Every module of the model by its path from the root.
        specs: The child calls to stand in for, in call order.
        capture: Where the children's captured outputs come from.
        apply: The export path's placeholder op.
    """
    # Output tensors are made before the trace starts (see torchscript.apply_placeholder).
    outputs = {
        spec.call.call_id: [capture.tensor(k) for k in tree_tensor_keys(spec.call.outputs)]
        for spec in specs
    }
    by_path: dict[str, list[PlaceholderSpec]] = {}
    for spec in specs:
        by_path.setdefault(spec.call.path, []).append(spec)
    patched: list[torch.nn.Module] = []
    try:
        for path, path_specs in by_path.items():
            module = modules[path]
            module.forward = _placeholder_forward(module, path_specs, outputs, apply)  # type: ignore[method-assign]
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward


def _placeholder_forward(
    module: torch.nn.Module,
    specs: list[PlaceholderSpec],
    outputs_by_call: dict[str, list[torch.Tensor]],
    apply: ApplyPlaceholder,
) -> Callable[..., Any]:
    original = type(module).forward.__get__(module)
    calls = iter(specs)

    def forward(*args: Any, **kwargs: Any) -> Any:
        spec = next(calls, None)
        if spec is None:
            raise ModuleExportError(
                specs[0].call.path,
                False,
                RuntimeError("called more often during export than during capture"),
            )
        call = spec.call
        live: list[torch.Tensor] = []
        tree.flatten(signature.bind(original, args, kwargs), f"module {call.path!r} input", live)
        expected = list(tree_tensor_keys(call.inputs))
        if len(live) != len(expected):
            raise InputError(
                f"module {call.path!r}",
                f"{len(live)} tensor inputs at export but {len(expected)} at capture; "
                "the forward is not deterministic in its input structure",
            )
        weights = dict(module_weights(module))
        extra = [weights[n] for n in spec.weight_names]
        out_keys = list(tree_tensor_keys(call.outputs))
        results = apply(spec.op_type, [*live, *extra], outputs_by_call[call.call_id])
        position = {k: i for i, k in enumerate(out_keys)}
        return tree.unflatten(call.outputs, lambda k: results[position[k]])

    return forward
