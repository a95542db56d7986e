"""The probe run of a capture with dynamic axes: the root inputs at a second shape, and the check
that the model makes the same hiera calls there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hyperexport.base.contracts.names import PROBE_PREFIX
from hyperexport.base.contracts.records import ModuleCall
from hyperexport.base.errors import (
    InputError,
    OptionsError,
)
from hyperexport.library.capture import tree

#: Key prefix of the tensors of the run at the second (probe) shape.
PROBE = PROBE_PREFIX


def resize_inputs(
    bound: dict[str, Any],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    probe_shapes: Mapping[str, Sequence[int]] | None,
) -> dict[str, Any]:
    """The root inputs at the probe shape: each dynamic axis tiled or cut to its new size.

    Tiling keeps the values meaningful (token ids stay in the vocabulary, an all-ones mask
    stays all ones).
    """
    tensors: list[torch.Tensor] = []
    structure = tree.flatten(bound, "model input", tensors)
    leaves = tree.leaf_names(structure)
    unknown = sorted(set(dynamic_axes) - set(leaves))
    if unknown:
        raise InputError(f"dynamic_axes {unknown}", f"not among the model inputs {leaves}")
    dim_names = sorted({n for axes in dynamic_axes.values() for n in axes.values()})
    grow = {n: 1 + i for i, n in enumerate(dim_names)}
    resized = []
    for name, tensor in zip(leaves, tensors):
        axes = dynamic_axes.get(name, {})
        beyond = sorted(a for a in axes if a >= tensor.dim())
        if beyond:
            raise OptionsError(
                f"dynamic_axes[{name!r}]",
                f"axis {beyond[0]} is beyond the input's rank {tensor.dim()} "
                f"(shape {tuple(tensor.shape)})",
            )
        target = list(tensor.shape)
        for axis, dim in axes.items():
            target[axis] = tensor.shape[axis] + grow[dim]
        if probe_shapes and name in probe_shapes:
            target = list(probe_shapes[name])
        for axis, size in enumerate(target):
            if size != tensor.shape[axis]:
                index = torch.arange(size) % tensor.shape[axis]
                tensor = tensor.index_select(axis, index)
        resized.append(tensor)
    return tree.unflatten(structure, lambda k: resized[int(k)])


def require_same_calls(calls: Sequence[ModuleCall], probe: Sequence[ModuleCall]) -> None:
    first = [c.call_id for c in calls]
    second = [c.call_id for c in probe]
    if first != second:
        diff = sorted(set(first) ^ set(second))
        raise InputError(
            "dynamic_axes",
            f"the hiera calls differ between the traced and the second shape ({diff[:5]}); "
            "the model's module structure depends on the dynamic dimensions",
        )
