"""A single build composes its config once, into the same config ``hydra.main`` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra._internal.hydra import Hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from hyperexport.product.cli import build
from tests.helpers.release_skips import NEEDS_OPSET_18


def _spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[dict[str, Any]]]:
    """Record the run mode of every composition, and each job's config (nothing is built)."""
    modes: list[Any] = []
    jobs: list[dict[str, Any]] = []
    compose = Hydra.compose_config

    def counted(self: Hydra, *args: Any, **kwargs: Any) -> Any:
        modes.append(kwargs.get("run_mode"))
        return compose(self, *args, **kwargs)

    def job(cfg: DictConfig) -> int:
        hydra: Any = OmegaConf.to_container(HydraConfig.get(), resolve=True)
        jobs.append({"cfg": OmegaConf.to_container(cfg, resolve=True), "hydra": hydra})
        return 0

    monkeypatch.setattr(Hydra, "compose_config", counted)
    monkeypatch.setattr(build, "build_from_config", job)
    return modes, jobs


def test_a_single_build_composes_once_into_what_hydra_main_composes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes, jobs = _spy(monkeypatch)
    args = [
        "opset=17",
        f"build.cache_dir={tmp_path / 'cache'}",
        f"build.outputs_dir={tmp_path / 'outputs'}",
    ]
    assert build.main(args) == 0
    assert modes == [RunMode.RUN]
    # `--run` (a Hydra flag) goes through hydra.main, which composes twice
    assert build.main(["--run", *args]) == 0
    assert modes[1:] == [RunMode.MULTIRUN, RunMode.RUN]
    once, twice = jobs
    assert once["cfg"] == twice["cfg"]
    assert once["cfg"]["opset"] == 17
    for part in ("job", "overrides", "run", "mode", "job_logging", "callbacks"):
        assert once["hydra"][part] == twice["hydra"][part], part
    assert once["hydra"]["runtime"]["choices"] == twice["hydra"]["runtime"]["choices"]


@NEEDS_OPSET_18  # a sweep over opset=17,18
def test_a_sweep_still_goes_through_hydra_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes, jobs = _spy(monkeypatch)
    code = build.main(
        [
            "-m",
            "opset=17,18",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'outputs'}",
        ]
    )
    assert code == 0
    assert [job["cfg"]["opset"] for job in jobs] == [17, 18]
    assert RunMode.MULTIRUN in modes  # hydra.main learning the mode (jobs are validated first)
