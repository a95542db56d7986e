"""The version matrix: one nox session per leg, each in its own reused virtualenv.

    nox -s "leg(cheap)"                 # one leg: build its venv, run the default tests and the
                                        # zoo on both paths, write bench/versions/cheap.json
    nox -s "leg(cheap)" -- --no-zoo     # the default tests only (what .ci/run does)
    nox -l                              # every leg
    python bench/versions_table.py      # then rewrite the "Tested versions" table (docs/versions.md)

Why nox: sessions are plain Python (the legs below are one dict, parametrized into sessions),
it reuses each leg's virtualenv between runs (``-R``), installs with the ordinary pip, so the
machine's pip configuration and download cache apply as they are, and it is well kept (one
release every few months). tox would need the legs spelled as ini/toml environments, and uv
would bypass pip's configuration (the local torch wheel) and its cache.

A leg varies one axis from the pinned stack (``constraints.txt``: torch 2.13.0, everything else
the newest release), except ``floors``, which puts every declared floor together, and ``cheap``
(transformers 4.57, its floor, with onnxscript and onnx at their floors), meant to run in CI
after the default suite. torch legs other than the pin install the registry's CUDA build (run on the CPU); the
machine-wide pip cap on torch is lifted for that one install only (``PIP_CONSTRAINT=/dev/null``), and a
directory of already downloaded wheels may be named in ``HYPEREXPORT_WHEELS``. Run one torch
leg at a time: each is about 4 GB of wheels.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import nox

REPO = Path(__file__).resolve().parent
RESULTS = REPO / "bench" / "versions"
PINNED_TORCH = "2.13.0"

#: The declared floors (pyproject.toml's lower bounds), as exact releases.
FLOORS = {
    "torch": "2.2.2",
    "transformers": "4.48.3",
    "onnxscript": "0.5.7",
    "onnx": "1.19.0",
    "onnx-ir": "0.1.16",
    "onnxruntime": "1.31.0",
    "numpy": "1.26.4",
}

#: Every leg: its pins over the pinned stack. The pinned stack itself is the newest release of
#: everything but torch, so "newest" of transformers, onnxscript, onnx, onnx-ir, onnxruntime
#: and numpy is the ``pinned`` leg.
LEGS: dict[str, dict[str, str]] = {
    "pinned": {},
    "torch-2.9.1": {"torch": "2.9.1"},
    "torch-2.11.0": {"torch": "2.11.0"},
    # the newest torch with the newest of everything else (the pinned stack's): the leg that
    # sees the drift, failing on a deprecation hyperexport's own calls raise (STRICT_WARNINGS)
    "newest": {"torch": "2.15.0"},
    # each floor but torch's on the pinned stack (torch's floor is the torch-2.2.2 leg below)
    **{f"{name}-floor": {name: FLOORS[name]} for name in FLOORS if name != "torch"},
    # what .ci/run runs after the default suite: transformers 4.57 (the last 4.x; Optimum's
    # exporter still needs < 4.58), with onnxscript 0.6.2 (the lowest that takes torch 2.13's
    # dynamo path) and onnx at its floor (docs/versions.md).
    "cheap": {"transformers": "4.57.6", "onnxscript": "0.6.2", "onnx": FLOORS["onnx"]},
    # every floor at once: torch 2.2 takes the TorchScript path only (versions.unsupported)
    "floors": dict(FLOORS),
    # The TorchScript path below the floors (issue 37): transformers 5 refuses torch below 2.6, so
    # the legs below it run transformers 4.57.6, and 2.2.2 runs 4.48.3 (transformers' lowest
    # supported); torch 2.2 is built against numpy 1.x. The dynamo path is refused below
    # versions.DYNAMO_PATH_FROM_TORCH (2.6), which 2.4.1 and 2.5.1 show and 2.6.0 must disprove.
    "torch-2.2.2": {
        "torch": FLOORS["torch"],
        "transformers": FLOORS["transformers"],
        "numpy": FLOORS["numpy"],
    },
    "torch-2.4.1": {"torch": "2.4.1", "transformers": "4.57.6"},
    "torch-2.5.1": {"torch": "2.5.1", "transformers": "4.57.6"},
    "torch-2.6.0": {"torch": "2.6.0"},
    "torch-2.8.0": {"torch": "2.8.0"},
    # transformers from the seed's floor to 5.0, the newest patch of each, each with the newest
    # torch it takes: none of them caps torch, so the pinned stack's. 4.48 is the
    # transformers-floor leg, the newest is the pinned leg.
    **{
        f"transformers-{release}": {"transformers": release}
        for release in ("4.51.3", "4.53.3", "4.55.4", "4.57.6", "5.0.0")
    },
}

#: The legs whose tests fail on a ``DeprecationWarning`` or ``FutureWarning`` that hyperexport's
#: own code raises (its calls into the libraries); what the libraries raise inside themselves
#: stays allowed, listed by name in pyproject's ``filterwarnings``.
STRICT_WARNINGS = ("newest",)
_WARNINGS_AS_ERRORS = (
    r"error::DeprecationWarning:hyperexport(\..*)?$",
    r"error::FutureWarning:hyperexport(\..*)?$",
)


def _strict_warning_filters() -> str:
    """pyproject's ``filterwarnings`` with :data:`_WARNINGS_AS_ERRORS` last (the last filter
    wins), as one ``-o`` override (an ini line list is given one per line)."""
    import tomllib

    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return "\n".join([*ini["filterwarnings"], *_WARNINGS_AS_ERRORS])


#: Test tools of the dev extra that need numpy 2 (onnxifier needs numpy > 2.0): a numpy 1.x leg
#: installs without them, and the tests that use them skip there.
NUMPY2_TOOLS = ("onnxifier",)

#: Pinned in every leg to the release installed where nox runs (the pinned stack): none is an axis
#: of the matrix, and left free, pip's resolver spends many minutes backtracking through boto
#: releases to satisfy s3fs's and moto's narrow botocore ranges.
STEADY = ("boto3", "botocore", "aiobotocore", "s3fs", "fsspec", "moto")

#: What a result file records of the environment it ran in.
REPORTED = ("torch", "transformers", "onnxscript", "onnx", "onnx-ir", "onnxruntime", "numpy")

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["leg(cheap)"]


def _steady() -> dict[str, str]:
    """``{name: version}`` of :data:`STEADY` as installed where nox runs."""
    from importlib import metadata

    found = {}
    for name in STEADY:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _constraints(pins: dict[str, str]) -> str:
    """The leg's constraints: its pins, the steady ones, and torch at the pinned stack's release
    unless the leg varies it. Not the rest of constraints.txt, which pins the pinned stack's
    whole closure: a leg lets pip resolve what its own pins need (transformers 4.57 its own
    tokenizers and huggingface-hub)."""
    pins = {"torch": PINNED_TORCH, **_steady(), **pins}
    return "\n".join(f"{name}=={version}" for name, version in pins.items()) + "\n"


def _below_floors(pins: dict[str, str]) -> list[str]:
    """The distributions the leg pins below their declared floor (:data:`FLOORS`)."""
    from packaging.version import Version

    return [
        name
        for name, version in pins.items()
        if name in FLOORS and Version(version) < Version(FLOORS[name])
    ]


def _numpy1(pins: dict[str, str]) -> bool:
    """Whether the leg pins numpy 1.x (its dev tools of :data:`NUMPY2_TOOLS` cannot install)."""
    from packaging.version import Version

    return "numpy" in pins and Version(pins["numpy"]) < Version("2")


def _requirements_below_floors(pins: dict[str, str]) -> list[str]:
    """pyproject's dependencies and dev extra, each distribution the leg pins as its pin (the
    declared floor dropped), without :data:`NUMPY2_TOOLS` on a numpy 1.x leg."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    numpy1 = _numpy1(pins)
    found = []
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(text)
        if numpy1 and req.name in NUMPY2_TOOLS:
            continue
        found.append(f"{req.name}=={pins[req.name]}" if req.name in pins else text)
    return found


