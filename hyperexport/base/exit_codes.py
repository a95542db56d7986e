"""The process exit codes of every hyperexport command, in one place (documented in the README).

* ``OK`` (0): built (or, for a command, done).
* ``FAILED`` (1): a stage failed (export error, failed check, ...); the report says which.
* ``INVALID`` (2): the recipe, an override or a command's arguments are invalid: one line names
  the field or value. Nothing was built.
* ``UNAVAILABLE`` (3): the environment cannot serve the build: the cache or outputs directory
  cannot be used (not a directory, not writable when a stage must run, remote unreachable).
* ``INTERRUPTED`` (130): interrupted by the user (Ctrl-C); nothing half-written is left behind.
* ``TERMINATED`` (143, 128 + SIGTERM): terminated (a CI runner's or SLURM's timeout), handled
  like Ctrl-C: one line, scratch removed, the previous publication kept.

A multirun exits with the worst code of its jobs, in the order 130 > 143 > 2 > 3 > 1 > 0.
"""

from __future__ import annotations

OK = 0
FAILED = 1
INVALID = 2
UNAVAILABLE = 3
INTERRUPTED = 130
TERMINATED = 143

_SEVERITY = (OK, FAILED, UNAVAILABLE, INVALID, TERMINATED, INTERRUPTED)


def worst(codes: list[int] | tuple[int, ...]) -> int:
    """The most severe of ``codes`` (0 for none); unknown codes rank as FAILED."""
    if not codes:
        return OK
    return max(codes, key=lambda c: _SEVERITY.index(c) if c in _SEVERITY else 1)
