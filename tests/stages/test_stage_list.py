"""The declared pipeline: its order, its names, and what each stage reads."""

from __future__ import annotations

from hyperexport.contracts.names import STAGE_NAMES
from hyperexport.stages import PIPELINE


def test_stage_names_are_the_pipeline_in_order() -> None:
    assert tuple(s.name for s in PIPELINE) == STAGE_NAMES


def test_every_upstream_comes_earlier() -> None:
    seen: set[str] = set()
    for stage in PIPELINE:
        assert set(stage.upstream) <= seen, stage.name
        seen.add(stage.name)


def test_evaluate_reads_no_tolerance_and_check_reads_them() -> None:
    by_name = {s.name: s for s in PIPELINE}
    evaluate, check = by_name["evaluate"].reads, by_name["check"].reads
    assert not any(r in ("check", "check.atol", "check.rtol", "check.per_output") for r in evaluate)
    assert "check.function_scope" in evaluate and "check.atol" in check
    assert "evaluate" in by_name["check"].upstream


def test_quantize_follows_rewrite_and_only_check_reads_its_comparison() -> None:
    by_name = {s.name: s for s in PIPELINE}
    assert STAGE_NAMES.index("quantize") == STAGE_NAMES.index("rewrite") + 1
    # The whole quantize section, and how model files are written.
    assert set(by_name["quantize"].reads) == {"quantize", "external_data", "external_data_threshold"}
    assert "quantize" in by_name["check"].upstream  # judges the comparison
    assert "quantize" not in by_name["evaluate"].upstream  # the float model vs torch, as before
