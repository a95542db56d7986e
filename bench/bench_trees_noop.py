"""Benchmark: no-op and check-only builds of two source trees, interleaved.

Usage::

    python bench/bench_trees_noop.py /work/main . --repeat 10

Each tree gets its own cache and outputs (a cold build first). Then, ``--repeat`` times and in
turn for each tree, a no-op build (every stage a hit) and a check-only build (a new
``check.atol``). Every build is a fresh ``python -m hyperexport`` process with ``PYTHONPATH``
set to the tree, as :mod:`bench_noop_build` runs them. Prints the medians (wall and CPU) and the
ratios of the second tree to the first, then one JSON line.
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

from bench_noop_build import PROBE, _children_cpu, _ran


def _build(tree: Path, overrides: list[str], root: Path) -> tuple[float, float, str, int]:
    settings = [f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'outputs'}"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides, *settings],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), "PROBE {}")
    code = json.loads(line.removeprefix("PROBE ")).get("code", -1)
    return wall, _children_cpu() - cpu, proc.stdout + proc.stderr, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("trees", nargs=2, type=Path, help="baseline tree, then the tree measured")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    trees = [t.resolve() for t in args.trees]
    data: dict[str, dict[str, list[float]]] = {
        str(t): {"noop": [], "noop_cpu": [], "check": [], "check_cpu": []} for t in trees
    }
    with tempfile.TemporaryDirectory(prefix="hyperexport-bench-") as tmp:
        roots = {t: Path(tmp) / f"tree{i}" for i, t in enumerate(trees)}
        for tree, root in roots.items():
            root.mkdir()
            wall, _, log, code = _build(tree, [], root)
            print(f"{tree}: cold build {wall:.2f}s (exit {code})")
            if code != 0:
                print(log, file=sys.stderr)
                return 1
        for i in range(args.repeat):
            for tree, root in roots.items():
                wall, cpu, log, code = _build(tree, [], root)
                if code != 0 or _ran(log):
                    print(f"{tree}: not a no-op ({_ran(log)}, exit {code})\n{log}", file=sys.stderr)
                    return 1
                data[str(tree)]["noop"].append(wall)
                data[str(tree)]["noop_cpu"].append(cpu)
                atol = f"check.atol={1e-4 * (1 + (i + 1) / 1000):.7g}"
                wall, cpu, log, code = _build(tree, [atol], root)
                if code != 0 or _ran(log) != ["check"]:
                    print(f"{tree}: check-only ran {_ran(log)}\n{log}", file=sys.stderr)
                    return 1
                data[str(tree)]["check"].append(wall)
                data[str(tree)]["check_cpu"].append(cpu)
                print(
                    f"{tree.name or tree}: no-op {data[str(tree)]['noop'][-1]:.3f}s, "
                    f"check-only {wall:.3f}s"
                )
    medians = {
        t: {k: round(statistics.median(v), 3) for k, v in d.items()} for t, d in data.items()
    }
    base, new = (medians[str(t)] for t in trees)
    ratios = {k: round(new[k] / base[k], 3) for k in base}
    for tree in trees:
        print(f"{tree}: {medians[str(tree)]}")
    print(f"ratios (second / first): {ratios}")
    print(json.dumps({"medians": medians, "ratios": ratios}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
