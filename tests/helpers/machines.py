"""Two "machines" on one: virtualenvs, checkouts, homes and temporary directories at other paths.

A machine here is a folder holding a virtualenv, a copy of the checkout under test, a user
folder (recipe and model module), a home, a temporary directory, a cache and an outputs
folder. Builds run in a new interpreter of that virtualenv with that environment, so nothing of
the test process (its ``sys.path``, its imported modules) leaks in. Used by the tests of issue
32: the same inputs give the same keys, and a remote filled on one machine serves another.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: What a checkout holds that a build reads: the package, and the config roots beside it.
CHECKOUT_PARTS = (
    "hyperexport",
    "conf",
    "recipes",
    "pyproject.toml",
    "constraints.txt",
    "README.md",
)

#: Two small distributions: ``hxm-model`` holds the model the recipe names (as transformers
#: does), and imports ``hxm-shift``. Each installs a console script, whose first line names the
#: virtualenv's Python (what made RECORD's digest differ between virtualenvs).
MODEL = """
import torch

from hxm_shift import SHIFT


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.fc(x)) + SHIFT + x


class Net(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make(dim: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Net(dim).eval()


def main():
    print(make())
"""
DISTRIBUTIONS = {
    "hxm-model": ("hxm_model", MODEL),
    "hxm-shift": ("hxm_shift", "SHIFT = 0.5\n\n\ndef main():\n    print(SHIFT)\n"),
}
RECIPE = """\
name: machines
model: {_target_: hxm_model.make, seed: 0}
inputs:
  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}
hiera: [hxm_model.Block]
dynamo: false
"""


def write_distribution(root: Path, name: str) -> Path:
    """A wheel of distribution ``name`` (:data:`DISTRIBUTIONS`) in ``root``, written directly
    (no build backend: nothing to fetch), with a console script entry point."""
    package, source = DISTRIBUTIONS[name]
    info = f"{package}-1.0.dist-info"
    files = {
        f"{package}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {package}:main\n",
        f"{info}/top_level.txt": f"{package}\n",
    }
    record = [f"{path},sha256={_urlsafe_digest(text)},{len(text)}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    root.mkdir(parents=True, exist_ok=True)
    wheel = root / f"{package}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _urlsafe_digest(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Machine:
    """One machine's folders (see the module docstring)."""

    root: Path
    user_name: str

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def checkout(self) -> Path:
        return self.root / "checkout"

    @property
    def user(self) -> Path:
        return self.root / "user"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    def env(self, bytecode_home: Path | None = None) -> dict[str, str]:
        """The environment of a build here: its own home, temporary directory and user name.

        ``bytecode_home`` (``HYPEREXPORT_CACHE_DIR``) keeps the keyed loader's compiled files
        warm across machines (they never enter a key); the build's cache is ``build.cache_dir``.
        """
        home, tmp = self.root / "home", self.root / "tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HYPEREXPORT_CACHE_DIR")
        }
        env.update(
            HOME=str(home),
            TMPDIR=str(tmp),
            USER=self.user_name,
            LOGNAME=self.user_name,
            PYTHONPATH=str(self.checkout),
            PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        )
        if bytecode_home is not None:
            env["HYPEREXPORT_CACHE_DIR"] = str(bytecode_home)
        return env


def make_venv(machine: Machine, *, system_site_packages: bool) -> None:
    args = [sys.executable, "-m", "venv", str(machine.venv)]
    if system_site_packages:
        args.insert(3, "--system-site-packages")
    subprocess.run(args, check=True, capture_output=True, timeout=300)


def pip(machine: Machine, *args: str, timeout: float = 300) -> None:
    subprocess.run(
        [str(machine.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        timeout=timeout,
        env=machine.env(),
    )


def install_distributions(machine: Machine, sources: Sequence[Path]) -> None:
    """Install the small distributions' wheels, in the order given, without any index."""
    for source in sources:
        pip(machine, "--no-index", "--no-deps", str(source))


def copy_checkout(machine: Machine, repo: Path = REPO) -> None:
    machine.checkout.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in CHECKOUT_PARTS:
        source = repo / part
        if source.is_dir():
            shutil.copytree(source, machine.checkout / part, ignore=ignore)
        elif source.is_file():
            shutil.copy2(source, machine.checkout / part)


def write_user(machine: Machine) -> Path:
    """The user's folder: only a recipe (the model is installed)."""
    machine.user.mkdir(parents=True)
    recipe = machine.user / "machines.yaml"
    recipe.write_text(RECIPE)
    return recipe


def hyperexport(
    machine: Machine,
    *args: str,
    bytecode_home: Path | None = None,
    hostname: str | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``python -m hyperexport *args`` on ``machine``, from its user folder (on ``sys.path`` as
    the working directory), optionally under another host name (a UTS namespace)."""
    command = [str(machine.python), "-m", "hyperexport", *args]
    if hostname is not None:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh"]
        command += [str(machine.python), "-m", "hyperexport", *args]
    return subprocess.run(
        command,
        cwd=machine.user,
        env=machine.env(bytecode_home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def build_here(machine: Machine, *extra: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A build of the user's recipe into the machine's own cache and outputs."""
    return hyperexport(
        machine,
        f"recipe_file={machine.user / 'machines.yaml'}",
        f"build.cache_dir={machine.cache}",
        f"build.outputs_dir={machine.outputs}",
        *extra,
        **kw,
    )


def report(machine: Machine) -> dict[str, Any]:
    return json.loads((machine.outputs / "machines" / "default" / "report.json").read_text())


def stage_keys(machine: Machine) -> dict[str, str]:
    return {s["name"]: s["key"] for s in report(machine)["stages"]}


def published(machine: Machine) -> dict[str, bytes]:
    folder = (machine.outputs / "machines" / "default").resolve()
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.suffix in (".onnx", ".data") or p.name.endswith(".onnx.data")
    }


def can_rename_host() -> str | None:
    """Why a build cannot run under another host name here, or None if it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--uts", "sh", "-c", "hostname hx-probe && hostname"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "hx-probe":
        return f"cannot make a UTS namespace here ({probe.stderr.strip() or probe.returncode})"
    return None
