from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperexport.engine.runner import BuildRequest, Runner
from hyperexport.engine.spans import collecting, span
from hyperexport.engine.stage import StageInputs
from hyperexport.engine.store import CacheStore
from tests.engine.fakes import CONFIG, ENV, MODEL, FakeStage, pipeline


def test_spans_add_up_by_name_and_nest() -> None:
    with collecting() as spans:
        with span("outer"):
            time.sleep(0.02)
            with span("inner"):
                time.sleep(0.02)
        with span("inner"):
            time.sleep(0.02)
    assert set(spans) == {"outer", "inner"}
    assert spans["outer"] >= 0.04 and spans["inner"] >= 0.04


def test_a_span_outside_a_collection_is_dropped_and_a_collection_ends() -> None:
    with span("alone"):
        pass
    with collecting() as first:
        pass
    with span("after"):
        pass
    assert first == {}


def test_a_span_that_raises_still_counts() -> None:
    with collecting() as spans, pytest.raises(KeyError), span("failing"):
        raise KeyError("x")
    assert "failing" in spans


def test_a_span_needs_a_name() -> None:
    with pytest.raises(ValueError, match="name"), span(""):
        pass


@dataclass
class _SpanStage(FakeStage):
    """A fake stage that marks part of its work as a span."""

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        with span("part"):
            time.sleep(0.05)
        super().run(params, inputs, out_dir)


def test_the_runner_reports_a_stage_s_spans(store: CacheStore) -> None:
    first, *rest = pipeline()
    stages = (_SpanStage(**{f: getattr(first, f) for f in first.__dataclass_fields__}), *rest)
    request = BuildRequest(
        name="fake", config=CONFIG, source="/r.yaml", stages=stages, env=ENV, model=MODEL
    )
    result = Runner(store, lambda: "live-model").run(request)
    traced = result.stages[0]
    assert set(traced.spans) == {"part"} and 0.05 <= traced.spans["part"] <= traced.seconds
    assert traced.to_json()["spans"] == {"part": round(traced.spans["part"], 4)}
    assert ", part " in traced.line()
    assert all(not s.spans and "spans" not in s.to_json() for s in result.stages[1:])
    again = Runner(store, lambda: "live-model").run(request)
    assert again.stages[0].status == "hit" and not again.stages[0].spans


def test_spans_read_as_people_read_them() -> None:
    from hyperexport.engine.spans import describe

    assert describe({"reference decode": 10.466, "other": 1.0}) == (
        "reference decode 10.47s, other 1.00s"
    )
    assert describe({}) == ""
