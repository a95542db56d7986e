"""make_inputs: seeded example tensors, dotted names nested as the capture names them back."""

from __future__ import annotations

import torch

from hyperexport.base.contracts.records import leaf_names
from hyperexport.library.models.inputs import make_inputs

SPEC = {"shape": [2, 3], "dtype": "float32", "low": -1.0, "high": 1.0, "seed": 0}


def test_dotted_names_nest_and_flatten_back_to_the_same_names() -> None:
    from hyperexport.library.capture import tree

    specs = {
        "input_ids": {**SPEC, "dtype": "int64", "low": 0, "high": 9},
        "past_key_values.0.key": SPEC,
        "past_key_values.0.value": {**SPEC, "seed": 1},
    }
    inputs = make_inputs(specs)
    assert set(inputs) == {"input_ids", "past_key_values"}
    kv = inputs["past_key_values"]["0"]
    assert kv["key"].shape == (2, 3) and not torch.equal(kv["key"], kv["value"])
    tensors: list[torch.Tensor] = []
    structure = tree.flatten(inputs, "inputs", tensors)
    assert leaf_names(structure) == list(specs)
