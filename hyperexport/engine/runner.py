"""The staged runner: key every stage, reuse cache hits, run the rest, and say why.

The runner is generic: it knows stages only through :class:`~.stage.Stage`, and the code it
keys only as the package it is handed (:class:`~.code_closure.CodePackage`). A stage that raises
is reported as failed (:class:`~.errors.StageFailed`) and leaves nothing in the cache.

Keys (:mod:`.keys`): a stage's *declared* key covers its params, upstream outputs, libraries,
the package code it runs and, if it runs user code, the model. A stage that runs user code
(``needs_model``) stores its outputs under a *full* key that also covers the modules it had
loaded (:mod:`.discovered`); a lookup first checks that one of the recorded module sets still
holds.

Cache faults heal rather than fail:

* a corrupt entry found on lookup is a miss (the store warns and removes it);
* a corrupt upstream met while a stage runs (a blob failing its digest on checkout, or a
  :class:`~.errors.CorruptInputError` the stage raised) discards that upstream entry, with a
  WARNING, and the build runs once more, rebuilding it;
* single flight: a stage that misses takes the lock of its declared key and looks again before
  running, so concurrent builds compute each entry once (``locks.py``);
* a cache that cannot be written serves hits; a stage that must run stops the build with
  :class:`~.errors.CacheUnavailableError` before it starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import discovered, opened, spans
from .code_closure import IMPORT_MEMO, CodePackage, ImportMemo, package_sources
from .discovered import DiscoveredDeps
from .entries import ActionEntry
from .errors import CacheUnavailableError, CorruptInputError, StageFailed
from .hashing import canonical_json
from .keyed_imports import (
    active_bytecode_dir,
    default_bytecode_dir,
    keyed_imports,
)
from .keys import declared_material, explain, recorded_material, stage_key
from .machinery import machinery
from .memory import return_freed_memory
from .record_secret import record_secret
from .sourced import FileSources
from .stage import (
    Stage,
    StageInputs,
    check_upstream_reads,
    config_slice,
    matches,
    reads_file,
    upstream_patterns,
)
from .store import CORRUPT, HIT, MISSING, CacheStore, CorruptBlobError, Lookup
from .workspace import Workspace

log = logging.getLogger(__name__)

_KEEP_FAILED_LIMIT = 1 << 20
#: The status of a stage that raised (a :class:`StageResult`'s, and a recorded run's).
FAILED = "failed"
#: Runs of one build: the second after discarding a corrupt upstream entry met mid-build.
_ATTEMPTS = 2


@dataclass(frozen=True)
class StageResult:
    """The outcome of one stage in one build.

    Attributes:
        name: Stage name.
        status: ``hit``, ``ran`` or ``failed``; in a dry run ``would_run`` for a miss.
        key: The stage key (None in a dry run when an upstream stage would run first).
        reason: Why it ran (empty for a hit).
        seconds: Wall time spent on the stage, lookup included.
        spans: Named parts of a stage that ran (:mod:`.spans`): ``{name: wall seconds}``.
    """

    name: str
    status: str
    key: str | None
    reason: str
    seconds: float
    spans: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "key": self.key,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            **({"spans": {k: round(v, 4) for k, v in self.spans.items()}} if self.spans else {}),
        }

    def line(self) -> str:
        """The one log line of this stage: ``export: ran (opset 18→17) in 1.20s``."""
        if self.status == HIT:
            return f"{self.name}: hit"
        if self.status == "would_run":
            return f"{self.name}: would run ({self.reason})"
        if self.status == FAILED:
            return f"{self.name}: failed in {self.seconds:.2f}s"
        parts = f", {spans.describe(self.spans)}" if self.spans else ""
        return f"{self.name}: {self.status} ({self.reason}) in {self.seconds:.2f}s{parts}"


#: The variant of a build without swept values.
DEFAULT_VARIANT = "default"


@dataclass(frozen=True)
class BuildRequest:
    """One build.

    Attributes:
        name: The build's name: its run records (reasons) and messages.
        config: The build's configuration as JSON-compatible data; each stage is handed the
            slice it declares (``Stage.reads``).
        source: Where the configuration came from (a file), for messages.
        stages: Stages in dependency order.
        env: Environment fingerprint (for the report; each stage keys its own libraries).
        model: Model fingerprint (code, weights, argument files), keyed by stages that run user
            code.
        force: Names of stages to rerun even on a hit.
        dry_run: Only report what would happen; write nothing.
        code_roots: Modules of the keyed package the configuration names for its model (a
            factory inside it): code that the stages running the model run besides their own.
        not_discovered: Paths whose reads are not discovered dependencies: keyed by content
            already (a checkpoint, files the model's arguments name) or the build's own (its
            outputs). The cache is excluded always.
        variant: The swept-values name (``"opset=17"``, ``"default"``): each variant keeps its
            own run records, so a sweep job's reasons compare with its own previous build.
    """

    name: str
    config: Mapping[str, Any]
    source: str
    stages: Sequence[Stage]
    env: Mapping[str, Any]
    model: Mapping[str, Any]
    force: frozenset[str] = frozenset()
    dry_run: bool = False
    code_roots: tuple[str, ...] = ()
    not_discovered: tuple[str, ...] = ()
    variant: str = DEFAULT_VARIANT

    def __post_init__(self) -> None:
        for stage in self.stages:
            check_upstream_reads(stage)

    @property
    def run_name(self) -> str:
        """The name of this variant's run records: the build's, plus ``@variant`` unless
        default."""
        if self.variant == DEFAULT_VARIANT:
            return self.name
        return f"{self.name}@{self.variant}"


@dataclass
class BuildResult:
    """What a build did: per-stage results, committed entries, and the failure if any.

    Attributes:
        stages: One result per attempted stage, in order.
        entries: Cache entries of the stages that succeeded (hit or ran).
        error: The failure that stopped the build.
        failed_files: Small text outputs (JSON) the failed stage wrote before raising, e.g. a
            failed check's report; never cached.
        declared: ``{stage: {artifact name: path}}``: the outputs each attempted stage
            declares for this build's params (``Stage.outputs``), what reports name them by.
    """

    stages: list[StageResult] = field(default_factory=list)
    entries: dict[str, ActionEntry] = field(default_factory=dict)
    error: StageFailed | None = None
    failed_files: dict[str, str] = field(default_factory=dict)
    declared: dict[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


class _Memo:
    """Calls ``loader`` at most once."""

    def __init__(self, loader: Callable[[], Any] | None) -> None:
        self._loader = loader
        self._value: Any = None
        self._loaded = False

    def __call__(self) -> Any:
        if not self._loaded:
            if self._loader is None:
                raise RuntimeError("this build has no model loader")
            self._value = self._loader()
            self._loaded = True
        return self._value

    def release(self) -> bool:
        """Drop the model (its weights) once no later stage needs it; a later call reloads.
        Whether there was a model to drop (the caller collects the garbage then)."""
        if not self._loaded:
            return False
        self._value, self._loaded = None, False
        log.debug("released the live model")
        return True


class Runner:
    """Runs a :class:`BuildRequest` against a :class:`CacheStore`.

    Used as a context manager (``with Runner(...) as runner:``), it keeps the last build's
    checkouts (:attr:`workspace`) until the block ends, so that publishing can move the build's
    copy of a large file instead of copying the blob again; otherwise :meth:`run` removes them
    before it returns.

    Args:
        store: The cache.
        load_model: Loads the live model; called at most once per build, and only if a stage
            with ``needs_model`` actually runs.
        package: The package whose code the stages' keys cover (the modules each stage's
            module imports, :mod:`.code_closure`); None: no code is keyed.
    """

    def __init__(
        self,
        store: CacheStore,
        load_model: Callable[[], Any] | None = None,
        package: CodePackage | None = None,
    ) -> None:
        self.store = store
        self.load_model = load_model
        self.package = package
        self.discovered = DiscoveredDeps(
            store.root,
            store.index,
            read_only=store.read_only,
            package=package.name if package is not None else None,
        )
        self.imports = ImportMemo(store.root / "index" / IMPORT_MEMO, read_only=store.read_only)
        self._final = True
        #: Paths opened by the stages that ran the model in this build (``opened.py``): the
        #: model's load and trace read them, so every later such stage depends on them too.
        self._opened = opened.Reads()
        self._held = contextlib.ExitStack()  # the single-flight lock of the current stage
        self._secret: bytes | None = None  # keys environment values in records (record_secret)
        #: The last build's checkouts; kept after :meth:`run` only inside ``with runner:``, for
        #: publishing to take its large copies (:meth:`Workspace.hand_over`).
        self.workspace: Workspace | None = None
        self._keep_workspace = False

    def run(self, request: BuildRequest) -> BuildResult:
        """Run (or, in a dry run, plan) every stage in order; stop at the first failure.

        Raises:
            CacheUnavailableError: A stage must run and the cache cannot be written.
        """
        bytecode = None if self.store.read_only else default_bytecode_dir(self.store.root)
        try:
            for attempt in range(_ATTEMPTS):
                self._final = attempt == _ATTEMPTS - 1
                try:
                    with keyed_imports(bytecode):  # the code that runs is the code keyed
                        self._share_import_memo(active_bytecode_dir(), bytecode)
                        return self._run_once(request)
                except _CorruptUpstream as e:
                    log.warning("%s; discarding that cache entry and rebuilding", e)
                    for key in e.keys:
                        self.store.discard(key)
            raise AssertionError("unreachable: the last attempt does not raise _CorruptUpstream")
        finally:
            if not self._keep_workspace:
                self.close()

    def _share_import_memo(self, active: Path | None, own: Path | None) -> None:
        """Keep the parsed imports beside an outer keyed loader's compiled files.

        An outer block (the command line's, one folder per user) outlives this cache: what is
        parsed there serves every cache, so a build into a new cache does not parse the package
        again (about 1.8 s of every such build, measured idle). Parsed imports, like bytecode, are
        a function of a file's content alone (:class:`ImportMemo` is keyed by module name and
        digest), so sharing them cannot change a key. Without an outer folder the memo stays in
        the cache's index.
        """
        if active is not None and active != own and self.imports.shareable:
            self.imports = ImportMemo(active / IMPORT_MEMO, bounded=True)

    def _run_once(self, request: BuildRequest) -> BuildResult:
        result = BuildResult()
        self._opened = opened.Reads()
        model = _Memo(self.load_model)
        workspace = self._new_workspace()

        def upstream_dir(name: str, patterns: tuple[str, ...] | None) -> Path:
            # Verified copies, never links (see workspace.py); large files once per build; only
            # the files the stage reads (Stage.upstream_reads).
            try:
                return workspace.checkout(name, result.entries[name], patterns)
            except CorruptBlobError as e:
                raise _CorruptUpstream(str(e), (result.entries[name].key,)) from e

        pending: set[str] = set()
        for index, stage in enumerate(request.stages):
            later = request.stages[index + 1 :]
            with contextlib.ExitStack() as self._held:
                try:
                    outcome = self._one(request, stage, result, pending, model, upstream_dir, later)
                except _CorruptUpstream as e:
                    if not self._final:
                        raise
                    outcome = _failed(stage.name, e, result)
            result.stages.append(outcome)
            released = False
            if not any(s.needs_model for s in request.stages[index + 1 :]):
                released = model.release()  # the check stage runs without the weights in memory
            if outcome.status == "ran" or released:
                # The weights just dropped, and what the stage left in reference cycles (a graph
                # whose nodes and values refer to each other), hold memory maps and buffers until
                # Python's own collection comes round, which a few large objects do not trigger.
                # In a 1B-parameter build that kept a 4.9 GB data file and the checkpoint mapped
                # into a later stage: peak RSS 18.5 GB, 11.1 GB with this (measured: the
                # benchmarks' README). The allocator's free memory goes back too (memory.py).
                return_freed_memory()
            if outcome.status == "would_run":
                pending.add(stage.name)
            level = {"failed": logging.ERROR, "would_run": logging.DEBUG}.get(
                outcome.status, logging.INFO
            )
            log.log(level, "%s", outcome.line())
            if outcome.status == FAILED:
                break
        self.store.save_index()
        self.imports.save()
        return result

    def _new_workspace(self) -> Workspace:
        """A fresh workspace for a build attempt; the previous attempt's is removed."""
        self.close()
        self.workspace = Workspace(self.store)
        return self.workspace

    def close(self) -> None:
        """Remove the last build's checkouts (what publishing did not take)."""
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    def __enter__(self) -> Runner:
        self._keep_workspace = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _material(
        self,
        request: BuildRequest,
        stage: Stage,
        params: Mapping[str, Any],
        upstream: Mapping[str, Mapping[str, str]],
    ) -> dict[str, Any]:
        """The declared key material of ``stage`` (:func:`~.keys.declared_material`)."""
        return declared_material(
            stage,
            params,
            upstream,
            model=request.model,
            code_roots=request.code_roots,
            sources=package_sources(self.package, memo=self.imports) if self.package else {},
        )

    def _recorded(self, material: dict[str, Any]) -> dict[str, Any]:
        """``material`` as the run records keep it: no plain digest of an environment value
        (:func:`~.keys.recorded_material`, under the cache's secret)."""
        model = material.get("model")
        if not isinstance(model, Mapping) or not model.get("env"):
            return material
        if self._secret is None:
            self._secret = record_secret(self.store.root, create=not self.store.read_only)
        return recorded_material(material, self._secret)

    def _resolve(self, stage: Stage, declared: str) -> tuple[str | None, str]:
        """``(key to look up, why not)``: for a stage that runs user code, the full key of a
        recorded module set that still holds (None, and what changed, if none does)."""
        if not stage.needs_model:
            return declared, ""
        resolution = self.discovered.resolve(declared)
        return resolution.key, resolution.reason

    def _output_key(self, request: BuildRequest, stage: Stage, declared: str) -> str:
        """The key a successful run is stored under; records the modules it loaded and the
        files the model opened."""
        if not stage.needs_model:
            return declared
        bytecode = active_bytecode_dir()  # the keyed loader's own reads
        exclude = (
            str(self.store.root),
            *request.not_discovered,
            *([str(bytecode)] if bytecode is not None else []),
        )
        return self.discovered.record(declared, opened.regular_files(self._opened, exclude))

    def _one(
        self,
        request: BuildRequest,
        stage: Stage,
        result: BuildResult,
        pending: set[str],
        model: _Memo,
        upstream_dir: Callable[[str, tuple[str, ...] | None], Path],
        later: Sequence[Stage] = (),
    ) -> StageResult:
        start = time.perf_counter()
        params = config_slice(request.config, stage.reads)
        own_run = self.store.previous_run(request.run_name, stage.name)
        previous = own_run  # a variant's first build compares with the build's default variant
        if own_run is None and request.variant != DEFAULT_VARIANT:
            previous = self.store.previous_run(request.name, stage.name)
        waiting = [u for u in stage.upstream if u in pending]
        if waiting:  # dry run only: the upstream outputs (and so this key) are not known yet
            material = self._material(request, stage, params, {})
            result.declared[stage.name] = stage.outputs(material["params"])
            material = self._recorded(material)
            own = explain(_without_upstream(previous), material)
            reason = f"after {', '.join(waiting)}" + ("" if own.startswith("same") else f"; {own}")
            return StageResult(stage.name, "would_run", None, reason, time.perf_counter() - start)
        upstream = {u: result.entries[u].digests() for u in stage.upstream}
        material = self._material(request, stage, params, upstream)
        declared = stage_key(material)
        material = self._recorded(material)  # from here on, as records keep it (reasons too)
        forced = stage.name in request.force
        expected = stage.outputs(material["params"])  # what a complete entry holds
        result.declared[stage.name] = expected
        with machinery():  # the cache's and remote tier's imports are not the model's
            key, stale, lookup = self._lookup(stage, declared, expected, forced, request.dry_run)
        if lookup.status == HIT and not forced:
            assert lookup.entry is not None and key is not None
            result.entries[stage.name] = lookup.entry
            if not request.dry_run and _record_outdated(own_run, key, material):
                record = _record(key, declared, material, "ok", request.name)
                self.store.record_run(request.run_name, stage.name, record)
            return StageResult(stage.name, HIT, key, "", time.perf_counter() - start)
        reason = _reason(forced, lookup.status, stale, previous, declared, material)
        if request.dry_run:
            return StageResult(stage.name, "would_run", key, reason, time.perf_counter() - start)
        self.store.require_writable(stage.name)
        checkouts = {u: upstream_dir(u, upstream_patterns(stage, u)) for u in stage.upstream}
        inputs = StageInputs(
            upstream=checkouts,
            model=model if stage.needs_model else _no_model(stage.name),
            source=request.source,
            digests=upstream,
            take=functools.partial(self._take, checkouts, request.stages, later),
        )
        with spans.collecting() as parts:
            status, detail, key = self._execute(
                request, stage, params, inputs, declared, material, result
            )
        return StageResult(
            stage.name,
            status,
            key,
            detail if status == FAILED else reason,
            time.perf_counter() - start,
            parts,
        )

    def _take(
        self,
        checkouts: Mapping[str, Path],
        stages: Sequence[Stage],
        later: Sequence[Stage],
        path: Path,
    ) -> bool:
        """``StageInputs.take``: whether the running stage may move or change its input file
        ``path``. Only the workspace's one copy of a large blob qualifies, and only when no
        later stage of this build reads it, under any checkout it is (an earlier checkout of
        the same bytes links to it), and no stage publishes it."""
        if self.workspace is None:
            return False
        names = self.workspace.names_of(path)
        if not any(name in checkouts for name, _ in names):
            return False  # not an input of the running stage
        producers = {s.name: s for s in stages}
        for name, rel in names:
            if any(reads_file(s, name, rel) for s in later):
                return False
            producer = producers.get(name)
            if producer is not None and matches(rel, producer.publish):
                return False
        return self.workspace.release(path)

    def _lookup(
        self,
        stage: Stage,
        declared: str,
        expected: Mapping[str, str],
        forced: bool,
        dry_run: bool,
    ) -> tuple[str | None, str, Lookup]:
        """``(key, why stale, lookup)``; to compute the stage, hold the single-flight lock of
        ``declared`` (until the stage is done, in ``self._held``) and resolve and look again:
        a concurrent build that computed it meanwhile makes this a hit. An entry lacking a
        file of ``expected`` (the stage's declared outputs) is a miss."""
        key, stale = self._resolve(stage, declared)
        if key is None and self.store.remote is not None:
            key = self._resolve_remote(declared) or key
        lookup = (
            self._complete(stage, self.store.lookup(key), expected)
            if key is not None
            else Lookup(MISSING)
        )
        if dry_run or self.store.read_only or (lookup.status == HIT and not forced):
            return key, stale, lookup
        self._held.enter_context(self.store.single_flight(declared, f"stage {stage.name}"))
        if forced:
            return key, stale, lookup
        if stage.needs_model:  # the holder may have recorded a new module set: read it afresh
            fresh = DiscoveredDeps(self.store.root, self.store.index).resolve(declared)
            again_key = fresh.key
        else:
            again_key = declared
        again = (
            self._complete(stage, self.store.lookup(again_key), expected)
            if again_key is not None
            else Lookup(MISSING)
        )
        return (again_key, "", again) if again.status == HIT else (key, stale, lookup)

    def _complete(self, stage: Stage, lookup: Lookup, expected: Mapping[str, str]) -> Lookup:
        """``lookup``, or ``corrupt`` when its entry lacks a file of ``expected`` (the outputs
        the stage's code declares for this build's params; never the entry's own record): an
        incomplete entry is a miss, warned about and discarded."""
        if lookup.status != HIT or lookup.entry is None:
            return lookup
        missing = lookup.entry.missing(expected)
        if not missing:
            return lookup
        detail = f"lacks {', '.join(missing)}"
        log.warning(
            "cache entry %s of stage %s %s; treating it as a miss",
            lookup.entry.key[:12],
            stage.name,
            detail,
        )
        self.store.discard(lookup.entry.key)
        return Lookup(CORRUPT, detail=detail)

    def _resolve_remote(self, declared: str) -> str | None:
        """The full key of a dependency set recorded on the remote that holds here, if any.

        A writable store merges the remote's sets into the local record (so later builds find
        them without the remote); a read-only one (a dry run) only reads them.
        """
        remote = self.store.remote
        assert remote is not None
        if self.store.read_only:
            for deps in remote.deps_sets(declared):
                if not discovered.changes(deps, self.store.index):
                    return discovered.full_key(declared, deps)
            return None
        if remote.fetch_deps(declared, self.discovered.path(declared)):
            return DiscoveredDeps(self.store.root, self.store.index).resolve(declared).key
        return None

    def _execute(
        self,
        request: BuildRequest,
        stage: Stage,
        params: Mapping[str, Any],
        inputs: StageInputs,
        declared: str,
        material: Mapping[str, Any],
        result: BuildResult,
    ) -> tuple[str, str, str]:
        """Run ``stage`` in a fresh directory; commit its outputs, or record its failure.

        Returns:
            ``(status, failure detail, key)``: the key the outputs were stored under.
        """
        key = declared
        with self.store.scratch(f"{stage.name}-") as scratch:
            out_dir = scratch / "out"
            out_dir.mkdir()
            declared_sources = _Declarations(stage.name, out_dir)
            inputs = dataclasses.replace(inputs, declare_sources=declared_sources.add)
            try:
                with (
                    opened.recording(self._opened)
                    if stage.needs_model
                    else contextlib.nullcontext(self._opened)
                ):
                    stage.run(params, inputs, out_dir)
            except Exception as e:
                _raise_if_refused(e, self.store.root, "cache")
                if stage.upstream and not self._final and _is_corrupt_input(e):
                    keys = tuple(result.entries[u].key for u in stage.upstream)
                    raise _CorruptUpstream(f"stage {stage.name}: {e}", keys) from e
                result.error = StageFailed(stage.name, e)
                result.failed_files = _small_text_files(out_dir)
                status = "failed"
            else:
                missing = missing_outputs(stage.outputs(material["params"]), out_dir)
                if missing:  # never commit an incomplete entry
                    error = RuntimeError(f"stage {stage.name} did not write {', '.join(missing)}")
                    result.error = StageFailed(stage.name, error)
                    return "failed", f"RuntimeError: {error}", key
                key = self._output_key(request, stage, declared)
                with machinery(), _refusals_are_unavailable(self.store.root, "cache"):
                    result.entries[stage.name] = self.store.commit(
                        key,
                        stage.name,
                        out_dir,
                        build=request.name,
                        params=material["params"],
                        known=self.workspace.digest_of if self.workspace is not None else None,
                        inputs=self.workspace.input_digest if self.workspace is not None else None,
                        keep=self.workspace,
                        sources=declared_sources.by_path,
                    )
                    if stage.needs_model and self.store.remote is not None:  # after the entry
                        self.store.remote.upload_deps(declared, self.discovered.path(declared))
                status = "ok"
        self.store.record_run(
            request.run_name,
            stage.name,
            _record(key, declared, material, status, request.name),
        )
        if result.error is not None and result.error.stage == stage.name:
            cause = result.error.__cause__
            return "failed", f"{type(cause).__name__}: {cause}", key
        return "ran", "", key