def _commit() -> str:
    """The short commit the leg tests, with ``+dirty`` when the work tree has changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def _counts(junit: Path) -> dict[str, Any]:
    """passed / failed / skipped / xfailed counts and the failed tests' ids from a JUnit file."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    failed: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(test_id)
        elif (skipped := case.find("skipped")) is not None:
            key = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
            counts[key] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failed_tests": sorted(failed)}


#: The default tests of a leg: pyproject's selection, less what holds on the pinned stack only
#: (the committed lock's freshness: a leg differs from the pins by design).
DEFAULT_SELECTION = "not slow and not zoo and not pinned_stack"


def _run_pytest(
    session: nox.Session, marker: str | None, junit: Path, *, strict_warnings: bool = False
) -> dict[str, Any]:
    args = ["python", "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"]
    args += ["-m", marker or DEFAULT_SELECTION]
    if strict_warnings:
        args += ["-o", f"filterwarnings={_strict_warning_filters()}"]
    start = time.monotonic()
    session.run(*args, f"--junitxml={junit}", success_codes=[0, 1], env={"PYTHONPATH": str(REPO)})
    return {**_counts(junit), "wall_seconds": round(time.monotonic() - start)}


@nox.session(python="3.11")
@nox.parametrize("leg", list(LEGS), ids=list(LEGS))
def leg(session: nox.Session, leg: str) -> None:
    """Build the leg's environment, run the default tests and the zoo, write its result file."""
    pins = LEGS[leg]
    strict = leg in STRICT_WARNINGS
    tmp = Path(session.create_tmp())
    constraints = tmp / "constraints.txt"
    constraints.write_text(_constraints(pins))
    env: dict[str, str] = {}
    install = ["-c", str(constraints)]
    if pins.get("torch", PINNED_TORCH) != PINNED_TORCH:
        # the machine's cap on torch, lifted for this install only (an empty value keeps the
        # cap of a pip.conf; a constraints file with nothing in it replaces it)
        env["PIP_CONSTRAINT"] = os.devnull
        if wheels := os.environ.get("HYPEREXPORT_WHEELS"):
            install += ["--find-links", wheels]
    # a reused venv is brought to the newest release the leg's constraints allow (else a venv
    # first built under other pins keeps them: the onnx-ir-floor leg kept onnxscript 0.6.2)
    install += ["--upgrade", "--upgrade-strategy", "eager"]
    start = time.monotonic()
    if (below := _below_floors(pins)) or _numpy1(pins):
        # pyproject's floors refuse this stack, or the dev extra's numpy-2 tools do: its
        # requirements with the leg's pins in place of those floors (without those tools), then
        # hyperexport itself without dependencies (a leg that passes is what lowers a floor)
        session.log(f"leg {leg}: below the floors of {below}, or numpy 1.x without {NUMPY2_TOOLS}")
        session.install(*install, *_requirements_below_floors(pins), env=env)
        session.install("--no-deps", "-e", str(REPO), env=env)
    else:
        session.install(*install, "-e", f"{REPO}[dev]", env=env)
    setup_seconds = round(time.monotonic() - start)
    versions = session.run(
        "python",
        "-c",
        "import json, importlib.metadata as m\n"
        f"print(json.dumps({{n: m.version(n) for n in {list(REPORTED)!r}}}))",
        silent=True,
    )
    if versions is None:  # nox --install-only
        return
    installed = json.loads(str(versions).strip().splitlines()[-1])
    result: dict[str, Any] = {
        "leg": leg,
        "commit": _commit(),
        "pins": pins,
        "installed": installed,
        "python": str(
            session.run(
                "python", "-c", "import platform; print(platform.python_version())", silent=True
            )
        ).strip(),
        "platform": f"{platform.system()} {platform.machine()}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "setup_seconds": setup_seconds,
        "default": _run_pytest(session, None, tmp / "default.xml", strict_warnings=strict),
    }
    if strict:
        result["strict_warnings"] = list(_WARNINGS_AS_ERRORS)
    if "--no-zoo" not in session.posargs:
        result["zoo"] = _run_pytest(session, "zoo", tmp / "zoo.xml", strict_warnings=strict)
    if "--no-write" not in session.posargs:
        RESULTS.mkdir(parents=True, exist_ok=True)
        target = RESULTS / f"{leg}.json"
        part = target.with_suffix(".json.part")
        part.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        os.replace(part, target)
        session.log(f"wrote {target.relative_to(REPO)}")
    failed = result["default"]["failed"] + result.get("zoo", {}).get("failed", 0)
    if failed:
        session.error(f"leg {leg}: {failed} failed (see {tmp})")
    print(f"leg {leg}: ok", file=sys.stderr)


