"""The hyperexport code each pipeline stage's key covers (the engine's code closure, run on
the package)."""

from __future__ import annotations

from hyperexport.engine.code_closure import package_sources, stage_code
from hyperexport.product.builds.fingerprint import KEYED_PACKAGE


def _files(stage: str) -> set[str]:
    files = stage_code(f"hyperexport.product.stages.{stage}", (), package_sources(KEYED_PACKAGE))
    return {p.removeprefix("hyperexport/") for p in files}


def _under(files: set[str], *folders: str) -> set[str]:
    return {f for f in files if f.startswith(folders)}


def test_check_runs_check_and_contracts_only() -> None:
    files = _files("check")
    # The judge, and the evaluator it loads (inside a function) to localise a failure.
    assert {
        "library/check/results.py",
        "library/check/judge.py",
        "library/check/model_evaluator.py",
    } <= files
    assert "base/contracts/capture_files.py" in files
    assert not _under(
        files,
        "library/capture/",
        "library/export/",
        "library/passes/",
        "library/transformers/",
        "library/api.py",
    )
    assert "product/stages/trace.py" not in files  # stages/__init__ loads no sibling stage


def test_evaluate_runs_the_evaluator_not_the_judge() -> None:
    files = _files("evaluate")
    assert {
        "library/check/model_evaluator.py",
        "library/check/function_runs.py",
        "library/check/evaluation.py",
    } <= files
    assert "library/check/judge.py" not in files  # a judging change reruns check, not evaluate
    assert not _under(
        files,
        "library/capture/",
        "library/export/",
        "library/passes/",
        "library/transformers/",
        "library/api.py",
    )


def test_rewrite_runs_the_passes_not_the_exporter_or_the_check() -> None:
    files = _files("rewrite")
    assert {
        "library/passes/pipeline.py",
        "library/passes/promote_attention.py",
        "library/model_file.py",
    } <= files
    assert not _under(
        files, "library/capture/", "library/export/", "library/check/", "library/api.py"
    )


def test_export_and_trace_do_not_run_passes_or_check() -> None:
    export, trace = _files("export"), _files("trace")
    assert {
        "library/export/units.py",
        "library/export/fallback.py",
        "library/capture/hooks.py",
    } <= export
    assert "library/capture/hooks.py" in trace
    for files in (export, trace):
        assert not _under(files, "library/passes/", "library/check/")
    assert not _under(trace, "library/export/")


def test_digests_follow_file_contents() -> None:
    sources = package_sources(KEYED_PACKAGE)
    files = stage_code("hyperexport.product.stages.check", (), sources)
    assert (
        files["hyperexport/library/check/results.py"]
        == sources["hyperexport.library.check.results"].digest
    )
