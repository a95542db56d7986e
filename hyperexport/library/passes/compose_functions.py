"""Splice exported unit graphs into the root graph as ONNX local functions.

Each placeholder node (domain ``hyperexport.placeholder``) left by the export becomes a call of
the function made from its unit's graph. A unit's weights become function inputs, fed at each
call site with that instance's weights (per-instance mode then bakes them into per-instance
clones: ``specialize_instances.py``); any other initializer becomes a Constant node in the body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from hyperexport.base.contracts import names
from hyperexport.base.contracts.bundle import ExportBundle, UnitEntry
from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    META_FALLBACK,
    META_FUNCTION_MODE,
    PLACEHOLDER_DOMAIN,
)
from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, leaf_names
from hyperexport.base.errors import RewriteError
from hyperexport.base.versions import installed_version, installed_versions
from hyperexport.library.passes import naming

log = logging.getLogger(__name__)

#: Function ``metadata_props`` key: qualified class of the module a function was made from.
META_MODULE_CLASS = names.META_MODULE_CLASS
#: Function ``metadata_props`` key: module path of the instance (per-instance functions only).
META_MODULE_PATH = names.META_MODULE_PATH

#: ``node.meta`` key: position of a call node's module call among its parent's child calls.
CHILD_INDEX = "hyperexport.child_index"

#: The wrapper module that every unit is exported through registers the module as ``inner``.
UNIT_PREFIX = "inner."


def strip_unit_prefix(graph: ir.Graph) -> int:
    """Give initializers their module-local state names (``inner.mlp.w`` -> ``mlp.w``).

    Returns:
        How many were renamed.
    """
    renamed = 0
    for value in list(graph.initializers.values()):
        if value.name and value.name.startswith(UNIT_PREFIX):
            graph.initializers.pop(value.name)
            value.name = value.name[len(UNIT_PREFIX) :]
            graph.initializers[value.name] = value
            renamed += 1
    return renamed


def function_names(bundle: ExportBundle, record: CaptureRecord) -> dict[str, str]:
    """Unit name -> function name (per module structure), stable and readable.

    These are the names of the shared bodies; in per-instance mode the specialisation pass
    renames each instance's copy after its module path.
    """
    names: dict[str, str] = {}
    variants: dict[str, int] = {}
    for unit in bundle.units:
        if not unit.call_ids:
            continue
        call = record.call(unit.call_ids[0])
        variant = variants.get(call.class_name, 0)
        names[unit.name] = naming.type_function_name(call.class_name, variant)
        variants[call.class_name] = variant + 1
    return names


class ComposeFunctionsPass(ir.passes.InPlacePass):
    """Turn unit graphs into functions and placeholder nodes into calls of them.

    Args:
        units: Unit name -> the unit's exported model (consumed: its graph becomes a function).
        bundle: How the units fit together.
        record: The capture, for classes, paths and input/output names.

    A model whose root graph holds no placeholder node is composed already: a second run
    changes nothing and reports ``modified=False``.
    """

    def __init__(
        self, units: Mapping[str, ir.Model], bundle: ExportBundle, record: CaptureRecord
    ) -> None:
        super().__init__()
        self.units = units
        self.bundle = bundle
        self.record = record

    def requires(self, model: ir.Model) -> None:
        missing = [u.name for u in self._pending(model) if u.name not in self.units]
        if missing:
            raise ir.passes.PreconditionError(
                f"ComposeFunctionsPass: no exported model for unit(s) {missing} of the bundle"
            )

    def _pending(self, model: ir.Model) -> list[UnitEntry]:
        """The bundle's function units, unless the model is composed already.

        Every function unit is reached from the root's placeholders, so a root graph without
        placeholder nodes has been composed (and possibly specialised since).
        """
        if not any(node.domain == PLACEHOLDER_DOMAIN for node in model.graph):
            return []
        return [u for u in self.bundle.units if u.call_ids]

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        bundle, record = self.bundle, self.record
        fn_names = function_names(bundle, record)
        by_name = {u.name: u for u in bundle.units}
        modified = strip_unit_prefix(model.graph) > 0
        self._kept: dict[str, list[int]] = {}
        functions: dict[str, ir.Function] = {}
        for unit in self._pending(model):
            functions[unit.name] = self._make_function(unit, fn_names[unit.name])
        graphs: list[tuple[UnitEntry, ir.Graph]] = [(by_name["root"], model.graph)]
        graphs += [(by_name[n], f.graph) for n, f in functions.items()]
        for unit, graph in graphs:
            modified |= self._replace_placeholders(unit, graph, fn_names)
        depth = {u.name: self._depth(u) for u in bundle.units if u.call_ids}
        for name in sorted(functions, key=lambda n: (-depth[n], n)):
            function = functions[name]
            model.functions[function.identifier()] = function
        modified |= bool(functions)
        before = (
            dict(model.opset_imports),
            dict(model.metadata_props),
            model.producer_name,
            model.producer_version,
        )
        model.opset_imports.pop(PLACEHOLDER_DOMAIN, None)
        model.opset_imports[FUNCTION_DOMAIN] = 1
        model.metadata_props[META_EXPORT_PATH] = f"dynamo={bundle.dynamo}"
        model.metadata_props[META_FUNCTION_MODE] = bundle.function_mode
        if bundle.fallback_from:
            model.metadata_props[META_FALLBACK] = bundle.fallback_from
        # The libraries the model was built with, beside report.json's environment. They are
        # in the keys of the stages that make the model (export, rewrite), so a cached model
        # never names other versions than a fresh build would.
        for name, version in installed_versions().items():
            model.metadata_props[f"{names.META_VERSION_PREFIX}{name}"] = version
        # Our name with torch's version ("hyperexport 2.13.0") would mislead; say which
        # hyperexport made the model.
        model.producer_name, model.producer_version = "hyperexport", _own_version()
        after = (
            dict(model.opset_imports),
            dict(model.metadata_props),
            model.producer_name,
            model.producer_version,
        )
        return ir.passes.PassResult(model, modified=modified or before != after)

    def _depth(self, unit: UnitEntry) -> int:
        call: ModuleCall | None = self.record.call(unit.call_ids[0])
        depth = 0
        while call is not None and call.parent is not None:
            depth += 1
            call = self.record.call(call.parent)
        return depth

    def _make_function(self, unit: UnitEntry, name: str) -> ir.Function:
        graph = self.units[unit.name].graph
        opsets = dict(self.units[unit.name].opset_imports)
        strip_unit_prefix(graph)
        call = self.record.call(unit.call_ids[0])
        self._kept[unit.name] = [int((v.name or "").partition(".")[2] or -1) for v in graph.inputs]
        _rename(graph.inputs, "in", leaf_names(call.inputs), unit)
        _rename(graph.outputs, "out", leaf_names(call.outputs, "output"), unit)
        weights = set(unit.weights)
        for weight in unit.weights:
            value = graph.initializers.pop(weight, None)
            if value is None:  # the body does not use this weight; prune removes the input
                value = ir.Value(name=weight)
            else:
                value.const_value = None
            graph.inputs.append(value)
        constants = [v for n, v in graph.initializers.items() if n not in weights]
        graph.initializers.clear()
        nodes = [_constant_node(value) for value in constants]
        if nodes and len(graph):
            graph.insert_before(graph[0], nodes)
        else:
            graph.extend(nodes)
        graph.opset_imports.clear()
        graph.opset_imports.update({d: v for d, v in opsets.items() if d != PLACEHOLDER_DOMAIN})
        if unit.placeholders:
            graph.opset_imports[FUNCTION_DOMAIN] = 1
        graph.name = name
        function = ir.Function(FUNCTION_DOMAIN, name, graph=graph, attributes=[])
        # For tools that work one block at a time: which module class the function is.
        function.doc_string = f"hyperexport: {unit.class_name}"
        function.metadata_props[META_MODULE_CLASS] = unit.class_name
        return function

    def _replace_placeholders(
        self, unit: UnitEntry, graph: ir.Graph, fn_names: dict[str, str]
    ) -> bool:
        """Turn the placeholder nodes of ``graph`` into calls; True if there were any."""
        children = dict(unit.placeholders)
        parent_path = unit.module_path
        replaced = False
        for node in list(graph):
            if node.domain != PLACEHOLDER_DOMAIN:
                continue
            replaced = True
            child_id = children.get(node.op_type)
            if child_id is None:
                raise RewriteError(
                    f"compose: placeholder {node.op_type} in unit {unit.name!r} "
                    f"({parent_path or 'root'}) has no recorded module call"
                )
            child_unit = self.bundle.unit_for(child_id)
            child = self.record.call(child_id)
            # Position among the parent call's children: how the manifest finds, for any call of
            # a shared body, which captured child call this node stands for.
            node.meta[CHILD_INDEX] = list(children).index(node.op_type)
            _align_inputs(node, self._kept[child_unit.name], len(leaf_names(child.inputs)))
            node.domain = FUNCTION_DOMAIN
            node.op_type = fn_names[child_unit.name]
            rel = naming.relative_path(child.path, parent_path)
            node.name = rel if child.call_index == 0 else f"{rel}#{child.call_index}"
        return replaced


def _align_inputs(node: ir.Node, kept: list[int], n_data: int) -> None:
    """Keep the call's data inputs that the function still has (the TorchScript exporter drops
    graph inputs the body never reads), followed by the weight inputs."""
    inputs = list(node.inputs)
    aligned = [inputs[i] for i in kept] + inputs[n_data:]
    for i, value in enumerate(aligned):
        node.replace_input_with(i, value)
    node.resize_inputs(len(aligned))


def _constant_node(value: ir.Value) -> ir.Node:
    """A Constant node producing ``value``'s tensor, taking over its uses and name."""
    name = value.name
    node = ir.node("Constant", [], attributes={"value": value.const_value}, name=f"{name}/Constant")
    out = node.outputs[0]
    value.replace_all_uses_with(out)
    value.name = None
    out.name, out.type, out.shape = name, value.type, value.shape
    return node


def _rename(values: Sequence[ir.Value], prefix: str, names: list[str], unit: UnitEntry) -> None:
    """Rename the unit's ``in.<i>``/``out.<i>`` values to the capture's leaf names.

    The TorchScript exporter drops graph inputs that the body never reads, so the mapping goes by
    the index in the name, not by position.
    """
    for value in values:
        head, _, index = (value.name or "").partition(".")
        if head != prefix or not index.isdigit() or int(index) >= len(names):
            raise RewriteError(
                f"compose: unit {unit.name!r} ({unit.module_path}) has a graph value "
                f"{value.name!r} that is not one of its {len(names)} captured {prefix}puts"
            )
        value.name = names[int(index)]


def _own_version() -> str:
    """hyperexport's installed version (package metadata: importing the package loads torch)."""
    version = installed_version("hyperexport")
    if version is None:
        log.warning("hyperexport is not installed; the model's producer_version says 'unknown'")
        return "unknown"
    return version
