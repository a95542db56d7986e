"""The build pipeline, in dependency order: trace → export → rewrite → quantize → evaluate → check."""

from __future__ import annotations

from hyperexport.stages.check import CheckStage
from hyperexport.stages.evaluate import EvaluateStage
from hyperexport.stages.export import ExportStage
from hyperexport.stages.quantize import QuantizeStage
from hyperexport.stages.rewrite import RewriteStage
from hyperexport.stages.trace import TraceStage

PIPELINE = (
    TraceStage(),
    ExportStage(),
    RewriteStage(),
    QuantizeStage(),
    EvaluateStage(),
    CheckStage(),
)
