"""One decode step's time in ONNX Runtime, for generation folders side by side: paired rounds.

onnxruntime-genai's tokens per second (``bench_generation.py``) move by 5-10% between runs at
small shapes, more than what separates two graphs of the same model. This times the model alone:
each folder's model (the file its ``genai_config.json`` names) in one ONNX Runtime session, one
thread, fed the same decode step: one new token after ``--past`` rows. A folder whose config says
``past_present_share_buffer`` runs as onnxruntime-genai runs it: each past is a buffer of
``--max-length`` rows bound (IOBinding) as its present too, so the kernel writes in place;
otherwise the past holds ``--past`` rows and ONNX Runtime allocates the presents. The folders run
in turn, ``--calls`` runs per turn, ``--rounds`` turns, CPU time. A round's time over the first
folder's in the same round is a paired ratio, which the machine's drift moves far less than the
times themselves; their median and quartiles are what it reports.

    python bench/bench_decode_step.py BUILDER_FOLDER OURS_FOLDER [MORE ...] --past 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def decoder_config(folder: Path) -> dict[str, Any]:
    """``genai_config.json``'s model entry (the decoder's file, heads, head size) and search."""
    config = json.loads((folder / "genai_config.json").read_text())
    return {**config["model"]["decoder"], "search": config.get("search", {})}


class Step:
    """One folder's model in a session, bound to one decode step's inputs."""

    def __init__(self, folder: Path, past: int, max_length: int) -> None:
        import onnxruntime as ort

        config = decoder_config(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(folder / config["filename"]), options, ["CPUExecutionProvider"]
        )
        self.binding = self.session.io_binding()
        shared = bool(config["search"].get("past_present_share_buffer"))
        heads, size = int(config["num_key_value_heads"]), int(config["head_size"])
        rng = np.random.default_rng(0)
        self.buffers = []  # the OrtValues the binding points at
        for i in self.session.get_inputs():
            if i.name == "input_ids":
                self.binding.bind_cpu_input(i.name, np.array([[5]], np.int64))
            elif i.name == "attention_mask":
                self.binding.bind_cpu_input(i.name, np.ones((1, past + 1), np.int64))
            elif i.name == "position_ids":
                self.binding.bind_cpu_input(i.name, np.array([[past]], np.int64))
            else:  # a past: (batch, kv heads, rows, head size)
                rows = max_length if shared else past
                array = rng.standard_normal((1, heads, rows, size)).astype(np.float32)
                value = ort.OrtValue.ortvalue_from_numpy(array)
                self.buffers.append(value)
                self.binding.bind_ortvalue_input(i.name, value)
                if shared:
                    present = i.name.replace("past_key_values", "present")
                    self.binding.bind_ortvalue_output(present, value)
        for o in self.session.get_outputs():
            if not shared or not o.name.startswith("present"):
                self.binding.bind_output(o.name)

    def run(self, calls: int) -> float:
        """Microseconds of CPU per call, over ``calls`` calls."""
        started = time.process_time()
        for _ in range(calls):
            self.session.run_with_iobinding(self.binding)
        return (time.process_time() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="the first is the reference")
    parser.add_argument("--past", type=int, default=40)
    parser.add_argument("--max-length", type=int, default=80, help="a shared buffer's rows")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    steps = {folder: Step(folder, args.past, args.max_length) for folder in args.folders}
    for step in steps.values():
        step.run(50)
    times: dict[Path, list[float]] = {f: [] for f in args.folders}
    for _ in range(args.rounds):
        for folder, step in steps.items():
            times[folder].append(step.run(args.calls))
    first = np.asarray(times[args.folders[0]])
    print(f"decode step after {args.past} rows, {args.rounds} rounds of {args.calls} calls:")
    for folder in args.folders:
        ratios = np.asarray(times[folder]) / first
        q1, median, q3 = np.percentile(ratios, [25, 50, 75])
        print(
            f"  {folder!s:48s} {statistics.median(times[folder]):8.1f} us (CPU)  "
            f"/ first {median:.3f} [{q1:.3f}, {q3:.3f}]"
        )


if __name__ == "__main__":
    main()
