"""The cache's action entries: a stage run's output files, by content digest (JSON, data only).

Its own module so that the local store and the remote tier, which both read and write entries,
depend on it rather than on each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: 2: the entry records its stage's params (format 1 recorded its own list of declared
#: outputs, which ``cache verify`` trusted). An entry of another format is unreadable: a miss.
ENTRY_FORMAT = 2


def _unsafe_relpath(path: str) -> bool:
    p = Path(path)
    return p.is_absolute() or ".." in p.parts or not path


@dataclass(frozen=True)
class OutputFile:
    """One output file of a stage run."""

    path: str
    digest: str
    size: int


@dataclass(frozen=True)
class ActionEntry:
    """A committed stage run: the files it produced, by content digest."""

    key: str
    stage: str
    outputs: tuple[OutputFile, ...]
    # The recipe whose build computed the entry (shown by ``cache ls``; not part of the key).
    recipe: str | None = None
    #: The stage's params as keyed: what ``cache verify`` recomputes the stage's declared
    #: outputs from (``Stage.outputs``). A build never reads them: it has its own.
    params: Mapping[str, Any] = field(default_factory=dict)

    def missing(self, declared: Mapping[str, str]) -> list[str]:
        """The files of ``declared`` (``{name: path}``, the stage's outputs) this entry lacks."""
        have = {f.path for f in self.outputs}
        return sorted({d for d in declared.values() if d not in have})

    def digests(self) -> dict[str, str]:
        """``{relative path: digest}``: what later stages' keys include."""
        return {f.path: f.digest for f in self.outputs}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": ENTRY_FORMAT,
            "key": self.key,
            "stage": self.stage,
            "outputs": [[f.path, f.digest, f.size] for f in self.outputs],
        }
        if self.recipe is not None:
            data["recipe"] = self.recipe
        data["params"] = dict(self.params)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ActionEntry:
        if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ValueError(f"entry format {found!r}, not {ENTRY_FORMAT}")
        outputs = tuple(OutputFile(str(p), str(d), int(s)) for p, d, s in data["outputs"])
        for f in outputs:
            if not re.fullmatch(r"[0-9a-f]{64}", f.digest) or _unsafe_relpath(f.path):
                raise ValueError(f"bad output record {f}")
        recipe = data.get("recipe")
        params = data["params"]
        if not isinstance(params, dict):
            raise ValueError("bad params record")
        return cls(
            key=str(data["key"]),
            stage=str(data["stage"]),
            outputs=outputs,
            recipe=recipe if isinstance(recipe, str) else None,
            params=params,
        )
