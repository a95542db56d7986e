"""The reference decode: transformers' greedy ``generate`` of each prompt (trace stage, torch).

Written as data for the torch-free evaluate and check stages, one record per task:

* ``task: text-generation`` (:func:`record_causal_lm`): ``generation_reference.json`` (prompts,
  generated token ids, and the model config keys ``genai_config.json`` is built from) and
  ``generation_reference.npz`` (per-step logits of the generated position, ``single.<i>`` of
  shape ``(steps, vocab)`` for prompt ``i`` alone and ``batch`` of shape
  ``(steps, prompts, vocab)`` for the left-padded batch).
* the encoder-decoders (:func:`record_encoder_decoder`): ``seq2seq_reference.json`` (the
  encoder inputs, decoder start and end ids, generated ids) and ``seq2seq_reference.npz``
  (``logits.<i>``: the per-step logits of prompt ``i``, ``(steps, vocab)``; ``input.<i>.<name>``:
  its encoder inputs). ``GenerationMixin.generate`` is called directly: Whisper's own
  ``generate`` wraps it with a task/language prompt and timestamp rules, which are a search
  strategy, not the model. Logits processors that transformers would take from the model's
  generation config (forced ids, n-gram bans, minimum length, suppressed tokens) are switched
  off: the graphs are compared with the model, not with a search strategy.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.engine.spans import span
from hyperexport.library.tasks.arrays import write_npz
from hyperexport.library.tasks.genai_config import genai_source
from hyperexport.library.tasks.prompts import left_padded, pad_id
from hyperexport.library.tasks.registry import (
    GENERATION_REFERENCE_JSON,
    GENERATION_REFERENCE_NPZ,
    SEQ2SEQ_REFERENCE_JSON,
    SEQ2SEQ_REFERENCE_NPZ,
)

log = logging.getLogger(__name__)

#: The span (``engine/spans.py``) of the trace stage's time spent in transformers' decode.
REFERENCE_DECODE = "reference decode"

#: generate's arguments that keep an encoder-decoder's decode plain greedy argmax of its logits.
PLAIN_GREEDY: Mapping[str, Any] = {
    "do_sample": False,
    "num_beams": 1,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "output_logits": True,
    "return_dict_in_generate": True,
}


@contextlib.contextmanager
def _generating(model: Any) -> Iterator[None]:
    """``generate`` needs the cache, which the factories switch off: on for the block. The
    block's time is the build report's :data:`REFERENCE_DECODE` span of the stage (verification
    done where the live model is, not part of making the graphs)."""
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = True
    try:
        with span(REFERENCE_DECODE):
            yield
    finally:
        model.config.use_cache = use_cache


def _step_logits(out: Any, row: int | None = 0) -> np.ndarray:
    """The logits of each generated step as float32 numpy: of batch row ``row``
    ``(steps, vocab)``, or of every row (None) ``(steps, batch, vocab)``."""
    steps = out.logits if row is None else (s[row] for s in out.logits)
    return np.stack([s.float().numpy() for s in steps])


def _write(
    out_dir: Path,
    json_name: str,
    npz_name: str,
    record: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
) -> None:
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / json_name, text.encode("utf-8"))
    write_npz(out_dir / npz_name, arrays)


def _generate_causal(model: Any, ids: np.ndarray, mask: np.ndarray, steps: int, pad: int) -> Any:
    import torch

    with torch.no_grad():
        return model.generate(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=steps,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )


def record_causal_lm(
    model: Any, config: Mapping[str, Any], generation: Mapping[str, Any], out_dir: Path
) -> None:
    """Run transformers' greedy decode of each prompt (and the padded batch); write it as data."""
    prompts = [list(map(int, p)) for p in generation["prompts"]]
    steps = int(generation["max_new_tokens"])
    pad = pad_id(config)
    arrays: dict[str, np.ndarray] = {}
    single: list[list[int]] = []
    with _generating(model):
        for i, prompt in enumerate(prompts):
            ids, mask = left_padded([prompt], pad)
            out = _generate_causal(model, ids, mask, steps, pad)
            single.append(out.sequences[0, len(prompt) :].tolist())
            arrays[f"single.{i}"] = _step_logits(out)
        batch: list[list[int]] = []
        if generation.get("padded_batch") and len(prompts) > 1:
            ids, mask = left_padded(prompts, pad)
            out = _generate_causal(model, ids, mask, steps, pad)
            batch = out.sequences[:, ids.shape[1] :].tolist()
            arrays["batch"] = _step_logits(out, row=None)
    record = {
        "prompts": prompts,
        "max_new_tokens": steps,
        "pad_token_id": pad,
        "single": single,
        "batch": batch,
        # The model config the decode ran with, as genai_config.json is built from it.
        "config": genai_source(config),
    }
    log.info("reference decode (transformers, greedy): %s", single)
    _write(out_dir, GENERATION_REFERENCE_JSON, GENERATION_REFERENCE_NPZ, record, arrays)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def decoder_ids(model: Any) -> tuple[int, list[int]]:
    """``(decoder start id, end-of-sequence ids)`` as ``generate`` uses them."""
    gen = getattr(model, "generation_config", None)
    config = model.config
    start = getattr(gen, "decoder_start_token_id", None)
    if start is None:
        start = config.decoder_start_token_id
    if isinstance(start, list):
        start = start[0]
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = config.eos_token_id
    return int(start), _ids(eos)


def record_encoder_decoder(
    model: Any,
    prompts: Sequence[Mapping[str, np.ndarray]],
    steps: int,
    out_dir: Path,
) -> None:
    """Greedy-decode each prompt (a mapping of encoder inputs) with ``generate``; write it as data."""
    import torch
    from transformers.generation.utils import GenerationMixin

    start, eos = decoder_ids(model)
    arrays: dict[str, np.ndarray] = {}
    tokens: list[list[int]] = []
    with _generating(model):
        for i, prompt in enumerate(prompts):
            feeds = {k: torch.from_numpy(v) for k, v in prompt.items()}
            with torch.no_grad():
                # GenerationMixin's generate, also for Whisper: its own adds the task and
                # language prompt and timestamp rules, which are not the model's decode.
                out = GenerationMixin.generate(
                    model,
                    **feeds,
                    max_new_tokens=steps,
                    decoder_start_token_id=start,
                    **PLAIN_GREEDY,
                )
            tokens.append(out.sequences[0, 1:].tolist())
            arrays[f"logits.{i}"] = _step_logits(out)
            for name, value in prompt.items():
                arrays[f"input.{i}.{name}"] = value
    record = {
        "max_new_tokens": steps,
        "decoder_start_token_id": start,
        "eos_token_id": eos,
        "inputs": [sorted(p) for p in prompts],
        "tokens": tokens,
    }
    log.info("reference decode (transformers, greedy): %s", tokens)
    _write(out_dir, SEQ2SEQ_REFERENCE_JSON, SEQ2SEQ_REFERENCE_NPZ, record, arrays)
