"""``task: auto``: the task a transformers checkpoint is exported for, read from its
``config.json`` (data only: no torch, no transformers import, nothing it names is imported).

Like Optimum's task inference, from the checkpoint's declared architecture:

* ``*ForCausalLM`` / ``*LMHeadModel`` that is not an encoder-decoder: ``text-generation``;
* an encoder-decoder (``is_encoder_decoder``) whose encoder reads audio features
  (``num_mel_bins``, or an architecture named ``*SpeechSeq2Seq*``): ``automatic-speech-recognition``;
* another encoder-decoder with a generation head (``*ForConditionalGeneration``, ``*MTModel``):
  ``text2text-generation``;
* anything else (a base model, a classifier, a vision backbone): ``forward``.

The resolved task replaces ``auto`` in the validated recipe, so the keys hold what is built;
the checkpoint's files are keyed with the model anyway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import (
    CHECKPOINT_CONFIG,
    FORWARD,
    SPEECH_RECOGNITION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)

#: The factory whose ``path`` argument names a checkpoint folder (``library/models/pretrained.py``).
PRETRAINED_FACTORY = "hyperexport.models.pretrained"

_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_SEQ2SEQ_SUFFIXES = ("ForConditionalGeneration", "MTModel", "ForSpeechSeq2Seq")


class TaskNotInferable(ValueError):
    """``task: auto`` met no checkpoint config to infer from; the message says what to set."""


def checkpoint_folder(model: Mapping[str, Any], recipe_file: str) -> Path | None:
    """The local checkpoint folder ``model.path`` names, if the model is the pretrained factory.

    A relative path is tried as given (the working directory), then beside the recipe file.
    """
    if model.get("_target_") != PRETRAINED_FACTORY or not isinstance(model.get("path"), str):
        return None
    path = Path(model["path"]).expanduser()
    for where in (path, Path(recipe_file).resolve().parent / path):
        if (where / CHECKPOINT_CONFIG).is_file():
            return where
    return None


def task_of(config: Mapping[str, Any]) -> str:
    """The task of a checkpoint whose ``config.json`` is ``config`` (see the module)."""
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    encoder_decoder = bool(config.get("is_encoder_decoder"))
    for arch in architectures:
        if encoder_decoder and arch.endswith(_SEQ2SEQ_SUFFIXES):
            speech = "num_mel_bins" in config or "SpeechSeq2Seq" in arch
            return SPEECH_RECOGNITION if speech else TEXT2TEXT_GENERATION
        if not encoder_decoder and arch.endswith(_CAUSAL_SUFFIXES):
            return TEXT_GENERATION
    return FORWARD


def infer_task(model: Mapping[str, Any], recipe_file: str) -> str:
    """The task of the recipe's checkpoint (``model.path`` of the pretrained factory).

    Raises:
        TaskNotInferable: The model is not a local transformers checkpoint, or its
            ``config.json`` is not JSON.
    """
    folder = checkpoint_folder(model, recipe_file)
    if folder is None:
        raise TaskNotInferable(
            f"auto needs a local transformers checkpoint (model._target_: {PRETRAINED_FACTORY} "
            "with model.path a folder holding config.json); set task explicitly"
        )
    try:
        config = json.loads((folder / CHECKPOINT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TaskNotInferable(f"cannot read {folder / CHECKPOINT_CONFIG}: {e}") from e
    if not isinstance(config, dict):
        raise TaskNotInferable(f"{folder / CHECKPOINT_CONFIG} is not a JSON object")
    return task_of(config)
