"""The capture's bridge to torch internals: the TorchScript tracer's state and warnings, dtypes
by name, and torch's pytree registry (private APIs, used nowhere else)."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def quiet_torchscript_exporter() -> Iterator[None]:
    """Silence the TorchScript exporter's per-call deprecation and tracer warnings.

    torch 2.13 warns on every ``dynamo=False`` export; a hierarchical export makes one call per
    unit, so the same warning would repeat for every module.
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def is_tracing() -> bool:
    """True while torch.jit tracing (the TorchScript exporter) runs."""
    import torch

    return torch.jit.is_tracing()


def pause_tracing() -> object:
    """Stop the TorchScript tracer recording ops; returns the state to give back to
    :func:`resume_tracing`. Tensors made meanwhile enter the trace as constants."""
    import torch

    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)  # type: ignore[attr-defined]
    return state


def resume_tracing(state: object) -> None:
    """Undo :func:`pause_tracing`."""
    import torch

    torch._C._set_tracing_state(state)  # type: ignore[attr-defined]


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


#: Every dtype torch defines, by :func:`torch_dtype_name`. Looked up in this table, never with
#: ``getattr(torch, name)``: a name read back from a cached record must not reach torch's lazy
#: submodule importer.
@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    import torch

    return {torch_dtype_name(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`torch_dtype_name`.

    Raises:
        ValueError: ``name`` is not a torch dtype.
    """
    dtype = _dtypes().get(name)
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
