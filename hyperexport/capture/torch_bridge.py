"""The one place that knows torch version differences (and the only one allowed private imports).

Everything else in hyperexport uses public torch APIs, and asks this module where torch moved
or changed between releases.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from packaging.version import Version

TORCH_VERSION = Version(torch.__version__.split("+")[0])


@contextlib.contextmanager
def quiet_torchscript_exporter() -> Iterator[None]:
    """Silence the TorchScript exporter's per-call deprecation and tracer warnings.

    torch 2.13 warns on every ``dynamo=False`` export; a hierarchical export makes one call per
    unit, so the same warning would repeat for every module.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def is_tracing() -> bool:
    """True while torch.jit tracing (the TorchScript exporter) runs."""
    return torch.jit.is_tracing()


def pause_tracing() -> object:
    """Stop the TorchScript tracer recording ops; returns the state to give back to
    :func:`resume_tracing`. Tensors made meanwhile enter the trace as constants."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)  # type: ignore[attr-defined]
    return state


def resume_tracing(state: object) -> None:
    """Undo :func:`pause_tracing`."""
    torch._C._set_tracing_state(state)  # type: ignore[attr-defined]


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


#: Every dtype torch defines, by :func:`torch_dtype_name`. Looked up in this table, never with
#: ``getattr(torch, name)``: a name read back from a cached record must not reach torch's lazy
#: submodule importer.
_DTYPES = {torch_dtype_name(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`torch_dtype_name`.

    Raises:
        ValueError: ``name`` is not a torch dtype.
    """
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def pytree_node_types() -> tuple[type, ...]:
    """The container classes registered with torch's pytree in this process.

    transformers registers every ``ModelOutput`` subclass there when its module is imported;
    the capture's tree decoder rebuilds only registered classes (``capture/tree.py``).
    """
    from torch.utils import _pytree

    return tuple(_pytree.SUPPORTED_NODES)


def set_symbolic_output_type(value: object, like: torch.Tensor, sizes: list[int | None]) -> None:
    """Give a TorchScript symbolic output the dtype of ``like`` and ``sizes`` (None: unknown).

    Without it, the TorchScript exporter warns for every custom op and loses the shape
    information that later symbolics (e.g. Linear -> Gemm vs MatMul) decide on.
    """
    tensor_type = torch._C.TensorType.create_from_tensor(like).with_sizes(sizes)
    value.setType(tensor_type)  # type: ignore[attr-defined]


#: torch.onnx's dynamo registries by opset, built once per process (see dynamo_export_caches).
_ONNX_REGISTRIES: dict[int, object] = {}
#: torch.export's set of CompositeImplicitAutograd ops, keyed by the op namespaces it covered.
_CIA_OPS: dict[frozenset[str], object] = {}


@contextlib.contextmanager
def dynamo_export_caches() -> Iterator[None]:
    """Let ``torch.onnx.export(dynamo=True)`` reuse what it rebuilds on every call, while open.

    A hierarchical export makes one call per unit, and two per-call costs of torch 2.13 would
    make most of its overhead over a plain export:

    * the registry of torchlib translations (about a second: it parses the source of every
      torchlib function), kept per opset;
    * the set of CompositeImplicitAutograd ops that ``run_decompositions`` preserves (about
      0.2 s: it walks every op of every namespace), kept per set of op namespaces. An op of an
      existing namespace registered after the first export is not seen until the process
      restarts.

    Both are built on first use and kept for the process; only calls inside this context see
    them. Translations passed in ``custom_translation_table`` are registered into the shared
    registry and stay there: callers must only pass ops whose translation never changes
    (hyperexport's placeholder ops, which are themselves defined once per process).
    """
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _registration

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    default_opset = original.__func__.__defaults__[0]
    collect = exported_program._collect_all_valid_cia_ops

    def from_torchlib(cls: type, opset_version: int = default_opset) -> object:
        if opset_version not in _ONNX_REGISTRIES:
            _ONNX_REGISTRIES[opset_version] = original.__func__(cls, opset_version=opset_version)
        return _ONNX_REGISTRIES[opset_version]

    def collect_cia_ops() -> object:
        key = frozenset(torch.ops._dir)
        if key not in _CIA_OPS:
            _CIA_OPS[key] = collect()
        return _CIA_OPS[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)  # type: ignore[method-assign,assignment]
    exported_program._collect_all_valid_cia_ops = collect_cia_ops  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = original  # type: ignore[method-assign]
        exported_program._collect_all_valid_cia_ops = collect  # type: ignore[attr-defined]


#: Weights at least this large are kept out of the TorchScript exporter's shape inference.
_SHAPE_INFERENCE_VALUE_LIMIT = 1 << 20


@contextlib.contextmanager
def weights_out_of_shape_inference() -> Iterator[None]:
    """Keep large weights' values out of the TorchScript exporter's ONNX shape inference.

    ``_jit_pass_onnx_graph_shape_type_inference`` copies every parameter value it is given
    into the protobuf of each node that reads it (the embedding table into its Gather node),
    twice per export: a transient copy of the largest weights. Shape inference needs values
    only for shape-like constants, never for weights (their shapes and types are on the graph),
    so tensors of at least 1 MiB are left out of the dict it sees. Restored on exit.
    """
    original = torch._C._jit_pass_onnx_graph_shape_type_inference

    def infer(graph: Any, params_dict: dict[str, Any], opset: int) -> None:
        small = {
            k: v
            for k, v in params_dict.items()
            if not isinstance(v, torch.Tensor)
            or v.numel() * v.element_size() < _SHAPE_INFERENCE_VALUE_LIMIT
        }
        original(graph, small, opset)

    torch._C._jit_pass_onnx_graph_shape_type_inference = infer  # type: ignore[assignment]
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original
