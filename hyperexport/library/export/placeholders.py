"""Replace child hiera modules by placeholders while their parent is exported.

A placeholder returns the outputs captured for that call (so the parent's trace sees the right
shapes and values) and appears in the exported graph as one custom-domain node, which the
compose pass later swaps for a function call. The export path (TorchScript or dynamo) only
supplies the op that stands in the graph: see ``torchscript.py`` and ``dynamo.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hyperexport.base.contracts.names import probe_key
from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, tree_tensor_keys
from hyperexport.base.errors import InputError, ModuleExportError
from hyperexport.library.capture import signature, tree
from hyperexport.library.capture.container import Capture
from hyperexport.library.public import set_module

log = logging.getLogger(__name__)

#: One output dimension of a placeholder: a fixed size; ``(input index, input axis)`` when the
#: dimension is dynamic and equals that dimension of that input; or None when it is dynamic and
#: *derived*: the child computes it from its inputs' sizes (a strided conv's output length, H/2
#: of an image), so it is its own symbolic dimension, worked out by :data:`ShapeFunction`.
Dim = int | tuple[int, int] | None

#: ``shapes(inputs) -> one shape per output``: the child's output shapes for these inputs (its
#: live tensor inputs, then its weights), found by running the child's own forward on them; under
#: ``torch.export``'s fake tensors the sizes are symbolic expressions of the inputs' sizes.
ShapeFunction = Callable[[Sequence[torch.Tensor]], list[tuple[Any, ...]]]


class ApplyPlaceholder(Protocol):
    """The path's stand-in op: ``apply(op_type, inputs, outputs, output_dims, derived)``.

    ``output_dims`` is empty for static shapes, else one tuple of :data:`Dim` per output;
    ``derived`` is given when some dimension is None (derived).
    """

    def __call__(
        self,
        op_type: str,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        output_dims: Sequence[tuple[Dim, ...]] = (),
        derived: ShapeFunction | None = None,
    ) -> Sequence[torch.Tensor]: ...


@dataclass(frozen=True)
class PlaceholderSpec:
    """One child call to stand in for while exporting its parent."""

    op_type: str
    call: ModuleCall
    weight_names: tuple[str, ...]
    output_dims: tuple[tuple[Dim, ...], ...] = ()


def symbolic_output_dims(record: CaptureRecord, call: ModuleCall) -> tuple[tuple[Dim, ...], ...]:
    """How each output dimension of ``call`` follows its inputs, read off the probe run.

    A dimension that changed between the capture and the probe is tied to an input dimension
    that changed the same way (same pair of sizes); the placeholder then computes it from that
    input, so the parent's export keeps it symbolic. A dynamic dimension that equals no input
    dimension is derived from them by the child (a conv output length, H/2): it is None, and
    the export path computes it by running the child's forward on the inputs' shapes.
    """
    if record.probe_inputs is None:
        return ()
    meta = {t.key: t for t in record.tensors}
    sources: dict[tuple[int, int], tuple[int, int]] = {}
    for i, key in enumerate(tree_tensor_keys(call.inputs)):
        for axis in record.dynamic_dims(key):
            pair = (meta[key].shape[axis], meta[probe_key(key)].shape[axis])
            sources.setdefault(pair, (i, axis))
    dims = []
    for key in tree_tensor_keys(call.outputs):
        shape: list[Dim] = list(meta[key].shape)
        for axis in record.dynamic_dims(key):
            pair = (meta[key].shape[axis], meta[probe_key(key)].shape[axis])
            source = sources.get(pair)
            shape[axis] = source
            if source is None:
                log.debug(
                    "module %r output %s: dimension %d is derived from its inputs (%d vs %d "
                    "at the second shape)",
                    call.path,
                    key,
                    axis,
                    *pair,
                )
        dims.append(tuple(shape))
    return tuple(dims)


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
    router = PlaceholderRouter(specs, capture, apply)
    with router.patched(modules), router.unit(specs):
        yield


class PlaceholderRouter:
    """Decides, call by call, whether a patched module runs for real or emits its placeholder.

    Several units can be traced in one export (the dynamo path's batch): the same module is a
    placeholder while its parent unit is traced and runs its real forward while its own unit is
    traced. Inside :meth:`unit`, a patched module that is a direct child of that unit consumes
    the unit's next placeholder spec for its path; any other patched module runs for real.

    Args:
        specs: Every placeholder spec of every unit that will be traced (their captured outputs
            are read now, before any trace starts).
        capture: Where the children's captured outputs come from.
        apply: The export path's placeholder op.
    """

    def __init__(
        self, specs: Iterable[PlaceholderSpec], capture: Capture, apply: ApplyPlaceholder
    ) -> None:
        self._apply = apply
        self._outputs: dict[str, list[torch.Tensor]] = {}
        self._paths: set[str] = set()
        for spec in specs:
            self._paths.add(spec.call.path)
            if spec.call.call_id not in self._outputs:
                keys = tree_tensor_keys(spec.call.outputs)
                self._outputs[spec.call.call_id] = [capture.tensor(k) for k in keys]
        self._pending: dict[str, Iterator[PlaceholderSpec]] = {}

    @contextlib.contextmanager
    def unit(self, specs: Sequence[PlaceholderSpec]) -> Iterator[None]:
        """Trace one unit: its direct children (``specs``, in call order) become placeholders."""
        by_path: dict[str, list[PlaceholderSpec]] = {}
        for spec in specs:
            by_path.setdefault(spec.call.path, []).append(spec)
        previous = self._pending
        self._pending = {path: iter(path_specs) for path, path_specs in by_path.items()}
        try:
            yield
        finally:
            self._pending = previous

    @contextlib.contextmanager
    def patched(self, modules: Mapping[str, torch.nn.Module]) -> Iterator[None]:
        """Patch the ``forward`` of every module that some spec stands for; restore on exit."""
        patched: list[tuple[torch.nn.Module, Any]] = []
        try:
            for path in sorted(self._paths):
                module = modules[path]
                own = module.__dict__.get("forward", _NOT_SET)
                module.forward = self._forward(module, path)  # type: ignore[method-assign]
                patched.append((module, own))
            yield
        finally:
            for module, own in patched:
                if own is _NOT_SET:
                    del module.forward
                else:
                    module.forward = own  # type: ignore[method-assign]

    def _forward(self, module: torch.nn.Module, path: str) -> Callable[..., Any]:
        real = module.forward
        original = type(module).forward.__get__(module)

        def forward(*args: Any, **kwargs: Any) -> Any:
            calls = self._pending.get(path)
            if calls is None:  # not a child of the unit being traced: its own unit, or none
                return real(*args, **kwargs)
            spec = next(calls, None)
            if spec is None:
                raise ModuleExportError(
                    path,
                    False,
                    RuntimeError("called more often during export than during capture"),
                )
            return self._emit(module, original, spec, args, kwargs)

        return forward

    def _emit(
        self,
        module: torch.nn.Module,
        original: Callable[..., Any],
        spec: PlaceholderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
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
        derived = None
        if any(d is None for dims in spec.output_dims for d in dims):
            derived = child_shapes(module, original, spec)
        results = self._apply(
            spec.op_type, [*live, *extra], self._outputs[call.call_id], spec.output_dims, derived
        )
        position = {k: i for i, k in enumerate(out_keys)}
        return tree.unflatten(call.outputs, lambda k: results[position[k]])


@set_module("hyperexport.export.placeholders")
class _CallOriginal(torch.nn.Module):
    """Runs a child's own forward (not the placeholder patched over it) as a module call."""

    def __init__(self, inner: torch.nn.Module, original: Callable[..., Any]) -> None:
        super().__init__()
        self.inner = inner
        self._original = original

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._original(*args, **kwargs)


def child_shapes(
    module: torch.nn.Module, original: Callable[..., Any], spec: PlaceholderSpec
) -> ShapeFunction:
    """The :data:`ShapeFunction` of one child call: its own forward run on the given tensors.

    The weights come from the given tensors too (``torch.func.functional_call``), so that under
    ``torch.export``'s fake mode nothing real meets a fake tensor.
    """
    call = spec.call
    keys = list(tree_tensor_keys(call.inputs))
    position = {k: i for i, k in enumerate(keys)}
    runner = _CallOriginal(module, original)

    def shapes(inputs: Sequence[torch.Tensor]) -> list[tuple[Any, ...]]:
        live, weights = inputs[: len(keys)], inputs[len(keys) :]
        bound = tree.unflatten(call.inputs, lambda k: live[position[k]])
        args, kwargs = signature.split(original, bound)
        params = {f"inner.{n}": w for n, w in zip(spec.weight_names, weights)}
        out = torch.func.functional_call(runner, params, tuple(args), kwargs)
        flat: list[torch.Tensor] = []
        tree.flatten(out, f"module {call.path!r} output", flat)
        return [tuple(t.shape) for t in flat]

    return shapes


#: Marks a module without a ``forward`` of its own in its instance dict.
_NOT_SET = object()
