"""Every stage's entry is complete or a miss, through the real stages (issue 32).

Complete is what the stage's code declares for the build's params (``Stage.outputs``): a
rewrite entry without ``model.onnx`` or an export entry without ``units/u000.onnx`` was a hit,
and every later build failed with rc 1; ``cache verify`` said "0 entries dropped".
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperexport.engine.store import CacheStore
from hyperexport.product.builds.session import BuildOutcome
from hyperexport.product.cli import cache as cache_cli
from hyperexport.product.config import Recipe
from hyperexport.product.stages import PIPELINE
from tests.helpers.builds import build, toy_package_in
from tests.helpers.builds import toy_package_recipe as toy_recipe
from tests.helpers.statuses import statuses

#: Per stage, a file its code declares for an int8 build of the toy (none shared with another
#: stage's entry, so that removing its blob leaves only that entry dangling).
DECLARED = {
    "trace": "capture_spec.json",
    "export": "units/u000.onnx",
    "rewrite": "model.onnx",
    "quantize": "model.quantized.onnx",
    "evaluate": "evaluation.npz",
    "check": "check.txt",
}


def _recipe(pkg: Path) -> Recipe:
    # Three dimensions: torch exports the blocks' Linear as a MatMul (2-D: a Gemm), to quantize.
    return toy_recipe(pkg, quantize__method="int8_dynamic", inputs__x__shape=[1, 2, 8])


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, BuildOutcome]]:
    """The toy package, and a cache holding one complete int8 build of it."""
    root = tmp_path_factory.mktemp("incomplete")
    with toy_package_in(root / "pkg") as pkg:
        first = build(_recipe(pkg), root)
        assert first.exit_code == 0, first.lines
        yield pkg, root / "cache", first


def _cache(toy: tuple[Path, Path, BuildOutcome], tmp_path: Path) -> CacheStore:
    shutil.copytree(toy[1], tmp_path / "cache")
    return CacheStore(tmp_path / "cache")


def _without(store: CacheStore, key: str, path: str) -> None:
    """Entry ``key`` without output ``path`` (its other files and digests untouched)."""
    record = json.loads(store.action_path(key).read_text())
    kept = [o for o in record["outputs"] if o[0] != path]
    assert len(kept) == len(record["outputs"]) - 1
    store.action_path(key).write_text(json.dumps({**record, "outputs": kept}))


def test_the_declarations_name_these_files() -> None:
    params = {"task": "forward", "quantize": {"method": "int8_dynamic", "block_size": 32}}
    for stage in PIPELINE:
        slice_ = {k: v for k, v in params.items() if any(r.split(".")[0] == k for r in stage.reads)}
        assert DECLARED[stage.name] in stage.outputs(slice_).values(), stage.name


def test_an_entry_lacking_a_declared_output_is_a_miss_at_every_stage(
    toy: tuple[Path, Path, BuildOutcome], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pkg, _, first = toy
    store = _cache(toy, tmp_path)
    for stage, path in DECLARED.items():
        _without(store, first.result.entries[stage].key, path)
    with caplog.at_level(logging.WARNING):
        again = build(_recipe(pkg), tmp_path)
    assert again.exit_code == 0, again.lines
    assert set(statuses(again).values()) == {"ran"}
    assert {s.reason for s in again.result.stages} == {"cache entry corrupt"}
    for stage, path in DECLARED.items():
        assert f"of stage {stage} lacks {path}; treating it as a miss" in caplog.text
    # Rebuilt whole: the same files as the first build, every entry complete again.
    for stage in DECLARED:
        assert again.result.entries[stage].digests() == first.result.entries[stage].digests()


def test_verify_drops_incomplete_and_dangling_entries_at_every_stage(
    toy: tuple[Path, Path, BuildOutcome], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, first = toy
    for case in ("incomplete", "dangling"):
        store = _cache(toy, tmp_path / case)
        for stage, path in DECLARED.items():
            entry = first.result.entries[stage]
            if case == "incomplete":
                _without(store, entry.key, path)
            else:
                store.blob_path(entry.digests()[path]).unlink()
        code = cache_cli.main(["verify", "--cache-dir", str(store.root)])
        lines = capsys.readouterr().out.splitlines()
        assert code == 1, lines
        for stage, path in DECLARED.items():
            key = first.result.entries[stage].key[:12]
            why = f"incomplete (lacks {path})" if case == "incomplete" else f"blob of {path} is"
            assert any(
                line.startswith(f"entry {key} ({stage}, toy): dropped, {why}") for line in lines
            )
        assert f"{len(DECLARED)} entries dropped" in lines[-1]
        assert not any(store.action_path(e.key).exists() for e in first.result.entries.values())
        assert cache_cli.main(["verify", "--cache-dir", str(store.root)]) == 0
        capsys.readouterr()
