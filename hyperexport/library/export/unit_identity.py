"""Decide which hiera calls can share one exported body (one ONNX function).

Two calls share a unit when everything that can shape their graph is equal:

* ``per_instance``: the same module instance, called with the same input signature (structure,
  shapes, dtypes, constant values), with the same nested calls.
* ``per_type``: the same class, the same input signature, the same weights (names, shapes,
  dtypes), the same submodule classes, the same values of every plain attribute the forward
  read during capture, and nested calls that match in the same way.

Anything not listed makes calls differ, so a reuse is never assumed from the class name alone;
the check stage's per-function parity (each call site with its own weights) backs it up.

When calls of one class get separate bodies, :func:`explain_split` says what differs (an
attribute read in forward and its two values, a submodule's class, an input's shape, a nested
call); the export logs it at INFO and the manifest carries it (``FunctionEntry.split_reason``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, TensorMeta, Tree
from hyperexport.library.capture.tree import qualified_name
from hyperexport.library.options import PER_INSTANCE, PER_TYPE, FunctionMode


@dataclass(frozen=True)
class PlannedUnit:
    """A group of calls that one exported body serves; the first call is the one exported.

    Attributes:
        name: The unit's name (``u003``).
        call_ids: The calls it serves.
        split_reason: When an earlier unit has calls of the same class: what differs from it
            (``attribute 'mlp.act.act' read in forward: ... vs ...``); else empty.
    """

    name: str
    call_ids: tuple[str, ...]
    split_reason: str = ""


def _shape_tree(t: Tree, meta: Mapping[str, TensorMeta]) -> Any:
    kind = t[0]
    if kind == "tensor":
        m = meta[t[1]]
        return ["T", list(m.shape), m.dtype]
    if kind == "const":
        return ["C", repr(t[1])]
    if kind in ("tuple", "list"):
        return [kind, [_shape_tree(c, meta) for c in t[1]]]
    if kind == "dict":
        return [kind, [[k, _shape_tree(c, meta)] for k, c in t[1]]]
    return [kind, t[1], [[k, _shape_tree(c, meta)] for k, c in t[2]]]


def _module_structure(module: torch.nn.Module) -> list[Any]:
    weights = [[n, list(p.shape), str(p.dtype)] for n, p in module.named_parameters()]
    buffers = [[n, list(b.shape), str(b.dtype)] for n, b in module.named_buffers()]
    classes = [[n, qualified_name(type(m))] for n, m in module.named_modules()]
    return [weights, buffers, classes]


def _relative(path: str, parent: str) -> str:
    return path[len(parent) + 1 :] if parent and path.startswith(parent + ".") else path


def _signature_data(
    call: ModuleCall,
    record: CaptureRecord,
    meta: Mapping[str, TensorMeta],
    modules: Mapping[str, torch.nn.Module],
    mode: FunctionMode,
) -> dict[str, Any]:
    children = [
        [_relative(c.path, call.path), _signature_data(c, record, meta, modules, mode)]
        for c in record.children(call.call_id)
    ]
    data: dict[str, Any] = {
        "class": call.class_name,
        "inputs": _shape_tree(call.inputs, meta),
        "children": children,
    }
    if mode == PER_INSTANCE:
        data["path"] = call.path
    else:
        data["structure"] = _module_structure(modules[call.path])
        data["reads"] = [list(r) for r in call.reads]
    return data


def explain_split(first: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """What differs between two calls' signature data (of one class), in one line.

    Attribute reads come first (they are what usually differs: a ``layer_idx`` read in
    forward, a flag), then submodule classes, weights, inputs and nested calls.
    """
    reasons: list[str] = []
    a_reads, b_reads = dict(map(tuple, first["reads"])), dict(map(tuple, other["reads"]))
    for name in sorted(set(a_reads) | set(b_reads)):
        a, b = a_reads.get(name), b_reads.get(name)
        if a == b:
            continue
        if a is None or b is None:
            reasons.append(f"attribute {name!r} read in forward by one only ({a or b})")
        else:
            reasons.append(f"attribute {name!r} read in forward: {a} vs {b}")
    a_weights, a_buffers, a_classes = first["structure"]
    b_weights, b_buffers, b_classes = other["structure"]
    a_sub, b_sub = dict(map(tuple, a_classes)), dict(map(tuple, b_classes))
    for name in sorted(set(a_sub) | set(b_sub)):
        if a_sub.get(name) != b_sub.get(name):
            what = f"submodule {name!r}" if name else "class"
            reasons.append(f"{what}: {a_sub.get(name, 'none')} vs {b_sub.get(name, 'none')}")
    if a_weights != b_weights or a_buffers != b_buffers:
        reasons.append("weights differ in names, shapes or dtypes")
    if first["inputs"] != other["inputs"]:
        reasons.append(f"inputs differ: {_first_difference(first['inputs'], other['inputs'])}")
    a_children, b_children = first["children"], other["children"]
    if len(a_children) != len(b_children):
        reasons.append(f"{len(a_children)} vs {len(b_children)} nested hiera calls")
    else:
        for (path, a_child), (_, b_child) in zip(a_children, b_children):
            if a_child != b_child:
                reasons.append(f"nested call {path!r}: {explain_split(a_child, b_child)}")
                break
    return "; ".join(reasons) or "their signatures differ"


def _first_difference(a: Any, b: Any) -> str:
    """The first differing leaf of two shape trees, as ``a vs b``."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        if a and a[0] in ("T", "C"):
            return f"{a[1:]} vs {b[1:]}"
        for x, y in zip(a, b):
            if x != y:
                return _first_difference(x, y)
    return f"{json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"


def plan_units(
    record: CaptureRecord, modules: Mapping[str, torch.nn.Module], mode: FunctionMode
) -> list[PlannedUnit]:
    """The root unit, then one unit per distinct call signature, in first-call order.

    A unit of a class that an earlier unit already has carries what differs (the export logs
    it, once it knows whether the graphs differ too).
    """
    meta = {t.key: t for t in record.tensors}
    groups: dict[str, list[ModuleCall]] = {}
    data: dict[str, dict[str, Any]] = {}
    for call in record.calls:
        signature = _signature_data(call, record, meta, modules, mode)
        key = json.dumps(signature, sort_keys=True)
        groups.setdefault(key, []).append(call)
        data.setdefault(key, signature)
    units = [PlannedUnit("root", ())]
    first_of_class: dict[str, tuple[str, ModuleCall]] = {}
    for key, calls in sorted(groups.items(), key=lambda item: item[1][0].order):
        call = calls[0]
        reason = ""
        earlier = first_of_class.setdefault(call.class_name, (key, call))
        if earlier[0] != key and mode == PER_TYPE:
            reason = (
                f"differs from {earlier[1].path!r}: {explain_split(data[earlier[0]], data[key])}"
            )
        units.append(PlannedUnit(f"u{call.order:03d}", tuple(c.call_id for c in calls), reason))
    return units
