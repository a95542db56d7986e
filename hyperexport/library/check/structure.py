"""Structural checks of the final model: checker, functions, domains, opsets, metadata, op counts."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    PLACEHOLDER_DOMAIN,
    ExportManifest,
)
from hyperexport.base.contracts.names import NO_FUSION, op_id
from hyperexport.library.check.onnxruntime_schemas import known_to_checker
from hyperexport.library.check.results import StructuralResult
from hyperexport.library.check.settings import CheckSettings

logger = logging.getLogger(__name__)

STANDARD_DOMAINS = frozenset({"", "ai.onnx.ml"})
ALLOWED_DOMAINS = STANDARD_DOMAINS | {FUNCTION_DOMAIN, "com.microsoft"}


def _norm(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _nodes(graph_like: ir.Graph | ir.Function) -> Iterator[ir.Node]:
    yield from ir.traversal.RecursiveGraphIterator(graph_like)


def _result(name: str, problems: list[str], ok_detail: str) -> StructuralResult:
    if problems:
        return StructuralResult(name, False, "; ".join(problems))
    return StructuralResult(name, True, ok_detail)


def check_onnx_checker(model_path: Path, fusion: str = NO_FUSION) -> StructuralResult:
    """``onnx.checker.check_model(path, full_check=True)``; a path, so external data works.
    After the ``onnxruntime`` fusion, the checker knows ONNX Runtime's default-domain ops
    (``onnxruntime_schemas.py``)."""
    try:
        with known_to_checker(fusion):
            onnx.checker.check_model(str(model_path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        return StructuralResult("checker", False, f"onnx.checker: {e}".strip())
    return StructuralResult("checker", True, "onnx.checker.check_model(full_check=True) passed")


def check_functions(
    model: ir.Model, manifest: ExportManifest, settings: CheckSettings
) -> StructuralResult:
    """Every expected class and every manifest function/call site exists as a called function."""
    problems: list[str] = []
    defined = {(d, n) for d, n, _ in model.functions}
    called = {(_norm(node.domain), node.op_type) for node in _nodes(model.graph)}
    for function in model.functions.values():
        called |= {(_norm(node.domain), node.op_type) for node in _nodes(function)}
    for cls in settings.expected_classes:
        entries = [f for f in manifest.functions if f.class_name == cls]
        if not entries:
            problems.append(f"expected class {cls} has no function in the manifest")
    for entry in manifest.functions:
        ident = (entry.domain, entry.name)
        if ident not in defined:
            problems.append(f"function {entry.domain}::{entry.name} ({entry.class_name}) missing")
        elif ident not in called:
            problems.append(f"function {entry.domain}::{entry.name} is never called")
    for site in manifest.calls:
        if (site.domain, site.name) not in defined:
            problems.append(f"call {site.call_id} refers to missing {site.domain}::{site.name}")
    detail = f"{len(manifest.functions)} functions, {len(manifest.calls)} call sites present"
    return _result("functions", problems, detail)


def check_domains(model: ir.Model) -> StructuralResult:
    """No placeholder op, no private custom domain, and no call of an undefined function."""
    problems: list[str] = []
    defined = set(model.functions)
    scopes: list[tuple[str, ir.Graph | ir.Function]] = [("main graph", model.graph)]
    scopes += [(f"function {f.domain}::{f.name}", f) for f in model.functions.values()]
    for where, graph_like in scopes:
        if isinstance(graph_like, ir.Function) and graph_like.domain not in ALLOWED_DOMAINS:
            problems.append(f"{where} is in non-standard domain {graph_like.domain!r}")
        for node in _nodes(graph_like):
            domain = _norm(node.domain)
            label = f"node {node.name or node.op_type} ({domain}::{node.op_type}) in {where}"
            if domain == PLACEHOLDER_DOMAIN:
                problems.append(f"placeholder {label} survived")
            elif domain not in ALLOWED_DOMAINS:
                problems.append(f"{label} uses non-standard domain {domain!r}")
            elif domain == FUNCTION_DOMAIN and (domain, node.op_type, node.overload) not in defined:
                problems.append(f"{label} calls an undefined function")
    return _result("domains", problems, "only standard domains and hyperexport.fn")


def check_opsets(model: ir.Model, settings: CheckSettings) -> StructuralResult:
    """Every graph and function imports the domains it uses, at the model's versions."""
    problems: list[str] = []
    model_imports = {_norm(d): v for d, v in model.opset_imports.items()}
    used = {_norm(node.domain) for node in _nodes(model.graph)}
    for domain in sorted(used - model_imports.keys()):
        problems.append(f"main graph uses domain {domain!r} without importing it")
    for function in model.functions.values():
        imports = {_norm(d): v for d, v in function.opset_imports.items()}
        where = f"function {function.domain}::{function.name}"
        for domain in sorted({_norm(n.domain) for n in _nodes(function)} - imports.keys()):
            problems.append(f"{where} uses domain {domain!r} without importing it")
        for domain, version in sorted(imports.items()):
            if domain in model_imports and model_imports[domain] != version:
                problems.append(
                    f"{where} imports {domain!r} at {version}, the model at {model_imports[domain]}"
                )
    default = model_imports.get("")
    if default is None:
        problems.append("the model does not import the default domain")
    elif settings.expected_opset is not None and default != settings.expected_opset:
        problems.append(f"default-domain opset is {default}, expected {settings.expected_opset}")
    return _result("opsets", problems, f"consistent; default domain at opset {default}")