class _Declarations:
    """Where a running stage said its output files' bytes are (``StageInputs.declare_sources``),
    by path relative to its output folder."""

    def __init__(self, stage: str, out_dir: Path) -> None:
        self.stage = stage
        self.out_dir = out_dir
        self.by_path: dict[str, FileSources] = {}

    def add(self, path: Path, sources: FileSources) -> None:
        try:
            rel = Path(path).resolve().relative_to(self.out_dir.resolve()).as_posix()
        except ValueError:
            raise ValueError(
                f"stage {self.stage} declared the sources of {path}, which is not one of its "
                "outputs"
            ) from None
        self.by_path[rel] = sources


#: A filesystem refusing writes: full, read-only, not permitted, over quota. In the cache or the
#: outputs, this is the environment's fault, not the build's: naming the directory.
REFUSED = frozenset(
    e
    for e in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", None))
    if e is not None
)


def _raise_if_refused(error: BaseException, root: Path, what: str) -> None:
    """Raise :class:`CacheUnavailableError` for a refused write (:data:`REFUSED`) under
    ``root``, naming the directory and the reason; else return."""
    if not isinstance(error, OSError) or error.errno not in REFUSED:
        return
    names = [n for n in (error.filename, error.filename2) if isinstance(n, (str, os.PathLike))]
    if names and not any(Path(os.fspath(n)).absolute().is_relative_to(root) for n in names):
        return  # the filesystem refused something else: the stage's own failure
    reason = error.strerror or os.strerror(error.errno or 0)
    raise CacheUnavailableError(f"{what} directory {root}: {reason}") from error


