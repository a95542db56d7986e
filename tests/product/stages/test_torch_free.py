"""The rewrite and check stages, and the packages they use, run with torch unimportable.

Every run is a fresh ``python`` process whose ``sys.meta_path`` refuses ``torch``: the cold build
that fills the cache imports torch as usual; the later builds may not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.builds import TOY_SOURCE

RECIPE = """\
# @package _global_
name: toy
model: {_target_: hx_free.net.make, seed: 0}
inputs:
  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}
hiera: [hx_free.net.Block]
dynamo: false
rewrite: {optimize: false, fuse_constants: false}
"""

BLOCK_TORCH = """
import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is unimportable in this test ({name})")
        return None


sys.meta_path.insert(0, _NoTorch())
"""

# Builds with torch blocked, then reports the exit code and whether torch got imported.
BUILD = (
    BLOCK_TORCH
    + """
import json
from hyperexport.__main__ import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
onnx = sorted(m for m in ("onnx", "onnx_ir", "onnxruntime") if m in sys.modules)
print("PROBE " + json.dumps({"code": code, "torch": "torch" in sys.modules, "onnx": onnx,
                             "ml_dtypes": "ml_dtypes" in sys.modules}))
"""
)

# Imports every module of the torch-free packages with torch blocked.
IMPORT_ALL = (
    BLOCK_TORCH
    + """
import importlib, pkgutil
import hyperexport.library.check, hyperexport.base.contracts, hyperexport.library.passes
names = ["hyperexport.product.stages.rewrite", "hyperexport.product.stages.check", "hyperexport.library.model_file"]
for package in (hyperexport.library.check, hyperexport.base.contracts, hyperexport.library.passes):
    names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print("IMPORTED", len(names), "torch" in sys.modules)
"""
)


def _env(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "user"), *sys.path])}
    env.pop("HYPEREXPORT_CACHE_DIR", None)
    return env


def _run(root: Path, code: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    recipe = root / "user" / "toy.yaml"
    build = [f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'outputs'}"]
    cmd = [sys.executable, *(["-c", code] if code else ["-m", "hyperexport"])]
    return subprocess.run(
        [*cmd, f"recipe_file={recipe}", *args, *build],
        cwd=root,
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _probe(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, proc.stdout + proc.stderr
    return json.loads(line.removeprefix("PROBE "))


def _statuses(root: Path, variant: str = "default") -> dict[str, str]:
    report = json.loads((root / "outputs" / "toy" / variant / "report.json").read_text())
    return {s["name"]: s["status"] for s in report["stages"]}


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding every stage of the toy recipe, built by a clean process."""
    root = tmp_path_factory.mktemp("torch_free")
    pkg = root / "user" / "hx_free"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(TOY_SOURCE)
    (root / "user" / "toy.yaml").write_text(RECIPE)
    cold = _run(root, None)
    assert cold.returncode == 0, cold.stderr
    return root


def test_check_only_change_runs_without_torch_or_onnx(cached: Path) -> None:
    """A tolerance is judged on the cached evaluation: neither torch nor ONNX is loaded."""
    proc = _run(cached, BUILD, "check.atol=1e-3")
    # ml_dtypes only for bfloat16 models; this one is float32
    assert _probe(proc) == {"code": 0, "torch": False, "onnx": [], "ml_dtypes": False}, proc.stderr
    ran = _statuses(cached, "check.atol=1e-3")
    assert ran == {
        "trace": "hit",
        "export": "hit",
        "rewrite": "hit",
        "quantize": "hit",
        "evaluate": "hit",
        "check": "ran",
    }


def test_rewrite_evaluate_and_check_run_without_torch(cached: Path) -> None:
    proc = _run(cached, BUILD, "build.force=[rewrite,evaluate,check]")
    probe = {k: v for k, v in _probe(proc).items() if k != "ml_dtypes"}  # onnx may import it
    assert probe == {"code": 0, "torch": False, "onnx": ["onnx", "onnx_ir", "onnxruntime"]}
    assert _statuses(cached) == {
        "trace": "hit",
        "export": "hit",
        "rewrite": "ran",
        "quantize": "hit",
        "evaluate": "ran",
        "check": "ran",
    }


def test_passes_check_and_contracts_import_no_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    count, torch = proc.stdout.split()[1:]
    assert int(count) > 20 and torch == "False"


def test_the_published_check_names_the_model_beside_it(cached: Path) -> None:
    """No scratch path of the build that made it leaks into the published check report."""
    check = json.loads((cached / "outputs" / "toy" / "default" / "check.json").read_text())
    assert check["model_path"] == "model.onnx"
