"""A Llama-2-7B-shaped bf16 decoder, exported hierarchically and checked function by function.

    python bench/bench_7b.py OUT_DIR [--layers 32] [--dynamo] [--functions per_type]
    python bench/bench_7b.py OUT_DIR --plain [--dynamo] [--limit-gb 21]

Process 1 builds the model (random weights made directly in bfloat16, ``zoo.sized_decoder``),
captures it, exports it with ``export_hyper_onnx(external_data=True)`` and prints its peak RSS.
Process 2 (the check, without torch's model in memory) runs ``run_checks`` on the result: the
whole-model comparison when memory allows, otherwise skipped with its reason, and every layer
alone, upcast to float32; it prints its own peak RSS. Needs free disk for one copy of the weights
(13.5 GB), written once.

With ``--plain`` the one process is a plain ``torch.onnx.export(dynamo=...)`` of the same model
(external data), the baseline the issue asks about. It runs under a watchdog: this process reads
the child's resident memory every half second and kills it past ``--limit-gb`` (so a baseline
that needs more memory than the machine has is stopped and reported, not left to the kernel's
OOM killer, which may pick another process).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def export(out: Path, layers: int, dynamo: bool, functions: str) -> None:
    import torch

    from hyperexport import ExportOptions, export_hyper_onnx, zoo
    from hyperexport.library.api import capture_model

    started = time.perf_counter()
    model = zoo.sized_decoder("llama2_7b", "bfloat16", num_layers=layers)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    built = time.perf_counter()
    ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(0))
    layer = type(model.layers[0])
    capture = capture_model(model, (ids,), hiera=[layer], dynamo=dynamo)
    capture.save(out / "capture")
    manifest = export_hyper_onnx(
        model,
        (ids,),
        out / "model.onnx",
        hiera=[layer],
        dynamo=dynamo,
        external_data=True,
        options=ExportOptions(functions=functions),  # type: ignore[arg-type]
    )
    (out / "manifest.json").write_text(manifest.dumps())
    figures = {
        "weights_gb": weights / 1e9,
        "build_s": built - started,
        "capture_and_export_s": time.perf_counter() - built,
        "peak_gb": _peak(),
    }
    print(json.dumps(figures))


def plain(out: Path, layers: int, dynamo: bool) -> None:
    import torch

    from hyperexport import zoo

    started = time.perf_counter()
    model = zoo.sized_decoder("llama2_7b", "bfloat16", num_layers=layers)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    built = time.perf_counter()
    print(json.dumps({"weights_gb": weights / 1e9, "build_s": built - started}), flush=True)
    ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(0))
    torch.onnx.export(model, (ids,), str(out / "plain.onnx"), dynamo=dynamo, external_data=True)
    figures = {"export_s": time.perf_counter() - built, "peak_gb": _peak()}
    print(json.dumps(figures), flush=True)


def _rss_gb(pid: int) -> float:
    """Resident memory of process ``pid`` in GB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def watched(command: list[str], limit_gb: float) -> None:
    """Run ``command``, killing it when its resident memory passes ``limit_gb``."""
    started = time.perf_counter()
    child = subprocess.Popen(command)
    highest = 0.0
    while child.poll() is None:
        rss = _rss_gb(child.pid)
        highest = max(highest, rss)
        if rss > limit_gb:
            child.kill()
            child.wait()
            print(
                json.dumps(
                    {
                        "killed": True,
                        "at_gb": round(rss, 2),
                        "limit_gb": limit_gb,
                        "after_s": round(time.perf_counter() - started, 1),
                    }
                )
            )
            return
        time.sleep(0.5)
    print(json.dumps({"exit": child.returncode, "sampled_peak_gb": round(highest, 2)}))


def check(out: Path) -> None:
    from hyperexport.base.contracts.manifest import ExportManifest
    from hyperexport.library.api import Capture
    from hyperexport.library.check import CheckSettings, run_checks

    started = time.perf_counter()
    capture = Capture.load(out / "capture")
    manifest = ExportManifest.loads((out / "manifest.json").read_text())
    report = run_checks(
        out / "model.onnx", manifest, capture.record, capture.arrays, CheckSettings()
    )
    (out / "check.txt").write_text("\n".join(report.summary_lines()) + "\n")
    print("\n".join(report.summary_lines()[:3]))
    print(
        json.dumps({"ok": report.ok, "check_s": time.perf_counter() - started, "peak_gb": _peak()})
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--dynamo", action="store_true")
    parser.add_argument("--functions", default="per_type")
    parser.add_argument("--step", choices=["export", "check", "plain"])
    parser.add_argument("--plain", action="store_true", help="a plain torch.onnx.export instead")
    parser.add_argument("--limit-gb", type=float, default=21.0, help="watchdog for --plain")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "plain":
        plain(args.out, args.layers, args.dynamo)
        return
    if args.step == "export":
        export(args.out, args.layers, args.dynamo, args.functions)
        return
    if args.step == "check":
        check(args.out)
        return
    base = [sys.executable, __file__, str(args.out), "--layers", str(args.layers)]
    base += ["--functions", args.functions] + (["--dynamo"] if args.dynamo else [])
    if args.plain:
        watched([*base, "--step", "plain"], args.limit_gb)
        return
    for step in ("export", "check"):
        subprocess.run([*base, "--step", step], check=True)


if __name__ == "__main__":
    main()
