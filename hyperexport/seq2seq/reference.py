"""The reference decode: transformers' greedy ``generate`` of each prompt (trace stage, torch).

``GenerationMixin.generate`` is called directly: Whisper's own ``generate`` wraps it with a
task/language prompt and timestamp rules, which are a search strategy, not the model.

Written as data for the torch-free evaluate and check stages: ``seq2seq_reference.json`` (the
encoder inputs, decoder start and end ids, generated ids) and ``seq2seq_reference.npz``
(``logits.<i>``: the per-step logits of prompt ``i``, ``(steps, vocab)``; ``features.<i>``: a
speech model's input features). Logits processors that transformers would take from the
model's generation config (forced ids, n-gram bans, minimum length, suppressed tokens) are
switched off: the graphs are compared with the model, not with a search strategy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.atomic import atomic_write_bytes
from hyperexport.generation.arrays import write_npz
from hyperexport.seq2seq.names import REFERENCE_JSON, REFERENCE_NPZ

log = logging.getLogger(__name__)

#: generate's arguments that keep the decode plain greedy argmax of the model's logits.
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


def record_reference(
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
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = True  # generate needs the cache; the factory switched it off
    try:
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
            arrays[f"logits.{i}"] = np.stack([s[0].float().numpy() for s in out.logits])
            for name, value in prompt.items():
                arrays[f"input.{i}.{name}"] = value
    finally:
        model.config.use_cache = use_cache
    record = {
        "max_new_tokens": steps,
        "decoder_start_token_id": start,
        "eos_token_id": eos,
        "inputs": [sorted(p) for p in prompts],
        "tokens": tokens,
    }
    log.info("reference decode (transformers, greedy): %s", tokens)
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / REFERENCE_JSON, text.encode("utf-8"))
    write_npz(out_dir / REFERENCE_NPZ, arrays)
