"""Every job of a sweep is validated before the first one runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hyperexport.product.cli import build
from hyperexport.product.cli.sweep_check import sweep_jobs


def test_sweep_jobs_expand_like_hydras_basic_sweeper() -> None:
    assert sweep_jobs(["recipe=llama", "opset=17"]) is None
    assert sweep_jobs(["-m", "opset=17,18", "dynamo=false,true"]) == [
        ["opset=17", "dynamo=False"],  # as Hydra writes the jobs
        ["opset=17", "dynamo=True"],
        ["opset=18", "dynamo=False"],
        ["opset=18", "dynamo=True"],
    ]


def test_an_invalid_value_refuses_the_sweep_before_any_job_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    outputs = tmp_path / "outputs"
    code = build.main(
        [
            "-m",
            "functions=per_instance,per_bogus,per_type",
            f"build.outputs_dir={outputs}",
            f"build.cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(m.startswith("job 1 (functions=per_bogus):") and "functions" in m for m in errors)
    assert "1 of 3 jobs refused; none was run" in errors
    assert not outputs.exists() and not (tmp_path / "cache").exists()


def test_a_glob_over_the_recipe_group_expands_to_its_recipes() -> None:
    from hyperexport.product.config import RECIPES_DIR, register_configs

    register_configs(None)
    jobs = sweep_jobs(["-m", "recipe=glob(*)"])
    assert jobs == [[f"recipe={p.stem}"] for p in sorted(RECIPES_DIR.glob("*.yaml"))]
