from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hyperexport.base import versions
from hyperexport.base.errors import CheckError
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.product.builds.session import BuildOutcome, run_build, variant_dir
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import FakeStage, StageBoom, pipeline
from tests.helpers.fake_recipe import recipe


def _settings(tmp_path: Path, cache: str = "cache", **kw: object) -> BuildSettings:
    return BuildSettings(
        cache_dir=str(tmp_path / cache),
        outputs_dir=tmp_path / "outputs",
        dry_run=bool(kw.get("dry_run", False)),
        force=tuple(kw.get("force", ())),  # type: ignore[arg-type]
    )


def test_variant_dir() -> None:
    assert variant_dir([]) == "default"
    assert variant_dir(["recipe=llama", "opset=17", "build.dry_run=true"]) == "opset=17"
    assert variant_dir(["opset=17", "dynamo=true"]) == "dynamo=true,opset=17"
    assert variant_dir(["+checkpoint=/a/b.pt"]) == "checkpoint=_a_b.pt"


def test_variant_names_need_no_quoting_and_stay_unique() -> None:
    """Issue 34: a quoted check.accept_vacuous override named its folder
    ``check.accept_vacuous=["…#0_out.2"]``."""
    quoted = ['check.accept_vacuous=["model.decoder.block.0.step#0/out.2"]']
    name = variant_dir(quoted)
    assert name.startswith("check.accept_vacuous=model.decoder.block.0.step_0_out.2~")
    assert re.fullmatch(r"[A-Za-z0-9._=,+~-]+", name)
    assert variant_dir(quoted) == name  # stable
    assert variant_dir(['check.accept_vacuous=["model.decoder.block.0.step_0/out.2"]']) != name
    assert variant_dir(["inputs.x.shape=[2,8]", "opset=17"]).startswith(
        "inputs.x.shape=2,8,opset=17~"
    )


def test_outputs_and_report(tmp_path: Path) -> None:
    outcome = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    out = tmp_path / "outputs" / "fake" / "default"
    assert outcome.exit_code == 0
    assert outcome.out_dir == out
    assert outcome.model_path == out / "model.onnx"
    report = json.loads((out / "report.json").read_text())
    assert report["recipe"]["name"] == "fake"
    assert report["recipe"]["file"] == "/recipes/fake.yaml"
    assert [(s["name"], s["status"]) for s in report["stages"]] == [
        ("trace", "ran"),
        ("export", "ran"),
        ("rewrite", "ran"),
        ("check", "ran"),
    ]
    assert all(len(s["key"]) == 64 and s["seconds"] >= 0 for s in report["stages"])
    assert report["artifacts"]["model"] == str(out / "model.onnx")
    assert report["check"]["params"] == {
        "check": {
            "accept_vacuous": [],
            "atol": 0.0001,
            "expect_ops": {},
            "function_scope": "all",
            "per_output": {},
            "quantized": {
                "decode": "gate",
                "max_rel_error": 0.35,
                "min_cosine": 0.95,
                "min_decode_cosine": 0.98,
                "min_token_agreement": 0.85,
                "min_top1": 0.75,
            },
            "generation": {"min_distinct": 3},
            "rtol": 0.001,
        },
        "opset": versions.torchscript_opset(DEFAULT_OPSET),  # the recipe leaves it unset
    }
    assert sorted(report["files"]) == ["check.json", "model.onnx"]
    assert (out / "summary.txt").read_text().rstrip().endswith(f"model: {out / 'model.onnx'}")
    # intermediate files stay in the cache
    assert not (out / "trace.json").exists()


