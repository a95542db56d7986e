"""Issue 12: the live model is released once no later stage needs it (check runs without it)."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from hyperexport.product.builds.session import run_build
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import pipeline
from tests.helpers.fake_recipe import recipe


class _Model(dict[str, str]):
    """Stands for the weights (a dict: the fake stages write what they saw as JSON); the test
    keeps only a weak reference to it."""


def test_the_model_is_released_after_the_last_stage_that_needs_it(tmp_path: Path) -> None:
    refs: list[weakref.ref[_Model]] = []

    def load() -> _Model:
        model = _Model()
        refs.append(weakref.ref(model))
        return model

    alive_in: dict[str, bool] = {}

    def probe(name: str) -> Any:
        def check(params: Any) -> None:
            alive_in[name] = bool(refs) and refs[0]() is not None

        return check

    stages = pipeline()
    for stage in stages:
        stage.fail = probe(stage.name)
    settings = BuildSettings(
        cache_dir=str(tmp_path / "cache"),
        outputs_dir=tmp_path / "out",
        dry_run=False,
        force=(),
    )
    outcome = run_build(recipe(), settings, stages=stages, load_model=load)
    assert outcome.exit_code == 0
    assert len(refs) == 1  # loaded once, for trace and export
    assert alive_in == {"trace": True, "export": True, "rewrite": False, "check": False}
