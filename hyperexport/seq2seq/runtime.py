"""Greedy decode through the exported encoder and decoder graphs in ONNX Runtime (no torch).

The encoder graph runs once; its ``present.<i>.encoder.*`` outputs are fed unchanged as the
decoder's ``past_key_values.<i>.encoder.*``. The decoder starts from the decoder start id with
an empty self-attention past (length 0) and feeds each step's ``present.<i>.decoder.*`` back as
the next step's past, as transformers' ``generate`` does, stopping after an end-of-sequence id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

#: ONNX Runtime's type names of the float dtypes a past may have.
_FLOAT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}


def _session(path: Path) -> object:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def greedy_decode(
    encoder_file: Path,
    decoder_file: Path,
    inputs: Mapping[str, np.ndarray],
    start: int,
    eos: Sequence[int],
    steps: int,
) -> tuple[list[int], np.ndarray]:
    """``(generated ids, per-step logits (steps, vocab))`` of one prompt (batch 1)."""
    encoder, decoder = _session(encoder_file), _session(decoder_file)
    enc_names = [o.name for o in encoder.get_outputs()]  # type: ignore[attr-defined]
    enc_wanted = {i.name for i in encoder.get_inputs()}  # type: ignore[attr-defined]
    enc_out = dict(
        zip(enc_names, encoder.run(None, {k: v for k, v in inputs.items() if k in enc_wanted}))  # type: ignore[attr-defined]
    )
    feeds: dict[str, np.ndarray] = {
        name.replace("present.", "past_key_values.", 1): value
        for name, value in enc_out.items()
        if name.startswith("present.")
    }
    dec_inputs = decoder.get_inputs()  # type: ignore[attr-defined]
    for value in dec_inputs:
        if value.name.startswith("past_key_values.") and ".decoder." in value.name:
            _, heads, _, size = value.shape
            feeds[value.name] = np.zeros((1, heads, 0, size), dtype=_FLOAT_TYPES[value.type])
    if any(v.name == "encoder_attention_mask" for v in dec_inputs):
        feeds["encoder_attention_mask"] = inputs["attention_mask"]
    dec_names = [o.name for o in decoder.get_outputs()]  # type: ignore[attr-defined]
    token = start
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for _ in range(steps):
        feeds["input_ids"] = np.asarray([[token]], dtype=np.int64)
        out = dict(zip(dec_names, decoder.run(None, feeds)))  # type: ignore[attr-defined]
        last = out["logits"][0, -1].astype(np.float32)
        logits.append(last)
        token = int(last.argmax())
        tokens.append(token)
        for name, value in out.items():
            if name.startswith("present."):
                feeds[name.replace("present.", "past_key_values.", 1)] = value
        if token in eos:
            break
    return tokens, np.stack(logits)
