"""The library's defaults and value sets that the recipe schema shows, written once.

The exporter (``api.py``), the quantize pass (``passes/quantize_weights.py``) and the checks
(``check/settings.py``, ``check/quantized_judge.py``) define their defaults from here, and the
recipe schema (``config/schema.py``) borrows them, as it borrows the export options' defaults
from ``options.py``. A module of plain values that imports only names: every stage imports the
schema, so importing the check library or the quantize pass there would put their code into
every stage's key (and numpy into a no-op build).
"""

from __future__ import annotations

from hyperexport.base.contracts.names import FUNCTION_SCOPES, NO_QUANTIZATION

# -- export ------------------------------------------------------------------------------------
#: The default-domain opset of an export (``export_hyper_onnx(opset_version=)``, recipe ``opset``).
DEFAULT_OPSET = 18

# -- quantization (the quantize pass, recipe ``quantize.*``) ------------------------------------
#: int4 blocks for com.microsoft ``MatMulNBits``.
INT4_BLOCK = "int4_block"
#: int8 columns for com.microsoft ``DynamicQuantizeMatMul``.
INT8_DYNAMIC = "int8_dynamic"
#: ``quantize.method`` values: no quantization (the stage does nothing), then the pass's methods.
QUANTIZE_METHODS = (NO_QUANTIZATION, INT8_DYNAMIC, INT4_BLOCK)
#: The smallest block ``MatMulNBits`` accepts; block sizes are powers of two from here.
MIN_BLOCK_SIZE = 16
#: K elements per int4 block when the recipe says nothing (ONNX Runtime's quantizer's default).
DEFAULT_BLOCK_SIZE = 32
#: ``MatMulNBits``' ``accuracy_level`` values: 0 (unset: ONNX Runtime's default), then the
#: least precision of the activations: 1 float32, 2 float16, 3 bfloat16, 4 int8.
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
#: What onnxruntime-genai's model builder sets for int4 on CPU: int8 activations, whose int8
#: block kernels make int4 faster than float.
DEFAULT_ACCURACY_LEVEL = 4


def block_size_problem(block_size: int) -> str | None:
    """Why ``block_size`` is no int4 block size (a power of two >= :data:`MIN_BLOCK_SIZE`), or
    None when it is one."""
    if block_size < MIN_BLOCK_SIZE or block_size & (block_size - 1):
        return f"must be a power of two >= {MIN_BLOCK_SIZE}, got {block_size}"
    return None


# -- the check (``run_checks``' settings, recipe ``check.*``) ------------------------------------
#: Absolute and relative tolerance of every compared tensor.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
#: Which call sites get a per-function check: every one.
DEFAULT_FUNCTION_SCOPE = FUNCTION_SCOPES[0]
#: How close a quantized model must stay to its float model (``check.quantized.*``): cosine
#: similarity, relative L2 error and top-1 agreement of logits-like outputs.
DEFAULT_MIN_COSINE = 0.95
DEFAULT_MAX_REL_ERROR = 0.35
DEFAULT_MIN_TOP1 = 0.75
#: Fewest distinct token ids each reference decode must hold (``check.generation.min_distinct``).
DEFAULT_MIN_DISTINCT = 3
#: How close a quantized text-generation model's decode must stay to the float model's, fed the
#: float decode's tokens (``check.quantized.*``): share of steps with the same next token, and
#: the least cosine of a step's logits.
DEFAULT_MIN_TOKEN_AGREEMENT = 0.85
DEFAULT_MIN_DECODE_COSINE = 0.98
#: ``check.quantized.decode`` values: the two figures gate the check, or are only reported
#: (random weights, where the float model's top-2 logits are close and agreement means little).
DECODE_GATES = ("gate", "report")
