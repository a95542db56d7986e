"""The manifest of a quantized model: per_type call sites name their quantized weights.

``QuantizeMatMulsPass`` replaces a per_type function's float weight input ``w`` by inputs named
``w.q4`` / ``w.q4_scales`` / ``w.q4_zero_points`` (``q8`` for int8), fed from main-graph
initializers named after the call site's float weight the same way. A call site's
``weight_inputs`` (main-graph initializer names, in the function's input order after the data
inputs) are rewritten to match; per_instance call sites have none and stay as they are.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hyperexport.base.contracts.manifest import CallSite, ExportManifest
from hyperexport.base.contracts.names import is_invariant_input
from hyperexport.base.errors import RewriteError


def _global_name(local: str, old: dict[str, str]) -> str | None:
    if local in old:
        return old[local]
    for prefix, name in old.items():  # "<weight>.q4_scales" of float weight "<weight>"
        if local.startswith(prefix + ".q"):
            return name + local[len(prefix) :]
    return None


def _weights(names: list[str]) -> list[str]:
    """The weight inputs among a function's inputs after its data inputs."""
    return [name for name in names if not is_invariant_input(name)]


def _site(site: CallSite, before: list[str], after: ir.Function, model: ir.Model) -> CallSite:
    if not site.weight_inputs:
        return site
    data = len(site.data_inputs)
    old = dict(zip(_weights(before[data:]), site.weight_inputs, strict=True))
    weights = []
    for value in after.inputs[data:]:
        if is_invariant_input(value.name):
            continue
        name = _global_name(value.name or "", old)
        if name is None or name not in model.graph.initializers:
            raise RewriteError(
                f"quantize: input {value.name!r} of {after.name} (call {site.call_id}) is fed by "
                "no main-graph initializer"
            )
        weights.append(name)
    return dataclasses.replace(site, weight_inputs=tuple(weights))


def function_inputs(model: ir.Model) -> dict[ir.OperatorIdentifier, list[str]]:
    """Each function's input names (to take before the pass runs)."""
    return {ident: [v.name or "" for v in f.inputs] for ident, f in model.functions.items()}


def quantized_manifest(
    manifest: ExportManifest, before: dict[ir.OperatorIdentifier, list[str]], model: ir.Model
) -> ExportManifest:
    """``manifest`` with the weight inputs of ``model``, the quantized model.

    Args:
        manifest: The float model's manifest.
        before: :func:`function_inputs` of the float model.
        model: The quantized model.

    Raises:
        RewriteError: When a quantized function input has no main-graph initializer to feed it.
    """
    calls = []
    for site in manifest.calls:
        ident = (site.domain, site.name, "")
        calls.append(_site(site, before[ident], model.functions[ident], model))
    return dataclasses.replace(manifest, calls=tuple(calls))
