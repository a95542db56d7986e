"""Models an older ONNX Runtime loads: built here on the pinned stack with
``target.onnxruntime: "1.16"``, run in ONNX Runtime 1.16 in its own virtualenv (numpy 1.x), and
compared with the reference torch computed during the build (the export's captured arrays, read
from the cache: no torch in that environment).

It needs that environment's Python in ``HYPEREXPORT_OLD_ONNXRUNTIME_PYTHON`` (what
``nox -s onnxruntime-1.16`` makes and sets); without it the test skips, saying so. The
environment is the separate virtualenv the issue allows, rather than a whole leg on 1.16: the
export needs the pinned stack (onnx, onnx-ir and onnxscript of today), only the consumer is old.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import onnx
import pytest

from hyperexport.engine.store import CacheStore
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader

OLD_PYTHON = os.environ.get("HYPEREXPORT_OLD_ONNXRUNTIME_PYTHON")
TARGET = "1.16"
RUN = Path(__file__).resolve().parents[1] / "helpers" / "old_runtime_run.py"

pytestmark = pytest.mark.skipif(
    not OLD_PYTHON,
    reason="HYPEREXPORT_OLD_ONNXRUNTIME_PYTHON names no Python with onnxruntime 1.16 "
    "(nox -s onnxruntime-1.16 makes one)",
)

#: The default recipe at opset 17 (TorchScript) and the 4-layer llama at 18 on the dynamo path
#: (whose exporter says IR 10, which 1.16 refuses: the build writes 8).
BUILDS = {
    "tiny_llama-opset17": ["recipe=tiny_llama", "opset=17"],
    "llama-opset18-dynamo": ["recipe=llama", "opset=18", "dynamo=true"],
}


def _old(*args: str) -> subprocess.CompletedProcess[str]:
    assert OLD_PYTHON is not None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this stack
    return subprocess.run([OLD_PYTHON, *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any, Path]]:
    """Each of :data:`BUILDS` once: ``{name: (recipe, outcome, cache folder)}``."""
    found = {}
    for name, overrides in BUILDS.items():
        tmp_path = tmp_path_factory.mktemp(name)
        recipe, outcome = _build(tmp_path, overrides)
        found[name] = (recipe, outcome, tmp_path / "cache")
    return found


def _build(tmp_path: Path, overrides: list[str]) -> tuple[Any, Any]:
    recipe, settings = compose_recipe(
        [
            *overrides,
            f"target.onnxruntime='{TARGET}'",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.result.error
    return recipe, outcome


@pytest.mark.parametrize("name", list(BUILDS))
def test_onnxruntime_1_16_loads_the_model_and_matches_torch(
    built: dict[str, tuple[Any, Any, Path]], name: str
) -> None:
    recipe, outcome, cache = built[name]
    model = outcome.model_path
    assert onnx.load(str(model), load_external_data=False).ir_version == 8
    export = outcome.result.entries["export"].digests()
    tensors = CacheStore(cache).blob_path(export["reference/tensors.npz"])
    check = recipe.config.check
    done = _old(
        str(RUN),
        str(model),
        str(tensors),
        str(outcome.out_dir / "manifest.json"),
        str(check.atol),
        str(check.rtol),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(name, json.dumps(result))  # the record: pytest -s shows it
    assert result["onnxruntime"].startswith(f"{TARGET}."), result
    assert result["numpy"].startswith("1."), result
    assert result["outputs"], result
    for output in result["outputs"]:
        assert output["shape_equal"] and output["within"], output
        assert output["max_abs_reference"] > 0, output  # a reference that proves something


def test_onnxruntime_1_16_refuses_ir_10_as_its_table_says(
    built: dict[str, tuple[Any, Any, Path]], tmp_path: Path
) -> None:
    """What the export said before this release (IR 10 on the dynamo path) 1.16 does not load:
    the fact ``versions.ONNXRUNTIME_LOADS`` holds for it (IR up to 9), measured."""
    _, outcome, _ = built["llama-opset18-dynamo"]
    proto = onnx.load(str(outcome.model_path))
    proto.ir_version = 10
    old = tmp_path / "ir10.onnx"
    onnx.save(proto, str(old))
    done = _old("-c", f"import onnxruntime as o; o.InferenceSession({str(old)!r})")
    assert done.returncode != 0
    assert "Unsupported model IR version: 10, max supported IR version: 9" in done.stderr
