"""The engine's errors: what a caller of the runner and the cache tells its user.

* :class:`CacheUnavailableError`: the cache cannot serve the build (not a directory, not
  writable when a stage must run, its remote unreachable); the message names the directory or
  URL. A command line maps it to its "environment unusable" exit code.
* :class:`StageFailed`: a stage raised; it names the stage and carries the cause (the
  stage's own error, as ``__cause__``). What a caller says about the cause is its own business.
* :class:`CorruptInputError`: raised (or chained) by a stage that met data from an upstream
  entry it cannot use: the runner discards that entry and builds again, once.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of the engine's errors."""


class CacheUnavailableError(EngineError):
    """The cache cannot serve this build: not a directory, not writable when a stage must run,
    or its remote unreachable. The message names the directory (or URL)."""


class StageFailed(EngineError):
    """A stage failed. Names the stage; the stage's own error is ``__cause__`` (also ``cause``).

    Args:
        stage: The stage's name.
        cause: What it raised (or why the runner refused its outputs).
    """

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        self.cause = cause
        super().__init__(f"stage {stage!r} failed: {cause}")
        self.__cause__ = cause


class CorruptInputError(EngineError, ValueError):
    """Data a stage read from an upstream entry cannot be used as it is (malformed, or naming
    something this process cannot rebuild): the entry is corrupt, not the build.

    The runner discards the upstream entries of the stage that raised it (anywhere in the
    chain of causes) and runs the build again, once.

    Args:
        what: What was read (a file, a record).
        reason: What is wrong with it.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")
