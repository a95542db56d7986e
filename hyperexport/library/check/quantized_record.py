"""The record of comparing a quantized model with its float model (``quantized.json``).

Plain data (no numpy, no ONNX library): the check stage reads it to judge.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import QUANTIZED_JSON


@dataclass(frozen=True)
class Closeness:
    """One quantized result against its float counterpart.

    Attributes:
        name: Graph output name, or the call id of a call site run alone.
        module_path: The call site's module path (empty for a graph output).
        function: The called function's name (empty for a graph output).
        rel_error: ``|q - f| / |f|``, L2 over every element of every output.
        cosine: Cosine similarity of the flattened outputs.
        top1: Share of positions whose argmax over the last axis agrees (logits only).
        error: Why one of the two could not be run, if so (the other fields are then 0).
    """

    name: str
    module_path: str = ""
    function: str = ""
    rel_error: float = 0.0
    cosine: float = 0.0
    top1: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class QuantizedComparison:
    """What comparing found, before any threshold is applied.

    Attributes:
        method: ``quantize.method``.
        block_size: ``quantize.block_size``.
        ops: Function name (``main`` for the main graph) -> quantized op type -> node count.
        outputs: One per graph output.
        functions: One per call site, in execution order.
    """

    method: str
    block_size: int
    ops: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    outputs: tuple[Closeness, ...] = ()
    functions: tuple[Closeness, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QuantizedComparison:
        return cls(
            method=str(data["method"]),
            block_size=int(data["block_size"]),
            ops={k: dict(v) for k, v in data["ops"].items()},
            outputs=tuple(Closeness(**c) for c in data["outputs"]),
            functions=tuple(Closeness(**c) for c in data["functions"]),
        )

    def save(self, directory: Path) -> None:
        text = json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_bytes(directory / QUANTIZED_JSON, text.encode("utf-8"))

    @classmethod
    def load(cls, directory: Path) -> QuantizedComparison | None:
        """The record in ``directory``, or None when there is none (``quantize.method: none``)."""
        path = directory / QUANTIZED_JSON
        if not path.is_file():
            return None
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
