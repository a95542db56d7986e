"""The build pipeline, in dependency order: trace → export → rewrite → quantize → evaluate → check."""

from __future__ import annotations

from hyperexport.product.stages.check import CheckStage
from hyperexport.product.stages.evaluate import EvaluateStage
from hyperexport.product.stages.export import ExportStage
from hyperexport.product.stages.quantize import QuantizeStage
from hyperexport.product.stages.rewrite import RewriteStage
from hyperexport.product.stages.trace import TraceStage

PIPELINE = (
    TraceStage(),
    ExportStage(),
    RewriteStage(),
    QuantizeStage(),
    EvaluateStage(),
    CheckStage(),
)
