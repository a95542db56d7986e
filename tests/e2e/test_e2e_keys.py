"""What the keys cover, end to end through the real stages, in process.

A user folder outside the repository holds a recipe, a model module that imports a helper module
and a local package, and weights. Each test edits one thing and checks which stages rerun, and
that the artifact follows. Between builds the user's modules are dropped from ``sys.modules``, as
a new process would not have them.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hyperexport.engine import code_closure
from hyperexport.engine.store import CacheStore
from hyperexport.product.builds.fingerprint import KEYED_PACKAGE
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import BuildSettings, Recipe, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.rebuilds import reran_from
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION
from tests.helpers.statuses import statuses

MODEL = """
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from hxk_helpers import act
from hxk_lib.scale import SCALE


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return act(self.fc(x)) * SCALE + x


class Net(torch.nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make(dim: int = 8, layers: int = 2, seed: int = 0, pretrained: str | None = None):
    torch.manual_seed(seed)
    net = Net(dim, layers)
    if pretrained is not None:  # a from_pretrained-style folder, relative to the working dir
        net.load_state_dict(load_file(f"{pretrained}/weights.safetensors"))
    # What the recipe does not name: a data file beside the module, an environment variable.
    gain_file = Path(__file__).with_name("hxk_gain.txt")
    gain = float(gain_file.read_text()) if gain_file.exists() else 1.0
    gain *= float(os.environ.get("HXK_GAIN", "1"))
    with torch.no_grad():
        for block in net.blocks:
            block.fc.weight.mul_(gain)
    return net.eval()
"""
HELPERS = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
RECIPE = """\
name: keys
model: {_target_: hxk_model.make, seed: 0}
inputs:
  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}
