"""The reference decode: transformers' greedy ``generate`` for each prompt (trace stage, torch).

Written as data for the torch-free evaluate and check stages: ``generation_reference.json``
(prompts, generated token ids, per-step top-2 logit gap, and the model config keys
``genai_config.json`` is built from) and ``generation_reference.npz``
(per-step logits of the generated position, ``single.<i>`` of shape ``(steps, vocab)`` for
prompt ``i`` alone and ``batch`` of shape ``(steps, prompts, vocab)`` for the left-padded batch).
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
from hyperexport.generation.genai_config import genai_source
from hyperexport.generation.names import REFERENCE_JSON, REFERENCE_NPZ

log = logging.getLogger(__name__)


def pad_id(config: Mapping[str, Any]) -> int:
    """The id left padding uses: ``pad_token_id``, else the first ``eos_token_id``, else 0."""
    for key in ("pad_token_id", "eos_token_id"):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` of the prompts left-padded to the longest."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask


def _generate(model: Any, ids: np.ndarray, mask: np.ndarray, steps: int, pad: int) -> Any:
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


def record_reference(
    model: Any, config: Mapping[str, Any], generation: Mapping[str, Any], out_dir: Path
) -> None:
    """Run transformers' greedy decode of each prompt (and the padded batch); write it as data."""
    prompts = [list(map(int, p)) for p in generation["prompts"]]
    steps = int(generation["max_new_tokens"])
    pad = pad_id(config)
    arrays: dict[str, np.ndarray] = {}
    single: list[list[int]] = []
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = True  # generate needs the cache; the factory switched it off
    try:
        for i, prompt in enumerate(prompts):
            ids, mask = left_padded([prompt], pad)
            out = _generate(model, ids, mask, steps, pad)
            single.append(out.sequences[0, len(prompt) :].tolist())
            arrays[f"single.{i}"] = np.stack([s[0].float().numpy() for s in out.logits])
        batch: list[list[int]] = []
        if generation.get("padded_batch") and len(prompts) > 1:
            ids, mask = left_padded(prompts, pad)
            out = _generate(model, ids, mask, steps, pad)
            batch = out.sequences[:, ids.shape[1] :].tolist()
            arrays["batch"] = np.stack([s.float().numpy() for s in out.logits])
    finally:
        model.config.use_cache = use_cache
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
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / REFERENCE_JSON, text.encode("utf-8"))
    write_npz(out_dir / REFERENCE_NPZ, arrays)
