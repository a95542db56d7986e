"""How close our fused decode step comes to the builder's once it gives up what the builder does
not do (issue 35): one-off variants of a published fused folder, stepped against the builder's.

The variants, written under OUT, are edits of ONNX Runtime's own optimised copy of our model (the
functions inlined, so each edit is one pass over a flat graph):

* ``inlined``: that copy, unedited (the reference for the edits);
* ``no_bias``: ``GroupQueryAttention`` without the attention bias and with the sizes computed as
  the builder computes them (``ReduceSum`` of the mask); a left-padded row then attends its pads,
  which transformers' attention does not;
* ``boundary``: each layer's residual ``Add`` and the next layer's norm as one
  ``SkipSimplifiedLayerNormalization``, across the boundary between two layers' functions;
* ``both``: ``no_bias`` and ``boundary``;
* ``builder_layout``: ``both`` with each projection a ``Split`` takes apart (gate and up) as
  separate MatMuls again: the builder's own kernel list.

Each process loads the builder's folder, ours and the variants in a seeded shuffled order, each
folder first in turn (``bench_generation_orders.orders``), and runs ``bench_decode_step.py`` on
them; reported per folder: the median [range] over the processes of its step CPU time over the
builder's.

    python bench/bench_step_bound.py BUILDER_FOLDER OURS_FOLDER OUT --processes 30
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_generation_orders import orders, ratios, summary  # noqa: E402

MODEL = "model.onnx"
DATA = "model.onnx.data"
MS = "com.microsoft"
#: ``GroupQueryAttention``'s input slots this script rewrites.
SEQLENS, TOTAL, BIAS = 5, 6, 10


def inlined(ours: Path, out: Path) -> Path:
    """ONNX Runtime's optimised copy of ``ours``'s model (functions inlined), in ``out``."""
    import onnxruntime as ort

    shutil.copytree(ours, out)
    for name in (MODEL, DATA):
        (out / name).unlink(missing_ok=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out / MODEL)
    options.log_severity_level = 3
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", DATA
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    ort.InferenceSession(str(ours / MODEL), options, providers=["CPUExecutionProvider"])
    return out


def without_bias(graph: onnx.GraphProto) -> None:
    """The attention without its bias; sizes as the builder computes them from the mask."""
    sizes = [
        helper.make_node("ReduceSum", ["attention_mask", "bound.axis1"], ["bound.sum"], keepdims=0),
        helper.make_node("Sub", ["bound.sum", "bound.one"], ["bound.sum1"]),
        helper.make_node("Cast", ["bound.sum1"], ["bound.seqlens"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["bound.shape"]),
        helper.make_node("Gather", ["bound.shape", "bound.one"], ["bound.total64"], axis=0),
        helper.make_node("Cast", ["bound.total64"], ["bound.total"], to=TensorProto.INT32),
    ]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], np.int64), "bound.axis1"),
            numpy_helper.from_array(np.array(1, np.int64), "bound.one"),
        ]
    )
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            inputs = list(node.input)
            inputs[SEQLENS], inputs[TOTAL] = "bound.seqlens", "bound.total"
            del node.input[:]
            node.input.extend(inputs[:BIAS])  # no bias, nor the query lengths after it
    nodes = sizes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)


def across_boundaries(graph: onnx.GraphProto) -> None:
    """Each residual ``Add`` feeding a ``SimplifiedLayerNormalization``, one
    ``SkipSimplifiedLayerNormalization`` giving the norm and the sum."""
    producer = {o: n for n in graph.node for o in n.output}
    nodes, dropped = list(graph.node), set()
    for norm in graph.node:
        add = (
            producer.get(norm.input[0]) if norm.op_type == "SimplifiedLayerNormalization" else None
        )
        if add is None or add.op_type != "Add":
            continue
        epsilon = next(a.f for a in norm.attribute if a.name == "epsilon")
        fused = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], norm.input[1]],
            [norm.output[0], "", "", add.output[0]],
            domain=MS,
            epsilon=epsilon,
        )
        nodes[nodes.index(add)] = fused
        dropped.add(id(norm))
    del graph.node[:]
    graph.node.extend(n for n in nodes if id(n) not in dropped)


def unpacked(graph: onnx.GraphProto) -> None:
    """Each ``MatMul``/``MatMulNBits`` whose output a ``Split`` takes apart, one per part (in a
    generation step, whose query, key and value go to the attention packed: gate and up). The
    weights are initializers, as in ONNX Runtime's copy: a float one ``[K, N]``, pre-transposed."""
    initializers = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    nodes = list(graph.node)
    for split in [n for n in graph.node if n.op_type == "Split"]:
        matmul = producer.get(split.input[0])
        if matmul is None or matmul.op_type not in ("MatMul", "MatMulNBits"):
            continue
        sizes = numpy_helper.to_array(initializers[split.input[1]])
        attributes = {a.name: helper.get_attribute_value(a) for a in matmul.attribute}
        parts, start = [], 0
        for k, (size, output) in enumerate(zip(sizes, split.output, strict=True)):
            rows = slice(start, start + int(size))
            weights = [name for name in matmul.input[1:] if name]
            names = [f"{name}.part{k}" for name in weights]
            if matmul.op_type == "MatMul":  # [K, N]: columns
                weight = numpy_helper.to_array(initializers[matmul.input[1]])
                arrays = [weight[:, rows]]
                extra = {}
            else:  # weights [N, blocks, bytes], scales and zero points: N rows each
                n = attributes["N"]
                arrays = []
                for name in weights:
                    array = numpy_helper.to_array(initializers[name])
                    part = array.reshape(n, -1)[rows]
                    arrays.append(
                        part.reshape((-1,) if array.ndim == 1 else (-1, *array.shape[1:]))
                    )
                extra = {**attributes, "N": int(size)}
            graph.initializer.extend(
                numpy_helper.from_array(np.ascontiguousarray(a), n)
                for a, n in zip(arrays, names, strict=True)
            )
            parts.append(
                helper.make_node(
                    matmul.op_type,
                    [matmul.input[0], *names],
                    [output],
                    domain=matmul.domain,
                    **extra,
                )
            )
            start += int(size)
        at = nodes.index(matmul)
        nodes[at : at + 1] = parts
        nodes.remove(split)
    del graph.node[:]
    graph.node.extend(nodes)