#: What the stack is, of constraints.txt: the distributions whose versions the lock records (and
#: torch); ``nox -s constraints`` resolves the rest afresh around them.
STACK = (
    "torch",
    "transformers",
    "onnxscript",
    "onnx",
    "onnx-ir",
    "onnxruntime",
    "onnxruntime-genai",
    "numpy",
    "ml-dtypes",
)


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@nox.session(python="3.11", reuse_venv=False)
def constraints(session: nox.Session) -> None:
    """Rewrite constraints.txt: the stack's pins kept, everything else ``pip install -e .[dev]``
    resolves around them in a fresh virtualenv, frozen (its comment header kept)."""
    path = REPO / "constraints.txt"
    lines = path.read_text().splitlines()
    header = [line for line in lines if line.startswith("#")]
    stack = [
        line
        for line in lines
        if "==" in line and _normalized(line.split("==", 1)[0].strip()) in STACK
    ]
    tmp = Path(session.create_tmp())
    (tmp / "stack.txt").write_text("\n".join(stack) + "\n")
    session.install("-c", str(tmp / "stack.txt"), "-e", f"{REPO}[dev]")
    frozen = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    pins = sorted(
        (line for line in str(frozen).splitlines() if "==" in line and not line.startswith("#")),
        key=str.lower,
    )
    path.write_text("\n".join([*header, *pins]) + "\n")
    session.log(f"wrote {path.relative_to(REPO)} ({len(pins)} pins)")


