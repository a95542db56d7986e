"""The declared pipeline: its order, its names, and what each stage reads."""

from __future__ import annotations

from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.product.stages import PIPELINE


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


def test_quantize_follows_rewrite_and_evaluate_runs_what_it_wrote() -> None:
    by_name = {s.name: s for s in PIPELINE}
    assert STAGE_NAMES.index("quantize") == STAGE_NAMES.index("rewrite") + 1
    # The whole quantize section, and how model files are written.
    assert set(by_name["quantize"].reads) == {
        "quantize",
        "external_data",
        "external_data_threshold",
    }
    assert by_name["quantize"].upstream == ("rewrite",)  # it compares nothing: no reference
    # Issue 32: evaluate runs the quantized model file (the published one) against the float
    # one; the check judges that, and names the file by the digest its key covers.
    assert "quantize" in by_name["evaluate"].upstream
    assert {"quantize.method", "quantize.block_size"} <= set(by_name["evaluate"].reads)
    assert {"quantize", "evaluate"} <= set(by_name["check"].upstream)
