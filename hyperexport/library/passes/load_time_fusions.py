"""What ONNX Runtime would fuse when it loads the model, written in the model
(``rewrite.fuse: onnxruntime``, after every other pass but ``hoist_invariants``).

ONNX Runtime fuses a standalone RMSNorm into ``SimplifiedLayerNormalization`` and SiLU into
``QuickGelu`` when it loads a model. The kernels it runs are the same either way, but a session
that fused, merged or shared anything at load runs the same final graph about 4% slower than one
that found nothing left to do (``bench/README.md``), so the model carries them already, as the
builder's does (``fuse_norms.simplified_rules``, ``fuse_gelu.silu_rules``).

Last, because onnx's shape inference knows no ``SimplifiedLayerNormalization``: the passes
before read shapes through the norms (Qwen3's per-head norms stand before its attention fuses).
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from hyperexport.library.passes import fuse_gelu, fuse_norms
from hyperexport.library.passes.fuse_ops import apply_rules

log = logging.getLogger(__name__)


class LoadTimeFusionsPass(ir.passes.InPlacePass):
    """Standalone RMSNorm -> ``SimplifiedLayerNormalization``; SiLU -> ``QuickGelu``."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = apply_rules(model, [*fuse_norms.simplified_rules(), *fuse_gelu.silu_rules()])
        log.debug("load_time_fusions: %d rewrites", count)
        return ir.passes.PassResult(model, modified=bool(count))