def check_metadata(
    model: ir.Model, manifest: ExportManifest, settings: CheckSettings
) -> StructuralResult:
    """``metadata_props[hyperexport.export_path]`` is valid and matches manifest and settings."""
    recorded = model.metadata_props.get(META_EXPORT_PATH)
    problems: list[str] = []
    if recorded not in ("dynamo=False", "dynamo=True"):
        problems.append(f"metadata {META_EXPORT_PATH} is {recorded!r}, not dynamo=False|True")
    else:
        if recorded != f"dynamo={manifest.dynamo}":
            problems.append(f"metadata says {recorded}, manifest says dynamo={manifest.dynamo}")
        if (
            settings.expected_dynamo is not None
            and recorded != f"dynamo={settings.expected_dynamo}"
        ):
            problems.append(f"metadata says {recorded}, expected dynamo={settings.expected_dynamo}")
    return _result("metadata", problems, f"{META_EXPORT_PATH}={recorded}")


def executed_op_counts(model: ir.Model) -> Counter[str]:
    """How many nodes of each op type the model executes (``domain::op`` outside the default
    domain, e.g. ``com.microsoft::GroupQueryAttention``; calls of its functions excluded).

    A function's nodes count once per call of the function, and calls from inside functions
    multiply (a function called twice by a function the main graph calls three times runs six
    times). Nodes in control-flow subgraphs (``If``/``Loop`` bodies) count once per enclosing
    node: executed iterations are not known statically.
    """
    bodies: dict[ir.OperatorIdentifier, ir.Function] = dict(model.functions)
    memo: dict[ir.OperatorIdentifier, Counter[str]] = {}

    def count(
        graph_like: ir.Graph | ir.Function, active: tuple[ir.OperatorIdentifier, ...]
    ) -> Counter[str]:
        counts: Counter[str] = Counter()
        for node in _nodes(graph_like):
            ident = (node.domain, node.op_type, node.overload)
            if ident in bodies and ident not in active:
                if ident not in memo:
                    memo[ident] = count(bodies[ident], (*active, ident))
                counts.update(memo[ident])
            else:
                counts[op_id(node.domain, node.op_type)] += 1
        return counts

    return count(model.graph, ())


def check_op_counts(model: ir.Model, settings: CheckSettings) -> StructuralResult:
    """Each op type of ``settings.expected_ops`` runs exactly the expected number of times."""
    counts = executed_op_counts(model)
    problems = [
        f"{op}: {counts[op]} executed, expected {want}"
        for op, want in settings.expected_ops
        if counts[op] != want
    ]
    found = ", ".join(f"{op}={counts[op]}" for op, _ in settings.expected_ops)
    return _result("op_counts", problems, f"executed nodes as expected: {found}")


def check_structure(
    model_path: Path, model: ir.Model, manifest: ExportManifest, settings: CheckSettings
) -> tuple[StructuralResult, ...]:
    """Run every structural check.

    Args:
        model_path: The model file (given to onnx's checker, so external data is followed).
        model: The same model loaded with onnx_ir.
        manifest: The export manifest.
        settings: Check settings (expected classes, opset and export path).

    Returns:
        One result per check, in a fixed order.
    """
    results: tuple[StructuralResult, ...] = (
        check_onnx_checker(model_path, manifest.fusion),
        check_functions(model, manifest, settings),
        check_domains(model),
        check_opsets(model, settings),
        check_metadata(model, manifest, settings),
    )
    if settings.expected_ops:
        results += (check_op_counts(model, settings),)
    for r in results:
        if not r.ok:
            logger.info("structural check %s failed: %s", r.name, r.detail)
    return results
