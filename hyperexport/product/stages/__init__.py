"""The build pipeline: trace → export → rewrite → quantize → evaluate → check.

Each stage is thin: it reads its declared inputs, calls the library and writes its outputs;
torch is imported only inside the ``run`` of the stages that need the live model (trace,
export), and never by rewrite, quantize, evaluate or check.

The package imports none of its stage modules eagerly: a stage's key covers the hyperexport
modules its module loads (:mod:`hyperexport.engine.code_closure`), and loading one stage must
not load the others. ``PIPELINE`` and ``model_loader`` are resolved on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyperexport import lazy_attributes

if TYPE_CHECKING:
    from hyperexport.product.from_recipe.model import model_loader
    from hyperexport.product.stages.check import CheckStage
    from hyperexport.product.stages.evaluate import EvaluateStage
    from hyperexport.product.stages.export import ExportStage
    from hyperexport.product.stages.pipeline import PIPELINE
    from hyperexport.product.stages.quantize import QuantizeStage
    from hyperexport.product.stages.rewrite import RewriteStage
    from hyperexport.product.stages.trace import TraceStage

_LAZY = {
    "PIPELINE": "hyperexport.product.stages.pipeline",
    "CheckStage": "hyperexport.product.stages.check",
    "EvaluateStage": "hyperexport.product.stages.evaluate",
    "ExportStage": "hyperexport.product.stages.export",
    "QuantizeStage": "hyperexport.product.stages.quantize",
    "RewriteStage": "hyperexport.product.stages.rewrite",
    "TraceStage": "hyperexport.product.stages.trace",
    "model_loader": "hyperexport.product.from_recipe.model",
}

__all__ = [
    "PIPELINE",
    "CheckStage",
    "EvaluateStage",
    "ExportStage",
    "QuantizeStage",
    "RewriteStage",
    "TraceStage",
    "model_loader",
]


__getattr__ = lazy_attributes(__name__, _LAZY)
