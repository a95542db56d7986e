"""Per-function parity, the pure part: which calls to run, how they nest, where blame falls.

numpy-free and ONNX-free: the judge uses it without loading the model. Running a function alone
is ``function_runs.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.names import ALL_CALLS, NO_CALLS
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.library.check.results import FunctionResult


def select_calls(manifest: ExportManifest, scope: str) -> list[int]:
    """Indices into ``manifest.calls`` that ``scope`` selects, in execution order.

    ``first_instance`` keeps, for each class, the first call in execution order: the first call
    of the first instance.
    """
    if scope == NO_CALLS:
        return []
    if scope == ALL_CALLS:
        return list(range(len(manifest.calls)))
    classes = class_names(manifest)
    seen: set[str] = set()
    selected = []
    for i, site in enumerate(manifest.calls):
        cls = classes.get((site.domain, site.name), f"{site.domain}::{site.name}")
        if cls not in seen:
            seen.add(cls)
            selected.append(i)
    return selected


def class_names(manifest: ExportManifest) -> dict[tuple[str, str], str]:
    """``(domain, name)`` of each manifest function to its module class."""
    return {(f.domain, f.name): f.class_name for f in manifest.functions}


def nested_calls(manifest: ExportManifest, capture: CaptureRecord) -> list[list[int]]:
    """For each call site, the indices of the call sites nested in it (any depth), in order."""
    parents = {c.call_id: c.parent for c in capture.calls}
    index = {site.call_id: i for i, site in enumerate(manifest.calls)}
    nested: list[list[int]] = [[] for _ in manifest.calls]
    for j, site in enumerate(manifest.calls):
        ancestor = parents.get(site.call_id)
        while ancestor is not None:
            if ancestor in index:
                nested[index[ancestor]].append(j)
            ancestor = parents.get(ancestor)
    return [sorted(n) for n in nested]


def first_divergent(
    order: Sequence[int],
    get: Callable[[int], FunctionResult | None],
    nested: Sequence[Sequence[int]],
) -> int | None:
    """The first diverging call in execution order, descending into nested calls.

    A call diverges when it failed to run or an output differs from its reference (a result
    that fails only on a vacuous reference does not diverge). When a diverging call has diverging nested calls,
    the blame moves to the first of those (recursively), so the innermost guilty module is named
    rather than every module that encloses it.

    Args:
        order: Call indices in execution order.
        get: Result of a call (checking it if the caller wants), or None if unchecked.
        nested: For each call, the calls nested in it.
    """

    def diverges(i: int) -> bool:
        result = get(i)  # a refused vacuous reference is no divergence: nothing to localise
        return result is not None and result.diverges

    def innermost(i: int) -> int:
        for j in nested[i]:
            if diverges(j):
                return innermost(j)
        return i

    for i in order:
        if diverges(i):
            return innermost(i)
    return None
