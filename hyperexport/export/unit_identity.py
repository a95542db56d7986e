"""Decide which hiera calls can share one exported body (one ONNX function).

Two calls share a unit when everything that can shape their graph is equal:

* ``per_instance``: the same module instance, called with the same input signature (structure,
  shapes, dtypes, constant values), with the same nested calls.
* ``per_type``: the same class, the same input signature, the same weights (names, shapes,
  dtypes), the same submodule classes, the same values of every plain attribute the forward
  read during capture, and nested calls that match in the same way.

Anything not listed makes calls differ, so a reuse is never assumed from the class name alone;
the check stage's per-function parity (each call site with its own weights) backs it up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.capture.tree import qualified_name
from hyperexport.contracts.records import CaptureRecord, ModuleCall, TensorMeta, Tree
from hyperexport.options import FunctionMode


@dataclass(frozen=True)
class PlannedUnit:
    """A group of calls that one exported body serves; the first call is the one exported."""

    name: str
    call_ids: tuple[str, ...]


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


def call_signature(
    call: ModuleCall,
    record: CaptureRecord,
    meta: Mapping[str, TensorMeta],
    modules: Mapping[str, torch.nn.Module],
    mode: FunctionMode,
) -> str:
    """Canonical JSON of everything that decides the call's graph in ``mode``."""
    children = [
        [_relative(c.path, call.path), call_signature(c, record, meta, modules, mode)]
        for c in record.children(call.call_id)
    ]
    data: dict[str, Any] = {
        "class": call.class_name,
        "inputs": _shape_tree(call.inputs, meta),
        "children": children,
    }
    if mode == "per_instance":
        data["path"] = call.path
    else:
        data["structure"] = _module_structure(modules[call.path])
        data["reads"] = [list(r) for r in call.reads]
    return json.dumps(data, sort_keys=True)


def plan_units(
    record: CaptureRecord, modules: Mapping[str, torch.nn.Module], mode: FunctionMode
) -> list[PlannedUnit]:
    """The root unit, then one unit per distinct call signature, in first-call order."""
    meta = {t.key: t for t in record.tensors}
    groups: dict[str, list[ModuleCall]] = {}
    for call in record.calls:
        groups.setdefault(call_signature(call, record, meta, modules, mode), []).append(call)
    units = [PlannedUnit("root", ())]
    for calls in sorted(groups.values(), key=lambda cs: cs[0].order):
        units.append(PlannedUnit(f"u{calls[0].order:03d}", tuple(c.call_id for c in calls)))
    return units
