"""Each task's part in the evaluate stage (:class:`~hyperexport.library.tasks.task.TaskDecode`): the
exported graphs decode the reference's prompts, and what came out is written as data (no
torch, no tolerance: the check judges it).

One greedy loop in ONNX Runtime (:func:`greedy`) serves both tasks that decode there: a
decoder-only model's left-padded batch (:func:`ort_padded_decode`) and an encoder-decoder's
decoder after its encoder (:func:`encoder_decoder_decode`). Each step feeds the step's
``present.*`` outputs back as the next step's ``past_key_values.*`` inputs, as transformers'
``generate`` does, starting from an empty past (length 0).

* ``task: text-generation`` (:func:`decode_text_generation`): onnxruntime-genai's decode of
  each prompt on the folder as published (``genai_runtime.py``), and the padded batch here:
  onnxruntime-genai 0.18.0's ``append_tokens`` gives a padded row an all-ones mask and
  positions counted from the first pad (measured), so a padded batch there is not
  transformers' padded batch. Writes ``generation.json`` (tokens) and ``generation.npz``.
* the encoder-decoders (:func:`decode_encoder_decoder`): the encoder graph runs once; its
  ``present.<i>.encoder.*`` outputs are fed unchanged as the decoder's
  ``past_key_values.<i>.encoder.*``; the decoder starts from the decoder start id. Writes
  ``seq2seq_decode.json`` and ``seq2seq_decode.npz``.

The ``.npz`` keys are the reference's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import (
    MODEL_FILE,
    QUANTIZED_MODEL_FILE,
    SEQ2SEQ_GRAPHS,
    SPEECH_RECOGNITION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)
from hyperexport.library.tasks.arrays import read_npz, write_npz
from hyperexport.library.tasks.kv import PAST, PRESENT, as_past
from hyperexport.library.tasks.prompts import left_padded
from hyperexport.library.tasks.registry import (
    GENAI_CONFIG,
    GENERATED_JSON,
    GENERATED_NPZ,
    GENERATED_QUANTIZED_JSON,
    GENERATED_QUANTIZED_NPZ,
    GENERATION_REFERENCE_JSON,
    SEQ2SEQ_DECODED_JSON,
    SEQ2SEQ_DECODED_NPZ,
    SEQ2SEQ_REFERENCE_JSON,
    SEQ2SEQ_REFERENCE_NPZ,
)
from hyperexport.library.tasks.task import TaskDecode, model_file

log = logging.getLogger(__name__)

#: ONNX Runtime's type names of the float dtypes a past may have.
_FLOAT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}


def session(path: Path) -> Any:
    """An ONNX Runtime session of the model at ``path`` on the CPU."""
    import onnxruntime as ort

    from hyperexport.library.check.ort_session import session_options, weights_in_place

    options = session_options(in_place=weights_in_place(path))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def empty_past(
    decoder: Any, batch: int, keep: Callable[[str], bool] = lambda name: True
) -> dict[str, np.ndarray]:
    """A past of length 0 for each ``past_key_values.*`` input of ``decoder`` that ``keep``
    accepts: ``(batch, heads, 0, head size)`` of the input's dtype."""
    past: dict[str, np.ndarray] = {}
    for value in decoder.get_inputs():
        if value.name.startswith(PAST) and keep(value.name):
            _, heads, _, size = value.shape
            past[value.name] = np.zeros((batch, heads, 0, size), dtype=_FLOAT_TYPES[value.type])
    return past