hiera: [hxk_model.Block]
dynamo: false
rewrite: {optimize: false, fuse_constants: false}
"""
USER_MODULES = ("hxk_model", "hxk_helpers", "hxk_lib", "hxk_inst")
ALL_RAN = {
    "trace": "ran",
    "export": "ran",
    "rewrite": "ran",
    "quantize": "ran",
    "evaluate": "ran",
    "check": "ran",
}
ALL_HIT = {
    "trace": "hit",
    "export": "hit",
    "rewrite": "hit",
    "quantize": "hit",
    "evaluate": "hit",
    "check": "hit",
}


def _forget_user_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in USER_MODULES]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _write_user_folder(root: Path) -> Path:
    (root / "hxk_lib").mkdir(parents=True)
    (root / "hxk_lib" / "__init__.py").write_text("")
    (root / "hxk_lib" / "scale.py").write_text("SCALE = 1.0\n")
    (root / "hxk_helpers.py").write_text(HELPERS)
    (root / "hxk_model.py").write_text(MODEL)
    recipe = root / "keys.yaml"
    recipe.write_text(RECIPE)
    return recipe


@pytest.fixture
def user(tmp_path: Path) -> Iterator[Path]:
    """The user folder (on sys.path); returns the recipe file."""
    recipe = _write_user_folder(tmp_path / "user")
    sys.path.insert(0, str(recipe.parent))
    _forget_user_modules()
    yield recipe
    sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
    _forget_user_modules()


def load(recipe_file: Path, **changes: Any) -> Recipe:
    data = yaml.safe_load(recipe_file.read_text())
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return validate_recipe(data, str(recipe_file))


def build(recipe: Recipe, cache: Path, outputs: Path, **kw: Any) -> BuildOutcome:
    _forget_user_modules()
    settings = BuildSettings(
        cache_dir=str(cache),
        outputs_dir=outputs,
        dry_run=bool(kw.get("dry_run", False)),
        force=(),
    )
    return run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))


def reasons(outcome: BuildOutcome) -> dict[str, str]:
    return {s.name: s.reason for s in outcome.result.stages}


def model_bytes(outcome: BuildOutcome) -> bytes:
    assert outcome.exit_code == 0, outcome.lines
    assert outcome.model_path is not None
    return outcome.model_path.read_bytes()


@pytest.mark.parametrize(
    ("edited", "old", "new"),
    [
        ("hxk_helpers.py", "torch.relu(x)", "torch.sigmoid(x)"),
        ("hxk_lib/scale.py", "SCALE = 1.0", "SCALE = 2.0"),
    ],
)
def test_edited_module_imported_by_the_model_reruns(
    user: Path, tmp_path: Path, edited: str, old: str, new: str
) -> None:
    """A helper module, and a local package, that the model's module imports: neither is named
    in the recipe; both are discovered when the trace runs, and validated on lookup."""
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    cold = build(load(user), cache, outputs)
    before = model_bytes(cold)
    assert statuses(build(load(user), cache, outputs)) == ALL_HIT
    source = user.parent / edited
    source.write_text(source.read_text().replace(old, new))
    plan = build(load(user), cache, outputs, dry_run=True)
    assert plan.lines[1] == f"trace: would run (model code changed ({edited}))"
    again = build(load(user), cache, outputs)
    assert statuses(again) == ALL_RAN
    assert reasons(again)["trace"] == f"model code changed ({edited})"
    assert model_bytes(again) != before  # the artifact follows the code
    assert again.report is not None and again.report["check"]["ok"] is True  # ORT vs torch


def test_an_edit_that_keeps_size_and_mtime_runs_the_new_source(user: Path, tmp_path: Path) -> None:
    """Issue 32: an edited .py whose size and mtime stayed the same ran from its stale .pyc,
    and the old code's model was stored under the new source's key."""
    import py_compile
    import subprocess

    helpers = user.parent / "hxk_helpers.py"
    py_compile.compile(  # the bytecode Python itself would write, recording mtime and size
        str(helpers), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
    )
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    before = model_bytes(build(load(user), cache, outputs))
    stat = helpers.stat()
    helpers.write_text(HELPERS.replace("torch.relu(x)", "torch.tanh(x)"))  # the same size
    os.utime(helpers, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    stale = subprocess.run(  # the default loader still runs relu: the hazard is real here
        [sys.executable, "-c", "import hxk_helpers, torch; print(hxk_helpers.act(-torch.ones(1)))"],
        cwd=user.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tensor([0.])" in stale.stdout
    again = build(load(user), cache, outputs)
    assert reasons(again)["trace"] == "model code changed (hxk_helpers.py)"
    assert model_bytes(again) != before  # tanh was exported, not the stale relu
    assert again.report is not None and again.report["check"]["ok"] is True


def test_swapped_checkpoint_with_mtime_restored_reruns(user: Path, tmp_path: Path) -> None:
    import hxk_model  # type: ignore[import-not-found]
    from safetensors.torch import save_file

    ckpt = user.parent / "w.safetensors"
    save_file(hxk_model.make(seed=1).state_dict(), str(ckpt))
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    before = model_bytes(build(load(user, checkpoint="w.safetensors"), cache, outputs))
    stat = ckpt.stat()
    other = user.parent / "other.safetensors"
    save_file(hxk_model.make(seed=2).state_dict(), str(other))
    assert other.stat().st_size == stat.st_size
    shutil.copyfile(other, ckpt)  # same size; then mtime set back, as cp -p / rsync -t do
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ckpt.stat().st_mtime_ns == stat.st_mtime_ns
    again = build(load(user, checkpoint="w.safetensors"), cache, outputs)
    assert statuses(again) == ALL_RAN
    assert reasons(again)["trace"].startswith("weights.checkpoint.w.safetensors")
    assert model_bytes(again) != before


def test_pretrained_folder_argument_is_hashed(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hxk_model  # type: ignore[import-not-found]
    from safetensors.torch import save_file

    folder = user.parent / "pretrained"
    folder.mkdir()
    save_file(hxk_model.make(seed=3).state_dict(), str(folder / "weights.safetensors"))
    (folder / "config.json").write_text('{"dim": 8}')
    monkeypatch.chdir(user.parent)  # the factory opens the relative path from here
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    recipe = load(user, model__pretrained="pretrained")
    before = model_bytes(build(recipe, cache, outputs))
    assert statuses(build(recipe, cache, outputs)) == ALL_HIT
    (folder / "config.json").write_text('{"dim": 8, "note": "edited"}')
    again = build(recipe, cache, outputs)
    assert statuses(again)["trace"] == "ran" and statuses(again)["export"] == "ran"
    assert reasons(again)["trace"] == "files of model.pretrained changed (config.json)"
    save_file(hxk_model.make(seed=4).state_dict(), str(folder / "weights.safetensors"))
    third = build(recipe, cache, outputs)
    assert statuses(third) == ALL_RAN
    assert model_bytes(third) != before


def test_cache_and_checkout_moved_still_hit(user: Path, tmp_path: Path) -> None:
    """No absolute path in any key: another checkout of the user's code, another cache dir."""
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    model_bytes(build(load(user), cache, outputs))
    moved_user = tmp_path / "checkout2"
    shutil.copytree(user.parent, moved_user)
    sys.path.remove(str(user.parent))
    sys.path.insert(0, str(moved_user))
    shutil.copytree(cache, tmp_path / "cache2")
    again = build(load(moved_user / user.name), tmp_path / "cache2", tmp_path / "out2")
    assert statuses(again) == ALL_HIT


