"""The quantized model against the float model it came from, both in ONNX Runtime.

Both models run on the captured inputs: the whole model (each output compared), and every call
site alone (each function compared on the inputs torch gave it, so a layer's error is its own,
not what the layers before it passed on). Per comparison: the relative error
``|q - f| / |f|`` (L2 over all elements), the cosine similarity, and for outputs whose name says
logits, the share of positions whose top-1 class agrees. What is computed here is a record
(``quantized.json``, ``check/quantized_record.py``); the check stage judges it under
``check.quantized.*`` (``check/quantized_judge.py``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.names import QUANTIZED_DOMAIN, QUANTIZED_OP_TYPES
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.library.check.quantized_record import Closeness, QuantizedComparison
from hyperexport.library.model_file import load_model

if TYPE_CHECKING:
    from hyperexport.library.check.evaluation import OutputRun
    from hyperexport.library.check.model_evaluator import ModelEvaluator

log = logging.getLogger(__name__)


def quantized_op_counts(model: ir.Model) -> dict[str, dict[str, int]]:
    """Function name (``main``: the main graph) -> quantized op type -> nodes in its body."""
    counts: dict[str, dict[str, int]] = {}
    bodies: list[tuple[str, ir.Graph]] = [("main", model.graph)]
    bodies += [(f.name, f.graph) for f in model.functions.values()]
    for name, graph in bodies:
        found = Counter(
            n.op_type
            for n in graph
            if n.domain == QUANTIZED_DOMAIN and n.op_type in QUANTIZED_OP_TYPES
        )
        if found:
            counts[name] = dict(sorted(found.items()))
    return counts


def closeness(name: str, quantized: list[np.ndarray], reference: list[np.ndarray]) -> Closeness:
    """Relative error, cosine and (for logits) top-1 agreement of two lists of arrays."""
    q = np.concatenate([a.astype(np.float64).ravel() for a in quantized])
    f = np.concatenate([a.astype(np.float64).ravel() for a in reference])
    norm_f, norm_q = float(np.linalg.norm(f)), float(np.linalg.norm(q))
    rel = float(np.linalg.norm(q - f)) / norm_f if norm_f else float(np.linalg.norm(q - f))
    if norm_f and norm_q:
        cosine = float(q @ f) / (norm_f * norm_q)
    else:
        cosine = 1.0 if norm_f == norm_q else 0.0
    top1 = None
    if "logits" in name.lower() and len(reference) == 1 and reference[0].ndim >= 1:
        top1 = float(np.mean(quantized[0].argmax(-1) == reference[0].argmax(-1)))
    return Closeness(name=name, rel_error=rel, cosine=cosine, top1=top1)


def compare_quantized(
    float_model: tuple[Path, ExportManifest],
    quantized_model: tuple[Path, ExportManifest],
    record: CaptureRecord,
    arrays: Mapping[str, np.ndarray],
    *,
    method: str,
    block_size: int,
    evaluated: tuple[ModelEvaluator, Sequence[OutputRun]] | None = None,
) -> QuantizedComparison:
    """Run both models (whole, and every call site alone) in ONNX Runtime and compare them.

    Args:
        float_model: The float model file and its manifest.
        quantized_model: The quantized model file and its manifest.
        record: The capture record; ``arrays`` its tensors (the inputs both models run on).
        method: The quantization method (for the record).
        block_size: The int4 block size (for the record).
        evaluated: The float model's evaluator after its evaluation, and the whole-model runs
            it made (at the traced shape; empty when it made none): reused, not run again
            (the call sites it ran are not run again either), so that the quantized model is
            compared with the very outputs the check compares with torch.
    """
    from hyperexport.library.check.model_evaluator import ModelEvaluator
    from hyperexport.library.check.tensors import CapturedArrays
    from hyperexport.library.check.whole_model_runs import run_end_to_end

    captured = CapturedArrays(record, arrays)
    evaluators, ends, calls_run = [], [], []
    for side, (path, manifest) in enumerate((float_model, quantized_model)):
        reused = evaluated if side == 0 else None
        evaluator = reused[0] if reused else ModelEvaluator(path, manifest, record, arrays)
        if reused and reused[1]:
            ends.append(tuple(reused[1]))
        else:
            ends.append(run_end_to_end(path, manifest, captured, evaluator.computed))
        calls_run.append(evaluator.run_functions(range(len(manifest.calls)), "quantized"))
        evaluators.append(evaluator)
    f_arrays, q_arrays = evaluators[0].computed, evaluators[1].computed
    outputs = tuple(
        closeness(f.name, [q_arrays[q.array]], [f_arrays[f.array]])
        for f, q in zip(ends[0], ends[1], strict=True)
    )
    functions = []
    for site, f_run, q_run in zip(quantized_model[1].calls, *calls_run, strict=True):
        if f_run.error or q_run.error:
            error = f"float: {f_run.error}" if f_run.error else f"quantized: {q_run.error}"
            c = Closeness(site.call_id, error=error)
        else:
            q = [q_arrays[o.array] for o in q_run.outputs]
            f = [f_arrays[o.array] for o in f_run.outputs]
            c = closeness(site.call_id, q, f)
        functions.append(dataclasses.replace(c, module_path=site.module_path, function=site.name))
    ops = quantized_op_counts(load_model(quantized_model[0]))
    return QuantizedComparison(method, block_size, ops, outputs, tuple(functions))
