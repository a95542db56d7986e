from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperexport.engine.errors import StageFailed
from hyperexport.engine.runner import BuildRequest, BuildResult, Runner
from hyperexport.engine.stage import config_slice
from hyperexport.engine.store import CacheStore
from tests.engine.fakes import CONFIG as RECIPE
from tests.engine.fakes import ENV, MODEL, FakeStage, StageBoom, pipeline, statuses


def _build(
    store: CacheStore,
    stages: Sequence[FakeStage],
    recipe: dict[str, Any] | None = None,
    *,
    loads: list[int] | None = None,
    **kwargs: Any,
) -> BuildResult:
    counter = loads if loads is not None else []

    def load() -> str:
        counter.append(1)
        return "live-model"

    request = BuildRequest(
        name="fake",
        config=recipe or RECIPE,
        source="/recipes/fake.yaml",
        stages=stages,
        env=kwargs.pop("env", ENV),
        model=kwargs.pop("model", MODEL),
        **kwargs,
    )
    return Runner(store, load).run(request)


def test_cold_then_noop(store: CacheStore) -> None:
    stages = pipeline()
    cold = _build(store, stages)
    assert statuses(cold) == dict.fromkeys(("trace", "export", "rewrite", "check"), "ran")
    assert all(s.reason == "no previous build" for s in cold.stages)
    warm = _build(store, stages)
    assert statuses(warm) == dict.fromkeys(("trace", "export", "rewrite", "check"), "hit")
    assert [len(s.runs) for s in stages] == [1, 1, 1, 1]
    assert [s.key for s in cold.stages] == [s.key for s in warm.stages]


def test_model_loaded_once_and_not_at_all_on_hits(store: CacheStore) -> None:
    loads: list[int] = []
    _build(store, pipeline(), loads=loads)
    assert loads == [1]  # trace and export both used it
    _build(store, pipeline(), loads=loads)
    assert loads == [1]


def test_tolerance_change_reruns_check_only(store: CacheStore) -> None:
    stages = pipeline()
    _build(store, stages)
    result = _build(store, stages, {**RECIPE, "check": {"atol": 1e-3}})
    assert statuses(result) == {"trace": "hit", "export": "hit", "rewrite": "hit", "check": "ran"}
    assert result.stages[-1].reason == "check.atol 0.0001→0.001"


def test_opset_change_reruns_export_and_downstream_not_trace(store: CacheStore) -> None:
    stages = pipeline()
    _build(store, stages)
    result = _build(store, stages, {**RECIPE, "opset": 17})
    assert statuses(result) == {"trace": "hit", "export": "ran", "rewrite": "ran", "check": "ran"}
    assert result.stages[1].line().startswith("export: ran (opset 18→17)")
    assert result.stages[2].reason == "export output changed"


def test_model_fingerprint_change_reruns_the_stages_that_run_the_model(store: CacheStore) -> None:
    """Rewrite and check do not run user code: they rerun only if their inputs changed (the
    fake stages' outputs do not depend on the model's code)."""
    stages = pipeline()
    _build(store, stages)
    model = {"code": {"m": {"kind": "local", "digest": "1" * 64}}, "weights": {"seed": 0}}
    result = _build(store, stages, model=model)
    assert statuses(result) == {"trace": "ran", "export": "ran", "rewrite": "hit", "check": "hit"}
    assert result.stages[0].reason == "model code changed (m 00000000→11111111)"


def test_failing_stage_leaves_no_entry_and_names_module(store: CacheStore) -> None:
    stages = list(pipeline())
    stages[1] = FakeStage(
        "export",
        reads=("opset",),
        upstream=("trace",),
        fail=lambda p: StageBoom("unsupported op", "model.layers.1"),
    )
    result = _build(store, stages)
    assert statuses(result) == {"trace": "ran", "export": "failed"}
    assert isinstance(result.error, StageFailed)
    assert result.error.stage == "export"
    assert (
        isinstance(result.error.cause, StageBoom) and result.error.__cause__ is result.error.cause
    )
    assert str(result.error) == "stage 'export' failed: unsupported op"
    failed_key = result.stages[1].key
    assert failed_key is not None
    assert store.lookup(failed_key).status == "missing"
    assert "export.json" in result.failed_files
    assert not list((store.root / "tmp").iterdir())
    again = _build(store, stages)
    assert again.stages[1].status == "failed"
    assert again.stages[1].key == failed_key
    # fix the stage: it runs, and the reason says why it was not cached
    stages[1] = FakeStage("export", reads=("opset",), upstream=("trace",))
    fixed = _build(store, stages)
    assert fixed.stages[1].status == "ran"
    assert fixed.stages[1].reason == "previous run failed"


