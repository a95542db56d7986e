"""Run call sites alone in ONNX Runtime, each on its captured inputs: the functions' evaluation."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, MutableMapping
from pathlib import Path

import numpy as np
import onnx_ir as ir

from hyperexport import progress
from hyperexport.base.contracts.manifest import CallSite, ExportManifest
from hyperexport.base.errors import CheckError
from hyperexport.check.evaluation import FunctionRun, OutputRun
from hyperexport.check.ort_session import OrtRunner
from hyperexport.check.precision import round_to, upcast_feeds
from hyperexport.check.standalone import build_standalone, input_signature
from hyperexport.check.tensors import CapturedArrays
from hyperexport.check.upcast import session_payload

logger = logging.getLogger(__name__)

SessionKey = tuple[str, str, tuple[str, ...], tuple[tuple[str, int], ...]]


class FunctionRunner:
    """Runs call sites alone in ONNX Runtime and keeps what they computed.

    Call sites calling the same function with the same weights and input dtypes/ranks share one
    standalone model and session; only one session is alive at a time.

    Args:
        model: The final model, loaded with onnx_ir.
        manifest: The export manifest.
        arrays: The captured arrays (inputs, and the references' dtypes for rounding).
        computed: Where each computed output is stored, under ``fn/<call id>/<i>``.
        external_data_dir: The directory relative external-data locations resolve against (the
            model's directory), or None when the model has no external data.
    """

    def __init__(
        self,
        model: ir.Model,
        manifest: ExportManifest,
        arrays: CapturedArrays,
        computed: MutableMapping[str, np.ndarray],
        external_data_dir: Path | None,
    ) -> None:
        self._model = model
        self._calls = manifest.calls
        self._arrays = arrays
        self._computed = computed
        self._external_data_dir = external_data_dir
        self._session_key: SessionKey | None = None
        self._session: OrtRunner | CheckError | None = None
        self.runs: dict[int, FunctionRun] = {}
        self.sessions_built = 0
        self._upcast = False

    def run_all(self, indices: Iterable[int], reason: str) -> None:
        """Run the given call sites (grouped by shared session), skipping ones already run."""
        todo = [i for i in indices if i not in self.runs]
        groups: dict[SessionKey | None, list[int]] = {}
        for i in progress.track(todo, "checking functions", unit="functions"):
            groups.setdefault(self._key(i), []).append(i)
        for members in groups.values():
            for i in members:
                self.runs[i] = self._run_one(i, reason)

    def get(self, index: int, reason: str = "localisation") -> FunctionRun:
        """The run of one call site, running it now if needed."""
        if index not in self.runs:
            self.runs[index] = self._run_one(index, reason)
        return self.runs[index]

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

    def _run_one(self, index: int, reason: str) -> FunctionRun:
        site = self._calls[index]
        start = time.perf_counter()
        outputs: tuple[OutputRun, ...] = ()
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
            runs = []
            for i, (a, e, ref) in enumerate(zip(actual, expected, site.outputs, strict=True)):
                name = f"fn/{site.call_id}/{i}"
                self._computed[name] = round_to(a, e) if self._upcast else a
                runs.append(OutputRun(name=f"output {i}", key=ref, array=name))
            outputs = tuple(runs)
        except CheckError as e:
            error = str(e)
        run = FunctionRun(
            index=index,
            call_id=site.call_id,
            outputs=outputs,
            error=error,
            reason=reason,
            seconds=time.perf_counter() - start,
        )
        logger.debug("function %s ran (%s)", site.call_id, error or "ok")
        return run
