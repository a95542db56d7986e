"""The tasks a recipe may ask for, as every stage sees them (:class:`~.task.Task`), and the
files they write. Names and data only: every stage imports this module.

Adding a task is one :class:`~.task.Task` here, its line in :data:`TASKS`, and its part in the
modules of the stages where it does more than ``forward`` (:mod:`.models`, :mod:`.decode`,
:mod:`.judge`).
"""

from __future__ import annotations

from hyperexport.base.contracts.names import (
    FORWARD,
    SEQ2SEQ_GRAPHS,
    SPEECH_RECOGNITION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
    TOKENIZER_FILES,
)
from hyperexport.library.tasks.task import Task

# -- text-generation: a decoder for onnxruntime-genai -------------------------------------------
#: Written by the trace stage, published beside the model: what ``onnxruntime_genai.Model`` reads.
GENAI_CONFIG = "genai_config.json"
#: The reference decode (transformers' greedy ``generate``), trace stage output.
GENERATION_REFERENCE_JSON = "generation_reference.json"
GENERATION_REFERENCE_NPZ = "generation_reference.npz"
#: The decode in onnxruntime-genai, evaluate stage output.
GENERATED_JSON = "generation.json"
GENERATED_NPZ = "generation.npz"
#: The judgement of the decode, check stage output (published).
GENERATION_CHECK = "generation_check.json"
#: With ``quantize.method``: the quantized model's decode in onnxruntime-genai (and the padded
#: batch in ONNX Runtime), fed the float decode's tokens, evaluate stage output.
GENERATED_QUANTIZED_JSON = "generation_quantized.json"
GENERATED_QUANTIZED_NPZ = "generation_quantized.npz"

# -- the encoder-decoders: two graphs ----------------------------------------------------------
#: The reference decode (transformers' greedy ``generate``), trace stage output.
SEQ2SEQ_REFERENCE_JSON = "seq2seq_reference.json"
SEQ2SEQ_REFERENCE_NPZ = "seq2seq_reference.npz"
#: The decode through the exported graphs in ONNX Runtime, evaluate stage output.
SEQ2SEQ_DECODED_JSON = "seq2seq_decode.json"
SEQ2SEQ_DECODED_NPZ = "seq2seq_decode.npz"
#: The judgement of the decode, check stage output (published).
SEQ2SEQ_CHECK = "seq2seq_check.json"

#: ``task: forward`` (the default): one graph of ``method``, checked by its outputs alone.
FORWARD_TASK = Task(FORWARD)

#: ``task: text-generation``: the step model with past/present KV as tensors, decoded in
#: onnxruntime-genai against transformers' ``generate``.
TEXT_GENERATION_TASK = Task(
    TEXT_GENERATION,
    trace_files={
        "genai_config": GENAI_CONFIG,
        "generation_reference": GENERATION_REFERENCE_JSON,
        "generation_reference_arrays": GENERATION_REFERENCE_NPZ,
    },
    evaluate_files={"generation": GENERATED_JSON, "generation_arrays": GENERATED_NPZ},
    check_files={"generation_check": GENERATION_CHECK},
    vouched=(GENAI_CONFIG,),
    published=(GENAI_CONFIG, *TOKENIZER_FILES),
    # Quantized, the published genai_config.json names model.quantized.onnx.
    quantized_files={"genai_config": GENAI_CONFIG},
    quantized_evaluate_files={
        "generation_quantized": GENERATED_QUANTIZED_JSON,
        "generation_quantized_arrays": GENERATED_QUANTIZED_NPZ,
    },
)


def _encoder_decoder(name: str) -> Task:
    """An encoder-decoder task: two graphs, decoded through both in ONNX Runtime."""
    return Task(
        name,
        graphs=SEQ2SEQ_GRAPHS,
        trace_files={
            "seq2seq_reference": SEQ2SEQ_REFERENCE_JSON,
            "seq2seq_reference_arrays": SEQ2SEQ_REFERENCE_NPZ,
        },
        evaluate_files={
            "seq2seq_decode": SEQ2SEQ_DECODED_JSON,
            "seq2seq_decode_arrays": SEQ2SEQ_DECODED_NPZ,
        },
        check_files={"seq2seq_check": SEQ2SEQ_CHECK},
    )


#: ``task: text2text-generation``: the encoder (with each decoder layer's cross-attention KV)
#: and one decoder step as two graphs, from token ids.
TEXT2TEXT_TASK = _encoder_decoder(TEXT2TEXT_GENERATION)
#: ``task: automatic-speech-recognition``: the same, the encoder from input features (Whisper).
SPEECH_RECOGNITION_TASK = _encoder_decoder(SPEECH_RECOGNITION)

#: Every task a recipe may ask for, by name.
TASKS: dict[str, Task] = {
    t.name: t for t in (FORWARD_TASK, TEXT_GENERATION_TASK, TEXT2TEXT_TASK, SPEECH_RECOGNITION_TASK)
}


def task_named(name: str) -> Task:
    """The task ``name`` (a validated recipe's ``task``).

    Raises:
        KeyError: No such task.
    """
    return TASKS[name]


def trace_published() -> tuple[str, ...]:
    """Every file of the trace a task publishes (the trace stage's ``publish``)."""
    return tuple(dict.fromkeys(f for t in TASKS.values() for f in t.published))


def quantize_published() -> tuple[str, ...]:
    """Every file besides the model a task has the quantize stage publish (its ``publish``)."""
    return tuple(dict.fromkeys(f for t in TASKS.values() for f in t.quantized_files.values()))


def check_published() -> tuple[str, ...]:
    """Every file of the check a task writes, all published (the check stage's ``publish``)."""
    return tuple(dict.fromkeys(f for t in TASKS.values() for f in t.check_files.values()))
