"""``auto_trace_method``: record the calls of one method while the outer model runs, then export it.

HyperONNX's context manager of the same name, on top of hyperexport::

    with auto_trace_method(model.decode_step, expected_stages=2) as tracer:
        model.generate(...)                 # runs normally; the first 2 calls are recorded
        tracer.export("step.onnx", hiera=[Block], dynamo=False)   # step.0.onnx, step.1.onnx

The method is wrapped on the instance for the duration and restored in ``finally``. A call
beyond ``expected_stages`` raises ``StopIteration`` (HyperONNX's way to end a long run early).
Arguments are recorded as detached copies, so later in-place changes do not reach them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch

from hyperexport.base.errors import OptionsError
from hyperexport.library.public import set_module
from hyperexport.library.transformers.method_capture import detached_copy

log = logging.getLogger(__name__)

Exporter = Callable[..., Any]


@set_module("hyperexport.compat.auto_trace")
class _MethodHolder(torch.nn.Module):
    """Exports a method of a non-module object: the object's submodules become children."""

    def __init__(self, method: Callable[..., Any]) -> None:
        super().__init__()
        owner = getattr(method, "__self__", None)
        for name, value in vars(owner).items() if owner is not None else ():
            if isinstance(value, torch.nn.Module):
                self.add_module(name, value)

        @functools.wraps(method)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        self.forward = forward


class MethodTracer:
    """The recorded calls of one method, and their export (one file per recorded call)."""

    def __init__(self, method: Any, expected_stages: int, exporter: Exporter) -> None:
        self.method = method
        self.expected_stages = expected_stages
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._exporter = exporter

    def record(self, *args: Any, **kwargs: Any) -> Any:
        """Stands for the method while the context is open."""
        if len(self.calls) >= self.expected_stages:
            raise StopIteration(
                f"{self.method.__name__} called more than expected_stages={self.expected_stages}"
            )
        self.calls.append(detached_copy((args, kwargs)))
        return self.method(*args, **kwargs)

    def export(self, f: str | os.PathLike[str] | IO[bytes], **export_kwargs: Any) -> None:
        """Export the method once per recorded call, with ``export_hyper_onnx``'s keywords.

        With more than one expected stage, stage ``i`` goes to ``<stem>.<i><suffix>`` (and its
        per-module files to ``<external_directory>/<i>/``); a file object cannot hold several.

        Raises:
            OptionsError: Nothing was recorded, or several stages and a file object.
        """
        if not self.calls:
            raise OptionsError("auto_trace_method", "no call was recorded inside the context")
        several = self.expected_stages > 1
        if several and not isinstance(f, (str, os.PathLike)):
            raise OptionsError("f", "several stages cannot be exported into one file object")
        owner = self.method.__self__
        name = self.method.__name__
        current = vars(owner).get(name) if hasattr(owner, "__dict__") else None
        for stage, (args, kwargs) in enumerate(self.calls[: self.expected_stages]):
            target: Any = f
            stage_kwargs = dict(export_kwargs)
            if several:
                path = Path(f)  # type: ignore[arg-type]
                target = path.with_suffix(f".{stage}{path.suffix}")
                directory = stage_kwargs.get("external_directory")
                if directory:
                    stage_kwargs["external_directory"] = Path(directory) / str(stage)
            if isinstance(owner, torch.nn.Module):
                # The library exports owner.<name>; the original method stands there meanwhile.
                with _original_method(owner, name, current):
                    self._exporter(owner, args, target, kwargs=kwargs, method=name, **stage_kwargs)
            else:
                self._exporter(
                    _MethodHolder(self.method), args, target, kwargs=kwargs, **stage_kwargs
                )


@contextmanager
def _original_method(owner: Any, name: str, wrapper: Any) -> Iterator[None]:
    if wrapper is not None:
        delattr(owner, name)
    try:
        yield
    finally:
        if wrapper is not None:
            setattr(owner, name, wrapper)


@contextmanager
def trace_method(method: Any, expected_stages: int, exporter: Exporter) -> Iterator[MethodTracer]:
    """Wrap ``method`` on its instance to record its calls; restore it on exit.

    Raises:
        OptionsError: ``method`` is not a bound method.
    """
    if not inspect.ismethod(method):
        raise OptionsError(
            "auto_trace_method", "pass a bound method (Foo().bar), not a function (Foo.bar)"
        )
    owner, name = method.__self__, method.__name__
    tracer = MethodTracer(method, expected_stages, exporter)
    had = name in vars(owner)
    previous = vars(owner).get(name)

    @functools.wraps(method)
    def recorder(*args: Any, **kwargs: Any) -> Any:
        return tracer.record(*args, **kwargs)

    setattr(owner, name, recorder)
    try:
        with torch.no_grad():  # HyperONNX: inference_mode; no_grad keeps tensors exportable
            yield tracer
    finally:
        if had:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)