@contextlib.contextmanager
def _refusals_are_unavailable(root: Path, what: str) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        _raise_if_refused(e, root, what)
        raise


class _CorruptUpstream(Exception):
    """A stage met corrupt data from upstream entries ``keys``: discard them and run again."""

    def __init__(self, message: str, keys: tuple[str, ...]) -> None:
        super().__init__(message)
        self.keys = keys


def _is_corrupt_input(error: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, CorruptInputError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _failed(stage: str, error: _CorruptUpstream, result: BuildResult) -> StageResult:
    """The outcome of a stage whose upstream is still corrupt after a rebuild."""
    cause = error.__cause__ or error
    result.error = StageFailed(stage, cause)
    return StageResult(stage, "failed", None, f"{type(cause).__name__}: {cause}", 0.0)


def _record(
    key: str, declared: str, material: Mapping[str, Any], status: str, build: str
) -> dict[str, Any]:
    return {
        "key": key,
        "declared": declared,
        "status": status,
        "material": dict(material),
        "build": build,  # the records of a sweep variant live under <build>@<variant>
    }


def _record_outdated(own: Mapping[str, Any] | None, key: str, material: Mapping[str, Any]) -> bool:
    """Whether a hit must rewrite the build's run record: another key, or (for a model that
    reads declared environment variables) material recorded otherwise, such as a plain digest
    of a value written before records keyed them (``recorded_material``)."""
    if own is None or own.get("key") != key:
        return True
    model = material.get("model")
    if not isinstance(model, Mapping) or not model.get("env"):
        return False
    return canonical_json(own.get("material")) != canonical_json(material)


def _without_upstream(previous: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if previous is None or not isinstance(previous.get("material"), Mapping):
        return None
    return {**previous["material"], "upstream": {}}


def _reason(
    forced: bool,
    lookup_status: str,
    stale: str,
    previous: Mapping[str, Any] | None,
    declared: str,
    material: Mapping[str, Any],
) -> str:
    if forced:
        return "forced"
    if lookup_status == CORRUPT:
        return "cache entry corrupt"
    if stale:  # a module the stage loaded last time changed (discovered dependencies)
        return stale
    if previous is not None and previous.get("declared", previous.get("key")) == declared:
        return "previous run failed" if previous.get("status") == FAILED else "not in cache"
    prev_material = previous.get("material") if previous else None
    return explain(prev_material if isinstance(prev_material, Mapping) else None, material)


def missing_outputs(declared: Mapping[str, str], out_dir: Path) -> list[str]:
    """The files of ``declared`` (a stage's ``outputs``) that ``out_dir`` does not hold."""
    have = {p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if not p.is_dir()}
    return sorted({f for f in declared.values() if f not in have})


def _no_model(stage: str) -> Callable[[], Any]:
    def fail() -> Any:
        raise RuntimeError(f"stage {stage} did not declare needs_model")

    return fail


def _small_text_files(out_dir: Path) -> dict[str, str]:
    files = {}
    for path in sorted(out_dir.rglob("*")):
        if path.suffix in (".json", ".txt") and path.stat().st_size <= _KEEP_FAILED_LIMIT:
            files[path.relative_to(out_dir).as_posix()] = path.read_text(encoding="utf-8")
    return files
