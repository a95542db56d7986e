"""Export at real model sizes: wall time and peak memory, one fresh process per variant.

    python bench/bench_scale.py [--shapes qwen2_0_5b llama3_2_1b] [--paths torchscript dynamo]
                                [--variants plain per_type per_instance] [--dtype float32]
                                [--verify] [--threads 1]

For each decoder shape (``hyperexport.zoo.DECODER_SHAPES``, random weights) and export path it
runs, each in its own process, one after the other:
  plain         torch.onnx.export(dynamo=...) of the model, external data (the baseline)
  per_type      export_hyper_onnx(hiera=[<DecoderLayer>], functions=per_type), external data
  per_instance  the same with functions=per_instance
on input_ids (1, 32) with an all-ones attention mask, and prints the export's wall time and its
ratio to plain, and three memory figures over the weights' bytes:
  peak      the whole process's peak RSS (``VmHWM``: model build and export);
  start     the RSS when the export starts: torch, transformers and the built model, run once
            for the reference (a process that holds the model cannot go below it);
  increment the export's own high-water mark above ``start``: the high-water mark is reset
            (``/proc/self/clear_refs``) when the clock starts and read when it stops.
The model is built before the clock starts. ``--warm-up`` first runs a tiny export on the same
path, so that the exporter's one-time costs (code, operator registries) fall before the reset
rather than in the increment. With ``--verify`` every exported model is then run in ONNX
Runtime, in another process, against torch's output.

A variant whose expected peak (4.2x the weights for a plain TorchScript export, 1.3x otherwise)
exceeds the memory available is skipped and reported as such, not run into the OOM killer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Expected peak RSS over the weights, per variant, for the skip decision (measured).
EXPECTED_PEAK = {"plain/torchscript": 4.2, "plain/dynamo": 1.3}
DEFAULT_PEAK = 1.3


def _available_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _status_bytes(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the RSS high-water mark) of this process, in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_high_water() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where the kernel refuses.

    Writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+) resets the high-water mark; from
    then on ``VmHWM`` (and ``ru_maxrss``, which reads the same counter) is the peak since.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError as e:
        print(f"WARNING: cannot reset the RSS high-water mark ({e}); no increment", file=sys.stderr)
        return False
    if _status_bytes("VmHWM") > _status_bytes("VmRSS") + (1 << 20):
        print("WARNING: the RSS high-water mark did not reset; no increment", file=sys.stderr)
        return False
    return True


def _warm_up(dynamo: bool) -> None:
    """A tiny export on the same path: the exporter's one-time costs, paid before the clock."""
    import io

    import torch

    tiny = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
    with torch.no_grad():
        torch.onnx.export(
            tiny, (torch.randn(2, 8),), None if dynamo else io.BytesIO(), dynamo=dynamo
        )


def _layer_class(model: Any) -> type:
    return type(model.layers[0])


def run_one(
    shape: str, path: str, variant: str, dtype: str, out: Path, threads: int, warm_up: bool
) -> None:
    """Child process: build the model, export it one way, print one JSON line of figures."""
    import warnings

    import torch

    from hyperexport import ExportOptions, export_hyper_onnx, zoo
    from hyperexport.library.capture.model_patches import export_context

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    model = zoo.sized_decoder(shape, dtype)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (1, 32), generator=generator)
    mask = torch.ones(1, 32, dtype=torch.int64)
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state
    _save_reference(out, ids, mask, reference)
    dynamo = path == "dynamo"
    if warm_up:
        _warm_up(dynamo)
    rss_start = _status_bytes("VmRSS")
    peak_before = _status_bytes("VmHWM")
    reset = _reset_high_water()
    target = out / "model.onnx"
    started = time.perf_counter()
    if variant == "plain":
        wrapper = _plain_wrapper(model)
        with export_context(model, dynamo), torch.no_grad():
            torch.onnx.export(
                wrapper,
                (ids, mask),
                str(target),
                dynamo=dynamo,
                opset_version=18,
                input_names=["input_ids", "attention_mask"],
                external_data=True,
            )
    else:
        export_hyper_onnx(
            model,
            (),
            target,
            kwargs={"input_ids": ids, "attention_mask": mask},
            hiera=[_layer_class(model)],
            dynamo=dynamo,
            opset_version=18,
            external_data=True,
            options=ExportOptions(functions=variant),  # type: ignore[arg-type]
        )
    wall = time.perf_counter() - started
    peak_export = _status_bytes("VmHWM")
    files = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    print(
        json.dumps(
            {
                "wall": wall,
                "peak": max(peak_before, peak_export),
                "weights": weights,
                "rss_start": rss_start,
                "increment": peak_export - rss_start if reset else None,
                "bytes": files,
            }
        )
    )


