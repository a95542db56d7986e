"""A build in its own process, for the engine's tests that kill or race real builds.

``python -m tests.engine.driver CACHE [--delay S] [--slow NAME] [--big N]`` builds the fake
configuration with the fake pipeline (real files, real runner, real store) and prints one JSON
line: every stage's status and key. ``--delay`` makes each stage (``--slow NAME``: one stage)
sleep before writing, so a test can kill it mid-stage, or start two builds that overlap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tests.engine.fakes import build, slow_pipeline
from tests.helpers.driver_process import start_module


def start(cache: Path, *extra: str) -> subprocess.Popen[str]:
    """Start the driver on ``cache`` in its own process (pipes: text)."""
    return start_module("tests.engine.driver", str(cache), *extra)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--slow", help="delay only this stage")
    parser.add_argument("--big", type=int, default=0)
    args = parser.parse_args(argv)
    result = build(args.cache, slow_pipeline(args.delay, args.big, args.slow))
    print(
        json.dumps(
            {
                "stages": {s.name: s.status for s in result.stages},
                "keys": {s.name: s.key for s in result.stages},
            }
        ),
        flush=True,
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