def test_check_code_edit_reruns_only_check(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A docstring edited in check/judge.py (in a copy of the package tree): only check reruns; an edit
    in passes/ reruns rewrite (and check only if the model changed)."""
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    model_bytes(build(load(user), cache, outputs))
    tree = tmp_path / "tree" / "hyperexport"
    shutil.copytree(KEYED_PACKAGE.root, tree, ignore=shutil.ignore_patterns("__pycache__"))
    report = tree / "library" / "check" / "judge.py"
    report.write_text(report.read_text().replace('"""', '"""Edited. ', 1))
    monkeypatch.setitem(code_closure._READ, KEYED_PACKAGE.root, _sources(tree))
    again = build(load(user), cache, outputs)
    assert statuses(again) == reran_from("check")
    assert reasons(again)["check"] == "hyperexport code changed (library/check/judge.py)"
    compose = tree / "library" / "passes" / "compose_functions.py"
    compose.write_text(compose.read_text() + "\n# a comment changes no key\n")
    monkeypatch.setitem(code_closure._READ, KEYED_PACKAGE.root, _sources(tree))
    assert statuses(build(load(user), cache, outputs)) == ALL_HIT
    compose.write_text(compose.read_text() + "\n_EDITED = True\n")
    monkeypatch.setitem(code_closure._READ, KEYED_PACKAGE.root, _sources(tree))
    third = build(load(user), cache, outputs)
    assert statuses(third)["trace"] == statuses(third)["export"] == "hit"
    assert statuses(third)["rewrite"] == "ran"
    assert (
        reasons(third)["rewrite"]
        == "hyperexport code changed (library/passes/compose_functions.py)"
    )


def _sources(tree: Path) -> dict[str, code_closure.ModuleSource]:
    return code_closure.read_package(tree)


@NEEDS_HYPEREXPORT_ATTENTION
def test_fuse_toggle_does_not_change_the_export_key(tmp_path: Path) -> None:
    """The fusion is the rewrite's and the check's: the export's key does not move. The trace
    reads ``rewrite.fuse`` too (a generation step's ``genai_config.json`` says whether its pasts
    are shared buffers), so it reruns, and for a forward model writes the same files: with the
    same upstream files the export then hits."""
    from hyperexport.engine.keys import stage_key
    from hyperexport.engine.runner import BuildRequest, Runner
    from hyperexport.engine.stage import config_slice
    from hyperexport.engine.store import CacheStore
    from hyperexport.product.config import compose_recipe

    runner = Runner(CacheStore(tmp_path / "cache"), package=KEYED_PACKAGE)
    keys: dict[bool, dict[str, str]] = {}
    # the two fusions (the exported attention node is refused without one)
    for promote in (False, True):
        fuse = "standard" if promote else "onnxruntime"
        recipe, _ = compose_recipe(["recipe=llama_attention", f"rewrite.fuse={fuse}"])
        request = BuildRequest(
            name=recipe.name,
            config=recipe.data,
            source=recipe.file,
            stages=PIPELINE,
            env={},
            model={"code": {}, "weights": {"seed": 0}},
        )
        keys[promote] = {
            stage.name: stage_key(
                runner._material(
                    request, stage, config_slice(recipe.data, stage.reads), {"u": {"f": "0"}}
                )
            )
            for stage in PIPELINE
        }
    assert keys[False]["trace"] != keys[True]["trace"]
    assert keys[False]["export"] == keys[True]["export"]
    assert keys[False]["rewrite"] != keys[True]["rewrite"]
    assert keys[False]["check"] != keys[True]["check"]


@pytest.fixture
def not_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary directory elsewhere: files the model reads from tmp_path are the user's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def test_a_data_file_the_model_reads_is_discovered(
    user: Path, tmp_path: Path, not_temp: None
) -> None:
    """Issue 21: a file the model's code opens (not named in the recipe) was not seen: all
    stages hit, and the published model was stale."""
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    (user.parent / "hxk_gain.txt").write_text("1.0")
    before = model_bytes(build(load(user), cache, outputs))
    assert statuses(build(load(user), cache, outputs)) == ALL_HIT
    (user.parent / "hxk_gain.txt").write_text("0.5")
    plan = build(load(user), cache, outputs, dry_run=True)
    assert plan.lines[1] == "trace: would run (file read by the model changed (hxk_gain.txt))"
    again = build(load(user), cache, outputs)
    assert statuses(again)["trace"] == "ran" and statuses(again)["export"] == "ran"
    assert model_bytes(again) != before
    assert again.report is not None and again.report["check"]["ok"] is True  # ORT vs torch


def test_a_declared_environment_variable_is_keyed(
    user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``env: [NAME]``: the variable's value enters the keys of the stages that run the model,
    and a dry run names it."""
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    monkeypatch.setenv("HXK_GAIN", "1")
    before = model_bytes(build(load(user, env=["HXK_GAIN"]), cache, outputs))
    monkeypatch.setenv("HXK_GAIN", "0.5")
    plan = build(load(user, env=["HXK_GAIN"]), cache, outputs, dry_run=True)
    assert plan.lines[1] == "trace: would run (env HXK_GAIN changed)"
    again = build(load(user, env=["HXK_GAIN"]), cache, outputs)
    assert statuses(again) == ALL_RAN
    assert model_bytes(again) != before
    assert again.report is not None and again.report["check"]["ok"] is True
    monkeypatch.setenv("HXK_GAIN", "1")  # back: the first build's entries hit again
    assert statuses(build(load(user, env=["HXK_GAIN"]), cache, outputs)) == ALL_HIT


def _install(site: Path, gain: str) -> None:
    """``hxk_inst`` 1.0 installed in ``site`` (a site-packages folder), exporting ``GAIN``."""
    (site / "hxk_inst").mkdir(parents=True, exist_ok=True)
    (site / "hxk_inst" / "__init__.py").write_text(f"GAIN = {gain}\n")
    info = site / "hxk_inst-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hxk-inst\nVersion: 1.0\n")
    (info / "RECORD").write_text("hxk_inst/__init__.py,,\n")
    (info / "top_level.txt").write_text("hxk_inst\n")


