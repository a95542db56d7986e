"""Benchmark: a no-op rebuild and a check-only rebuild, against each other and a cold build.

Usage::

    python bench/bench_noop_build.py                      # the default tiny Llama recipe
    python bench/bench_noop_build.py recipe=llama opset=17 --repeat 5

Each build is a fresh ``python -m hyperexport`` process, as a user runs it, with an empty
temporary cache and outputs directory for the cold build. Then, interleaved (so that the load of
a shared machine hits both alike), ``--repeat`` no-op builds (every stage a cache hit) and
``--repeat`` builds where only ``check.atol`` changed (trace, export and rewrite hit; check runs,
each time with a new tolerance). Both kinds report whether they imported torch (they must not).
Prints one line per measurement and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _build(overrides: list[str], root: Path) -> tuple[float, dict[str, object], str]:
    """Wall seconds, the probe's report (plus ``cpu``: the process's CPU seconds), the log."""
    settings = [f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'outputs'}"]
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides, *settings],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), "PROBE {}")
    info = {**json.loads(line.removeprefix("PROBE ")), "cpu": _children_cpu() - cpu}
    return seconds, info, proc.stdout + proc.stderr


def _ran(log: str) -> list[str]:
    """The stages a build's log says ran (``trace: ran (...)``)."""
    return [s for s in ("trace", "export", "rewrite", "check") if f"{s}: ran" in log]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. recipe=llama")
    parser.add_argument("--repeat", type=int, default=5, help="builds of each kind")
    args = parser.parse_args()
    noops: list[float] = []
    checks: list[float] = []
    noop_cpu: list[float] = []
    check_cpu: list[float] = []
    torch_on_noop = torch_on_check = False
    with tempfile.TemporaryDirectory(prefix="hyperexport-bench-") as tmp:
        root = Path(tmp)
        cold, info, log = _build(args.overrides, root)
        print(f"cold build: {cold:.2f}s (exit {info.get('code')})")
        if info.get("code") != 0:
            print(log, file=sys.stderr)
            return 1
        for attempt in range(3 * args.repeat):
            if len(noops) == args.repeat:
                break
            seconds, info, log = _build(args.overrides, root)
            if info.get("code") != 0:
                print(log, file=sys.stderr)
                return 1
            if _ran(log):  # the sources changed meanwhile (an editable install being edited)
                print(f"rebuild that ran stages (sources changed?): {seconds:.2f}s, not counted")
                continue
            torch_on_noop |= bool(info.get("torch"))
            noops.append(seconds)
            noop_cpu.append(float(info["cpu"]))  # type: ignore[arg-type]
            print(f"no-op build: {seconds:.3f}s ({info['cpu']:.2f}s CPU)")
            # A new tolerance each time, so that check really runs.
            atol = f"check.atol={1e-4 * (1 + (attempt + 1) / 1000):.7g}"
            seconds, info, log = _build([*args.overrides, atol], root)
            if info.get("code") != 0 or _ran(log) != ["check"]:
                print(f"check-only build ran {_ran(log)}, exit {info.get('code')}", file=sys.stderr)
                print(log, file=sys.stderr)
                return 1
            torch_on_check |= bool(info.get("torch"))
            checks.append(seconds)
            check_cpu.append(float(info["cpu"]))  # type: ignore[arg-type]
            print(f"check-only build ({atol}): {seconds:.3f}s ({info['cpu']:.2f}s CPU)")
        if not noops:
            print("no build was a no-op", file=sys.stderr)
            return 1
    median, check_median = statistics.median(noops), statistics.median(checks)
    result = {
        "cold_seconds": round(cold, 3),
        "noop_seconds_median": round(median, 3),
        "noop_seconds_max": round(max(noops), 3),
        "ratio_noop_over_cold": round(median / cold, 4),
        "noop_imported_torch": torch_on_noop,
        "noop_within_1s": median <= 1.0,
        "check_only_seconds_median": round(check_median, 3),
        "ratio_check_only_over_noop": round(check_median / median, 3),
        "check_only_imported_torch": torch_on_check,
        "check_only_within_1_5x": check_median <= 1.5 * median,
        "noop_cpu_median": round(statistics.median(noop_cpu), 3),
        "check_only_cpu_median": round(statistics.median(check_cpu), 3),
        "cpu_ratio_check_only_over_noop": round(
            statistics.median(check_cpu) / statistics.median(noop_cpu), 3
        ),
    }
    print(
        f"no-op/cold = {median:.3f}s / {cold:.2f}s = {median / cold:.3f}"
        f" (torch imported on no-op: {torch_on_noop})"
    )
    print(
        f"check-only/no-op = {check_median:.3f}s / {median:.3f}s = {check_median / median:.2f}"
        f" (torch imported on check-only: {torch_on_check}; target <= 1.5)"
    )
    print(
        f"CPU: check-only/no-op = {statistics.median(check_cpu):.2f}s /"
        f" {statistics.median(noop_cpu):.2f}s ="
        f" {statistics.median(check_cpu) / statistics.median(noop_cpu):.2f}"
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
