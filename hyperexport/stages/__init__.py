"""The build pipeline: trace → export → rewrite → evaluate → check.

Each stage is thin: it reads its declared inputs, calls the library and writes its outputs;
torch is imported only inside the ``run`` of the stages that need the live model (trace,
export), and never by rewrite, evaluate or check.

The package imports none of its stage modules eagerly: a stage's key covers the hyperexport
modules its module loads (:mod:`hyperexport.engine.code_closure`), and loading one stage must
not load the others. ``PIPELINE`` and ``model_loader`` are resolved on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperexport.from_recipe.model import model_loader
    from hyperexport.stages.check import CheckStage
    from hyperexport.stages.evaluate import EvaluateStage
    from hyperexport.stages.export import ExportStage
    from hyperexport.stages.pipeline import PIPELINE
    from hyperexport.stages.rewrite import RewriteStage
    from hyperexport.stages.trace import TraceStage

_LAZY = {
    "PIPELINE": "hyperexport.stages.pipeline",
    "CheckStage": "hyperexport.stages.check",
    "EvaluateStage": "hyperexport.stages.evaluate",
    "ExportStage": "hyperexport.stages.export",
    "RewriteStage": "hyperexport.stages.rewrite",
    "TraceStage": "hyperexport.stages.trace",
    "model_loader": "hyperexport.from_recipe.model",
}

__all__ = [
    "PIPELINE",
    "CheckStage",
    "EvaluateStage",
    "ExportStage",
    "RewriteStage",
    "TraceStage",
    "model_loader",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hyperexport.stages' has no attribute {name!r}")
