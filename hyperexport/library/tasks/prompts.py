"""Prompts as token ids: the id left padding uses, and a batch of prompts left-padded (numpy;
the reference decode in the trace and the decode of the export in evaluate share them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


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
