"""sweep.json has seconds per job and per stage."""

from __future__ import annotations

from pathlib import Path

from hyperexport.product.builds import sweep


def _report(trace: float, export: float) -> dict[str, object]:
    return {
        "status": "ok",
        "stages": [
            {"name": "trace", "status": "ran", "key": "a", "reason": "", "seconds": trace},
            {"name": "export", "status": "hit", "key": "b", "reason": "", "seconds": export},
        ],
    }


def test_sweep_json_has_seconds_per_job_and_stage(tmp_path: Path) -> None:
    sweep.write_job_record(
        tmp_path, sweep.job_record(0, ["opset=17"], 0, _report(1.5, 0.25), seconds=2.0)
    )
    sweep.write_job_record(
        tmp_path, sweep.job_record(1, ["opset=18"], 0, _report(0.5, 0.75), seconds=1.5)
    )
    result = sweep.collect(tmp_path)
    assert [j["seconds"] for j in result["jobs"]] == [2.0, 1.5]
    assert [s["seconds"] for s in result["jobs"][0]["stages"]] == [1.5, 0.25]
    assert result["seconds"] == {"jobs": 3.5, "stages": {"trace": 2.0, "export": 1.0}}