def test_an_edited_installed_library_reruns_and_a_restored_one_hits_again(
    user: Path, tmp_path: Path
) -> None:
    """Issue 21: a patched library in site-packages (same version) was a hit, and a forced
    build under the patch wrote its entry under the pristine key."""
    from hyperexport.engine import discovered
    from hyperexport.engine import environment as fingerprint

    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    _install(site, "1.0")
    sys.path.insert(0, str(site))
    for memo in (discovered._distributions_by_top, fingerprint._dist_info_versions):
        memo.cache_clear()
    fingerprint.distribution_version.cache_clear()
    helpers = user.parent / "hxk_helpers.py"
    helpers.write_text(
        HELPERS.replace("import torch\n", "import torch\nfrom hxk_inst import GAIN\n").replace(
            "torch.relu(x)", "torch.relu(x) * GAIN"
        )
    )
    cache, outputs = tmp_path / "cache", tmp_path / "out"
    pristine = model_bytes(build(load(user), cache, outputs))
    _install(site, "3.0")  # a local patch: same version, other code
    plan = build(load(user), cache, outputs, dry_run=True)
    assert plan.lines[1] == "trace: would run (model code changed (hxk_inst/__init__.py))"
    patched = build(load(user), cache, outputs)
    assert statuses(patched) == ALL_RAN
    assert model_bytes(patched) != pristine
    _install(site, "1.0")  # restored: its own entries, not the patched ones
    restored = build(load(user), cache, outputs)
    assert statuses(restored) == ALL_HIT
    assert model_bytes(restored) == pristine


