"""Incomplete cache entries, met by a whole build (session, publication) and by ``cache verify``
on the fake stages: complete is what the stage's code declares for its params, never what the
entry says of itself."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.engine.store import CacheStore
from hyperexport.engine.verify import verify
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import FakeStage, pipeline
from tests.helpers.fake_recipe import recipe


def _settings(tmp_path: Path) -> BuildSettings:
    return BuildSettings(
        cache_dir=str(tmp_path / "cache"), outputs_dir=tmp_path / "out", dry_run=False, force=()
    )


def _keys(outcome: BuildOutcome) -> dict[str, str]:
    return {s.name: str(s.key) for s in outcome.result.stages}


def _drop(store: CacheStore, key: str, *paths: str, **extra: Any) -> None:
    """Edit entry ``key`` as a writer of the cache could: without ``paths``, plus ``extra``."""
    path = store.action_path(key)
    data = json.loads(path.read_text())
    data["outputs"] = [o for o in data["outputs"] if o[0] not in paths]
    data.update(extra)
    path.write_text(json.dumps(data))


def test_an_incomplete_entry_is_a_miss_and_verify_drops_it(tmp_path: Path) -> None:
    """Issue 21: a check entry lacking check.json was a hit (check.json not published), and a
    rewrite entry lacking model.onnx failed every later build while verify saw nothing."""
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    keys = _keys(first)
    store = CacheStore(tmp_path / "cache")
    _drop(store, keys["rewrite"], "model.onnx")
    _drop(store, keys["check"], "check.json")
    found = verify(CacheStore(tmp_path / "cache"), pipeline())
    assert not found.ok
    assert any("rewrite" in p and "incomplete (lacks model.onnx)" in p for p in found.problems)
    assert any("check" in p and "incomplete (lacks check.json)" in p for p in found.problems)
    again = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert again.exit_code == 0
    assert [s.status for s in again.result.stages] == ["hit", "hit", "ran", "ran"]
    assert (again.out_dir / "check.json").is_file()
    assert verify(CacheStore(tmp_path / "cache"), pipeline()).ok


def test_an_entry_edited_to_declare_what_it_holds_is_still_incomplete(tmp_path: Path) -> None:
    """Issue 32: verify trusted the entry's own list of declared outputs, and said "0 entries
    dropped" for an entry whose list was edited to match what it held. The list is gone; verify
    asks the stage, and a list planted in the entry changes nothing."""
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    store = CacheStore(tmp_path / "cache")
    key = _keys(first)["rewrite"]
    _drop(store, key, "model.onnx", declares=["rewrite.json"])
    found = verify(CacheStore(tmp_path / "cache"), pipeline())
    assert [p for p in found.problems if "incomplete (lacks model.onnx)" in p] == [
        f"entry {key[:12]} (rewrite, fake): dropped, incomplete (lacks model.onnx)"
    ]
    assert not store.action_path(key).exists()


def test_a_lookup_judges_by_the_stage_not_by_the_entry(tmp_path: Path) -> None:
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    store = CacheStore(tmp_path / "cache")
    _drop(store, _keys(first)["rewrite"], "model.onnx", params={})
    again = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert again.exit_code == 0
    assert [s.status for s in again.result.stages] == ["hit", "hit", "ran", "hit"]
    assert "cache entry corrupt" in again.result.stages[2].reason


class _Quantize(FakeStage):
    """Declares ``model.quantized.onnx`` unless ``quantize.method`` is ``none``, as the real
    quantize stage does: its declared outputs are a function of its params."""

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        if params["quantize"]["method"] == "none":
            return {}
        return {"quantized_model": "model.quantized.onnx"}

    def run(self, params: Mapping[str, Any], inputs: Any, out_dir: Path) -> None:
        super().run(params, inputs, out_dir)
        if params["quantize"]["method"] != "none":
            (out_dir / "model.quantized.onnx").write_bytes(b"q" * 64)


def _quantizing() -> tuple[FakeStage, ...]:
    stages = list(pipeline())
    stages.insert(3, _Quantize("quantize", reads=("quantize.method",), upstream=("rewrite",)))
    return tuple(stages)


def test_outputs_that_depend_on_a_field_are_declared_by_it(tmp_path: Path) -> None:
    plain = run_build(recipe(), _settings(tmp_path), stages=_quantizing(), load_model=lambda: "m")
    assert plain.exit_code == 0
    quantized = run_build(
        recipe(quantize__method="int4_block"),
        _settings(tmp_path),
        stages=_quantizing(),
        load_model=lambda: "m",
    )
    assert quantized.exit_code == 0
    store = CacheStore(tmp_path / "cache")
    assert verify(store, _quantizing()).ok  # the method none entry holds no quantized model
    _drop(store, _keys(quantized)["quantize"], "model.quantized.onnx")
    found = verify(CacheStore(tmp_path / "cache"), _quantizing())
    assert len(found.problems) == 1
    assert "(quantize, fake): dropped, incomplete (lacks model.quantized.onnx)" in found.problems[0]
    assert store.action_path(_keys(plain)["quantize"]).exists()


def test_verify_drops_entries_it_cannot_judge(tmp_path: Path) -> None:
    """An entry of a stage the pipeline lacks, or whose params the stage cannot read, is no
    entry this pipeline would use: dropped, with the reason."""
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    store = CacheStore(tmp_path / "cache")
    keys = _keys(first)
    _drop(store, keys["export"], stage="fuse")
    found = verify(store, _quantizing())
    assert found.problems == [
        f"entry {keys['export'][:12]} (fuse, fake): dropped, stage 'fuse' is not one of this "
        "pipeline's (trace, export, rewrite, quantize, check)"
    ]


def test_an_entry_of_the_previous_format_is_a_miss(tmp_path: Path) -> None:
    """Format 1 held the list verify trusted, and no params: unreadable now, rebuilt."""
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    store = CacheStore(tmp_path / "cache")
    key = _keys(first)["rewrite"]
    data = json.loads(store.action_path(key).read_text())
    old = {k: v for k, v in data.items() if k != "params"}
    store.action_path(key).write_text(json.dumps({**old, "format": 1, "declares": ["model.onnx"]}))
    again = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert [s.status for s in again.result.stages] == ["hit", "hit", "ran", "hit"]
