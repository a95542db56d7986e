"""The cache's action entries: a stage run's output files, by content digest (JSON, data only).

Its own module so that the local store and the remote tier, which both read and write entries,
depend on it rather than on each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY_FORMAT = 1


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
    #: The outputs its stage declares (``artifacts``): an entry lacking one is incomplete.
    declares: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """The declared outputs this entry lacks (an incomplete entry, never served)."""
        have = {f.path for f in self.outputs}
        return sorted(d for d in self.declares if d not in have)

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
        if self.declares:
            data["declares"] = list(self.declares)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ActionEntry:
        if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT:
            raise ValueError("unknown entry format")
        outputs = tuple(OutputFile(str(p), str(d), int(s)) for p, d, s in data["outputs"])
        for f in outputs:
            if not re.fullmatch(r"[0-9a-f]{64}", f.digest) or _unsafe_relpath(f.path):
                raise ValueError(f"bad output record {f}")
        recipe = data.get("recipe")
        declares = data.get("declares", [])
        if not isinstance(declares, list) or not all(isinstance(d, str) for d in declares):
            raise ValueError("bad declared outputs")
        return cls(
            key=str(data["key"]),
            stage=str(data["stage"]),
            outputs=outputs,
            recipe=recipe if isinstance(recipe, str) else None,
            declares=tuple(declares),
        )
