"""A declared environment value enters the keys only: no file a build writes (run records,
entries, dependency records, report, summary) nor the lock holds the value or its plain
digest (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.engine.hashing import canonical_json, sha256_text
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import pipeline
from tests.helpers.fake_recipe import recipe

VALUE = "pin-4821"  # short: a plain digest of it is found by trying guesses


def _written(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_no_file_a_build_writes_holds_the_value_or_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HX_MODEL_FLAG", VALUE)
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "outputs", False, ())
    built = run_build(
        recipe(env=["HX_MODEL_FLAG"]), settings, stages=pipeline(), load_model=lambda: "m"
    )
    assert built.exit_code == 0
    everything = _written(tmp_path / "cache") + _written(tmp_path / "outputs")
    assert b"HX_MODEL_FLAG" in everything  # the name is recorded (the recipe's field)
    assert sha256_text(VALUE).encode() not in everything
    assert VALUE.encode() not in everything

    monkeypatch.setenv("HX_MODEL_FLAG", "pin-9930")
    again = run_build(
        recipe(env=["HX_MODEL_FLAG"]), settings, stages=pipeline(), load_model=lambda: "m"
    )
    reasons = {s.name: s.reason for s in again.result.stages}
    assert reasons["trace"] == "env HX_MODEL_FLAG changed"


def test_the_lock_keeps_the_names_of_env_values_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyperexport.product.cli.lock_file import Variant, variant_inputs

    variant = Variant("tiny_llama", ("env=[HX_MODEL_FLAG]",))
    monkeypatch.setenv("HX_MODEL_FLAG", VALUE)
    first = variant_inputs(variant)
    monkeypatch.setenv("HX_MODEL_FLAG", "pin-9930")
    assert variant_inputs(variant) == first  # the machine's value is not locked
    assert sha256_text(VALUE) not in canonical_json(first)
    assert first["fields"]["env"] == ["HX_MODEL_FLAG"]
