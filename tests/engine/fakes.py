"""Small real stages for testing the build machinery: they write real files.

They import nothing but the engine: the engine's own tests (``tests/engine/``, which run with
the engine alone, ``test_engine_alone.py``) use them, and so do the product's tests of its
build plumbing (with the validated configuration of ``tests/helpers/fake_recipe.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.engine.remote import Remote
from hyperexport.engine.runner import BuildRequest, BuildResult, Runner
from hyperexport.engine.stage import Stage, StageInputs
from hyperexport.engine.store import open_store


class StageBoom(RuntimeError):
    """Raised by a failing fake stage; carries a module path as a caller's errors may."""

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


def statuses(result: BuildResult) -> dict[str, str]:
    """``{stage name: status}`` of a runner's result (``ran``, ``hit``, ``failed``)."""
    return {s.name: s.status for s in result.stages}


@dataclass
class SlowStage(FakeStage):
    """A fake stage that sleeps ``delay`` seconds first and may write a ``big`` file."""

    delay: float = 0.0
    big: int = 0

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        print(f"running {self.name}", flush=True)
        time.sleep(self.delay)
        super().run(params, inputs, out_dir)
        if self.big:
            # Deterministic, incompressible-looking content of the asked size.
            block = bytes(range(256)) * 4096
            with open(out_dir / "big.bin", "wb") as fh:
                for i in range(0, self.big, len(block)):
                    fh.write(block[: min(len(block), self.big - i)])


def slow_pipeline(
    delay: float = 0.0, big: int = 0, slow: str | None = None
) -> tuple[SlowStage, ...]:
    """The fake pipeline with ``delay`` on every stage (or only on stage ``slow``) and ``big``
    bytes in export's outputs."""
    return tuple(
        SlowStage(
            s.name,
            reads=s.reads,
            upstream=s.upstream,
            needs_model=s.needs_model,
            publish=s.publish,
            declares=dict(s.declares),
            delay=delay if slow in (None, s.name) else 0.0,
            big=big if s.name == "export" else 0,
        )
        for s in pipeline()
    )


#: A configuration the fake pipeline reads (any JSON data: the engine slices it by ``reads``).
CONFIG: dict[str, Any] = {
    "model": {"factory": "m.f", "seed": 0},
    "inputs": {"x": {"shape": [1]}},
    "hiera": ["m.C"],
    "opset": 18,
    "dynamo": False,
    "rewrite": {"optimize": True},
    "check": {"atol": 1e-4},
}
ENV = {"python": "3.11", "packages": {"numpy": "2.0.0"}}
MODEL = {"code": {"m": {"kind": "local", "digest": "0" * 64}}, "weights": {"seed": 0}}


def build(
    cache: Path,
    stages: Sequence[Stage] | None = None,
    *,
    remote: Remote | None = None,
    dry_run: bool = False,
) -> BuildResult:
    """One build of :data:`CONFIG` with the fake pipeline (or ``stages``) on the cache at
    ``cache``, through the engine alone: open the store, run."""
    store = open_store(cache, dry_run=dry_run, remote=remote)
    request = BuildRequest(
        name="fake",
        config=CONFIG,
        source="fake.json",
        stages=stages or pipeline(),
        env=ENV,
        model=MODEL,
        dry_run=dry_run,
    )
    return Runner(store, lambda: "model").run(request)