def test_force_reruns_named_stage(store: CacheStore) -> None:
    stages = pipeline()
    _build(store, stages)
    result = _build(store, stages, force=frozenset({"export"}))
    assert result.stages[1].status == "ran"
    assert result.stages[1].reason == "forced"
    # same outputs, so later stages still hit (their keys did not change)
    assert statuses(result)["rewrite"] == "hit"


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache", read_only=True)
    result = _build(store, pipeline(), dry_run=True)
    assert {s.status for s in result.stages} == {"would_run"}
    assert result.stages[1].line() == "export: would run (after trace; no previous build)"
    assert not (tmp_path / "cache").exists()


def test_dry_run_after_build_shows_reasons(store: CacheStore) -> None:
    stages = pipeline()
    _build(store, stages)
    before = sorted(p for p in store.root.rglob("*"))
    ro = CacheStore(store.root, read_only=True)
    result = _build(ro, stages, {**RECIPE, "opset": 17}, dry_run=True)
    lines = [s.line() for s in result.stages]
    assert lines == [
        "trace: hit",
        "export: would run (opset 18→17)",
        "rewrite: would run (after export)",
        "check: would run (after rewrite; opset 18→17)",
    ]
    assert sorted(p for p in store.root.rglob("*")) == before
    assert [len(s.runs) for s in stages] == [1, 1, 1, 1]


def test_stage_receives_exactly_its_slice(store: CacheStore) -> None:
    stages = pipeline()
    _build(store, stages)
    assert stages[1].runs == [{"model": RECIPE["model"], "opset": 18, "dynamo": False}]


def test_config_slice_nested_and_missing() -> None:
    data = {"a": {"b": 1, "c": 2}, "d": 3}
    assert config_slice(data, ("a.b", "e")) == {"a": {"b": 1}, "e": None}


def test_corrupt_entry_recovers(store: CacheStore) -> None:
    stages = pipeline()
    cold = _build(store, stages)
    entry = cold.entries["rewrite"]
    blob = store.blob_path(entry.outputs[-1].digest)
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.truncate(3)
    result = _build(store, stages)
    assert statuses(result) == {"trace": "hit", "export": "hit", "rewrite": "ran", "check": "hit"}
    assert result.stages[2].reason == "cache entry corrupt"


@pytest.mark.parametrize("bad", [KeyboardInterrupt])
def test_interrupt_propagates_and_cleans_scratch(store: CacheStore, bad: type) -> None:
    def boom(params: Any) -> Any:
        raise bad()

    stages = (FakeStage("trace", reads=("opset",), fail=boom),)
    with pytest.raises(bad):
        _build(store, stages)
    assert not list((store.root / "tmp").iterdir())


def test_what_a_stage_leaves_in_reference_cycles_is_collected_before_the_next_runs(
    store: CacheStore,
) -> None:
    """A stage's garbage in cycles (an onnx_ir model holds its data file's memory maps that
    way) is gone before the next stage starts, not whenever Python's collector comes round:
    automatic collection is off here, so only the runner's own collection can free it."""
    import gc
    import weakref

    class Held:
        """Stands for a large object kept alive only by a cycle."""

    left: list[weakref.ref[Held]] = []
    seen_alive: dict[str, bool] = {}

    @dataclass
    class Leaving(FakeStage):
        def run(self, params: Any, inputs: Any, out_dir: Path) -> None:
            seen_alive[self.name] = any(r() is not None for r in left)
            cycle: dict[str, Any] = {"held": Held()}
            cycle["self"] = cycle
            left.append(weakref.ref(cycle["held"]))
            super().run(params, inputs, out_dir)

    stages = [
        Leaving(s.name, reads=s.reads, upstream=s.upstream, needs_model=s.needs_model)
        for s in pipeline()
    ]
    gc.disable()
    try:
        result = _build(store, stages)
    finally:
        gc.enable()
    assert statuses(result) == dict.fromkeys(("trace", "export", "rewrite", "check"), "ran")
    assert seen_alive == dict.fromkeys(("trace", "export", "rewrite", "check"), False)
