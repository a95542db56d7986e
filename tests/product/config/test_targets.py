"""Every ``_target_`` in ``model:`` is checked before anything runs, by the rule of the other
import paths, and a refused build (exit 2) leaves every file as it was (issue 32, case 6)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.imports import static_parameters
from tests.helpers.cli import REPO

#: A user's package: a factory taking anything, one with a fixed signature, a class, a
#: re-export through the package's ``__init__``, and a module that writes a file when imported.
_PACKAGE = {
    "__init__.py": "from .impl import strict as reexported\n",
    "impl.py": """\
def loose(**kwargs):
    return kwargs


def strict(width, depth=2, *, scale=1.0):
    return (width, depth, scale)


class Part:
    def __init__(self, size, bias=True):
        self.size = size


def decorated_is_not_read(x):
    return x


decorated_is_not_read = staticmethod(decorated_is_not_read)
""",
    "loud.py": """\
import os
from pathlib import Path

Path(os.environ["HX_TARGETS_MARKER"]).write_text("imported")


def make(**kwargs):
    return kwargs
""",
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "user"
    (root / "hx_targets").mkdir(parents=True)
    for name, text in _PACKAGE.items():
        (root / "hx_targets" / name).write_text(text)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("HX_TARGETS_MARKER", str(tmp_path / "marker"))
    return root


def _recipe(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "t",
        "model": model,
        "inputs": {"x": {"shape": [1, 4], "dtype": "float32"}},
        "hiera": ["hx_targets.impl.Part"],
        "dynamo": False,
    }


def _refusal(model: dict[str, Any]) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        validate_recipe(_recipe(model), "/r.yaml")
    return info.value


def test_a_nested_target_without_python_source_is_refused(package: Path) -> None:
    error = _refusal(
        {
            "_target_": "hx_targets.impl.loose",
            "config": {"_target_": "builtins.open", "file": "/x", "mode": "w"},
        }
    )
    assert error.field == "model.config._target_"
    assert "no Python source" in error.reason


@pytest.mark.parametrize(
    ("model", "field", "reason"),
    [
        (
            {"_target_": "hx_targets.impl.loose", "a": [0, {"b": {"_target_": "nosuch.mod.X"}}]},
            "model.a[1].b._target_",
            "no module named 'nosuch'",
        ),
        (
            {"_target_": "hx_targets.impl.loose", "p": {"_target_": "hx_targets.impl.Prat"}},
            "model.p._target_",
            "did you mean 'Part'",
        ),
        (
            {"_target_": "hx_targets.impl.loose", "p": {"_target_": "hx_targets.impl.Part"}},
            "model.p",
            "needs 'size'",
        ),
        (
            {
                "_target_": "hx_targets.impl.loose",
                "p": {"_target_": "hx_targets.impl.Part", "sise": 1},
            },
            "model.p.sise",
            "did you mean 'size'",
        ),
        ({"_target_": "hx_targets.impl.strict", "width": 1, "sclae": 2}, "model.sclae", "scale"),
        ({"_target_": "hx_targets.reexported", "depth": 1}, "model", "needs 'width'"),
        ({"_target_": "hx_targets.impl.strict", "_args_": [1, 2, 3]}, "model._args_", "takes 2"),
        ({"_target_": "hx_targets.impl.strict", "_args_": [1], "width": 1}, "model.width", "twice"),
        (
            {"_target_": "hx_targets.impl.loose", "p": {"_target_": 3}},
            "model.p._target_",
            "import path",
        ),
    ],
)
def test_nested_targets_and_their_arguments(
    package: Path, model: dict[str, Any], field: str, reason: str
) -> None:
    error = _refusal(model)
    assert error.field == field
    assert reason in error.reason


def test_what_a_call_accepts_passes(package: Path) -> None:
    for model in (
        {"_target_": "hx_targets.impl.strict", "width": 1, "scale": 2.0},
        {"_target_": "hx_targets.impl.strict", "_args_": [1, 3]},
        {"_target_": "hx_targets.reexported", "_partial_": True, "depth": 3},
        {"_target_": "hx_targets.impl.loose", "p": {"_target_": "hx_targets.impl.Part", "size": 2}},
        # a binding validation cannot read is left to the call: only its import path is checked
        {"_target_": "hx_targets.impl.decorated_is_not_read", "anything": 1},
    ):
        validate_recipe(_recipe(model), "/r.yaml")


def test_parameters_are_read_from_the_source(package: Path) -> None:
    strict = static_parameters("hx_targets.impl.strict")
    assert strict is not None
    assert strict.positional == ("width", "depth")
    assert strict.keyword == {"width", "depth", "scale"}
    assert strict.required == {"width"}
    part = static_parameters("hx_targets.impl:Part")
    assert part is not None and part.positional == ("size", "bias")
    assert static_parameters("hx_targets.reexported") == strict
    assert static_parameters("hx_targets.impl.decorated_is_not_read") is None
    assert static_parameters("builtins.open") is None


def test_validation_imports_nothing_a_recipe_names(package: Path, tmp_path: Path) -> None:
    model = {"_target_": "hx_targets.impl.loose", "inner": {"_target_": "hx_targets.loud.make"}}
    validate_recipe(_recipe(model), "/r.yaml")
    assert not (tmp_path / "marker").exists()
    assert "hx_targets.loud" not in sys.modules and "hx_targets" not in sys.modules


def _snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every file and folder under ``root``: kind, inode, size, mtime, ctime and content."""
    found: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            found[str(path.relative_to(root))] = (
                st.st_mode,
                st.st_ino,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                digest,
            )
    return found


