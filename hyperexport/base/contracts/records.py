"""Plain, serialisable records of a capture. No torch here: the build's no-op path reads these.

A *tree* describes a nested Python value whose leaves are tensors or constants. Trees are tuples
so that records stay hashable and frozen; ``tree_to_json``/``tree_from_json`` round-trip them:

* ``("tensor", key)``: a tensor stored in the capture's tensor store under ``key``;
* ``("const", value)``: an int, float, bool, str or None;
* ``("tuple", (child, ...))`` and ``("list", (child, ...))``;
* ``("dict", ((key, child), ...))``: keys are strings, in insertion order;
* ``("object", "module.Class", ((field, child), ...))``: a ModelOutput-like or dataclass value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from hyperexport.base.contracts.names import probe_key

Tree = tuple[Any, ...]


def tree_tensor_keys(tree: Tree) -> Iterator[str]:
    """Yield the tensor keys of ``tree`` in flattening (depth-first, left-to-right) order."""
    kind = tree[0]
    if kind == "tensor":
        yield tree[1]
    elif kind in ("tuple", "list"):
        for child in tree[1]:
            yield from tree_tensor_keys(child)
    elif kind == "dict":
        for _, child in tree[1]:
            yield from tree_tensor_keys(child)
    elif kind == "object":
        for _, child in tree[2]:
            yield from tree_tensor_keys(child)


#: The name of a tensor that is the whole tree (no key names it).
LONE_TENSOR = "value"


def leaf_names(tree: Tree, root: str = "") -> list[str]:
    """Readable dotted names of the tensor leaves, in flattening order (``past.0.key``); a lone
    tensor is :data:`LONE_TENSOR`."""
    kind = tree[0]
    if kind == "tensor":
        return [root or LONE_TENSOR]
    if kind == "const":
        return []
    join = (lambda k: f"{root}.{k}") if root else (lambda k: str(k))
    if kind in ("tuple", "list"):
        return [n for i, c in enumerate(tree[1]) for n in leaf_names(c, join(i))]
    items = tree[1] if kind == "dict" else tree[2]
    return [n for k, c in items for n in leaf_names(c, join(k))]


def tree_to_json(tree: Tree) -> Any:
    """Convert a tree to JSON-compatible lists."""
    kind = tree[0]
    if kind in ("tensor", "const"):
        return [kind, tree[1]]
    if kind in ("tuple", "list"):
        return [kind, [tree_to_json(c) for c in tree[1]]]
    if kind == "dict":
        return [kind, [[k, tree_to_json(c)] for k, c in tree[1]]]
    if kind == "object":
        return [kind, tree[1], [[k, tree_to_json(c)] for k, c in tree[2]]]
    raise ValueError(f"unknown tree node kind {kind!r}")


def tree_from_json(data: Any) -> Tree:
    """Inverse of :func:`tree_to_json`."""
    kind = data[0]
    if kind in ("tensor", "const"):
        return (kind, data[1])
    if kind in ("tuple", "list"):
        return (kind, tuple(tree_from_json(c) for c in data[1]))
    if kind == "dict":
        return (kind, tuple((k, tree_from_json(c)) for k, c in data[1]))
    if kind == "object":
        return (kind, data[1], tuple((k, tree_from_json(c)) for k, c in data[2]))
    raise ValueError(f"unknown tree node kind {kind!r}")


def _optional_tree(data: Any) -> Tree | None:
    return None if data is None else tree_from_json(data)


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one captured tensor. ``dtype`` is torch's name without prefix."""

    key: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModuleCall:
    """One call of one hiera module instance, as seen by forward hooks.

    Attributes:
        path: Dotted module path from the root model (``"model.layers.3"``).
        class_name: Qualified class name (``"transformers...LlamaDecoderLayer"``).
        call_index: 0 for the instance's first call, 1 for the second, ...
        order: Position of the call's start among all hiera calls (execution order).
        parent: ``call_id`` of the nearest enclosing hiera call, or None at top level.
        inputs: ``("dict", ((param, tree), ...))`` bound to the forward signature, in signature
            order (kwargs given out of order are re-ordered; defaults are not included).
        outputs: The tree of the value forward returned.
        reads: Sorted ``(attribute path, value digest)`` pairs of plain attributes the module
            and its submodules read during this call (used to prove per-type reuse is safe).
    """

    path: str
    class_name: str
    call_index: int
    order: int
    parent: str | None
    inputs: Tree
    outputs: Tree
    reads: tuple[tuple[str, str], ...] = ()

    @property
    def call_id(self) -> str:
        """Stable identifier of this call: ``"<path>#<call_index>"``."""
        return f"{self.path}#{self.call_index}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = tree_to_json(self.inputs)
        data["outputs"] = tree_to_json(self.outputs)
        data["reads"] = [list(r) for r in self.reads]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleCall:
        return cls(
            path=data["path"],
            class_name=data["class_name"],
            call_index=data["call_index"],
            order=data["order"],
            parent=data["parent"],
            inputs=tree_from_json(data["inputs"]),
            outputs=tree_from_json(data["outputs"]),
            reads=tuple((a, b) for a, b in data.get("reads", [])),
        )


