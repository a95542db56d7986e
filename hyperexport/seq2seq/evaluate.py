"""The evaluate stage's part for the encoder-decoder tasks: decode through both graphs (no torch).

Reads the trace's reference record (encoder inputs, start and end ids, steps), runs
:func:`~hyperexport.seq2seq.runtime.greedy_decode` per prompt on the rewrite's
``encoder_model.onnx`` and ``decoder_model.onnx``, and writes ``seq2seq_decode.json`` (tokens)
and ``seq2seq_decode.npz`` (per-step logits, the reference's keys). No tolerance is read here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hyperexport.atomic import atomic_write_bytes
from hyperexport.generation.arrays import read_npz, write_npz
from hyperexport.seq2seq.names import (
    DECODED_JSON,
    DECODED_NPZ,
    DECODER,
    ENCODER,
    REFERENCE_JSON,
    REFERENCE_NPZ,
    model_file,
)

log = logging.getLogger(__name__)


def evaluate_seq2seq(trace_dir: Path, model_dir: Path, out_dir: Path) -> None:
    """Decode the reference's prompts with the exported graphs; write what came out."""
    import numpy as np

    from hyperexport.seq2seq.runtime import greedy_decode

    reference = json.loads((trace_dir / REFERENCE_JSON).read_text(encoding="utf-8"))
    ref_arrays = read_npz(trace_dir / REFERENCE_NPZ)
    arrays: dict[str, np.ndarray] = {}
    tokens: list[list[int]] = []
    for i, names in enumerate(reference["inputs"]):
        inputs = {name: ref_arrays[f"input.{i}.{name}"] for name in names}
        got, logits = greedy_decode(
            model_dir / model_file(ENCODER),
            model_dir / model_file(DECODER),
            inputs,
            int(reference["decoder_start_token_id"]),
            [int(t) for t in reference["eos_token_id"]],
            int(reference["max_new_tokens"]),
        )
        tokens.append(got)
        arrays[f"logits.{i}"] = logits
    log.info("decode through the exported graphs in onnxruntime (greedy): %s", tokens)
    text = json.dumps({"runtime": "onnxruntime", "tokens": tokens}, indent=1) + "\n"
    atomic_write_bytes(out_dir / DECODED_JSON, text.encode("utf-8"))
    write_npz(out_dir / DECODED_NPZ, arrays)
