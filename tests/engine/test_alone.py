"""The engine ships alone: built as its own wheel (its folder, a generated ``pyproject.toml``)
into a fresh virtual environment without system site-packages, where hyperexport cannot be
imported, its tests (this folder's, reading the engine by the wheel's name) pass.

Offline: the wheel is built without build isolation (this environment's setuptools), and what
the tests need besides the engine (pytest and its dependencies, filelock, fsspec) is linked
into the new environment from this one, never downloaded.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import hyperexport.engine as engine

#: The import name and distribution of the engine alone.
NAME = "stage_engine"
PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "stage-engine"
version = "0.1.0"
description = "Stages keyed by what they read and run, a content-addressed cache, a runner"
requires-python = ">=3.10"
dependencies = ["filelock>=3.12"]

[project.optional-dependencies]
remote = ["fsspec>=2023.1"]

[tool.setuptools]
packages = ["{NAME}"]
"""
#: Linked into the new environment: the test runner and the engine's dependencies.
LINKED = ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments")
#: ... and a third-party module the discovered-dependency tests import as one.
SAMPLE = ("typing_extensions",)
DEPENDENCIES = ("filelock", "fsspec")
PYTEST_INI = """\
[pytest]
addopts = -ra -m 'not slow'
markers =
    slow: long tests
"""


def _wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(
        Path(engine.__file__).parent, src / NAME, ignore=shutil.ignore_patterns("__pycache__")
    )
    (src / "pyproject.toml").write_text(PYPROJECT)
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("stage_engine-*.whl")
    return wheel


def _environment(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel and the linked packages; its python."""
    home = tmp_path / "venv"
    venv.create(home, with_pip=False, system_site_packages=False)
    python = home / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as archive:  # a pure wheel installs by unpacking it
        archive.extractall(site)
    for name in (*LINKED, *SAMPLE, *DEPENDENCIES):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (site / source.name).symlink_to(source)
    for dist in {d for name in (*LINKED, *SAMPLE, *DEPENDENCIES) for d in _owners(name)}:
        info = Path(str(metadata.distribution(dist)._path))  # type: ignore[attr-defined]
        if not (site / info.name).exists():
            (site / info.name).symlink_to(info)  # installed as distributions, by version
    return python


def _owners(top: str) -> list[str]:
    return metadata.packages_distributions().get(top, [])


def _tests(tmp_path: Path) -> Path:
    """This folder's tests, reading the engine by the wheel's name (this file left out)."""
    work = tmp_path / "work"
    (work / "tests" / "engine").mkdir(parents=True)
    for path in Path(__file__).parent.glob("*.py"):
        if path.name == Path(__file__).name:
            continue
        text = re.sub(r"\bhyperexport\.engine\b", NAME, path.read_text(encoding="utf-8"))
        (work / "tests" / "engine" / path.name).write_text(text, encoding="utf-8")
    (work / "pytest.ini").write_text(PYTEST_INI)
    return work


@pytest.mark.slow
def test_the_engine_builds_alone_and_its_tests_pass_where_hyperexport_is_not(
    tmp_path: Path,
) -> None:
    python = _environment(tmp_path, _wheel(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    refused = subprocess.run(
        [str(python), "-c", "import hyperexport"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert refused.returncode != 0 and "No module named 'hyperexport'" in refused.stderr
    work = _tests(tmp_path)
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine"],
        cwd=work,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(work)},
        timeout=1800,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
