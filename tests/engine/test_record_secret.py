"""Run records never hold a plain digest of a declared environment value, while keys stay the
same on every machine and reasons still name a changed value (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hyperexport.engine.hashing import sha256_text
from hyperexport.engine.keys import recorded_material
from hyperexport.engine.record_secret import SECRET_FILE, record_secret
from hyperexport.engine.runner import BuildRequest, BuildResult, Runner
from hyperexport.engine.store import CacheStore
from tests.engine.fakes import pipeline

RECIPE: dict[str, Any] = {
    "model": {"_target_": "m.f", "seed": 0},
    "inputs": {"x": {"shape": [1]}},
    "hiera": ["m.C"],
    "opset": 18,
    "dynamo": False,
    "rewrite": {"optimize": True},
    "check": {"atol": 1e-4},
}
ENV = {"python": "3.11", "packages": {"torch": "2.13.0"}}


def _model(value: str | None) -> dict[str, Any]:
    digest = None if value is None else sha256_text(value)
    return {"code": {}, "weights": {"seed": 0}, "env": {"HX_FLAG": digest}}


def _build(store: CacheStore, value: str | None, *, dry_run: bool = False) -> BuildResult:
    request = BuildRequest(
        name="fake",
        config=RECIPE,
        source="/recipes/fake.yaml",
        stages=pipeline(),
        env=ENV,
        model=_model(value),
        dry_run=dry_run,
    )
    return Runner(store, lambda: "m").run(request)


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_records_hold_no_plain_digest_and_keys_agree_across_caches(tmp_path: Path) -> None:
    value = "pin-4821"  # short: a plain digest of it is found by trying guesses
    one, two = CacheStore(tmp_path / "one"), CacheStore(tmp_path / "two")
    first, second = _build(one, value), _build(two, value)
    keys = {s.name: s.key for s in first.stages}
    assert keys == {s.name: s.key for s in second.stages}  # machine-independent keys
    plain = sha256_text(value).encode()
    for store in (one, two):
        assert plain not in _all_bytes(store.root)
        assert value.encode() not in _all_bytes(store.root)
        record = json.loads(store.run_record_path("fake", "trace").read_text())
        assert record["material"]["model"]["env"]["HX_FLAG"] not in (None, plain.decode())
        assert (store.root / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    # the same value looks different in each cache: nothing to correlate between them
    recorded = [
        json.loads(s.run_record_path("fake", "trace").read_text())["material"]["model"]["env"]
        for s in (one, two)
    ]
    assert recorded[0] != recorded[1]


def test_a_changed_value_is_a_reason_within_one_cache(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache")
    _build(store, "a")
    assert {s.status for s in _build(store, "a").stages} == {"hit"}
    changed = _build(store, "b")
    trace = next(s for s in changed.stages if s.name == "trace")
    assert trace.status == "ran" and trace.reason == "env HX_FLAG changed"
    unset = next(s for s in _build(store, None).stages if s.name == "trace")
    assert unset.reason == "env HX_FLAG unset"
    plan = _build(CacheStore(store.root, read_only=True), "c", dry_run=True)
    assert next(s for s in plan.stages if s.name == "trace").reason == "env HX_FLAG set"


def test_a_record_written_before_keyed_digests_is_rewritten_on_a_hit(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache")
    _build(store, "short")
    path = store.run_record_path("fake", "trace")
    record = json.loads(path.read_text())
    record["material"]["model"]["env"]["HX_FLAG"] = sha256_text("short")  # as older versions did
    path.write_text(json.dumps(record))
    assert {s.status for s in _build(store, "short").stages} == {"hit"}
    assert sha256_text("short").encode() not in path.read_bytes()


def test_the_secret_is_made_once_and_never_by_a_read_only_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    assert record_secret(root, create=False) is None
    assert not root.exists()
    made = record_secret(root, create=True)
    assert made is not None and len(made) == 32
    assert record_secret(root, create=True) == made == record_secret(root, create=False)
    assert [p.name for p in (root / SECRET_FILE).parent.iterdir()] == [SECRET_FILE.name]
    (root / SECRET_FILE).write_bytes(b"short")  # damaged: replaced, with a WARNING
    again = record_secret(root, create=True)
    assert again is not None and again != made and len(again) == 32


def test_recorded_material_leaves_the_rest_alone() -> None:
    material = {"stage": "trace", "model": _model("v")}
    assert recorded_material(material, None) == material
    keyed = recorded_material(material, b"k" * 32)
    assert keyed["stage"] == "trace" and keyed["model"]["code"] == {}
    assert keyed["model"]["env"]["HX_FLAG"] != material["model"]["env"]["HX_FLAG"]
    assert recorded_material({"model": _model(None)}, b"k" * 32)["model"]["env"] == {
        "HX_FLAG": None
    }
    assert material["model"]["env"]["HX_FLAG"] == sha256_text("v")  # not changed in place
