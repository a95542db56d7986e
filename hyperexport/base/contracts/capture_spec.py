"""The capture specification: what a capture runs, with every ``auto`` resolved, frozen as data.

The trace stage resolves the recipe's ``inputs: auto`` / ``hiera: auto`` / ``dynamic: auto`` on
the live model once and writes the result as ``capture_spec.json``; the export stage reads it
(its key covers the file, through the trace's output digests) and captures again from it on a
fallback, instead of resolving ``auto`` a second time. The library's ``export_hyper_onnx``
builds the same record from its arguments. Data only: class names are strings (the caller
imports them, never this record), inputs are recipes for tensors (shape, dtype, range, seed),
not tensors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.contracts.names import CAPTURE_SPEC_JSON
from hyperexport.base.errors import CorruptRecordError

#: Bumped whenever the layout changes; a record of another format is refused.
FORMAT = 1

DynamicAxes = tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
ProbeShapes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class InputEntry:
    """One example input, generated deterministically (``library/models/inputs.py``).

    Attributes:
        name: Input name (dotted names nest: ``past_key_values.0.key``).
        shape: Traced shape.
        dtype: torch dtype name (``float32``, ``int64``, ``bool``).
        low: Lower bound of the uniform draw.
        high: Upper bound (exclusive).
        seed: numpy seed of the draw.
        dynamic: ``(axis, dim name)`` of the axes that stay symbolic.
        check_shape: The probe (second) shape, if set.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    low: float
    high: float
    seed: int
    dynamic: tuple[tuple[int, str], ...] = ()
    check_shape: tuple[int, ...] | None = None

    def generator(self) -> dict[str, Any]:
        """The spec in the form :func:`hyperexport.library.models.inputs.make_inputs` takes."""
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "low": self.low,
            "high": self.high,
            "seed": self.seed,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.generator(),
            "name": self.name,
            "dynamic": [[axis, dim] for axis, dim in self.dynamic],
            "check_shape": None if self.check_shape is None else list(self.check_shape),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InputEntry:
        check = data["check_shape"]
        return cls(
            name=str(data["name"]),
            shape=tuple(int(d) for d in data["shape"]),
            dtype=str(data["dtype"]),
            low=float(data["low"]),
            high=float(data["high"]),
            seed=int(data["seed"]),
            dynamic=tuple((int(a), str(d)) for a, d in data["dynamic"]),
            check_shape=None if check is None else tuple(int(d) for d in check),
        )


@dataclass(frozen=True)
class CaptureSpec:
    """Everything a capture of the model runs, explicit.

    Attributes:
        hiera: Qualified names of the hiera classes, in order.
        method: The model's method that is captured and exported.
        dynamo: The export path the capture is made for first (a fallback captures again for
            the other one).
        attention: transformers' attention implementation the model runs with (None: as loaded).
        inputs: How to make the example inputs; empty when the caller hands tensors (the
            library).
        dynamic_axes: ``(input leaf name, ((axis, dim name), ...))`` of the dynamic inputs.
        probe_shapes: ``(input leaf name, shape)`` of the second (check) run, where set.
    """

    hiera: tuple[str, ...]
    method: str
    dynamo: bool
    attention: str | None = None
    inputs: tuple[InputEntry, ...] = ()
    dynamic_axes: DynamicAxes = ()
    probe_shapes: ProbeShapes = ()

    def capture_settings(self) -> dict[str, Any]:
        """``capture_model``'s keywords other than the model, inputs, classes and path."""
        return {
            "method": self.method,
            "attention": self.attention,
            "dynamic_axes": {k: dict(v) for k, v in self.dynamic_axes} or None,
            "probe_shapes": {k: tuple(v) for k, v in self.probe_shapes} or None,
        }

    def generators(self) -> dict[str, dict[str, Any]]:
        """``{input name: generator}`` of :attr:`inputs`, in order."""
        return {entry.name: entry.generator() for entry in self.inputs}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "hiera": list(self.hiera),
            "method": self.method,
            "dynamo": self.dynamo,
            "attention": self.attention,
            "inputs": [entry.to_json() for entry in self.inputs],
            "dynamic_axes": [[k, [[a, d] for a, d in v]] for k, v in self.dynamic_axes],
            "probe_shapes": [[k, list(v)] for k, v in self.probe_shapes],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n"

    @classmethod
    def loads(cls, text: str) -> CaptureSpec:
        """The record from its JSON text.

        Raises:
            CorruptRecordError: Not a capture specification of this format.
        """
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            return cls(
                hiera=tuple(str(h) for h in data["hiera"]),
                method=str(data["method"]),
                dynamo=bool(data["dynamo"]),
                attention=None if data["attention"] is None else str(data["attention"]),
                inputs=tuple(InputEntry.from_json(e) for e in data["inputs"]),
                dynamic_axes=tuple(
                    (str(k), tuple((int(a), str(d)) for a, d in v)) for k, v in data["dynamic_axes"]
                ),
                probe_shapes=tuple(
                    (str(k), tuple(int(d) for d in v)) for k, v in data["probe_shapes"]
                ),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptRecordError(CAPTURE_SPEC_JSON, str(e)) from e

    def save(self, directory: Path) -> None:
        """Write ``capture_spec.json`` into ``directory`` (atomically)."""
        atomic_write_text(directory / CAPTURE_SPEC_JSON, self.dumps())

    @classmethod
    def load(cls, directory: Path) -> CaptureSpec:
        """Read ``capture_spec.json`` from ``directory``."""
        return cls.loads((directory / CAPTURE_SPEC_JSON).read_text(encoding="utf-8"))
