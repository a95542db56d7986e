"""Read the final model back into an ExportManifest: which function each module call calls.

The manifest is derived from the model as it is after every pass (pruning included), so the
check stage feeds each function exactly the inputs it still has. Weights are resolved through
the call chain to the main-graph initializers that really feed them (torch's exporter merges
initializers with equal values, so a weight's state-dict name is not always its graph name).
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    CallSite,
    ExportManifest,
    FunctionEntry,
)
from hyperexport.base.contracts.names import FUSED_OPS, is_invariant_input, op_id, probe_key
from hyperexport.base.contracts.records import (
    CaptureRecord,
    ModuleCall,
    leaf_names,
    tree_tensor_keys,
)
from hyperexport.base.errors import RewriteError
from hyperexport.library.options import PER_TYPE
from hyperexport.library.passes.compose_functions import CHILD_INDEX
from hyperexport.library.passes.share_kv_buffer import shared_buffer_inputs


def _call_sites(
    model: ir.Model,
    graph: ir.Graph,
    parent: ModuleCall | None,
    record: CaptureRecord,
    outer: dict[str, str | None] | None,
    sites: dict[str, CallSite],
) -> None:
    """Visit the call nodes of ``graph`` (the body run for ``parent``), depth first."""
    children = record.children(parent.call_id if parent else None)
    initializers = model.graph.initializers
    for node in graph:
        if node.domain != FUNCTION_DOMAIN or CHILD_INDEX not in node.meta:
            continue
        call = children[node.meta[CHILD_INDEX]]
        function = model.functions[node.op_identifier()]
        actual: dict[str, str | None] = {}
        for formal, value in zip(function.graph.inputs, node.inputs):
            name = value.name if value is not None else None
            actual[formal.name or ""] = name if outer is None else outer.get(name or "")
        in_keys = dict(zip(leaf_names(call.inputs), tree_tensor_keys(call.inputs)))
        out_keys = dict(zip(leaf_names(call.outputs, "output"), tree_tensor_keys(call.outputs)))
        data: list[str] = []
        weights: list[str] = []
        for formal in function.graph.inputs:
            if is_invariant_input(formal.name):  # computed by the main graph for every call
                continue
            if formal.name in in_keys and not weights:
                data.append(in_keys[formal.name])
                continue
            source = actual.get(formal.name or "")
            if source is None or source not in initializers:
                raise RewriteError(
                    f"manifest: input {formal.name!r} of function {node.op_type} (module "
                    f"{call.path!r}) is neither a captured input nor fed by a main-graph weight"
                )
            weights.append(source)
        outputs = [out_keys[v.name] for v in function.graph.outputs if v.name in out_keys]
        if len(outputs) != len(function.graph.outputs):
            raise RewriteError(
                f"manifest: outputs of function {node.op_type} lost their capture names"
            )
        sites[call.call_id] = CallSite(
            call.call_id,
            call.path,
            FUNCTION_DOMAIN,
            node.op_type,
            tuple(data),
            tuple(weights),
            tuple(outputs),
        )
        _call_sites(model, function.graph, call, record, actual, sites)


def build_manifest(
    model: ir.Model, bundle: ExportBundle, record: CaptureRecord, fusion: str = "none"
) -> ExportManifest:
    """Describe ``model``'s functions and call sites in terms of the capture's tensors (and,
    after a fusion, the fused kernels in each function)."""
    sites: dict[str, CallSite] = {}
    _call_sites(model, model.graph, None, record, None, sites)
    used: dict[str, tuple[str, list[str], str]] = {}
    per_type = bundle.function_mode == PER_TYPE
    for call in record.calls:
        site = sites.get(call.call_id)
        if site is not None:
            reason = bundle.unit_for(call.call_id).split_reason if per_type else ""
            _, paths, _ = used.setdefault(site.name, (call.class_name, [], reason))
            if call.path not in paths:
                paths.append(call.path)
    entries = [
        FunctionEntry(
            FUNCTION_DOMAIN,
            name,
            class_name,
            tuple(paths),
            reason,
            _fused_ops(_function(model, name), fusion),
        )
        for name, (class_name, paths, reason) in used.items()
    ]
    missing = [c.call_id for c in record.calls if c.call_id not in sites]
    if missing:
        raise RewriteError(f"manifest: module calls {missing} have no call site in the final model")
    graph_inputs = _graph_input_keys(model, bundle, record)
    probe = record.probe_inputs is not None and record.probe_outputs is not None
    return ExportManifest(
        dynamo=bundle.dynamo,
        opset=model.opset_imports.get("", bundle.opset),
        function_mode=bundle.function_mode,
        graph_inputs=graph_inputs,
        graph_outputs=tuple(tree_tensor_keys(record.outputs)),
        functions=tuple(entries),
        calls=tuple(sites[c.call_id] for c in record.calls),
        fallback_from=bundle.fallback_from,
        probe_inputs=tuple(probe_key(k) for k in graph_inputs) if probe else (),
        probe_outputs=tuple(probe_key(k) for k in tree_tensor_keys(record.outputs))
        if probe
        else (),
        fusion=fusion,
        kv_buffers=tuple(sorted(shared_buffer_inputs(model).items())),
    )


def _function(model: ir.Model, name: str) -> ir.Function:
    return next(
        f for f in model.functions.values() if (f.domain, f.name) == (FUNCTION_DOMAIN, name)
    )


def _fused_ops(function: ir.Function, fusion: str) -> tuple[tuple[str, int], ...]:
    """``(op, nodes)`` of the kernels fusion ``fusion`` writes, in the body of ``function``."""
    fused = set(FUSED_OPS.get(fusion, ()))
    counts = Counter(op_id(n.domain, n.op_type) for n in function)
    return tuple(sorted((op, n) for op, n in counts.items() if op in fused))


def _graph_input_keys(
    model: ir.Model, bundle: ExportBundle, record: CaptureRecord
) -> tuple[str, ...]:
    by_name = dict(zip(bundle.root_input_names, tree_tensor_keys(record.inputs)))
    return tuple(by_name[v.name] for v in model.graph.inputs if v.name in by_name)
