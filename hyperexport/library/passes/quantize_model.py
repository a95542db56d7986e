"""What the quantize stage does to a model's MatMuls: after ``rewrite.fuse: onnxruntime`` it
first packs the groups the rewrite left apart (``pack_matmuls.py``: an MLP's gate and up, which
are faster apart in float and together quantized), then quantizes (``quantize_matmul.py``).
One function, so that the stage and a benchmark that quantizes a fused model as the stage does
run the same passes in the same order.

Packing inside a function adds a ``Constant`` (the ``Split``'s sizes) to its body. Where the
rewrite moved the bodies' constants to the main graph (``hoist_invariants.py``: no body holds
one, which is how a fused model leaves ONNX Runtime nothing to change at load), the new one
moves there too; where the recipe keeps constants in the bodies (``rewrite.fuse_constants``),
it stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from hyperexport.base.contracts.names import ONNXRUNTIME_FUSION
from hyperexport.library.passes.fuse_layout import is_op
from hyperexport.library.passes.hoist_invariants import HoistInvariantsPass
from hyperexport.library.passes.pack_matmuls import PackedWeight, PackMatMulsPass
from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass


@dataclass(frozen=True)
class QuantizedModel:
    """What :func:`quantize_model` did.

    Attributes:
        modified: Whether any MatMul was quantized.
        packed: The values packing made before quantizing (for the quantized manifest).
    """

    modified: bool
    packed: tuple[PackedWeight, ...]


def quantize_model(model: ir.Model, quantize: QuantizeMatMulsPass, fusion: str) -> QuantizedModel:
    """Quantize ``model`` in place with ``quantize``; after the ONNX Runtime fusion (``fusion``,
    the rewrite's ``rewrite.fuse``), pack first what reads one activation, outside the pass's
    ``exclude`` as the pass leaves it."""
    packed: tuple[PackedWeight, ...] = ()
    if fusion == ONNXRUNTIME_FUSION:
        bodies_hold_constants = any(
            is_op(node, "Constant") for f in model.functions.values() for node in f
        )
        pack = PackMatMulsPass(quantize.exclude)
        if pack(model).modified:
            packed = tuple(pack.packed)
            HoistInvariantsPass(constants=not bodies_hold_constants)(model)
    return QuantizedModel(quantize(model).modified, packed)
