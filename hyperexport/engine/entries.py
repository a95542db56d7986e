"""The cache's action entries: a stage run's output files, by content digest (JSON, data only).

Its own module so that the local store and the remote tier, which both read and write entries,
depend on it rather than on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hashing import SHA256_HEX

#: 3: the entry names the build that computed it as ``build`` (2 said it in another word; 1
#: recorded its own list of declared outputs, which ``verify`` trusted). An entry of another
#: format is unreadable: a miss.
ENTRY_FORMAT = 3


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
    #: The name of the build that computed the entry (listed by the inventory; not keyed).
    build: str | None = None
    #: The stage's params as keyed: what :func:`~.verify.verify` recomputes the stage's
    #: declared outputs from (``Stage.outputs``). A build never reads them: it has its own.
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
        if self.build is not None:
            data["build"] = self.build
        data["params"] = dict(self.params)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ActionEntry:
        if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ValueError(f"entry format {found!r}, not {ENTRY_FORMAT}")
        outputs = tuple(OutputFile(str(p), str(d), int(s)) for p, d, s in data["outputs"])
        for f in outputs:
            if not SHA256_HEX.fullmatch(f.digest) or _unsafe_relpath(f.path):
                raise ValueError(f"bad output record {f}")
        build = data.get("build")
        params = data["params"]
        if not isinstance(params, dict):
            raise ValueError("bad params record")
        return cls(
            key=str(data["key"]),
            stage=str(data["stage"]),
            outputs=outputs,
            build=build if isinstance(build, str) else None,
            params=params,
        )