def _published(outcome: BuildOutcome) -> dict[str, bytes]:
    """Every published file but the three that carry timings."""
    timed = {"report.json", "report.html", "summary.txt"}
    root = outcome.out_dir.resolve()
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in timed
    }


def test_keys_and_artifacts_are_the_same_in_fresh_caches_with_and_without_a_remote(
    user: Path, tmp_path: Path
) -> None:
    """Issue 21: evaluation.json embedded timings (the check key differed between two fresh
    caches), and a remote's fsspec joined the recorded modules (trace, export, check keys).

    In one process the second build has more modules loaded than the first (a sweep's jobs
    share a process), so the modules recorded by trace and export differ: their *declared* keys
    are compared here, every full key in fresh processes by the slow test below.
    """
    outcomes, declared = [], []
    for name, remote in (("a", None), ("b", None), ("c", (tmp_path / "remote").as_uri())):
        _forget_user_modules()
        settings = BuildSettings(
            cache_dir=str(tmp_path / name / "cache"),
            outputs_dir=tmp_path / name / "out",
            dry_run=False,
            force=(),
            remote=remote,
        )
        recipe = load(user)
        outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
        assert statuses(outcome) == ALL_RAN
        outcomes.append(outcome)
        store = CacheStore(tmp_path / name / "cache")
        declared.append({s: store.previous_run("keys", s)["declared"] for s in ALL_RAN})
    keys = [
        {s.name: s.key for s in o.result.stages if s.name not in ("trace", "export")}
        for o in outcomes
    ]
    assert declared[0] == declared[1] == declared[2]
    assert keys[0] == keys[1] == keys[2]
    files = [_published(o) for o in outcomes]
    assert "check.json" in files[0]
    assert files[0] == files[1] == files[2]


BUILD = """
import sys
from hyperexport.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_every_key_is_the_same_in_fresh_processes_with_and_without_a_remote(
    user: Path, tmp_path: Path
) -> None:
    import json
    import subprocess

    keys, files = [], []
    for name, remote in (("a", None), ("b", None), ("c", (tmp_path / "remote").as_uri())):
        args = [
            f"recipe_file={user}",
            f"build.cache_dir={tmp_path / name / 'cache'}",
            f"build.outputs_dir={tmp_path / name / 'out'}",
            *([f"build.remote={remote}"] if remote else []),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user.parent), *sys.path])}
        proc = subprocess.run(
            [sys.executable, "-c", BUILD, *args], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = tmp_path / name / "out" / "keys" / "default"
        report = json.loads((out / "report.json").read_text())
        keys.append({s["name"]: s["key"] for s in report["stages"]})
        files.append(
            {
                p.name: p.read_bytes()
                for p in out.resolve().iterdir()
                if p.name not in ("report.json", "report.html", "summary.txt")
            }
        )
    assert keys[0] == keys[1] == keys[2]
    assert files[0] == files[1] == files[2]


def test_modules_the_machinery_imports_are_not_recorded(tmp_path: Path) -> None:
    from hyperexport.engine import discovered
    from hyperexport.engine.hashing import FileDigestIndex
    from hyperexport.engine.machinery import machinery

    (tmp_path / "hxk_machinery_only.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with machinery():
            importlib.import_module("hxk_machinery_only")
        assert "hxk_machinery_only" not in discovered.snapshot(FileDigestIndex(None))["modules"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hxk_machinery_only", None)
