"""Stage ``check``: structural and numerical checks of the final model against the capture.

Torch-free: it reads the export's reference capture with numpy and runs ONNX Runtime.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_bytes
from hyperexport.contracts.names import (
    CHECK_JSON,
    CHECK_SUMMARY,
    MANIFEST_JSON,
    MODEL_FILE,
    REFERENCE_DIR,
)
from hyperexport.runner.stage import StageInputs


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
    version: int = 4
    #: The reference capture comes from the export (``reference/``): the capture its bundle was
    #: exported from, which after a fallback is not the trace's.
    upstream: tuple[str, ...] = ("export", "rewrite")
    reads: tuple[str, ...] = (
        "check",
        "opset",
        "dynamo",
        "fallback",
        "attention.promote_opset24",
    )
    needs_model: bool = False
    libraries: tuple[str, ...] = ("onnx", "onnx-ir", "onnxruntime", "numpy", "ml-dtypes")
    publish: tuple[str, ...] = (CHECK_JSON, CHECK_SUMMARY)
    artifacts: Mapping[str, str] = {"check": CHECK_JSON, "check_summary": CHECK_SUMMARY}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.check import run_checks
        from hyperexport.contracts.capture_files import read_capture
        from hyperexport.contracts.manifest import ExportManifest

        capture = read_capture(inputs.dir("export") / REFERENCE_DIR)
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_JSON).read_text(encoding="utf-8"))
        settings = check_settings(params, capture.record.hiera, manifest.fallback_from)
        report = run_checks(
            rewrite_dir / MODEL_FILE, manifest, capture.record, capture.arrays, settings
        )
        text = json.dumps(report.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_bytes(out_dir / CHECK_JSON, text.encode("utf-8"))
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
