"""Small real stages for testing the build machinery without torch: they write real files."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.config import Recipe, validate_recipe
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
    artifacts: dict[str, str] = field(default_factory=dict)
    fail: Callable[[Mapping[str, Any]], StageBoom | None] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)

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
            artifacts={"model": "model.onnx"},
        ),
        FakeStage(
            "check",
            reads=("check", "opset"),
            upstream=("trace", "rewrite"),
            publish=("check.json",),
            artifacts={"check": "check.json"},
        ),
    )


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
