"""Names shared by the generation modules and stages (no torch, no ONNX library)."""

from __future__ import annotations

#: ``task`` values this package serves (``forward`` is every other recipe's default).
from hyperexport.contracts.names import FORWARD as FORWARD
from hyperexport.contracts.names import TEXT_GENERATION as TEXT_GENERATION

# Tokenizer files copied from a checkpoint directory when it has them.
from hyperexport.contracts.names import TOKENIZER_FILES as TOKENIZER_FILES

#: The import path of the unit that becomes one function per decoder-layer structure.
KV_STEP = "hyperexport.transformers.kv_layers.KVStep"

#: Written by the trace stage, published beside the model: what ``onnxruntime_genai.Model`` reads.
GENAI_CONFIG = "genai_config.json"
#: The reference decode (transformers' greedy ``generate``), trace stage output.
REFERENCE_JSON = "generation_reference.json"
REFERENCE_NPZ = "generation_reference.npz"
#: The decode in onnxruntime-genai, evaluate stage output.
GENERATED_JSON = "generation.json"
GENERATED_NPZ = "generation.npz"
#: The judgement of the decode, check stage output (published).
GENERATION_CHECK = "generation_check.json"


def past_name(layer: int, kind: str) -> str:
    """onnxruntime-genai's past KV input name (``past_key_values.0.key``)."""
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """onnxruntime-genai's present KV output name (``present.0.key``)."""
    return f"present.{layer}.{kind}"
