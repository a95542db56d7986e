"""Stage ``check``: structural and numerical checks of the final model against the trace."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.runner.hashing import atomic_write_bytes
from hyperexport.runner.stage import StageInputs
from hyperexport.stages.rewrite import MANIFEST_FILE, MODEL_FILE

CHECK_FILE = "check.json"
CHECK_SUMMARY = "check.txt"


class CheckStage:
    """``run_checks`` → ``check.json`` and ``check.txt``; a failed check fails the build.

    The check's outputs are written before it raises, so the report can show them; the runner
    never caches a failed stage. What the final model must declare follows from the recipe:

    * default-domain opset: ``opset``, or 24 with ``attention.promote_opset24`` (promotion
      raises the model to 24 whatever the export opset);
    * export path (metadata): ``dynamo``, or the other path when ``fallback`` is on and the
      manifest records that the export fell back;
    * ``check.expect_ops``: executed counts of default-domain op types (``op_counts``).
    """

    name: str = "check"
    version: int = 3
    upstream: tuple[str, ...] = ("trace", "export", "rewrite")
    reads: tuple[str, ...] = (
        "check",
        "opset",
        "dynamo",
        "fallback",
        "attention.promote_opset24",
    )
    needs_model: bool = False
    publish: tuple[str, ...] = (CHECK_FILE, CHECK_SUMMARY)
    artifacts: Mapping[str, str] = {"check": CHECK_FILE, "check_summary": CHECK_SUMMARY}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.api import Capture
        from hyperexport.check import run_checks
        from hyperexport.contracts.manifest import ExportManifest
        from hyperexport.stages.export import FALLBACK_CAPTURE

        # After a fallback, the model was exported from a capture made for the other path.
        fallback = inputs.dir("export") / FALLBACK_CAPTURE
        capture = Capture.load(fallback if fallback.is_dir() else inputs.dir("trace"))
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        settings = check_settings(params, capture.record.hiera, manifest.fallback_from)
        report = run_checks(
            rewrite_dir / MODEL_FILE, manifest, capture.record, capture.arrays, settings
        )
        text = json.dumps(report.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_bytes(out_dir / CHECK_FILE, text.encode("utf-8"))
        atomic_write_bytes(
            out_dir / CHECK_SUMMARY, ("\n".join(report.summary_lines()) + "\n").encode("utf-8")
        )
        report.raise_for_failure()


def check_settings(
    params: Mapping[str, Any], hiera: tuple[str, ...], fallback_from: str | None = None
) -> Any:
    """:class:`~hyperexport.check.CheckSettings` from the check slice of a recipe.

    Args:
        params: The stage's recipe slice.
        hiera: Qualified hiera class names (each must become a function).
        fallback_from: The manifest's record of a fallback, if the export fell back. Only a
            recipe with ``fallback: true`` accepts the other path; otherwise the metadata check
            fails on it.
    """
    from hyperexport.check import CheckSettings, Tolerance

    c = params["check"]
    per_output = tuple(
        (name, Tolerance(t.get("atol") or c["atol"], t.get("rtol") or c["rtol"]))
        for name, t in sorted(c.get("per_output", {}).items())
    )
    promote = bool((params.get("attention") or {}).get("promote_opset24"))
    dynamo = bool(params["dynamo"])
    if fallback_from is not None and params.get("fallback"):
        dynamo = not dynamo
    return CheckSettings(
        atol=float(c["atol"]),
        rtol=float(c["rtol"]),
        per_output=per_output,
        function_scope=c["function_scope"],
        expected_classes=tuple(hiera),
        expected_opset=24 if promote else int(params["opset"]),
        expected_dynamo=dynamo,
        expected_ops=tuple(sorted((op, int(n)) for op, n in c.get("expect_ops", {}).items())),
    )
