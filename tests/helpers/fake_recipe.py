"""A small valid recipe for the product's build plumbing (session, publication, remote, faults)
run on the fake stages of ``fake_stages.py``."""

from __future__ import annotations

from typing import Any

from hyperexport.product.config import Recipe, validate_recipe


def recipe(**overrides: Any) -> Recipe:
    """A valid recipe (validated for real; validation imports nothing heavy)."""
    data: dict[str, Any] = {
        "name": "fake",
        "model": {"_target_": "hyperexport.zoo.tiny_llama", "num_layers": 1, "seed": 0},
        "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
        "dynamo": False,
    }
    for dotted, value in overrides.items():
        target = data
        *parents, last = dotted.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return validate_recipe(data, "/recipes/fake.yaml")
