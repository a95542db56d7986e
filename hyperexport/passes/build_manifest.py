"""Read the final model back into an ExportManifest: which function each module call calls.

The manifest is derived from the model as it is after every pass (pruning included), so the
check stage feeds each function exactly the inputs it still has.
"""

from __future__ import annotations

import onnx_ir as ir

from hyperexport.capture.records import CaptureRecord, tree_tensor_keys
from hyperexport.capture.tree import leaf_names
from hyperexport.capture.units import ExportBundle
from hyperexport.errors import RewriteError
from hyperexport.manifest import FUNCTION_DOMAIN, CallSite, ExportManifest, FunctionEntry
from hyperexport.passes.compose_functions import function_names


def build_manifest(model: ir.Model, bundle: ExportBundle, record: CaptureRecord) -> ExportManifest:
    """Describe ``model``'s functions and call sites in terms of the capture's tensors."""
    fn_names = function_names(bundle, record)
    entries = []
    for unit in bundle.units:
        if not unit.call_ids:
            continue
        paths = tuple(dict.fromkeys(record.call(c).path for c in unit.call_ids))
        entries.append(FunctionEntry(FUNCTION_DOMAIN, fn_names[unit.name], unit.class_name, paths))
    initializers = model.graph.initializers
    calls = []
    for call in record.calls:
        name = fn_names[bundle.unit_for(call.call_id).name]
        function = model.functions.get((FUNCTION_DOMAIN, name, ""))
        if function is None:
            raise RewriteError(f"manifest: function {name} of module {call.path!r} is missing")
        in_keys = dict(zip(leaf_names(call.inputs), tree_tensor_keys(call.inputs)))
        out_keys = dict(zip(leaf_names(call.outputs, "output"), tree_tensor_keys(call.outputs)))
        data, weights = [], []
        for value in function.graph.inputs:
            if value.name in in_keys and not weights:
                data.append(in_keys[value.name])
                continue
            qualified = f"{call.path}.{value.name}"
            if qualified not in initializers:
                raise RewriteError(
                    f"manifest: input {value.name!r} of function {name} (module {call.path!r}) is "
                    f"neither a captured input nor a main-graph weight {qualified!r}"
                )
            weights.append(qualified)
        outputs = [out_keys[v.name] for v in function.graph.outputs if v.name in out_keys]
        if len(outputs) != len(function.graph.outputs):
            raise RewriteError(f"manifest: outputs of function {name} lost their capture names")
        calls.append(
            CallSite(
                call.call_id,
                call.path,
                FUNCTION_DOMAIN,
                name,
                tuple(data),
                tuple(weights),
                tuple(outputs),
            )
        )
    return ExportManifest(
        dynamo=bundle.dynamo,
        opset=model.opset_imports.get("", bundle.opset),
        function_mode=bundle.function_mode,
        graph_inputs=tuple(
            k for v, k in zip(model.graph.inputs, tree_tensor_keys(record.inputs)) if v is not None
        ),
        graph_outputs=tuple(tree_tensor_keys(record.outputs)),
        functions=tuple(entries),
        calls=tuple(calls),
        fallback_from=bundle.fallback_from,
    )
