"""Which safetensors files a recipe's weights can stream from (``weights: stream``), or why
none (data only: the checkpoint's ``config.json`` and file names are read, nothing imported).

A recipe streams when its weights are in safetensors files outside the model's code: the
pretrained factory with ``model.path`` a local checkpoint folder, or any factory with a
``checkpoint:`` of safetensors (a file, or a folder of them). ``docs/streaming.md`` has the
design; ``from_recipe/weights.py`` builds the model from the source.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import (
    CHECKPOINT_CONFIG,
    FORWARD,
    SAFETENSORS,
    WEIGHTS_STREAM,
)
from hyperexport.product.config.task_inference import PRETRAINED_FACTORY, checkpoint_folder

#: The ``config.json`` key of a quantized checkpoint (its tensors are packed, not the model's).
QUANTIZATION_KEY = "quantization_config"


@dataclass(frozen=True)
class WeightsSource:
    """Where streamed weights come from.

    Attributes:
        folder: The folder the files are in.
        files: The safetensors files, relative to ``folder``; None: the folder's own (its
            shard index, else every ``*.safetensors``).
        pretrained: Whether the model is the pretrained factory's (built from ``config.json``)
            rather than a factory's with a ``checkpoint:``.
    """

    folder: Path
    files: tuple[str, ...] | None
    pretrained: bool


def weights_source(
    model: Mapping[str, Any],
    checkpoint: Path | None,
    recipe_file: str,
    task: str,
    fallback: bool = False,
) -> WeightsSource | str:
    """The recipe's streaming source, or one line saying why its weights cannot stream."""
    if fallback:
        # A retry on the other path captures the model again, outside the streamed run.
        return (
            "a fallback captures the model again on the other path with every weight loaded; "
            "set fallback: false to stream"
        )
    if task != FORWARD:
        return (
            f"task {task} swaps the model's layers for its step wrappers while it traces; "
            f"only task {FORWARD} streams"
        )
    if checkpoint is not None:
        if checkpoint.is_dir():
            return WeightsSource(checkpoint, None, pretrained=False)
        if checkpoint.suffix != SAFETENSORS:
            return f"checkpoint {checkpoint.name} is a torch pickle: no offsets to map"
        return WeightsSource(checkpoint.parent, (checkpoint.name,), pretrained=False)
    folder = checkpoint_folder(model, recipe_file)
    if folder is None:
        target = model.get("_target_")
        if target == PRETRAINED_FACTORY:
            return f"model.path {model.get('path')!r} is not a local checkpoint folder"
        return (
            f"the weights come from the factory {target!r}, not from a safetensors checkpoint "
            "(give checkpoint:, or use the pretrained factory with a local folder)"
        )
    if not any(folder.glob(f"*{SAFETENSORS}")):
        return f"{folder} holds no {SAFETENSORS} file (a .bin checkpoint has no offsets to map)"
    try:
        config = json.loads((folder / CHECKPOINT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"cannot read {folder / CHECKPOINT_CONFIG}: {e}"
    if isinstance(config, dict) and config.get(QUANTIZATION_KEY):
        method = config[QUANTIZATION_KEY].get("quant_method", "?")
        return f"{folder} is a quantized checkpoint ({method}): its tensors are not the model's"
    return WeightsSource(folder, None, pretrained=True)


def refusal(weights: str, source: WeightsSource | str) -> str | None:
    """The line refusing ``weights: stream`` with no source; None otherwise (``load`` and
    ``auto`` load what cannot stream)."""
    if weights != WEIGHTS_STREAM or isinstance(source, WeightsSource):
        return None
    return f"{WEIGHTS_STREAM} needs a local safetensors checkpoint: {source}"
