"""Running ``python -m hyperexport`` as users do, for the CLI and sweep tests.

Builds use a small local model package (written to a temporary directory by
:func:`write_toy`) and a recipe file outside the repository. Every subprocess runs
from an unrelated working directory: nothing may depend on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.builds import TOY_SOURCE

REPO = Path(__file__).resolve().parents[2]
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
dynamo: false
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


def write_toy(tmp_path: Path) -> Path:
    """A directory with the toy package and ``toy.yaml``; returns the recipe file."""
    pkg = tmp_path / "user" / "hx_toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(TOY_SOURCE)
    recipe = tmp_path / "user" / "toy.yaml"
    recipe.write_text(TOY_RECIPE)
    return recipe


def run(
    args: list[str], tmp_path: Path, *, probe: bool = False, build: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m hyperexport *args`` (with ``probe``: ``main()`` under :data:`PROBE`).

    With ``build``, the cache and outputs go to ``tmp_path`` (``build.*`` overrides appended).
    """
    # The user's package, then the checkout under test, then an existing PYTHONPATH.
    paths = [str(tmp_path / "user"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("HYPEREXPORT_CACHE_DIR", None)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    where = [f"build.cache_dir={tmp_path / 'cache'}", f"build.outputs_dir={tmp_path / 'outputs'}"]
    cmd = [sys.executable, "-c", PROBE] if probe else [sys.executable, "-m", "hyperexport"]
    return subprocess.run(
        [*cmd, *args, *(where if build else [])],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def probe_result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def report(tmp_path: Path, variant: str = "default", name: str = "toy") -> dict[str, object]:
    return json.loads((tmp_path / "outputs" / name / variant / "report.json").read_text())


def run_here(
    args: list[str], tmp_path: Path, *, build: bool = True
) -> subprocess.CompletedProcess[str]:
    """:func:`run` without a new interpreter: ``hyperexport.__main__.main`` in this process.

    For tests that read what a build prints, exits with and writes, not what a fresh process
    imports (those use :func:`run` with ``probe``). Starting Python and importing torch again
    costs a few seconds a call; here the test's interpreter is warm. The toy package's folder
    goes on ``sys.path`` and its modules are dropped afterwards, the working directory is an
    unrelated folder, and the logging configuration that Hydra installs is undone.
    """
    import contextlib
    import importlib
    import io
    import logging

    from hyperexport.__main__ import main

    where = [f"build.cache_dir={tmp_path / 'cache'}", f"build.outputs_dir={tmp_path / 'outputs'}"]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    user = str(tmp_path / "user")
    out, err = io.StringIO(), io.StringIO()
    root, ours = logging.getLogger(), logging.getLogger("hyperexport")
    saved = (root.handlers[:], root.level, ours.handlers[:], ours.level, ours.propagate)
    saved_cwd, saved_cache = os.getcwd(), os.environ.pop("HYPEREXPORT_CACHE_DIR", None)
    sys.path.insert(0, user)
    importlib.invalidate_caches()
    code: int | str | None = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([*args, *(where if build else [])])
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(saved_cwd)
        if saved_cache is not None:
            os.environ["HYPEREXPORT_CACHE_DIR"] = saved_cache
        sys.path.remove(user)
        for name in [m for m in sys.modules if m == "hx_toy" or m.startswith("hx_toy.")]:
            del sys.modules[name]
        root.handlers[:], ours.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        ours.setLevel(saved[3])
        ours.propagate = saved[4]
    returncode = code if isinstance(code, int) else 1
    return subprocess.CompletedProcess(args, returncode, out.getvalue(), err.getvalue())