#: The ONNX Runtime a model built here must still load (``target.onnxruntime``), and the numpy it
#: was built against: the consumer's environment of ``nox -s onnxruntime-1.16``.
OLD_RUNTIME = {"onnxruntime": "1.16.3", "numpy": "1.26.4"}


@nox.session(name="onnxruntime-1.16", python="3.11", reuse_venv=False)
def old_runtime(session: nox.Session) -> None:
    """Models built on the pinned stack load in ONNX Runtime 1.16 and match torch there.

    The virtualenv holds onnxruntime 1.16.3 and numpy 1.x only (the model's consumer); the builds
    run where nox runs, on the pinned stack, and ``tests/e2e/test_old_runtime.py`` runs each
    model in that virtualenv through a subprocess (``HYPEREXPORT_OLD_ONNXRUNTIME_PYTHON``),
    against the reference the build captured. The virtualenv is removed afterwards.
    """
    import shutil

    session.install(*(f"{name}=={version}" for name, version in OLD_RUNTIME.items()))
    venv = Path(str(session.virtualenv.location))
    start = time.monotonic()
    try:
        session.run(
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "e2e" / "test_old_runtime.py"),
            external=True,
            env={
                "PYTHONPATH": str(REPO),
                "HYPEREXPORT_OLD_ONNXRUNTIME_PYTHON": str(venv / "bin" / "python"),
            },
        )
    finally:
        shutil.rmtree(venv)
    session.log(f"onnxruntime-1.16: {round(time.monotonic() - start)} s")
