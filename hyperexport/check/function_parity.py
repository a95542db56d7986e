"""Per-function parity: run each function alone on its captured inputs, and localise divergences."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir

from hyperexport import progress
from hyperexport.check.compare import compare_arrays
from hyperexport.check.ort_session import OrtRunner
from hyperexport.check.report import FunctionResult, TensorResult
from hyperexport.check.settings import CheckSettings, Tolerance
from hyperexport.check.standalone import build_standalone, input_signature
from hyperexport.check.tensors import CapturedArrays
from hyperexport.check.upcast import floored, round_to, session_payload, upcast_feeds
from hyperexport.contracts.manifest import CallSite, ExportManifest
from hyperexport.contracts.records import CaptureRecord
from hyperexport.errors import CheckError

logger = logging.getLogger(__name__)

SessionKey = tuple[str, str, tuple[str, ...], tuple[tuple[str, int], ...]]


def select_calls(manifest: ExportManifest, scope: str) -> list[int]:
    """Indices into ``manifest.calls`` that ``scope`` selects, in execution order.

    ``first_instance`` keeps, for each class, the first call in execution order: the first call
    of the first instance.
    """
    if scope == "none":
        return []
    if scope == "all":
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


class FunctionChecker:
    """Runs call sites alone in ONNX Runtime and keeps their results.

    Call sites calling the same function with the same weights and input dtypes/ranks share one
    standalone model and session; only one session is alive at a time.

    Args:
        model: The final model, loaded with onnx_ir.
        manifest: The export manifest.
        arrays: The captured arrays.
        settings: Tolerances (per-output overrides match a call's output capture keys).
        external_data_dir: The directory relative external-data locations resolve against (the
            model's directory), or None when the model has no external data.
    """

    def __init__(
        self,
        model: ir.Model,
        manifest: ExportManifest,
        arrays: CapturedArrays,
        settings: CheckSettings,
        external_data_dir: Path | None,
    ) -> None:
        self._model = model
        self._calls = manifest.calls
        self._classes = class_names(manifest)
        self._arrays = arrays
        self._settings = settings
        self._external_data_dir = external_data_dir
        self._session_key: SessionKey | None = None
        self._session: OrtRunner | CheckError | None = None
        self.results: dict[int, FunctionResult] = {}
        self.sessions_built = 0
        self._upcast = False

    def check(self, indices: Iterable[int], reason: str) -> None:
        """Check the given call sites (grouped by shared session), skipping checked ones."""
        todo = [i for i in indices if i not in self.results]
        groups: dict[SessionKey | None, list[int]] = {}
        for i in progress.track(todo, "checking functions", unit="functions"):
            groups.setdefault(self._key(i), []).append(i)
        for members in groups.values():
            for i in members:
                self.results[i] = self._check_one(i, reason)

    def get(self, index: int, reason: str = "localisation") -> FunctionResult:
        """The result of one call site, checking it now if needed."""
        if index not in self.results:
            self.results[index] = self._check_one(index, reason)
        return self.results[index]

    def _key(self, index: int) -> SessionKey | None:
        site = self._calls[index]
        try:
            data = [self._arrays.get(k) for k in site.data_inputs]
        except CheckError:
            return None
        return (site.domain, site.name, site.weight_inputs, input_signature(data))

    def _runner(self, site: CallSite, key: SessionKey) -> OrtRunner:
        if self._session_key != key:
            self._session_key = key
            self._session = None  # release the previous session before building the next
            try:
                standalone = build_standalone(self._model, site, key[3])
                where = self._external_data_dir
                payload, self._upcast = session_payload(standalone, str(where) if where else None)
                self._session = OrtRunner(payload, external_data_dir=where)
                del payload
                if self._upcast:
                    # The upcast copy is cyclic garbage (onnx_ir graphs link nodes and values)
                    # holding a float32 copy of the function's weights: free it now, or memory
                    # grows by one function's weights per session (a 7B layer: 0.8 GB each).
                    gc.collect()
            except CheckError as e:
                self._session = e
            self.sessions_built += 1
        if isinstance(self._session, CheckError):
            raise self._session
        assert self._session is not None
        return self._session

    def _check_one(self, index: int, reason: str) -> FunctionResult:
        site = self._calls[index]
        start = time.perf_counter()
        outputs: tuple[TensorResult, ...] = ()
        error: str | None = None
        try:
            data = [self._arrays.get(k) for k in site.data_inputs]
            expected = [self._arrays.get(k) for k in site.outputs]
            key = (site.domain, site.name, site.weight_inputs, input_signature(data))
            runner = self._runner(site, key)
            feeds = {f"input_{i}": a for i, a in enumerate(data)}
            if self._upcast:  # low precision runs upcast to float32 (check/upcast.py)
                feeds = upcast_feeds(feeds)
            actual = runner.run(feeds, [e.shape for e in expected])
            if self._upcast:
                actual = [round_to(a, e) for a, e in zip(actual, expected, strict=True)]
            outputs = self._compare(actual, expected, site.outputs)
        except CheckError as e:
            error = str(e)
        result = FunctionResult(
            call_id=site.call_id,
            module_path=site.module_path,
            class_name=self._classes.get((site.domain, site.name), ""),
            domain=site.domain,
            function=site.name,
            ok=error is None and all(o.ok for o in outputs),
            outputs=outputs,
            error=error,
            reason=reason,
            seconds=time.perf_counter() - start,
        )
        logger.debug("function %s", result.describe())
        return result

    def _compare(
        self, actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], keys: Sequence[str]
    ) -> tuple[TensorResult, ...]:
        return tuple(
            compare_arrays(a, e, self._tolerance(key, e), name=f"output {i}", key=key)
            for i, (a, e, key) in enumerate(zip(actual, expected, keys, strict=True))
        )

    def _tolerance(self, key: str, expected: np.ndarray) -> Tolerance:
        """The settings' tolerance, raised to the floor of a low-precision output's dtype."""
        tolerance = self._settings.tolerance_for(key)
        return Tolerance(*floored(tolerance.atol, tolerance.rtol, expected))


def first_divergent(
    order: Sequence[int],
    get: Callable[[int], FunctionResult | None],
    nested: Sequence[Sequence[int]],
) -> int | None:
    """The first diverging call in execution order, descending into nested calls.

    A call diverges when its result is not ok. When a diverging call has diverging nested calls,
    the blame moves to the first of those (recursively), so the innermost guilty module is named
    rather than every module that encloses it.

    Args:
        order: Call indices in execution order.
        get: Result of a call (checking it if the caller wants), or None if unchecked.
        nested: For each call, the calls nested in it.
    """

    def diverges(i: int) -> bool:
        result = get(i)
        return result is not None and not result.ok

    def innermost(i: int) -> int:
        for j in nested[i]:
            if diverges(j):
                return innermost(j)
        return i

    for i in order:
        if diverges(i):
            return innermost(i)
    return None
