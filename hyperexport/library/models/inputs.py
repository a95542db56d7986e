"""A recipe's example inputs as tensors, generated deterministically from their specs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def make_inputs(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The recipe's example inputs as torch tensors, generated deterministically with numpy.

    A dotted name nests: ``past_key_values.0.key`` is passed as
    ``past_key_values={"0": {"key": tensor}}``, whose capture leaf (and ONNX input) name is the
    dotted name again.
    """
    import numpy as np
    import torch

    tensors = {}
    for name, spec in specs.items():
        rng = np.random.default_rng(int(spec["seed"]))
        shape = tuple(int(d) for d in spec["shape"])
        dtype = spec["dtype"]
        array: Any
        if dtype == "bool":
            array = rng.uniform(size=shape) < 0.5
        elif dtype.startswith(("int", "uint")):
            array = rng.integers(int(spec["low"]), int(spec["high"]), size=shape, dtype=np.int64)
        else:
            array = rng.uniform(float(spec["low"]), float(spec["high"]), size=shape).astype(
                np.float32
            )
        tensors[name] = torch.from_numpy(array).to(getattr(torch, dtype))
    return _nest(tensors)


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested
