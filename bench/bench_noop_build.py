"""Benchmark: a no-op rebuild (every stage a cache hit) against a cold build, in one run.

Usage::

    python bench/bench_noop_build.py                      # the default tiny Llama recipe
    python bench/bench_noop_build.py recipe=llama opset=17 --repeat 5

Each build is a fresh ``python -m hyperexport`` process, as a user runs it, with an empty
temporary cache and outputs directory for the cold build. The no-op builds also report whether
they imported torch (they must not). Prints one line per measurement and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, sys
from hyperexport.__main__ import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
print("PROBE " + json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def _build(overrides: list[str], root: Path) -> tuple[float, dict[str, object], str]:
    settings = [f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'outputs'}"]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides, *settings],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), "PROBE {}")
    return seconds, json.loads(line.removeprefix("PROBE ")), proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. recipe=llama")
    parser.add_argument("--repeat", type=int, default=5, help="number of no-op builds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hyperexport-bench-") as tmp:
        root = Path(tmp)
        cold, info, log = _build(args.overrides, root)
        print(f"cold build: {cold:.2f}s (exit {info.get('code')})")
        if info.get("code") != 0:
            print(log, file=sys.stderr)
            return 1
        noops: list[float] = []
        imported_torch = False
        for _ in range(3 * args.repeat):
            if len(noops) == args.repeat:
                break
            seconds, info, log = _build(args.overrides, root)
            if info.get("code") != 0:
                print(log, file=sys.stderr)
                return 1
            if ": ran" in log:  # the sources changed meanwhile (an editable install being edited)
                print(f"rebuild that ran stages (sources changed?): {seconds:.2f}s, not counted")
                continue
            imported_torch |= bool(info.get("torch"))
            noops.append(seconds)
            print(f"no-op build: {seconds:.3f}s")
        if not noops:
            print("no build was a no-op", file=sys.stderr)
            return 1
    median = statistics.median(noops)
    result = {
        "cold_seconds": round(cold, 3),
        "noop_seconds_median": round(median, 3),
        "noop_seconds_max": round(max(noops), 3),
        "ratio_noop_over_cold": round(median / cold, 4),
        "noop_imported_torch": imported_torch,
        "noop_within_1s": median <= 1.0,
    }
    print(
        f"no-op/cold = {median:.3f}s / {cold:.2f}s = {median / cold:.3f}"
        f" (torch imported on no-op: {imported_torch})"
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
