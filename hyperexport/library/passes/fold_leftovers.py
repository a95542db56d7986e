"""Fold the main graph's nodes that are not function calls into functions of their own.

After composition the main graph holds the calls of the hiera functions and, between them, the
nodes that belong to no hiera module (embeddings, masks, final norms, reshapes). This pass walks
the main graph in order and turns each maximal run of consecutive nodes that are not calls of a
local function into one function ``Leftover_<k>`` in domain ``hyperexport.fn``, called from the
place where the run was, so the top level becomes a sequence of function calls only.
``k`` counts the runs in graph order from 0 (skipping names already taken), so names are stable
for the same model.

Decisions:

* **Inputs** are the main-graph values the run reads and does not produce itself, in order of
  first use, including values read from inside subgraphs of the run's nodes. **Initializers are
  passed in as inputs**, never copied into the body: the functions stay weight-free, the
  weights stay where external data, the manifest and the check stage look for them, and
  ``FuseConstantsIntoFunctionsPass`` can still move them in on request. ``Constant`` nodes of
  the run are nodes like any other and move into the body.
* **Outputs** are the values the run produces that are read after it (by later nodes or their
  subgraphs) or are graph outputs, in production order. The call's outputs keep the names of
  the values they replace, so graph outputs keep their names.
* A run none of whose values is used after it is dead code; it is left in place for
  ``RemoveUnusedNodesPass`` rather than turned into a function without outputs.
* Each function imports exactly the domains its body uses, at the model's versions.

The pass requires the main graph to be topologically sorted; "consecutive" means consecutive in
that order. Call nodes made here carry no ``hyperexport.child_index`` metadata, so the manifest
builder, which follows only module calls, does not see them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import onnx_ir as ir

from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN
from hyperexport.base.errors import RewriteError

log = logging.getLogger(__name__)

#: Base name of the functions made by the pass.
LEFTOVER_PREFIX = "Leftover_"


def _walk(node: ir.Node) -> Iterator[ir.Node]:
    """``node`` and every node in its subgraphs, recursively."""
    yield node
    for attr in node.attributes.values():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            yield from ir.traversal.RecursiveGraphIterator(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            for graph in attr.as_graphs():
                yield from ir.traversal.RecursiveGraphIterator(graph)


def _runs(model: ir.Model) -> list[list[ir.Node]]:
    """Maximal runs of consecutive main-graph nodes that are not local function calls."""
    runs: list[list[ir.Node]] = [[]]
    for node in model.graph:
        if node.op_identifier() in model.functions:
            runs.append([])
        else:
            runs[-1].append(node)
    return [run for run in runs if run]


def _boundary(
    graph: ir.Graph, run: Sequence[ir.Node], inside: set[ir.Node]
) -> tuple[list[ir.Value], list[ir.Value]]:
    """The main-graph values ``run`` reads from outside, and those it produces for outside."""
    top = set(run)
    inputs: dict[int, ir.Value] = {}
    for node in _inside_order(run):
        for value in node.inputs:
            if value is None or value.graph is not graph:
                continue
            producer = value.producer()
            if producer is None or producer not in top:
                inputs.setdefault(id(value), value)
    outputs = [
        value
        for node in run
        for value in node.outputs
        if value.is_graph_output() or any(use.node not in inside for use in value.uses())
    ]
    return list(inputs.values()), outputs


def _inside_order(run: Sequence[ir.Node]) -> Iterator[ir.Node]:
    """Every node of ``run`` and of its subgraphs, in order."""
    for node in run:
        yield from _walk(node)


class FoldLeftoversPass(ir.passes.InPlacePass):
    """Group each run of non-call main-graph nodes into a ``Leftover_<k>`` function.

    Args:
        domain: Domain of the functions made.
    """

    def __init__(self, domain: str = FUNCTION_DOMAIN) -> None:
        super().__init__()
        self.domain = domain

    def requires(self, model: ir.Model) -> None:
        seen: set[ir.Node] = set()
        graph = model.graph
        for node in graph:
            for value in node.inputs:
                if value is None:
                    continue
                producer = value.producer()
                if producer is not None and producer.graph is graph and producer not in seen:
                    raise ir.passes.PreconditionError(
                        f"FoldLeftoversPass: the main graph is not topologically sorted: node "
                        f"{node.name!r} reads {value.name!r} before its producer "
                        f"{producer.name!r}"
                    )
            seen.add(node)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        made: list[str] = []
        k = 0
        for run in _runs(model):
            inside = set(_inside_order(run))
            inputs, outputs = _boundary(model.graph, run, inside)
            if not outputs:
                log.debug("fold_leftovers: %d dead nodes left for dead-code removal", len(run))
                continue
            while (self.domain, f"{LEFTOVER_PREFIX}{k}", "") in model.functions:
                k += 1
            name = f"{LEFTOVER_PREFIX}{k}"
            self._fold(model, run, inside, inputs, outputs, name)
            made.append(name)
            k += 1
        if made:
            model.opset_imports.setdefault(self.domain, 1)
            log.debug("fold_leftovers: made %s", ", ".join(made))
        return ir.passes.PassResult(model, modified=bool(made))

    def _fold(
        self,
        model: ir.Model,
        run: list[ir.Node],
        inside: set[ir.Node],
        inputs: list[ir.Value],
        outputs: list[ir.Value],
        name: str,
    ) -> None:
        graph = model.graph
        call = ir.Node(self.domain, name, inputs, num_outputs=len(outputs), name=name)
        graph.insert_before(run[0], call)
        formals = []
        for value in inputs:
            formal = ir.Value(name=value.name, type=value.type, shape=value.shape)
            for use in list(value.uses()):
                if use.node in inside:
                    use.node.replace_input_with(use.idx, formal)
            formals.append(formal)
        for value, actual in zip(outputs, call.outputs):
            actual.name, actual.type, actual.shape = value.name, value.type, value.shape
            for use in list(value.uses()):
                if use.node not in inside:
                    use.node.replace_input_with(use.idx, actual)
            for index, output in enumerate(graph.outputs):
                if output is value:
                    graph.outputs[index] = actual
        # Not safe=True: that would detach the moved nodes from their (now inner) inputs. Every
        # outside use was rewired to the call above.
        graph.remove(run)
        body = ir.Graph(
            formals,
            outputs,
            nodes=run,
            opset_imports=self._opsets(model, inside, name),
            name=name,
        )
        function = ir.Function(self.domain, name, graph=body, attributes=[])
        model.functions[function.identifier()] = function

    @staticmethod
    def _opsets(model: ir.Model, nodes: set[ir.Node], name: str) -> dict[str, int]:
        opsets: dict[str, int] = {}
        for domain in sorted({"" if n.domain == "ai.onnx" else n.domain for n in nodes}):
            version = model.opset_imports.get(domain)
            if version is None:
                raise RewriteError(
                    f"FoldLeftoversPass: {name}: the model does not import domain {domain!r}, "
                    "which the folded nodes use"
                )
            opsets[domain] = version
        return opsets