def presents_as_past(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``present.*`` outputs of a step, as the next step's ``past_key_values.*`` inputs."""
    return {as_past(name): value for name, value in outputs.items() if name.startswith(PRESENT)}


def greedy(
    decoder: Any,
    feeds: Mapping[str, np.ndarray],
    ids: np.ndarray,
    steps: int,
    eos: Sequence[int],
    pad: int,
    advance: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    forced: np.ndarray | None = None,
) -> tuple[list[list[int]], np.ndarray]:
    """Greedy decode of ``steps`` tokens with ``decoder``: ``(tokens per row, logits)``, the
    logits ``(steps, batch, vocab)`` in float32 at each step's last position.

    Args:
        decoder: The decoder's session.
        feeds: Its inputs besides ``input_ids`` (the empty past, masks).
        ids: The first step's ``input_ids`` ``(batch, length)``.
        steps: Most tokens to generate.
        eos: End-of-sequence ids: a row that chose one gets ``pad`` from then on, and the
            decode stops when every row has.
        pad: What a finished row gets.
        advance: The inputs of the next step from this step's (a mask grown by one).
        forced: ``(batch, steps)`` tokens fed instead of the ones chosen (another decode's, to
            compare this model's logits with its own along the same sequence).
    """
    outputs = [o.name for o in decoder.get_outputs()]
    batch = ids.shape[0]
    feeds = dict(feeds)
    done = np.zeros(batch, dtype=bool)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logits: list[np.ndarray] = []
    for step in range(steps if forced is None else forced.shape[1]):
        result = dict(zip(outputs, decoder.run(None, {**feeds, "input_ids": ids})))
        last = result["logits"][:, -1, :].astype(np.float32)
        logits.append(last)
        best = last.argmax(axis=-1) if forced is None else forced[:, step]
        chosen = np.where(done, pad, best).astype(np.int64)
        for row, token in enumerate(chosen):
            tokens[row].append(int(token))
        done |= np.isin(chosen, list(eos))
        feeds.update(presents_as_past(result))
        if advance is not None:
            feeds = advance(feeds)
        ids = chosen[:, None]
        if done.all():
            break
    return tokens, np.stack(logits)


def ort_padded_decode(
    model_file: Path,
    ids: np.ndarray,
    mask: np.ndarray,
    steps: int,
    eos: Sequence[int],
    pad: int,
    forced: np.ndarray | None = None,
) -> tuple[list[list[int]], np.ndarray]:
    """Greedy decode of a left-padded batch in ONNX Runtime: ``(tokens per row, logits)``
    (``forced``: the tokens fed, :func:`greedy`).

    Positions and mask follow transformers: ``position_ids = cumsum(mask) - 1`` (1 at pads), the
    mask grows by one 1 per step, and a row that produced an end-of-sequence id gets ``pad``.
    """
    decoder = session(model_file)
    batch = ids.shape[0]
    positions = np.where(mask == 0, 1, np.cumsum(mask, axis=1) - 1).astype(np.int64)

    def advance(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        grown = np.ones((batch, 1), dtype=feeds["attention_mask"].dtype)
        feeds["attention_mask"] = np.concatenate([feeds["attention_mask"], grown], axis=1)
        feeds["position_ids"] = feeds["position_ids"][:, -1:] + 1
        return feeds

    feeds = {"attention_mask": mask, "position_ids": positions, **empty_past(decoder, batch)}
    return greedy(decoder, feeds, ids, steps, eos, pad, advance, forced)


def encoder_decoder_decode(
    encoder_file: Path,
    decoder_file: Path,
    inputs: Mapping[str, np.ndarray],
    start: int,
    eos: Sequence[int],
    steps: int,
) -> tuple[list[int], np.ndarray]:
    """``(generated ids, per-step logits (steps, vocab))`` of one prompt (batch 1) through the
    encoder graph, then the decoder graph step by step."""
    encoder, decoder = session(encoder_file), session(decoder_file)
    enc_names = [o.name for o in encoder.get_outputs()]
    enc_wanted = {i.name for i in encoder.get_inputs()}
    enc_out = dict(
        zip(enc_names, encoder.run(None, {k: v for k, v in inputs.items() if k in enc_wanted}))
    )
    _, decoder_graph = SEQ2SEQ_GRAPHS
    feeds = {
        **presents_as_past(enc_out),
        **empty_past(decoder, 1, lambda name: f".{decoder_graph}." in name),
    }
    if any(v.name == "encoder_attention_mask" for v in decoder.get_inputs()):
        feeds["encoder_attention_mask"] = inputs["attention_mask"]
    start_ids = np.asarray([[start]], dtype=np.int64)
    tokens, logits = greedy(decoder, feeds, start_ids, steps, eos, pad=start)
    return tokens[0], logits[:, 0]


def decode_text_generation(
    trace_dir: Path, rewrite_dir: Path, out_dir: Path, quantize_dir: Path | None = None
) -> None:
    """Decode the reference's prompts with the exported model, in onnxruntime-genai one by one
    and in ONNX Runtime as a padded batch; write what came out. With ``quantize_dir``, the
    quantized model's decode too (:func:`decode_quantized_generation`)."""
    reference = json.loads((trace_dir / GENERATION_REFERENCE_JSON).read_text(encoding="utf-8"))
    steps = int(reference["max_new_tokens"])
    arrays: dict[str, np.ndarray] = {}
    single = _genai_singles(rewrite_dir, trace_dir / GENAI_CONFIG, out_dir, reference, arrays)
    batch: list[list[int]] = []
    if reference["batch"]:
        ids, mask = left_padded(reference["prompts"], int(reference["pad_token_id"]))
        batch, logits = ort_padded_decode(
            rewrite_dir / MODEL_FILE,
            ids,
            mask,
            steps,
            _eos_ids(trace_dir),
            int(reference["pad_token_id"]),
        )
        arrays["batch"] = logits
    log.info("decode in onnxruntime-genai (greedy): %s", single)
    record = {
        "runtime": "onnxruntime-genai",
        "batch_runtime": "onnxruntime",
        "single": single,
        "batch": batch,
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENERATED_JSON, text.encode("utf-8"))
    write_npz(out_dir / GENERATED_NPZ, arrays)
    if quantize_dir is not None:
        decode_quantized_generation(trace_dir, quantize_dir, out_dir, record)


def _genai_singles(
    model_dir: Path,
    genai_config: Path,
    scratch: Path,
    reference: Mapping[str, Any],
    arrays: dict[str, np.ndarray],
) -> list[list[int]]:
    """Each prompt decoded alone in onnxruntime-genai, one model loaded for all of them; the
    logits go into ``arrays`` (``single.<i>``). The model is let go on return, before the
    caller's ONNX Runtime session of the same weights is made (both at once: 5 GB more at 1B)."""
    from hyperexport.library.tasks.genai_runtime import genai_decode, genai_model

    steps = int(reference["max_new_tokens"])
    single: list[list[int]] = []
    with genai_model(model_dir, genai_config, scratch) as model:
        for i, prompt in enumerate(reference["prompts"]):
            tokens, arrays[f"single.{i}"] = genai_decode(model, prompt, steps)
            single.append(tokens)
    return single


def _genai_quantized(
    quantize_dir: Path,
    scratch: Path,
    reference: Mapping[str, Any],
    floats: Mapping[str, Any],
    arrays: dict[str, np.ndarray],
) -> list[list[int]]:
    """The quantized folder in onnxruntime-genai, one model for every prompt: each prompt fed
    the float decode's tokens (logits into ``arrays``), then decoded freely (returned). The
    model is let go on return, as in :func:`_genai_singles`."""
    from hyperexport.library.tasks.genai_runtime import genai_decode, genai_forced, genai_model

    steps = int(reference["max_new_tokens"])
    free: list[list[int]] = []
    genai_config = quantize_dir / GENAI_CONFIG
    with genai_model(quantize_dir, genai_config, scratch, QUANTIZED_MODEL_FILE) as model:
        for i, prompt in enumerate(reference["prompts"]):
            arrays[f"single.{i}"] = genai_forced(model, prompt, floats["single"][i])
            free.append(genai_decode(model, prompt, steps)[0])
    return free


def _eos_ids(trace_dir: Path) -> list[int]:
    """The end-of-sequence ids of the trace's ``genai_config.json``."""
    genai = json.loads((trace_dir / GENAI_CONFIG).read_text(encoding="utf-8"))
    eos = genai["model"].get("eos_token_id")
    return eos if isinstance(eos, list) else ([] if eos is None else [eos])


def decode_quantized_generation(
    trace_dir: Path, quantize_dir: Path, out_dir: Path, floats: Mapping[str, Any]
) -> None:
    """The quantized model's decode, on the folder as published (``model.quantized.onnx`` and
    the quantize stage's ``genai_config.json`` naming it): each prompt in onnxruntime-genai fed
    the float decode's tokens (``floats``: :func:`decode_text_generation`'s record), so that
    every step's logits compare with the float model's at the same sequence, and decoded freely
    (the tokens a user of the folder gets); the padded batch in ONNX Runtime, fed the same way.
    Writes ``generation_quantized.json`` and ``.npz`` (``single.<i>``, ``batch``: the logits
    along the float decode)."""
    reference = json.loads((trace_dir / GENERATION_REFERENCE_JSON).read_text(encoding="utf-8"))
    steps = int(reference["max_new_tokens"])
    arrays: dict[str, np.ndarray] = {}
    free = _genai_quantized(quantize_dir, out_dir, reference, floats, arrays)
    if floats["batch"]:
        pad = int(reference["pad_token_id"])
        ids, mask = left_padded(reference["prompts"], pad)
        forced = np.asarray(floats["batch"], dtype=np.int64)
        _, arrays["batch"] = ort_padded_decode(
            quantize_dir / QUANTIZED_MODEL_FILE, ids, mask, steps, _eos_ids(trace_dir), pad, forced
        )
    log.info("quantized model's free decode in onnxruntime-genai (greedy): %s", free)
    record = {
        "runtime": "onnxruntime-genai",
        "batch_runtime": "onnxruntime",
        "model": QUANTIZED_MODEL_FILE,
        "free_running": free,
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENERATED_QUANTIZED_JSON, text.encode("utf-8"))
    write_npz(out_dir / GENERATED_QUANTIZED_NPZ, arrays)


def decode_encoder_decoder(
    trace_dir: Path, rewrite_dir: Path, out_dir: Path, quantize_dir: Path | None = None
) -> None:
    """Decode the reference's prompts through the exported graphs; write what came out."""
    reference = json.loads((trace_dir / SEQ2SEQ_REFERENCE_JSON).read_text(encoding="utf-8"))
    ref_arrays = read_npz(trace_dir / SEQ2SEQ_REFERENCE_NPZ)
    arrays: dict[str, np.ndarray] = {}
    tokens: list[list[int]] = []
    encoder, decoder = SEQ2SEQ_GRAPHS
    for i, names in enumerate(reference["inputs"]):
        inputs = {name: ref_arrays[f"input.{i}.{name}"] for name in names}
        got, logits = encoder_decoder_decode(
            rewrite_dir / model_file(encoder),
            rewrite_dir / model_file(decoder),
            inputs,
            int(reference["decoder_start_token_id"]),
            [int(t) for t in reference["eos_token_id"]],
            int(reference["max_new_tokens"]),
        )
        tokens.append(got)
        arrays[f"logits.{i}"] = logits
    log.info("decode through the exported graphs in onnxruntime (greedy): %s", tokens)
    text = json.dumps({"runtime": "onnxruntime", "tokens": tokens}, indent=1) + "\n"
    atomic_write_bytes(out_dir / SEQ2SEQ_DECODED_JSON, text.encode("utf-8"))
    write_npz(out_dir / SEQ2SEQ_DECODED_NPZ, arrays)


#: The evaluate stage's part of every task that decodes, by name.
DECODES: dict[str, TaskDecode] = {
    TEXT_GENERATION: decode_text_generation,
    TEXT2TEXT_GENERATION: decode_encoder_decoder,
    SPEECH_RECOGNITION: decode_encoder_decoder,
}
