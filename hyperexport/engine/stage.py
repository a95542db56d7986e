"""The stage protocol: what a build step declares so that the runner can key, cache and run it."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .sourced import FileSources


class Stage(Protocol):
    """One build step.

    Attributes:
        name: Unique stage name (``"trace"``); also the key of its outputs for later stages.
        version: Bumped whenever the stage's logic changes; part of the key.
        upstream: Names of the stages whose outputs this stage reads.
        reads: Dotted paths of the build's configuration this stage depends on (its *slice*).
            ``run`` receives exactly this slice as ``params``, so a stage cannot read what it
            did not declare.
        needs_model: Whether ``run`` calls ``inputs.model()`` (the live model). Such a stage
            runs user code: its key also covers the model's code and weights, and the modules
            it had loaded when it finished (discovered dependencies, validated on lookup).
        libraries: Distributions whose versions shape the stage's result (``"numpy"``); their
            versions, and Python's, are part of its key. The code of the keyed package it runs
            is found from its module's imports (:mod:`.code_closure`).
        publish: Glob patterns of output files copied to the build's outputs directory.

    A stage may also have ``upstream_reads``: ``{upstream stage: glob patterns}`` of the
    output files it reads of that stage (relative paths; ``*`` crosses folders). Only those are
    checked out for it, and a file no later stage reads may be taken over by the stage that
    reads it last (:attr:`StageInputs.take`). An upstream stage it does not name is read whole.
    Its key still covers every upstream output (:func:`reads_file` is about checkouts only).
    """

    name: str
    version: int
    upstream: tuple[str, ...]
    reads: tuple[str, ...]
    needs_model: bool
    libraries: tuple[str, ...]
    publish: tuple[str, ...]

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        """``{artifact name: relative path}``: every file ``run`` writes for ``params`` that a
        cache entry of the stage must hold.

        A function of the params alone, as keyed (a path-valued argument is
        :data:`~.keys.FILE_PARAM`): a file whose presence depends on a field is declared for
        the values that write it, and a file that depends on content (a data file sized by
        its contents, files a model folder may or may not have) is not declared. The runner
        refuses to commit a run that lacks one, and treats an entry that lacks one as a miss;
        :func:`~.verify.verify` recomputes it from the params recorded in the entry. An
        entry's own list of files is never the measure. The names are what reports call the
        files (``model``, ``report``).
        """
        ...

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        """Produce the stage's output files in the empty directory ``out_dir``."""
        ...


@dataclass(frozen=True)
class StageInputs:
    """What a running stage may read besides its params.

    Attributes:
        upstream: ``{stage name: directory}`` holding that upstream stage's output files
            (verified copies of the cached files; treat them as read-only). A large file is
            held once per build (``workspace.py``): it is a regular file in the folder
            of the stage that runs now, and a symlink to it where an earlier stage read it. An
            output that is an input unchanged may be written as a symlink to that input file:
            the cache records it under the input's digest without copying it.
        model: Returns the live model, loading it at most once per build (memoised by the
            runner so that trace and export share one load).
        source: Where the build's configuration came from, for error messages.
        digests: ``{stage name: {relative path: sha256}}`` of the upstream outputs: the digests
            the stage's key covers (a stage that vouches for files names them by these).
        declare_sources: Called by a stage with one of its output files (a path under its
            ``out_dir``) and where that file's bytes are (``sourced.py``): ranges of files on
            disk that the stage's key already covers. The cache then records the ranges instead
            of storing a copy (checked byte for byte at commit). Outside a cached build it does
            nothing: there is no copy to save.
        take: Called by a stage with one of its input files it would copy in order to change
            it (append to it); True when it may move or change that file instead: the build's
            one copy of a large blob (``workspace.py``) that no later stage of the build reads
            or publishes (:func:`reads_file`). The file is then writable and the stage's: the
            cache still holds the blob, and a range of the file declared as a source is resolved
            to where the cache keeps its bytes. False outside a cached build.
    """

    upstream: Mapping[str, Path]
    model: Callable[[], Any]
    source: str = ""
    digests: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    declare_sources: Callable[[Path, FileSources], None] = field(default=lambda path, sources: None)
    take: Callable[[Path], bool] = field(default=lambda path: False)

    def dir(self, stage: str) -> Path:
        """The output directory of upstream ``stage``."""
        return self.upstream[stage]

    def digest(self, stage: str, path: str) -> str:
        """The sha256 of upstream ``stage``'s output ``path`` (as its key covers it).

        Raises:
            KeyError: ``stage`` wrote no such file.
        """
        return self.digests[stage][path]


def matches(path: str, patterns: tuple[str, ...] | None) -> bool:
    """Whether the relative ``path`` matches one of the glob ``patterns`` (any path when None;
    ``*`` crosses folders)."""
    return patterns is None or any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _upstream_reads(stage: Stage) -> Mapping[str, tuple[str, ...]]:
    return getattr(stage, "upstream_reads", {})  # optional: see Stage


def upstream_patterns(stage: Stage, upstream: str) -> tuple[str, ...] | None:
    """The glob patterns of ``upstream``'s files that ``stage`` reads; None when it reads them
    all (it names no patterns for ``upstream``)."""
    return _upstream_reads(stage).get(upstream)


def reads_file(stage: Stage, upstream: str, path: str) -> bool:
    """Whether ``stage`` reads ``upstream``'s output file ``path`` (relative)."""
    return upstream in stage.upstream and matches(path, upstream_patterns(stage, upstream))


def check_upstream_reads(stage: Stage) -> None:
    """Raise ``ValueError`` when ``stage.upstream_reads`` names a stage it does not read."""
    unknown = sorted(set(_upstream_reads(stage)) - set(stage.upstream))
    if unknown:
        raise ValueError(
            f"stage {stage.name}: upstream_reads names {', '.join(unknown)}, not among its "
            f"upstream stages ({', '.join(stage.upstream) or 'none'})"
        )


def config_slice(config: Mapping[str, Any], reads: tuple[str, ...]) -> dict[str, Any]:
    """The sub-dictionary of ``config`` made of the dotted paths ``reads`` (absent -> None).

    Example: ``config_slice(c, ("opset", "check.atol"))`` -> ``{"opset": 18, "check": {"atol": ..}}``.
    """
    out: dict[str, Any] = {}
    for path in reads:
        parts = path.split(".")
        value: Any = config
        for part in parts:
            value = value.get(part) if isinstance(value, Mapping) else None
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return out
