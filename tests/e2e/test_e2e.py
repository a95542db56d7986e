"""End to end through the real stages (torch, the exporter, ONNX Runtime), in process.

A small local model package (written to a temporary directory) stands in for user code, so the
tests can edit its source. Each build takes about a second once torch is imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.builds import (
    TOY_SOURCE,
    build,
    reasons,
    toy_package_in,
    toy_package_recipe,
)
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.rebuilds import reran_from
from tests.helpers.statuses import statuses


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


# Build mechanics are under test here, not the optional passes: the helper keeps rewrites minimal.
toy_recipe = toy_package_recipe
#: An opset other than the recipe's default (TEST_OPSET, which torch 2.2 lowers to 17).
LOWER = TEST_OPSET - 1


RAN_ALL = {
    "trace": "ran",
    "export": "ran",
    "rewrite": "ran",
    "quantize": "ran",
    "evaluate": "ran",
    "check": "ran",
}
HIT_ALL = {
    "trace": "hit",
    "export": "hit",
    "rewrite": "hit",
    "quantize": "hit",
    "evaluate": "hit",
    "check": "hit",
}


def test_cold_build_then_noop(toy_package: Path, tmp_path: Path) -> None:
    loads: list[int] = []
    cold = build(toy_recipe(toy_package), tmp_path, loads=loads)
    assert cold.exit_code == 0, cold.lines
    assert statuses(cold) == RAN_ALL
    assert loads == [1]  # trace and export share one live model
    assert cold.model_path == tmp_path / "outputs" / "toy" / "default" / "model.onnx"
    assert cold.model_path.is_file()
    report = json.loads((cold.out_dir / "report.json").read_text())
    assert report["artifacts"]["model"] == str(cold.model_path)
    assert report["check"]["ok"] is True
    tree = report["functions"]
    assert [f["calls"] for f in tree] == [1, 1]
    assert {f["class"].rsplit(".", 1)[-1] for f in tree} == {"Block"}
    assert any("Block → hyperexport.fn::" in line for line in cold.lines)
    assert cold.lines[-1] == f"model: {cold.model_path}"
    warm = build(toy_recipe(toy_package), tmp_path, loads=loads)
    assert statuses(warm) == HIT_ALL
    assert loads == [1]


def test_tolerance_change_reruns_check_only(toy_package: Path, tmp_path: Path) -> None:
    build(toy_recipe(toy_package), tmp_path)
    again = build(toy_recipe(toy_package, check__atol=1e-3), tmp_path)
    assert statuses(again) == reran_from("check")
    assert reasons(again)["check"] == "check.atol 0.0001→0.001"


def test_opset_change_reruns_export_rewrite_check_not_trace(
    toy_package: Path, tmp_path: Path
) -> None:
    build(toy_recipe(toy_package), tmp_path)
    again = build(toy_recipe(toy_package, opset=LOWER), tmp_path)
    assert statuses(again) == reran_from("export")
    assert reasons(again)["export"] == f"opset {TEST_OPSET}→{LOWER}"
    assert f"  export: ran (opset {TEST_OPSET}→{LOWER})" in "\n".join(again.lines)


def test_source_edit_reruns_the_stages_that_run_it(toy_package: Path, tmp_path: Path) -> None:
    """Trace and export run the model's code; rewrite and check read only their outputs,
    which a comment does not change (an early cutoff: their keys hold upstream digests)."""
    source = toy_package / "net.py"
    build(toy_recipe(toy_package), tmp_path)
    try:
        source.write_text(source.read_text() + "\n# an edit\n")
        again = build(toy_recipe(toy_package), tmp_path)
    finally:
        source.write_text(TOY_SOURCE)
    assert statuses(again) == {
        "trace": "ran",
        "export": "ran",
        "rewrite": "hit",
        "quantize": "hit",
        "evaluate": "hit",
        "check": "hit",
    }
    assert reasons(again)["trace"].startswith("model code changed (hx_toy")
    assert reasons(again)["export"].startswith("model code changed (hx_toy")


def test_dry_run_reports_and_writes_nothing(toy_package: Path, tmp_path: Path) -> None:
    build(toy_recipe(toy_package), tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = build(toy_recipe(toy_package, opset=LOWER), tmp_path, dry_run=True)
    assert plan.report is None
    change = f"opset {TEST_OPSET}→{LOWER}"
    assert plan.lines[1:7] == (
        "trace: hit",
        f"export: would run ({change})",
        "rewrite: would run (after export)",
        "quantize: would run (after rewrite)",
        f"evaluate: would run (after export, rewrite, quantize; {change})",
        f"check: would run (after export, rewrite, quantize, evaluate; {change})",
    )
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_force_reruns_the_named_stage(toy_package: Path, tmp_path: Path) -> None:
    build(toy_recipe(toy_package), tmp_path)
    again = build(toy_recipe(toy_package), tmp_path, force=["export"])
    assert statuses(again)["export"] == "ran"
    assert reasons(again)["export"] == "forced"
    assert statuses(again)["trace"] == "hit"


def test_two_empty_caches_give_byte_identical_models(toy_package: Path, tmp_path: Path) -> None:
    first = build(toy_recipe(toy_package), tmp_path / "a")
    second = build(toy_recipe(toy_package), tmp_path / "b")
    assert statuses(second) == RAN_ALL
    assert first.model_path is not None and second.model_path is not None
    assert first.model_path.read_bytes() == second.model_path.read_bytes()


def test_truncated_blob_is_rebuilt(toy_package: Path, tmp_path: Path) -> None:
    first = build(toy_recipe(toy_package), tmp_path)
    assert first.report is not None and first.model_path is not None
    expected = first.model_path.read_bytes()
    digest = first.report["files"]["model.onnx"]["digest"]
    blob = tmp_path / "cache" / "blobs" / digest[:2] / digest
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.truncate(100)
    again = build(toy_recipe(toy_package), tmp_path)
    assert statuses(again) == {
        "trace": "hit",
        "export": "hit",
        "rewrite": "ran",
        "quantize": "hit",
        "evaluate": "hit",
        "check": "hit",
    }
    assert reasons(again)["rewrite"] == "cache entry corrupt"
    assert again.model_path is not None and again.model_path.read_bytes() == expected


def test_failing_stage_names_module_and_caches_nothing(toy_package: Path, tmp_path: Path) -> None:
    outcome = build(toy_recipe(toy_package, model__broken_layer=1), tmp_path)
    assert outcome.exit_code == 1
    report = outcome.report
    assert report is not None
    assert report["status"] == "failed"
    assert report["failed_stage"] == "trace"
    assert report["module_path"] == "blocks.1"
    assert "stage 'trace' failed at module 'blocks.1'" in report["error"]
    assert statuses(outcome) == {"trace": "failed"}
    assert not (tmp_path / "cache" / "actions").exists()
    assert not (tmp_path / "cache" / "blobs").exists()


def test_external_data_is_published_and_checked(toy_package: Path, tmp_path: Path) -> None:
    outcome = build(
        toy_recipe(toy_package, external_data=True, external_data_threshold=0), tmp_path
    )
    assert outcome.exit_code == 0, outcome.lines
    assert outcome.report is not None
    assert "model.onnx.data" in outcome.report["files"]
    assert (outcome.out_dir / "model.onnx.data").is_file()
    assert outcome.report["check"]["ok"] is True


def test_default_recipe_builds_byte_identical_from_empty_caches(tmp_path: Path) -> None:
    from hyperexport.product.config import compose_recipe

    recipe, _ = compose_recipe([])
    first = build(recipe, tmp_path / "a")
    assert first.exit_code == 0, first.lines
    second = build(recipe, tmp_path / "b")
    assert statuses(second) == RAN_ALL
    assert first.model_path is not None and second.model_path is not None
    assert first.model_path.read_bytes() == second.model_path.read_bytes()


def test_hiera_typo_behind_a_reexport_fails_as_a_recipe_error(
    toy_package: Path, tmp_path: Path
) -> None:
    """``torch.nn`` re-exports its classes, so only the import at trace time can tell."""
    from hyperexport.base.errors import RecipeError

    recipe = toy_recipe(toy_package, hiera=["torch.nn.Linearr"])
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 1
    error = outcome.result.error
    assert error is not None and isinstance(error.__cause__, RecipeError)
    assert error.__cause__.field == "hiera[0]"
    assert "did you mean 'Linear'?" in error.__cause__.reason


def test_failed_check_is_not_cached_and_reruns_alone(tmp_path: Path) -> None:
    from hyperexport.product.config import compose_recipe

    strict, _ = compose_recipe(["check.atol=1e-12", "check.rtol=1e-12"])
    failed = build(strict, tmp_path)
    assert failed.exit_code == 1
    assert failed.report is not None
    assert failed.report["failed_stage"] == "check"
    assert failed.report["check"]["ok"] is False  # the failed check's report is kept
    assert failed.model_path is not None and failed.model_path.is_file()  # there to inspect
    again = build(strict, tmp_path)
    assert statuses(again) == {
        "trace": "hit",
        "export": "hit",
        "rewrite": "hit",
        "quantize": "hit",
        "evaluate": "hit",
        "check": "failed",
    }
    loose, _ = compose_recipe([])
    fixed = build(loose, tmp_path)
    assert statuses(fixed) == reran_from("check")
    assert reasons(fixed)["check"] == "check.atol 1e-12→0.0001, check.rtol 1e-12→0.001"
    assert fixed.report is not None and fixed.report["check"]["ok"] is True


def test_a_failed_comparison_is_localised_by_the_check_stage(tmp_path: Path) -> None:
    """evaluate ran no function alone (scope none); the failing whole-model comparison makes the
    check stage run them, in execution order, until it names the first divergent module."""
    from hyperexport.product.config import compose_recipe

    scoped, _ = compose_recipe(["check.function_scope=none"])
    passed = build(scoped, tmp_path)
    assert passed.exit_code == 0 and passed.report is not None
    assert passed.report["check"]["functions"] == []
    strict, _ = compose_recipe(
        ["check.function_scope=none", "check.atol=1e-12", "check.rtol=1e-12"]
    )
    failed = build(strict, tmp_path)
    assert statuses(failed)["evaluate"] == "hit" and statuses(failed)["check"] == "failed"
    assert failed.report is not None
    functions = failed.report["check"]["functions"]
    assert [(f["call_id"], f["reason"]) for f in functions] == [("layers.0#0", "localisation")]
    assert failed.report["check"]["first_divergent_module"] == "layers.0"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["llama", "zoo_mixtral"])
def test_dynamo_builds_in_two_processes_publish_the_same_bytes(recipe: str, tmp_path: Path) -> None:
    """Two processes (other addresses, other hash seeds), two empty caches: every published file
    but the run records is the same. Before the unit initializers were put in the batch graph's
    order, these two recipes differed in both pairs of runs tried (gpt2 and zoo_qwen2_moe did not)."""
    import hashlib
    import os
    import subprocess
    import sys

    published = []
    for run, seed in (("a", "1"), ("b", "2")):
        command = [
            sys.executable, "-m", "hyperexport", f"recipe={recipe}", "dynamo=true",
            f"build.cache_dir={tmp_path / run / 'cache'}",
            f"build.outputs_dir={tmp_path / run / 'out'}",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        folder = tmp_path / run / "out" / recipe / "dynamo=true"
        published.append({
            path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in folder.iterdir()
            if path.is_file() and path.name not in ("report.json", "report.html", "summary.txt")
        })  # fmt: skip
    assert "model.onnx" in published[0]
    assert published[0] == published[1]
