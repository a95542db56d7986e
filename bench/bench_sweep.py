"""Benchmark: a 4-job sweep run serially vs with joblib ``n_jobs=2``, each from an empty cache.

Each run is a fresh ``python -m hyperexport -m`` process with its own cache and outputs in a
temporary directory; the two kinds alternate (``--repeat`` times each) so that the load of a
shared machine hits both alike. Prints the wall time of each run, the medians and their ratio
(parallel / serial; the issue's target on a 2-core machine is <= 0.9).

    python bench/bench_sweep.py --repeat 1 [recipe=tiny_llama] [opset=15,16,17,18]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARALLEL = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def run(overrides: list[str], parallel: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "hyperexport", "-m", *overrides]
        args += [f"build.cache_dir={tmp}/cache", f"build.outputs_dir={tmp}/outputs"]
        args += PARALLEL if parallel else []
        env = {**os.environ, "HYPEREXPORT_PROGRESS": "off"}
        start = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"sweep failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each kind")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the sweep")
    args = parser.parse_args()
    overrides = args.overrides or ["recipe=tiny_llama", "opset=15,16,17,18"]
    times: dict[str, list[float]] = {"serial": [], "n_jobs=2": []}
    for _ in range(args.repeat):
        for kind in times:
            seconds = run(overrides, parallel=kind != "serial")
            times[kind].append(seconds)
            print(f"{kind}: {seconds:.1f}s", flush=True)
    serial, parallel = (statistics.median(times[k]) for k in times)
    print(f"n_jobs=2 / serial = {parallel:.1f}s / {serial:.1f}s = {parallel / serial:.2f}")
    print(
        json.dumps(
            {
                "serial": times["serial"],
                "n_jobs_2": times["n_jobs=2"],
                "ratio": round(parallel / serial, 3),
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
