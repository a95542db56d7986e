"""The build pipeline: trace → export → rewrite → check.

Each stage is thin: it reads its inputs, calls the library (``hyperexport.api``,
``hyperexport.check``) and writes its outputs. torch is imported only inside ``run``.
"""

from __future__ import annotations

from hyperexport.stages.check import CheckStage
from hyperexport.stages.export import ExportStage
from hyperexport.stages.model import model_loader
from hyperexport.stages.rewrite import RewriteStage
from hyperexport.stages.trace import TraceStage

PIPELINE = (TraceStage(), ExportStage(), RewriteStage(), CheckStage())

__all__ = ["PIPELINE", "CheckStage", "ExportStage", "RewriteStage", "TraceStage", "model_loader"]
