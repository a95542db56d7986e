"""Run call sites alone in ONNX Runtime, each on its captured inputs: the functions' evaluation."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Iterator, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.manifest import CallSite, ExportManifest
from hyperexport.base.errors import CheckError
from hyperexport.library import progress
from hyperexport.library.check.evaluation import FunctionRun, OutputRun
from hyperexport.library.check.kv_buffer import padded, valid_rows
from hyperexport.library.check.ort_session import OrtRunner
from hyperexport.library.check.precision import round_to, upcast_feeds
from hyperexport.library.check.standalone import (
    build_standalone,
    input_signature,
    weight_signature,
    weight_tensors,
)
from hyperexport.library.check.tensors import CapturedArrays
from hyperexport.library.check.upcast import session_payload
from hyperexport.library.check.weight_feeds import WeightFeeds

logger = logging.getLogger(__name__)

SessionKey = tuple[str, str, tuple[tuple[int, tuple[int, ...]], ...], tuple[tuple[str, int], ...]]
#: A call's weight tensors and the feeds made from them.
Prepared = tuple[list[ir.TensorProtocol], dict[str, np.ndarray]]


class FunctionRunner:
    """Runs call sites alone in ONNX Runtime and keeps what they computed.

    Call sites calling the same function with weights of the same dtypes and shapes and data
    inputs of the same dtypes and ranks share one standalone model and session (the weights are
    its inputs, fed per call: ``weight_feeds.py``); only one session is alive at a time. While a
    call runs, the next call's weights are read and converted on a second thread (numpy's
    conversion and ONNX Runtime's run both release the GIL).

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
        self._buffers = dict(manifest.kv_buffers)
        self._arrays = arrays
        self._computed = computed
        self._external_data_dir = external_data_dir
        self._session_key: SessionKey | None = None
        self._session: OrtRunner | CheckError | None = None
        self._feeds = WeightFeeds(upcast=False)
        self.runs: dict[int, FunctionRun] = {}
        self.sessions_built = 0
        self._upcast = False

    def run_all(self, indices: Iterable[int], reason: str) -> None:
        """Run the given call sites (grouped by shared session), skipping ones already run."""
        todo = [i for i in indices if i not in self.runs]
        groups: dict[SessionKey | None, list[int]] = {}
        for i in todo:
            groups.setdefault(self._key(i), []).append(i)
        bar = progress.track(range(len(todo)), "checking functions", unit="functions", memory=True)
        ticks = iter(bar)
        next(ticks, None)  # the bar starts; each later step counts one call done
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights") as pool:
            for key, members in groups.items():
                self._run_group(key, members, reason, pool, ticks)

    def _run_group(
        self,
        key: SessionKey | None,
        members: list[int],
        reason: str,
        pool: ThreadPoolExecutor,
        ticks: Iterator[int],
    ) -> None:
        """Run one group's calls; from the second on, each call's successor is prepared while
        it runs (slots 0 and 1 alternate)."""
        upcoming: Future[Prepared] | None = None
        for k, index in enumerate(members):
            prepared = upcoming
            upcoming = None
            keep: frozenset[int] = frozenset()
            if key is not None and k + 1 < len(members) and self._session_key == key:
                upcoming = pool.submit(self._prepare, members[k + 1], (k + 1) % 2)
                # A tensor the next call reads too (weights shared between calls) stays mapped.
                keep = frozenset(map(id, weight_tensors(self._model, self._calls[members[k + 1]])))
            self.runs[index] = self._run_one(index, reason, prepared, slot=k % 2, keep=keep)
            next(ticks, None)

    def get(self, index: int, reason: str = "localisation") -> FunctionRun:
        """The run of one call site, running it now if needed."""
        if index not in self.runs:
            self.runs[index] = self._run_one(index, reason, None, slot=0)
        return self.runs[index]

    def _key(self, index: int) -> SessionKey | None:
        site = self._calls[index]
        try:
            data = [self._arrays.get(k) for k in site.data_inputs]
            weights = weight_signature(self._model, site)
        except CheckError:
            return None
        return (site.domain, site.name, weights, input_signature(data))

    def _prepare(self, index: int, slot: int) -> Prepared:
        tensors = weight_tensors(self._model, self._calls[index])
        return tensors, self._feeds.feeds(tensors, slot)

    @staticmethod
    def _release(prepared: Future[Prepared]) -> None:
        try:
            tensors, feeds = prepared.result()
        except CheckError:
            return
        feeds.clear()  # the Future holds the dict: its views must go before the maps close
        WeightFeeds.release(tensors)

    def _runner(self, site: CallSite, key: SessionKey) -> OrtRunner:
        if self._session_key != key:
            self._session_key = key
            self._session = None  # release the previous session before building the next
            self._feeds.clear()
            try:
                standalone = build_standalone(self._model, site, key[3])
                where = self._external_data_dir
                payload, self._upcast = session_payload(standalone, str(where) if where else None)
                self._feeds = WeightFeeds(upcast=self._upcast, slots=2)
                self._session = OrtRunner(payload, external_data_dir=where)
                del payload
                if self._upcast:
                    # The upcast copy is cyclic garbage (onnx_ir graphs link nodes and values):
                    # free it now rather than let cycles accumulate from session to session.
                    gc.collect()
            except CheckError as e:
                self._session = e
            self.sessions_built += 1
        if isinstance(self._session, CheckError):
            raise self._session
        assert self._session is not None
        return self._session

    def _run_one(
        self,
        index: int,
        reason: str,
        prepared: Future[Prepared] | None,
        slot: int,
        keep: frozenset[int] = frozenset(),
    ) -> FunctionRun:
        """Run one call; its weights are unmapped after, but for the tensors in ``keep`` (by
        ``id``: the next call's)."""
        site = self._calls[index]
        start = time.perf_counter()
        outputs: tuple[OutputRun, ...] = ()
        error: str | None = None
        tensors: list[ir.TensorProtocol] = []
        feeds: dict[str, np.ndarray] = {}
        try:
            data = [self._arrays.get(k) for k in site.data_inputs]
            expected = [self._arrays.get(k) for k in site.outputs]
            key = (
                site.domain,
                site.name,
                weight_signature(self._model, site),
                input_signature(data),
            )
            runner = self._runner(site, key)
            if prepared is not None:
                tensors, weights = prepared.result()
                prepared = None
            else:
                tensors, weights = self._prepare(index, slot)
            # A function's shared KV buffers are fed padded, its presents compared on their
            # valid rows (kv_buffer.py).
            fed = padded(data, self._buffers.get(site.name, ()))
            feeds = {f"input_{i}": a for i, a in enumerate(fed)}
            if self._upcast:  # low precision runs upcast to float32 (check/upcast.py)
                feeds = upcast_feeds(feeds)
            feeds.update(weights)
            # The prepared Future (which the caller still holds) returned this very dict: empty
            # it, so that no view over the maps outlives the release below.
            weights.clear()
            actual = runner.run(feeds, [e.shape for e in expected])
            actual = [valid_rows(a, e) for a, e in zip(actual, expected, strict=True)]
            runs = []
            for i, (a, e, ref) in enumerate(zip(actual, expected, site.outputs, strict=True)):
                name = f"fn/{site.call_id}/{i}"
                self._computed[name] = round_to(a, e) if self._upcast else a
                runs.append(OutputRun(name=f"output {i}", key=ref, array=name))
            outputs = tuple(runs)
        except CheckError as e:
            error = str(e)
        finally:
            feeds.clear()  # views over the maps go before the maps are closed
            if prepared is not None:  # prepared for a call that failed before reading it
                self._release(prepared)
            WeightFeeds.release([t for t in tensors if id(t) not in keep])
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
