"""Names shared by the seq2seq modules and the stages (no torch, no ONNX library)."""

from __future__ import annotations

from hyperexport.contracts.names import SEQ2SEQ_GRAPHS
from hyperexport.contracts.names import SPEECH_RECOGNITION as SPEECH_RECOGNITION
from hyperexport.contracts.names import TEXT2TEXT_GENERATION as TEXT2TEXT_GENERATION

#: The tasks this package serves.
SEQ2SEQ_TASKS = (TEXT2TEXT_GENERATION, SPEECH_RECOGNITION)

#: The graphs of one build, in the order they run; each stage keeps a graph's files in a
#: folder of this name, and the rewrite stage publishes ``<graph>_model.onnx``.
GRAPHS = SEQ2SEQ_GRAPHS
ENCODER, DECODER = SEQ2SEQ_GRAPHS

#: Import paths of the units that become functions: each decoder layer's step (past and cross
#: KV explicit) and each decoder layer's cross-KV projection in the encoder graph.
KV_STEP = "hyperexport.transformers.seq2seq_layers.Seq2SeqKVStep"
CROSS_KV = "hyperexport.transformers.seq2seq_layers.CrossKV"

#: The reference decode (transformers' greedy ``generate``), trace stage output.
REFERENCE_JSON = "seq2seq_reference.json"
REFERENCE_NPZ = "seq2seq_reference.npz"
#: The decode through the exported graphs in ONNX Runtime, evaluate stage output.
DECODED_JSON = "seq2seq_decode.json"
DECODED_NPZ = "seq2seq_decode.npz"
#: The judgement of the decode, check stage output (published).
SEQ2SEQ_CHECK = "seq2seq_check.json"


def is_seq2seq(task: object) -> bool:
    """Whether ``task`` is one this package exports as an encoder and a decoder graph."""
    return task in SEQ2SEQ_TASKS


def model_file(graph: str) -> str:
    """The published ONNX file of ``graph`` (Optimum's names: ``encoder_model.onnx``)."""
    return f"{graph}_model.onnx"


def manifest_file(graph: str) -> str:
    """The published manifest of ``graph`` (``encoder_manifest.json``)."""
    return f"{graph}_manifest.json"


def past_name(layer: int, kind: str, which: str) -> str:
    """A decoder input: ``past_key_values.0.decoder.key`` (self) / ``....encoder.key`` (cross)."""
    return f"past_key_values.{layer}.{which}.{kind}"


def present_name(layer: int, kind: str, which: str) -> str:
    """An output: ``present.0.decoder.key`` (decoder, self) / ``present.0.encoder.key`` (encoder)."""
    return f"present.{layer}.{which}.{kind}"
