"""Turn live Python values (nested tensors, tuples, dicts, ModelOutputs) into records' trees.

``flatten`` walks a value and returns its tree plus the tensors it met, in flattening order.
``unflatten`` rebuilds a value of the same structure from a tree and replacement tensors.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hyperexport.contracts.records import Tree
from hyperexport.contracts.records import leaf_names as leaf_names  # moved; re-exported
from hyperexport.errors import InputError

_CONSTANT_TYPES = (bool, int, float, str, type(None))


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_model_output(value: Any) -> bool:
    # transformers' ModelOutput is an OrderedDict subclass and a dataclass; detect it without
    # importing transformers.
    return isinstance(value, Mapping) and dataclasses.is_dataclass(value)


def flatten(value: Any, where: str, tensors: list[torch.Tensor]) -> Tree:
    """Describe ``value`` as a tree, appending its tensors to ``tensors``.

    Tensor leaves get keys ``"<n>"`` where n is the position in ``tensors``; callers prefix them.

    Args:
        value: The value to describe.
        where: Human-readable location used in errors (``"args[1]"``, ``"model.layers.0 output"``).
        tensors: Receives the tensor leaves in order.

    Raises:
        InputError: A leaf is neither a tensor nor a plain constant.
    """
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("tensor", str(len(tensors) - 1))
    if isinstance(value, _CONSTANT_TYPES):
        return ("const", value)
    if isinstance(value, torch.Size):
        return ("tuple", tuple(("const", int(d)) for d in value))
    if _is_model_output(value):
        fields = tuple((str(k), flatten(v, f"{where}.{k}", tensors)) for k, v in value.items())
        return ("object", qualified_name(type(value)), fields)
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise InputError(where, f"dict key {k!r} is not a string")
            items.append((k, flatten(v, f"{where}[{k!r}]", tensors)))
        return ("dict", tuple(items))
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return ("tuple", tuple(flatten(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)))
    if isinstance(value, list):
        return ("list", tuple(flatten(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple(
            (f.name, flatten(getattr(value, f.name), f"{where}.{f.name}", tensors))
            for f in dataclasses.fields(value)
        )
        return ("object", qualified_name(type(value)), fields)
    raise InputError(
        where,
        f"a {type(value).__module__}.{type(value).__qualname__} cannot cross the ONNX boundary; "
        "pass tensors, plain constants, or tuples/lists/dicts of them",
    )


def _import_class(name: str) -> type:
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj: Any = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            qual = f"{head}.{qual}"
            continue
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def unflatten(tree: Tree, tensor: Callable[[str], Any]) -> Any:
    """Rebuild a value from ``tree``, asking ``tensor(key)`` for each tensor leaf."""
    kind = tree[0]
    if kind == "tensor":
        return tensor(tree[1])
    if kind == "const":
        return tree[1]
    if kind == "tuple":
        return tuple(unflatten(c, tensor) for c in tree[1])
    if kind == "list":
        return [unflatten(c, tensor) for c in tree[1]]
    if kind == "dict":
        return {k: unflatten(c, tensor) for k, c in tree[1]}
    if kind == "object":
        cls = _import_class(tree[1])
        return cls(**{k: unflatten(c, tensor) for k, c in tree[2]})
    raise ValueError(f"unknown tree node kind {kind!r}")


def rekey(tree: Tree, prefix: str) -> Tree:
    """Prefix every tensor key of ``tree`` with ``prefix``."""
    kind = tree[0]
    if kind == "tensor":
        return ("tensor", f"{prefix}{tree[1]}")
    if kind == "const":
        return tree
    if kind in ("tuple", "list"):
        return (kind, tuple(rekey(c, prefix) for c in tree[1]))
    if kind == "dict":
        return (kind, tuple((k, rekey(c, prefix)) for k, c in tree[1]))
    return (kind, tree[1], tuple((k, rekey(c, prefix)) for k, c in tree[2]))
