"""Small real stages for testing the build machinery without torch: they write real files.

They import nothing of the product (recipe schema, stages, builds): the engine's own tests
(``tests/engine/``) use them alone. A validated recipe for the product's build plumbing is in
``fake_recipe.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.engine.stage import StageInputs


class StageBoom(RuntimeError):
    """Raised by a failing fake stage; carries a module path like the library's errors do."""

    def __init__(self, message: str, module_path: str | None = None) -> None:
        super().__init__(message)
        self.module_path = module_path


@dataclass
class FakeStage:
    """Writes ``<name>.json`` = its params + the digests of what it read upstream.

    ``fail`` makes ``run`` write a partial file then raise; ``runs`` counts the calls.
    """

    name: str
    reads: tuple[str, ...]
    upstream: tuple[str, ...] = ()
    version: int = 1
    needs_model: bool = False
    libraries: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    #: Its declared outputs (``{name: path}``), whatever the params: ``outputs`` returns them.
    declares: dict[str, str] = field(default_factory=dict)
    fail: Callable[[Mapping[str, Any]], StageBoom | None] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return dict(self.declares)

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        self.runs.append(dict(params))
        seen = {u: sorted(p.name for p in inputs.dir(u).iterdir()) for u in self.upstream}
        upstream_text = {
            u: (inputs.dir(u) / f"{u}.json").read_text(encoding="utf-8") for u in self.upstream
        }
        if self.needs_model:
            seen["model"] = inputs.model()
        (out_dir / f"{self.name}.json").write_text(
            json.dumps({"params": params, "seen": seen, "upstream": upstream_text}, sort_keys=True),
            encoding="utf-8",
        )
        if self.name == "rewrite":
            (out_dir / "model.onnx").write_bytes(json.dumps(params, sort_keys=True).encode() * 50)
        if self.fail is not None:
            error = self.fail(params)
            if error is not None:
                raise error


def pipeline() -> tuple[FakeStage, ...]:
    """A four-stage pipeline shaped like the real one."""
    return (
        FakeStage("trace", reads=("model", "inputs", "hiera"), needs_model=True),
        FakeStage(
            "export",
            reads=("model", "opset", "dynamo"),
            upstream=("trace",),
            needs_model=True,
        ),
        FakeStage(
            "rewrite",
            reads=("rewrite",),
            upstream=("export",),
            publish=("model.onnx", "manifest.json"),
            declares={"model": "model.onnx"},
        ),
        FakeStage(
            "check",
            reads=("check", "opset"),
            upstream=("trace", "rewrite"),
            publish=("check.json",),
            declares={"check": "check.json"},
        ),
    )
