"""The command line, run as users run it: ``python -m hyperexport`` in a subprocess.

Builds use a small local model package (written to a temporary directory) and a recipe file
outside the repository, so they are fast and also cover ``recipe_file=``. Every subprocess runs
from an unrelated working directory: nothing may depend on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.builds import TOY_SOURCE

HEAVY = ("torch", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "transformers")

TOY_RECIPE = """\
# @package _global_
name: toy
model:
  _target_: hx_toy.net.make
  seed: 0
inputs:
  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}
hiera:
  - hx_toy.net.Block
rewrite: {optimize: false, fuse_constants: false}
"""

# Runs main() and then reports which heavy modules the process imported.
PROBE = f"""
import json, sys
from hyperexport.__main__ import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print("PROBE " + json.dumps({{"code": code, "heavy": heavy}}))
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A directory with the toy package and ``toy.yaml``; returns the recipe file."""
    pkg = tmp_path / "user" / "hx_toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(TOY_SOURCE)
    recipe = tmp_path / "user" / "toy.yaml"
    recipe.write_text(TOY_RECIPE)
    return recipe


def run(
    args: list[str], tmp_path: Path, *, probe: bool = False
) -> subprocess.CompletedProcess[str]:
    # Keep an existing PYTHONPATH (a worktree's checkout) after the user's package.
    paths = [str(tmp_path / "user"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("HYPEREXPORT_CACHE_DIR", None)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    build = [f"build.cache_dir={tmp_path / 'cache'}", f"build.outputs_dir={tmp_path / 'outputs'}"]
    cmd = [sys.executable, "-c", PROBE] if probe else [sys.executable, "-m", "hyperexport"]
    return subprocess.run(
        [*cmd, *args, *build], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def probe_result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def report(tmp_path: Path, variant: str = "default", name: str = "toy") -> dict[str, object]:
    return json.loads((tmp_path / "outputs" / name / variant / "report.json").read_text())


def test_build_then_noop_without_torch(toy: Path, tmp_path: Path) -> None:
    cold = run([f"recipe_file={toy}"], tmp_path)
    assert cold.returncode == 0, cold.stderr
    model = tmp_path / "outputs" / "toy" / "default" / "model.onnx"
    assert cold.stdout.rstrip().splitlines()[-1] == f"model: {model}"
    assert model.is_file()
    assert {s["status"] for s in report(tmp_path)["stages"]} == {"ran"}  # type: ignore[index]
    assert list((tmp_path / "elsewhere").iterdir()) == []

    start = time.perf_counter()
    noop = run([f"recipe_file={toy}"], tmp_path, probe=True)
    seconds = time.perf_counter() - start
    result = probe_result(noop)
    assert result == {"code": 0, "heavy": []}, noop.stderr
    stages = report(tmp_path)["stages"]
    assert [s["status"] for s in stages] == ["hit"] * 4  # type: ignore[index]
    assert "trace: hit" in noop.stderr
    # The acceptance bound is 1 s (bench/bench_noop_build.py measures it); a loaded CI machine
    # gets some slack here, but importing torch alone would blow this.
    assert seconds < 3.0


def test_dry_run_prints_plan_and_writes_nothing(toy: Path, tmp_path: Path) -> None:
    proc = run([f"recipe_file={toy}", "opset=17", "build.dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"recipe: toy ({toy})"
    assert lines[1] == "trace: would run (no previous build)"
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "outputs").exists()


def test_sweep_dry_run_writes_nothing(toy: Path, tmp_path: Path) -> None:
    proc = run(["-m", f"recipe_file={toy}", "opset=17,18", "build.dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("trace: would run (no previous build)") == 2
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "outputs").exists()


def test_sweep_reuses_trace_and_changes_opset(toy: Path, tmp_path: Path) -> None:
    import onnx

    proc = run(["-m", f"recipe_file={toy}", "opset=17,18"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    opsets = {}
    for value in (17, 18):
        model = tmp_path / "outputs" / "toy" / f"opset={value}" / "model.onnx"
        assert f"model: {model}" in proc.stdout
        imports = {o.domain: o.version for o in onnx.load(str(model)).opset_import}
        opsets[value] = imports[""]
    assert opsets == {17: 17, 18: 18}
    second = report(tmp_path, "opset=18")["stages"]
    assert second[0]["status"] == "hit"  # type: ignore[index]
    assert second[1]["reason"] == "opset 17→18"  # type: ignore[index]


def test_failing_stage_exits_nonzero_naming_stage_and_module(toy: Path, tmp_path: Path) -> None:
    proc = run([f"recipe_file={toy}", "+model.broken_layer=1"], tmp_path)
    assert proc.returncode == 1
    assert "stage 'trace' failed at module 'blocks.1'" in proc.stderr
    assert not (tmp_path / "cache" / "actions").exists()


BAD_RECIPES = [
    ("opst: 17\n", "field 'opst': unknown key; did you mean 'opset'?"),
    ("opset: 21\n", "field 'opset': 21 is out of range for dynamo=False"),
    ("check: {atol: 0}\n", "field 'check.atol': must be > 0"),
    ("inputs:\n  x: {shape: [2, 8], dtype: flaot32}\n", "did you mean 'float32'"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_RECIPES, ids=[m[:24] for _, m in BAD_RECIPES])
def test_bad_recipe_exits_2_with_one_message(
    toy: Path, tmp_path: Path, extra: str, message: str
) -> None:
    text = toy.read_text()
    if extra.startswith("inputs:"):
        text = text.replace(
            "inputs:\n  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}\n", ""
        )
    toy.write_text(text + extra)
    proc = run([f"recipe_file={toy}"], tmp_path, probe=True)
    assert probe_result(proc) == {"code": 2, "heavy": []}
    errors = [line for line in proc.stderr.splitlines() if line.startswith("[ERROR]")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"[ERROR] recipe {toy}: field ")
    assert message in errors[0]


def test_hiera_typo_exits_2_with_close_match(toy: Path, tmp_path: Path) -> None:
    toy.write_text(toy.read_text().replace("hx_toy.net.Block", "hx_toy.net.Blok"))
    proc = run([f"recipe_file={toy}"], tmp_path)
    assert proc.returncode == 2
    assert "field 'hiera[0]'" in proc.stderr
    assert "did you mean 'Block'?" in proc.stderr


def test_hiera_class_that_never_runs_exits_2(toy: Path, tmp_path: Path) -> None:
    """The library only warns about a hiera class that never runs; a build is strict."""
    toy.write_text(
        toy.read_text().replace(
            "  - hx_toy.net.Block\n", "  - hx_toy.net.Block\n  - torch.nn.Conv2d\n"
        )
    )
    proc = run([f"recipe_file={toy}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "field 'hiera'" in proc.stderr
    assert "torch.nn.modules.conv.Conv2d never ran in forward" in proc.stderr


def test_in_repo_recipe_override_out_of_range(tmp_path: Path) -> None:
    proc = run(["recipe=llama", "opset=21", "build.dry_run=true"], tmp_path)
    assert proc.returncode == 2
    assert "recipe " in proc.stderr and "llama.yaml: field 'opset'" in proc.stderr


def test_console_script_builds_the_default_recipe(tmp_path: Path) -> None:
    """The README command: no arguments builds the embedded tiny Llama recipe."""
    exe = Path(sys.executable).with_name("hyperexport")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "hyperexport"]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run(
        [
            *cmd,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'outputs'}",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = tmp_path / "outputs" / "tiny_llama" / "default" / "model.onnx"
    assert proc.stdout.rstrip().splitlines()[-1] == f"model: {model}"
    data = report(tmp_path, name="tiny_llama")
    assert data["check"]["ok"] is True  # type: ignore[index]
    assert len(data["check"]["functions"]) == 2  # type: ignore[index]


@pytest.mark.slow
def test_llama_opset_sweep(tmp_path: Path) -> None:
    import onnx

    proc = run(["-m", "recipe=llama", "opset=17,18"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    versions = []
    for value in (17, 18):
        model = tmp_path / "outputs" / "llama" / f"opset={value}" / "model.onnx"
        versions.append({o.domain: o.version for o in onnx.load(str(model)).opset_import}[""])
    assert versions == [17, 18]
    assert report(tmp_path, "opset=18", "llama")["stages"][0]["status"] == "hit"  # type: ignore[index]


def test_unknown_override_exits_2_with_close_match(tmp_path: Path) -> None:
    proc = run(["opsett=17"], tmp_path, probe=True)
    assert probe_result(proc) == {"code": 2, "heavy": []}
    assert "tiny_llama.yaml: field 'opsett': unknown key; did you mean 'opset'?" in proc.stderr