@dataclass(frozen=True)
class CaptureRecord:
    """Everything a capture observed, minus the tensor bytes (see :mod:`hyperexport.base.contracts.arrays`).

    Attributes:
        model_class: Qualified class name of the root model.
        inputs: Tree of the root call's inputs, bound to the signature like ModuleCall.inputs.
        outputs: Tree of the root call's outputs: the reference outputs of the check stage.
        calls: Every hiera call, in execution order.
        tensors: Shape and dtype of every tensor key used in the trees.
        hiera: Qualified names of the hiera classes asked for.
        probe_inputs: Root inputs of the second run at another shape (keys ``probe/...``), when
            dynamic axes were asked for; None otherwise.
        probe_outputs: Root outputs of that run: the reference at the second shape.
    """

    model_class: str
    inputs: Tree
    outputs: Tree
    calls: tuple[ModuleCall, ...]
    tensors: tuple[TensorMeta, ...]
    hiera: tuple[str, ...]
    probe_inputs: Tree | None = None
    probe_outputs: Tree | None = None

    def dynamic_dims(self, key: str) -> tuple[int, ...]:
        """Axes of tensor ``key`` whose size differs between the capture and the probe run."""
        meta = {t.key: t for t in self.tensors}
        probe = meta.get(probe_key(key))
        if probe is None:
            return ()
        shape = meta[key].shape
        if len(shape) != len(probe.shape):
            raise ValueError(f"tensor {key} changes rank between the two shapes")
        return tuple(i for i, (a, b) in enumerate(zip(shape, probe.shape)) if a != b)

    def call(self, call_id: str) -> ModuleCall:
        for c in self.calls:
            if c.call_id == call_id:
                return c
        raise KeyError(call_id)

    def children(self, parent: str | None) -> tuple[ModuleCall, ...]:
        """The hiera calls directly nested in ``parent`` (None: top level), in execution order."""
        return tuple(c for c in self.calls if c.parent == parent)

    def to_json(self) -> dict[str, Any]:
        return {
            "model_class": self.model_class,
            "inputs": tree_to_json(self.inputs),
            "outputs": tree_to_json(self.outputs),
            "calls": [c.to_json() for c in self.calls],
            "tensors": [[t.key, list(t.shape), t.dtype] for t in self.tensors],
            "hiera": list(self.hiera),
            "probe_inputs": None if self.probe_inputs is None else tree_to_json(self.probe_inputs),
            "probe_outputs": None
            if self.probe_outputs is None
            else tree_to_json(self.probe_outputs),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureRecord:
        return cls(
            model_class=data["model_class"],
            inputs=tree_from_json(data["inputs"]),
            outputs=tree_from_json(data["outputs"]),
            calls=tuple(ModuleCall.from_json(c) for c in data["calls"]),
            tensors=tuple(TensorMeta(k, tuple(s), d) for k, s, d in data["tensors"]),
            hiera=tuple(data["hiera"]),
            probe_inputs=_optional_tree(data.get("probe_inputs")),
            probe_outputs=_optional_tree(data.get("probe_outputs")),
        )

    def dumps(self) -> str:
        """Canonical JSON (sorted keys, no whitespace variance)."""
        return json.dumps(self.to_json(), sort_keys=True, indent=1)

    @classmethod
    def loads(cls, text: str) -> CaptureRecord:
        return cls.from_json(json.loads(text))