def test_noop_rebuild_hits_and_does_not_recopy(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    model = tmp_path / "outputs" / "fake" / "default" / "model.onnx"
    mtime = model.stat().st_mtime_ns
    outcome = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert {s.status for s in outcome.result.stages} == {"hit"}
    assert model.stat().st_mtime_ns == mtime


def test_edited_output_is_restored(tmp_path: Path) -> None:
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert first.model_path is not None
    original = first.model_path.read_bytes()
    first.model_path.write_bytes(b"user scribbled here")
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert first.model_path.read_bytes() == original


def test_byte_identical_outputs_from_two_empty_caches(tmp_path: Path) -> None:
    a = run_build(recipe(), _settings(tmp_path, "c1"), stages=pipeline(), load_model=lambda: "m")
    assert a.model_path is not None
    first = a.model_path.read_bytes()
    a.model_path.unlink()
    b = run_build(recipe(), _settings(tmp_path, "c2"), stages=pipeline(), load_model=lambda: "m")
    assert {s.status for s in b.result.stages} == {"ran"}
    assert b.model_path is not None and b.model_path.read_bytes() == first


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    outcome = run_build(
        recipe(), _settings(tmp_path, dry_run=True), stages=pipeline(), load_model=lambda: "m"
    )
    assert outcome.lines[0] == "recipe: fake (/recipes/fake.yaml)"
    assert outcome.lines[1] == "trace: would run (no previous build)"
    assert outcome.report is None
    assert list(tmp_path.iterdir()) == []


def _build_failing_check(tmp_path: Path, error: Exception) -> BuildOutcome:
    """The fake pipeline whose check stage raises ``error``."""
    stages = list(pipeline())
    stages[3] = FakeStage(
        "check",
        reads=("check",),
        upstream=("trace", "rewrite"),
        publish=("check.json",),
        declares={"check": "check.json"},
        fail=lambda p: error,
    )
    return run_build(recipe(), _settings(tmp_path), stages=stages, load_model=lambda: "m")


def test_failed_stage_report_and_exit_code(tmp_path: Path) -> None:
    outcome = _build_failing_check(tmp_path, StageBoom("output 0 diverges", "layers.0"))
    assert outcome.exit_code == 1
    report = outcome.report
    assert report is not None
    assert report["status"] == "failed"
    assert report["failed_stage"] == "check"
    assert report["module_path"] == "layers.0"
    assert report["stages"][-1]["status"] == "failed"
    # an untyped cause is an internal error: its traceback is kept, and the summary says where
    assert "StageBoom: output 0 diverges" in report["traceback"]
    assert "raise " in report["traceback"] or "File " in report["traceback"]
    assert any('report.json\'s "traceback"' in line for line in outcome.lines)
    # the failed check's own output still reaches the report, and the model is there to inspect
    assert report["check"]["params"]["check"]["atol"] == 0.0001
    assert outcome.model_path is not None and outcome.model_path.is_file()


def test_stale_files_are_removed(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    out = tmp_path / "outputs" / "fake" / "default"
    assert (out / "check.json").exists()
    stages = pipeline()[:3]
    run_build(recipe(), _settings(tmp_path), stages=stages, load_model=lambda: "m")
    assert not (out / "check.json").exists()
    assert (out / "model.onnx").exists()


@pytest.mark.parametrize("size", [10, 0])
def test_corrupt_published_blob_is_rebuilt(tmp_path: Path, size: int) -> None:
    first = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert first.model_path is not None
    expected = first.model_path.read_bytes()
    first.model_path.unlink()
    digest = first.report["files"]["model.onnx"]["digest"]  # type: ignore[index]
    blob = tmp_path / "cache" / "blobs" / digest[:2] / digest
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.truncate(size)
    again = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    statuses = {s.name: s.status for s in again.result.stages}
    assert statuses == {"trace": "hit", "export": "hit", "rewrite": "ran", "check": "hit"}
    assert again.model_path is not None and again.model_path.read_bytes() == expected


def test_a_sweep_job_explains_against_its_own_variant(tmp_path: Path) -> None:
    """Jobs of a sweep share the recipe's name; each compares with its own previous build (its
    first with the recipe's default variant), never with whichever job ran last."""
    settings = _settings(tmp_path)

    def reasons(variant: str, **overrides: object) -> dict[str, str]:
        outcome = run_build(
            recipe(**overrides),
            settings,
            stages=pipeline(),
            load_model=lambda: "m",
            variant=variant,
        )
        assert outcome.exit_code == 0, outcome.lines
        return {s.name: s.reason for s in outcome.result.stages if s.status == "ran"}

    # opsets every torch's TorchScript exporter takes (torch 2.2 stops at 17)
    reasons("default", opset=16)
    assert reasons("opset=15", opset=15)["export"] == "opset 16→15"
    assert reasons("opset=17", opset=17)["export"] == "opset 16→17"  # not 15→17
    again = reasons("opset=15", opset=15, check__atol=1e-3)
    assert set(again) == {"check"} and again["check"] == "check.atol 0.0001→0.001"


@pytest.mark.parametrize("how", ["copy", "reflink"])
def test_a_variant_sharing_a_model_says_once_at_info_that_it_holds_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A ``check.*`` variant publishes the same model as the default one, a real model file
    byte for byte: without reflinks its folder holds a copy, which the build says in one INFO
    line (no WARNING: it is expected); a reflink shares the bytes and says nothing."""
    import logging

    from hyperexport.product.builds import publish

    real = publish.clone_or_copy_hashed

    def clone(src: Path, dst: Path) -> tuple[str, str]:
        return how, real(src, dst)[1]

    monkeypatch.setattr(publish, "clone_or_copy_hashed", clone)
    caplog.set_level(logging.INFO, logger=publish.__name__)
    settings = _settings(tmp_path)
    first = run_build(recipe(), settings, stages=pipeline(), load_model=lambda: "m")
    assert first.exit_code == 0
    caplog.clear()
    variant = "check.atol=0.001"
    again = run_build(
        recipe(check__atol=1e-3),
        settings,
        stages=pipeline(),
        load_model=lambda: "m",
        variant=variant,
    )
    assert {s.name for s in again.result.stages if s.status == "ran"} == {"check"}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    shares = [r.getMessage() for r in caplog.records if "copied (no reflinks" in r.getMessage()]
    default = (tmp_path / "outputs" / "fake" / "default").resolve()
    mine = tmp_path / "outputs" / "fake" / variant / "model.onnx"
    assert mine.read_bytes() == (default / "model.onnx").read_bytes()
    assert not mine.is_symlink() and mine.stat().st_nlink == 1  # a real file, never a link
    if how == "reflink":
        assert shares == []
        return
    (line,) = shares  # one line for the variant's model files
    assert "model.onnx" in line and str(default) in line
    assert [r.levelname for r in caplog.records if "copied (no reflinks" in r.getMessage()] == [
        "INFO"
    ]


def test_a_typed_failure_keeps_no_traceback(tmp_path: Path) -> None:
    """hyperexport's own errors say what is wrong and where: no traceback, no bug-report line."""
    outcome = _build_failing_check(tmp_path, CheckError("output 0 diverges"))
    assert outcome.exit_code == 1 and outcome.report is not None
    assert outcome.report["failed_stage"] == "check"
    assert outcome.report["traceback"] is None
    assert not any("traceback" in line for line in outcome.lines)
