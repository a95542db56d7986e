"""The files a build's check vouches for: the published files the evaluate stage ran.

The rewrite's and the quantize stage's outputs (each of them is published: the models, their
data files and manifests) and the trace files a task's decode reads (``Task.vouched``: the
``genai_config.json`` of ``task: text-generation``, the quantize stage's in its place when it
wrote one: the one published). The evaluate stage records them (``evaluated.json``) and the check holds that
record against its own view, both computed here from the upstream digests the runner hands a
stage (:attr:`~hyperexport.engine.stage.StageInputs.digests`): so every file the check names
is one its key covers, by the digest it covers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import (
    EVALUATED_JSON,
    EXPORT,
    QUANTIZE,
    REFERENCE_DIR,
    REWRITE,
    TRACE,
)
from hyperexport.base.errors import CheckError
from hyperexport.library.tasks.task import Task

#: The stages whose every output is a published model file the evaluate stage runs.
MODEL_STAGES = (REWRITE, QUANTIZE)

#: What the judging stages (evaluate, check) read of the export (``Stage.upstream_reads``): the
#: reference capture, once or per graph folder. The units and their weights are the rewrite's
#: to read, so the export's weight file is not checked out for them, and the rewrite may take
#: it over to append to it (``StageInputs.take``).
EXPORT_READS = MappingProxyType({EXPORT: (f"{REFERENCE_DIR}/*", f"*/{REFERENCE_DIR}/*")})


def judged_files(digests: Mapping[str, Mapping[str, str]], task: Task) -> dict[str, str]:
    """``{published file: sha256}`` of what the evaluation runs, from the upstream digests: the
    models, and the trace files the task's decode reads (``Task.vouched``)."""
    files: dict[str, str] = {}
    for stage in MODEL_STAGES:
        files.update(digests.get(stage, {}))
    for name in task.vouched:  # unless the quantize stage wrote the one published
        files.setdefault(name, digests[TRACE][name])
    return dict(sorted(files.items()))


def write_evaluated(out_dir: Path, files: Mapping[str, str]) -> None:
    """Write ``evaluated.json``: the files the evaluation ran, by digest."""
    text = json.dumps({"files": dict(files)}, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / EVALUATED_JSON, text.encode("utf-8"))


def check_evaluated(evaluate_dir: Path, judged: Mapping[str, str]) -> CheckError | None:
    """A CheckError when the evaluation did not run exactly ``judged`` (the files this build
    publishes, by digest), naming the first file that differs; None when it did."""
    ran = json.loads((evaluate_dir / EVALUATED_JSON).read_text(encoding="utf-8"))["files"]
    for name in sorted(set(ran) | set(judged)):
        if name not in ran:
            return CheckError(f"{name} (sha256 {judged[name][:12]}) was not evaluated")
        if ran[name] != judged.get(name):
            published = judged[name][:12] if name in judged else "not published"
            return CheckError(
                f"the evaluation ran {name} sha256 {ran[name][:12]}, this build publishes "
                f"{published}"
            )
    return None
