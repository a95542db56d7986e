"""What each stage of a build did (``ran``, ``hit``, ``failed``), by stage name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyperexport.engine.runner import BuildResult

if TYPE_CHECKING:
    from hyperexport.product.builds.session import BuildOutcome


def statuses(build: BuildOutcome | BuildResult) -> dict[str, str]:
    """``{stage name: status}`` of a runner's result or of a session's outcome."""
    result = build if isinstance(build, BuildResult) else build.result
    return {s.name: s.status for s in result.stages}
