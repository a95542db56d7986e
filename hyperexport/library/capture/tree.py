"""Turn live Python values (nested tensors, tuples, dicts, ModelOutputs) into records' trees.

``flatten`` walks a value and returns its tree plus the tensors it met, in flattening order.
``unflatten`` rebuilds a value of the same structure from a tree and replacement tensors.

Trees are read back from the cache, which is data: the decoder never imports a module or looks
up a class by the name a tree gives. An ``object`` node is rebuilt only with a class this
process has already registered: one that :func:`flatten` met here (see
:func:`register_object_type`), or one registered with torch's pytree (transformers registers
every ``ModelOutput`` subclass when its module is imported). It must be a dataclass, called
with its own field names. Anything else raises :class:`~hyperexport.base.errors.CorruptRecordError`,
which the build treats as a corrupt cache entry (a WARNING, a miss, a rebuild).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from hyperexport.base.contracts.records import CaptureRecord, Tree
from hyperexport.base.contracts.records import leaf_names as leaf_names  # moved; re-exported
from hyperexport.base.errors import CorruptRecordError, InputError
from hyperexport.base.versions import size_int_refusal
from hyperexport.library.capture.torch_hooks import pytree_node_types

#: Classes of ``object`` nodes met by :func:`flatten` in this process, by qualified name.
_OBJECT_TYPES: dict[str, type] = {}

_CONSTANT_TYPES = (bool, int, float, str, type(None))


#: Field name of the tensor inside a tree node of a user tensor subclass.
TENSOR_FIELD = "data"


def is_user_tensor_subclass(value: torch.Tensor) -> bool:
    """A tensor of a subclass defined outside torch (not a Parameter, fake or functional tensor)."""
    cls = type(value)
    return cls is not torch.Tensor and not cls.__module__.startswith("torch")


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register_object_type(cls: type) -> None:
    """Allow :func:`unflatten` to rebuild ``object`` nodes naming ``cls`` (a dataclass, or a
    user tensor subclass).

    :func:`flatten` registers every class it describes as an ``object`` node; callers rarely
    need this.
    """
    _OBJECT_TYPES[qualified_name(cls)] = cls


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
        leaf: Tree = ("tensor", str(len(tensors) - 1))
        if is_user_tensor_subclass(value):
            # A tensor that is also an object with methods (a StaticCache): kept as its class
            # around the tensor, so a unit's export hands the module the same kind of object
            # (the class's ``from_export_tensor(tensor)`` when it has one, else ``as_subclass``).
            register_object_type(type(value))
            return ("object", qualified_name(type(value)), ((TENSOR_FIELD, leaf),))
        return leaf
    if isinstance(value, _CONSTANT_TYPES):
        return ("const", value)
    if isinstance(value, torch.Size):
        return ("tuple", tuple(("const", int(d)) for d in value))
    if _is_model_output(value):
        fields = tuple((str(k), flatten(v, f"{where}.{k}", tensors)) for k, v in value.items())
        register_object_type(type(value))
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
        register_object_type(type(value))
        return ("object", qualified_name(type(value)), fields)
    if isinstance(value, torch.SymInt):
        raise InputError(where, size_int_refusal(where))
    raise InputError(
        where,
        f"a {type(value).__module__}.{type(value).__qualname__} cannot cross the ONNX boundary; "
        "pass tensors, plain constants, or tuples/lists/dicts of them",
    )


def _registered_class(name: str) -> type | None:
    cls = _OBJECT_TYPES.get(name)
    if cls is not None:
        return cls
    for candidate in pytree_node_types():
        if qualified_name(candidate) == name:
            return candidate
    return None


def object_class(name: str, field_names: tuple[str, ...]) -> type:
    """The registered dataclass called ``name`` that accepts ``field_names`` (or a registered
    user tensor subclass, whose one field is its tensor).

    Raises:
        CorruptRecordError: No such class is registered in this process, it is not a
            dataclass, or it has no init field of one of those names.
    """
    cls = _registered_class(name)
    if cls is None:
        raise CorruptRecordError(
            f"object node {name!r}",
            "not a type registered in this process (met by flatten, or a torch pytree node); "
            "data never names code to import",
        )
    if issubclass(cls, torch.Tensor):  # a user tensor subclass: one field, its tensor
        if field_names != (TENSOR_FIELD,):
            raise CorruptRecordError(f"object node {name!r}", f"fields {list(field_names)}")
        return cls
    if not dataclasses.is_dataclass(cls):
        raise CorruptRecordError(f"object node {name!r}", "the registered type is no dataclass")
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(field_names) - accepted)
    if unknown:
        raise CorruptRecordError(f"object node {name!r}", f"unknown fields {unknown}")
    return cls


def _object_nodes(tree: Tree) -> Iterator[tuple[str, tuple[str, ...]]]:
    kind = tree[0]
    if kind in ("tuple", "list"):
        for child in tree[1]:
            yield from _object_nodes(child)
    elif kind == "dict":
        for _, child in tree[1]:
            yield from _object_nodes(child)
    elif kind == "object":
        yield tree[1], tuple(str(k) for k, _ in tree[2])
        for _, child in tree[2]:
            yield from _object_nodes(child)
    elif kind not in ("tensor", "const"):
        raise CorruptRecordError("tree", f"unknown node kind {kind!r}")


def check_rebuildable(record: CaptureRecord) -> None:
    """Check, before any export starts, that every tree of ``record`` can be rebuilt here.

    Call it after the model is loaded (loading imports the classes its outputs use).

    Raises:
        CorruptRecordError: A tree names a type :func:`unflatten` may not rebuild.
    """
    trees = [record.inputs, record.outputs]
    trees += [t for t in (record.probe_inputs, record.probe_outputs) if t is not None]
    for call in record.calls:
        trees += [call.inputs, call.outputs]
    for t in trees:
        for name, field_names in _object_nodes(t):
            object_class(name, field_names)


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
        cls = object_class(tree[1], tuple(str(k) for k, _ in tree[2]))
        fields = {k: unflatten(c, tensor) for k, c in tree[2]}
        if issubclass(cls, torch.Tensor):
            rebuild = getattr(cls, "from_export_tensor", None)
            data = fields[TENSOR_FIELD]
            return rebuild(data) if rebuild is not None else data.as_subclass(cls)
        return cls(**fields)
    raise CorruptRecordError("tree", f"unknown node kind {kind!r}")


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
