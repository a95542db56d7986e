"""Builds through the real stages, in process, and what their reports say.

``TOY_SOURCE`` is a small model package's source: tests write it to a temporary directory, where
it stands in for user code they can edit.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import BuildSettings, Recipe, compose_recipe, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader

TOY_SOURCE = """
import torch


class Block(torch.nn.Module):
    def __init__(self, dim: int, broken: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)
        self.broken = broken

    def forward(self, x):
        if self.broken:
            raise ValueError("this block is broken")
        return torch.relu(self.fc(x)) + x


class Net(torch.nn.Module):
    def __init__(self, dim: int, layers: int, broken_layer: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim, i == broken_layer) for i in range(layers))
        self.head = torch.nn.Linear(dim, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make(dim: int = 8, layers: int = 2, seed: int = 0, broken_layer: int = -1):
    torch.manual_seed(seed)
    return Net(dim, layers, broken_layer).eval()
"""


def build(
    recipe: Recipe,
    tmp_path: Path,
    *,
    cache: str = "cache",
    loads: list[int] | None = None,
    **kw: Any,
) -> BuildOutcome:
    settings = BuildSettings(
        cache_dir=str(tmp_path / cache),
        outputs_dir=tmp_path / "outputs",
        dry_run=bool(kw.get("dry_run", False)),
        force=tuple(kw.get("force", ())),
    )
    loader = model_loader(recipe)
    counter = loads if loads is not None else []

    def counting() -> Any:
        counter.append(1)
        return loader()

    return run_build(recipe, settings, stages=PIPELINE, load_model=counting)


def build_composed(overrides: list[str], root: Path) -> BuildOutcome:
    """Compose ``overrides`` (``recipe=<name>`` and fields, as on the command line) and build it
    with its cache and outputs under ``root``."""
    recipe, settings = compose_recipe(
        [*overrides, f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'out'}"]
    )
    return run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))


def reasons(outcome: BuildOutcome) -> dict[str, str]:
    assert outcome.report is not None
    return {s["name"]: s["reason"] for s in outcome.report["stages"]}


#: Two residual blocks and a last operation on their output; :func:`blocks_net_source` fills in
#: the last operation and a comment saying why a test needs it.
_BLOCKS_NET = """
import torch


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.fc(x)) + x


class Net(torch.nn.Module):
    # {why}
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return {last}


def make(dim: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Net(dim).eval()
"""


def blocks_net_source(last: str, why: str) -> str:
    """A model package's ``net.py``: ``make()`` builds two ``Block``s whose output ``x`` goes
    through ``last`` (an expression of ``x``), for a test that needs that operation."""
    return _BLOCKS_NET.format(last=last, why=why)


@contextlib.contextmanager
def package_in(root: Path, name: str, source: str) -> Iterator[Path]:
    """Write ``source`` as ``<name>/net.py`` under ``root`` and make the package importable
    while inside; its modules are forgotten on exit."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(source)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield pkg
    finally:
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def toy_package_in(root: Path) -> contextlib.AbstractContextManager[Path]:
    """Write ``TOY_SOURCE`` as package ``hx_toy`` under ``root`` and make it importable."""
    return package_in(root, "hx_toy", TOY_SOURCE)


def toy_package_recipe(pkg: Path, **changes: Any) -> Recipe:
    """A recipe of the ``hx_toy`` package's ``make``; ``a__b=v`` sets nested field ``a.b``."""
    data: dict[str, Any] = {
        "name": "toy",
        "model": {"_target_": "hx_toy.net.make", "seed": 0},
        "inputs": {"x": {"shape": [2, 8], "dtype": "float32", "low": -1.0, "high": 1.0}},
        "hiera": ["hx_toy.net.Block"],
        "dynamo": False,
        "rewrite": {"optimize": False, "fuse_constants": False},
    }
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return validate_recipe(data, str(pkg.parent / "toy.yaml"))
