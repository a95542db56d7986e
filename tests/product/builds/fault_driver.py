"""A build in its own process, for tests that kill, race or sandbox real builds.

``python -m tests.product.builds.fault_driver CACHE OUTPUTS [--delay S] [--big N] [--remote URL]
[--remote-mode MODE] [--endpoint URL]`` builds the fake recipe with the fake pipeline (real
files, real runner, real store; no torch) and prints one JSON line: the exit code and every
stage's status. ``--delay`` makes each stage (``--slow NAME``: one stage) sleep before writing
(so a test can kill it mid-stage, or start two builds that overlap); ``--big`` makes the export stage write an extra
file of N bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from hyperexport.product.builds.session import run_build
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import SlowStage, slow_pipeline
from tests.helpers.driver_process import start_module
from tests.helpers.fake_recipe import recipe


def stages(delay: float = 0.0, big: int = 0, slow: str | None = None) -> tuple[SlowStage, ...]:
    """The fake pipeline with ``delay`` on every stage (or only on stage ``slow``) and ``big``
    bytes in export's outputs (:func:`tests.engine.fakes.slow_pipeline`)."""
    return slow_pipeline(delay, big, slow)


def settings(cache: Path, outputs: Path, **remote: Any) -> BuildSettings:
    return BuildSettings(
        cache_dir=str(cache), outputs_dir=outputs, dry_run=False, force=(), **remote
    )


def start_driver(cache: Path, outputs: Path, *extra: str) -> subprocess.Popen[str]:
    """Start the driver on ``cache`` and ``outputs`` in its own process (pipes: text)."""
    return start_module("tests.product.builds.fault_driver", str(cache), str(outputs), *extra)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache", type=Path)
    parser.add_argument("outputs", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--slow", help="delay only this stage")
    parser.add_argument("--big", type=int, default=0)
    parser.add_argument("--remote")
    parser.add_argument("--remote-mode", default="read_write")
    parser.add_argument("--endpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(name)s: %(message)s")
    options = {"client_kwargs": {"endpoint_url": args.endpoint}} if args.endpoint else {}
    outcome = run_build(
        recipe(),
        settings(
            args.cache,
            args.outputs,
            remote=args.remote,
            remote_mode=args.remote_mode,
            storage_options=options,
        ),
        stages=stages(args.delay, args.big, args.slow),
        load_model=lambda: "model",
    )
    statuses = {s.name: s.status for s in outcome.result.stages}
    print(json.dumps({"exit_code": outcome.exit_code, "stages": statuses}), flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