def _plain_wrapper(model: Any) -> Any:
    """The model as ``(input_ids, attention_mask) -> last_hidden_state``, for torch.onnx.export."""
    import torch

    class Plain(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Plain(model).eval()


def _save_reference(out: Path, ids: Any, mask: Any, reference: Any) -> None:
    import numpy as np

    np.save(out / "input_ids.npy", ids.numpy())
    np.save(out / "attention_mask.npy", mask.numpy())
    np.save(out / "reference.npy", reference.float().numpy())


def verify(out: Path) -> float:
    """Child process: max |ONNX Runtime - torch| of the exported model (run upcast if needed)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(out / "model.onnx"), options)
    names = [i.name for i in session.get_inputs()]
    feeds = dict(zip(names, [np.load(out / "input_ids.npy"), np.load(out / "attention_mask.npy")]))
    (actual,) = session.run(None, feeds)
    return float(np.abs(actual.astype(np.float32) - np.load(out / "reference.npy")).max())


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {result.returncode}: {' | '.join(tail)}"}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def _weights_estimate(shape: str, dtype: str) -> int:
    from hyperexport import zoo

    _, sizes = zoo.DECODER_SHAPES[shape]
    h, i, v = sizes["hidden_size"], sizes["intermediate_size"], sizes["vocab_size"]
    heads, kv = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    kv_dim = h // heads * kv
    layer = 2 * h * h + 2 * h * kv_dim + 3 * h * i + 2 * h
    params = v * h + sizes["num_hidden_layers"] * layer + h
    return params * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=["qwen2_0_5b", "llama3_2_1b"])
    parser.add_argument("--paths", nargs="+", default=["torchscript", "dynamo"])
    parser.add_argument("--variants", nargs="+", default=["plain", "per_type", "per_instance"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--warm-up", action="store_true", help="a tiny export before the clock")
    parser.add_argument("--one", nargs=4, metavar=("SHAPE", "PATH", "VARIANT", "OUT"))
    parser.add_argument("--check", metavar="OUT")
    args = parser.parse_args()
    if args.one:
        shape, path, variant, out = args.one
        run_one(shape, path, variant, args.dtype, Path(out), args.threads, args.warm_up)
        return
    if args.check:
        print(json.dumps({"max_abs": verify(Path(args.check))}))
        return
    warm = ", warm-up export first" if args.warm_up else ""
    print(f"{args.dtype}, {args.threads} thread(s), input (1, 32), one process per run{warm}")
    print("ratios over the weights' bytes: peak (whole process), start (RSS when the export")
    print("starts), incr (the export's own high-water mark above start)")
    print(
        f"{'shape':>12} {'path':>11} {'variant':>12} {'wall s':>7} {'ratio':>6} "
        f"{'peak GB':>8} {'peak':>6} {'start':>6} {'incr GB':>8} {'incr':>6} {'max|d|':>8}"
    )
    for shape in args.shapes:
        weights = _weights_estimate(shape, args.dtype)
        for path in args.paths:
            plain_wall = None
            for variant in args.variants:
                factor = EXPECTED_PEAK.get(f"{variant}/{path}", DEFAULT_PEAK)
                available = _available_bytes()
                if weights * factor > 0.9 * available:
                    print(
                        f"{shape:>12} {path:>11} {variant:>12} skipped: expects "
                        f"{weights * factor / 1e9:.1f} GB, {available / 1e9:.1f} GB available"
                    )
                    continue
                with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
                    row = _child(
                        [
                            "--one",
                            shape,
                            path,
                            variant,
                            tmp,
                            "--dtype",
                            args.dtype,
                            "--threads",
                            str(args.threads),
                            *(["--warm-up"] if args.warm_up else []),
                        ]
                    )
                    if "error" in row:
                        print(f"{shape:>12} {path:>11} {variant:>12} failed: {row['error']}")
                        continue
                    diff = _child(["--check", tmp])["max_abs"] if args.verify else float("nan")
                if variant == "plain":
                    plain_wall = row["wall"]
                ratio = row["wall"] / plain_wall if plain_wall else float("nan")
                w = row["weights"]
                incr = float("nan") if row["increment"] is None else row["increment"]
                print(
                    f"{shape:>12} {path:>11} {variant:>12} {row['wall']:7.1f} {ratio:6.2f} "
                    f"{row['peak'] / 1e9:8.2f} {row['peak'] / w:5.3f}x "
                    f"{row['rss_start'] / w:5.3f}x {incr / 1e9:8.3f} {incr / w:5.3f}x "
                    f"{diff:8.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
