"""Record which plain attributes each hiera call reads, to prove per-type reuse safe.

Two instances of one class may share one ONNX function only if nothing that shapes their graphs
differs. Weights, buffers and submodule classes are compared directly; plain attributes (eps,
head counts, flags, config objects) are compared when the forward actually reads them. Reading
is observed by giving each module of a hiera subtree, for the duration of the capture, a
subclass of its own class whose ``__getattribute__`` notes reads of instance attributes.
Attributes that are never read (``layer_idx`` of a layer run without a cache) do not keep
otherwise identical layers apart.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)


class ReadLog:
    """Where reads go while the capture runs: one set per open hiera call."""

    def __init__(self) -> None:
        self.open: list[tuple[str, set[tuple[str, str]]]] = []  # (module path, reads)
        self.objects: dict[int, str] = {}  # id -> canonical name, in first-read order
        self.names: dict[int, str] = {}  # id(module) -> path

    def digest(self, value: Any) -> str:
        """A process-independent description of an attribute value."""
        if isinstance(value, _PLAIN):
            return repr(value)
        if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
            return repr(value)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            return f"fn:{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"
        if isinstance(value, functools.partial):
            # One per instance (transformers' activations: ``partial(gelu, approximate="tanh")``):
            # equal when its function and arguments are, not only when it is the same object.
            args = [self.digest(a) for a in value.args]
            keywords = [f"{k}={self.digest(v)}" for k, v in sorted(value.keywords.items())]
            return f"partial:{self.digest(value.func)}({', '.join(args + keywords)})"
        # Any other object (a config, say) is told apart by identity, named by first read so
        # that the digest is the same in every process.
        key = id(value)
        if key not in self.objects:
            self.objects[key] = f"obj#{len(self.objects)}:{type(value).__qualname__}"
        return self.objects[key]

    def note(self, module: torch.nn.Module, name: str, value: Any) -> None:
        if not self.open:
            return
        root, reads = self.open[-1]
        path = self.names.get(id(module), "?")
        relative = path[len(root) + 1 :] if path.startswith(root + ".") else ""
        reads.add((f"{relative}.{name}" if relative else name, self.digest(value)))


_ACTIVE: list[ReadLog] = []
_SUBCLASSES: dict[type, type] = {}


def _recording_getattribute(self: Any, name: str) -> Any:
    value = object.__getattribute__(self, name)
    if _ACTIVE and not name.startswith("_"):  # private: nn.Module machinery (hook dicts, ...)
        instance = object.__getattribute__(self, "__dict__")
        if name in instance and not isinstance(value, (torch.nn.Module, torch.Tensor)):
            _ACTIVE[-1].note(self, name, value)
    return value


def _recording_class(cls: type) -> type:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = type(
            cls.__name__,
            (cls,),
            {
                "__getattribute__": _recording_getattribute,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
        _SUBCLASSES[cls] = sub
    return sub


def original_class(module: torch.nn.Module) -> type:
    """The module's own class, also while its reads are being recorded."""
    cls = type(module)
    return cls.__mro__[1] if cls in _SUBCLASSES.values() else cls


@contextlib.contextmanager
def record_reads(
    model: torch.nn.Module, is_hiera: Callable[[torch.nn.Module], bool], log: ReadLog
) -> Iterator[None]:
    """Swap the classes of every module under a hiera module; restore them on exit."""
    swapped: list[tuple[torch.nn.Module, type]] = []
    seen: set[int] = set()
    log.names = {id(m): n for n, m in model.named_modules()}
    try:
        for module in model.modules():
            if not is_hiera(module):
                continue
            for sub in module.modules():
                cls = type(sub)
                if id(sub) in seen or cls in _SUBCLASSES.values():
                    continue
                seen.add(id(sub))
                sub.__class__ = _recording_class(cls)
                swapped.append((sub, cls))
        _ACTIVE.append(log)
        yield
    finally:
        if _ACTIVE and _ACTIVE[-1] is log:
            _ACTIVE.pop()
        for module, cls in reversed(swapped):
            module.__class__ = cls