@pytest.mark.parametrize(
    "overrides",
    [
        # the case: a nested target that would truncate the file when instantiated
        ["+model.config={_target_:builtins.open,file:${oc.env:HX_VICTIM},mode:w}"],
        # a valid nested target whose module writes when imported, beside a refused field
        ["+model.inner={_target_:hx_targets.loud.make}", "opset=99"],
        # the factory does not take the argument: refused before anything is called
        ["+model.config={_target_:hx_targets.impl.Part,size:1}"],
    ],
    ids=["builtins-open", "import-side-effect", "unknown-argument"],
)
def test_a_refused_build_touches_nothing(tmp_path: Path, overrides: list[str]) -> None:
    world = tmp_path / "world"  # everything the build could touch lives here
    user = world / "user" / "hx_targets"
    user.mkdir(parents=True)
    for name, text in _PACKAGE.items():
        (user / name).write_text(text)
    for folder in ("cwd", "home", "tmp", "outputs", "cache"):
        (world / folder).mkdir()
    victim = world / "victim.txt"
    victim.write_text("precious\n")
    (world / "outputs" / "earlier.txt").write_text("a file of the user's\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(world / "user"), str(REPO)]),
        "HOME": str(world / "home"),
        "TMPDIR": str(world / "tmp"),
        "HX_VICTIM": str(victim),
        "HX_TARGETS_MARKER": str(world / "marker"),
        "HYPEREXPORT_CACHE_DIR": str(world / "cache"),
    }
    before = _snapshot(world)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperexport",
            "recipe=tiny_llama",
            *overrides,
            f"build.cache_dir={world / 'cache'}",
            f"build.outputs_dir={world / 'outputs' / 'not-yet'}",  # a refusal makes no folder
        ],
        cwd=world / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("[ERROR]") == 1, done.stderr
    after = _snapshot(world)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    # The command's own compiled code (engine/keyed_imports.py: checked .pyc files of the
    # modules the command imports, hyperexport's and its libraries', like __pycache__) is the
    # one thing any run writes; nothing of what the recipe names is among it.
    bytecode = [p for p in changed if Path(p).is_relative_to(Path("cache", "bytecode"))]
    assert not [p for p in bytecode if "hx_targets" in p or "user" in Path(p).parts]
    changed = sorted(set(changed) - set(bytecode) - {"cache"})
    assert changed == [], f"a refused build touched {changed}"
    assert victim.read_text() == "precious\n"