def write_variant(source: Path, out: Path, edits: list[Callable[[onnx.GraphProto], None]]) -> Path:
    """``source``'s model with ``edits`` applied, dead nodes and initializers dropped, in ``out``."""
    model = onnx.load(str(source / MODEL))
    for edit in edits:
        edit(model.graph)
    outputs = {o.name for o in model.graph.output}
    nodes = list(model.graph.node)
    while True:
        read = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if any(o in read for o in n.output if o)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    read = {i for n in nodes for i in n.input}
    initializers = [i for i in model.graph.initializer if i.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(initializers)
    shutil.copytree(source, out)
    for name in (MODEL, DATA):
        (out / name).unlink(missing_ok=True)
    onnx.save(model, str(out / MODEL), save_as_external_data=True, location=DATA)
    return out


def variants(ours: Path, out: Path) -> dict[str, Path]:
    """The module docstring's variants of ``ours``, written under ``out``."""
    base = inlined(ours, out / "inlined")
    made = {"inlined": base}
    for name, edits in {
        "no_bias": [without_bias],
        "boundary": [across_boundaries],
        "both": [without_bias, across_boundaries],
        "builder_layout": [without_bias, across_boundaries, unpacked],
    }.items():
        made[name] = write_variant(base, out / name, edits)
    return made


def measure(folders: dict[str, Path], processes: int) -> list[dict[str, float]]:
    """Each process's step CPU times over the first label's (``bench_decode_step.py``), the
    processes loading the folders in ``bench_generation_orders.orders``' seeded orders."""
    step = HERE / "bench_decode_step.py"
    base = next(iter(folders))
    per_process = []
    for k, order in enumerate(orders(list(folders), processes)):
        command = [sys.executable, str(step), *(str(folders[label]) for label in order)]
        command += ["--past", "40", "--max-length", "80", "--rounds", "60", "--calls", "20"]
        text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        times = dict(re.findall(r"^\s+(\S+)\s+([\d.]+) us \(CPU\)", text, re.MULTILINE))
        step_us = {label: float(times[str(folder)]) for label, folder in folders.items()}
        per_process.append(ratios(step_us, base))  # each step time over the base's
        print(f"process {k + 1} (order {', '.join(order)}): "
              + ", ".join(f"{label} {r:.3f}" for label, r in per_process[-1].items()), flush=True)  # fmt: skip
    return per_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builder", type=Path, help="the builder's folder (the reference)")
    parser.add_argument("ours", type=Path, help="our published fused folder")
    parser.add_argument("out", type=Path, help="where the variants are written (must not exist)")
    parser.add_argument("--processes", type=int, default=30)
    args = parser.parse_args()
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.out.exists():
        parser.error(f"{args.out} exists: give a new folder for the variants")
    folders = {"builder": args.builder, "ours": args.ours, **variants(args.ours, args.out)}
    per_process = measure(folders, args.processes)
    print(f"{args.processes} processes, step CPU time over the builder's, median [range]:")
    for label, (median, low, high) in summary(per_process).items():
        print(f"  {label:15s} {median:.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
