"""The export stage's record: which unit file holds which module's graph, and how they fit together."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# Defined in names.py; re-exported here, where importers have always found them.
from hyperexport.base.contracts.names import BUNDLE_JSON as BUNDLE_JSON
from hyperexport.base.contracts.names import CAPTURE_RECORD as CAPTURE_RECORD


@dataclass(frozen=True)
class UnitEntry:
    """One exported unit.

    Attributes:
        name: File stem under ``units/`` (``root``, ``u003``).
        call_ids: The module calls whose function this unit's graph is (empty for the root).
        module_path: Path of the exported module (representative instance).
        class_name: Qualified class name of the module.
        weights: Per-type mode: local state names passed as extra inputs after the data inputs.
        placeholders: ``(op_type, child call_id)`` of each placeholder node in the graph.
        split_reason: Why these calls do not share the body of an earlier unit of their class
            (what differs: an attribute read in forward, a submodule); empty if none has it.
    """

    name: str
    call_ids: tuple[str, ...]
    module_path: str
    class_name: str
    weights: tuple[str, ...]
    placeholders: tuple[tuple[str, str], ...]
    split_reason: str = ""


@dataclass(frozen=True)
class ExportBundle:
    """The export stage's result: unit files and how they fit together."""

    dynamo: bool
    opset: int
    function_mode: str
    units: tuple[UnitEntry, ...]
    root_input_names: tuple[str, ...]
    root_output_names: tuple[str, ...]
    fallback_from: str | None = None

    def unit_for(self, call_id: str) -> UnitEntry:
        for unit in self.units:
            if call_id in unit.call_ids:
                return unit
        raise KeyError(call_id)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def loads(cls, text: str) -> ExportBundle:
        data = json.loads(text)
        units = tuple(
            UnitEntry(
                name=u["name"],
                call_ids=tuple(u["call_ids"]),
                module_path=u["module_path"],
                class_name=u["class_name"],
                weights=tuple(u["weights"]),
                placeholders=tuple((a, b) for a, b in u["placeholders"]),
                split_reason=u.get("split_reason", ""),
            )
            for u in data["units"]
        )
        return cls(
            dynamo=data["dynamo"],
            opset=data["opset"],
            function_mode=data["function_mode"],
            units=units,
            root_input_names=tuple(data["root_input_names"]),
            root_output_names=tuple(data["root_output_names"]),
            fallback_from=data.get("fallback_from"),
        )
