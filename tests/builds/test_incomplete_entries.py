"""Incomplete cache entries, met by a whole build (session, publication) on the fake stages."""

from __future__ import annotations

import json
from pathlib import Path

from hyperexport.builds.session import run_build
from hyperexport.cli.cache_verify import verify
from hyperexport.config import BuildSettings
from hyperexport.engine.store import CacheStore
from tests.helpers.fake_recipe import recipe
from tests.helpers.fake_stages import pipeline


def test_an_incomplete_entry_is_a_miss_and_verify_drops_it(tmp_path: Path) -> None:
    """Issue 21: a check entry lacking check.json was a hit (check.json not published), and a
    rewrite entry lacking model.onnx failed every later build while verify saw nothing."""

    settings = BuildSettings(
        cache_dir=str(tmp_path / "cache"), outputs_dir=tmp_path / "out", dry_run=False, force=()
    )
    first = run_build(recipe(), settings, stages=pipeline(), load_model=lambda: "m")
    keys = {s.name: s.key for s in first.result.stages}
    store = CacheStore(tmp_path / "cache")
    for stage in ("rewrite", "check"):
        path = store.action_path(str(keys[stage]))
        data = json.loads(path.read_text())
        data["outputs"] = [o for o in data["outputs"] if o[0] not in ("model.onnx", "check.json")]
        path.write_text(json.dumps(data))
    found = verify(CacheStore(tmp_path / "cache"))
    assert not found.ok
    assert any("rewrite" in p and "incomplete (lacks model.onnx)" in p for p in found.problems)
    assert any("check" in p and "incomplete (lacks check.json)" in p for p in found.problems)
    again = run_build(recipe(), settings, stages=pipeline(), load_model=lambda: "m")
    assert again.exit_code == 0
    assert [s.status for s in again.result.stages] == ["hit", "hit", "ran", "ran"]
    assert (again.out_dir / "check.json").is_file()


def test_an_entry_edited_to_lack_a_declared_output_is_a_miss(tmp_path: Path) -> None:
    """The lookup checks against the live stage's declared outputs, not only the entry's own."""

    settings = BuildSettings(
        cache_dir=str(tmp_path / "cache"), outputs_dir=tmp_path / "out", dry_run=False, force=()
    )
    first = run_build(recipe(), settings, stages=pipeline(), load_model=lambda: "m")
    key = next(s.key for s in first.result.stages if s.name == "rewrite")
    path = CacheStore(tmp_path / "cache").action_path(str(key))
    data = json.loads(path.read_text())
    data["outputs"] = [o for o in data["outputs"] if o[0] != "model.onnx"]
    data.pop("declares")
    path.write_text(json.dumps(data))
    again = run_build(recipe(), settings, stages=pipeline(), load_model=lambda: "m")
    assert again.exit_code == 0
    assert [s.status for s in again.result.stages] == ["hit", "hit", "ran", "hit"]
    assert "cache entry corrupt" in again.result.stages[2].reason
