"""``weights``: whether the recipe's model is loaded whole or streamed from its checkpoint, and
the streamed model's loader (``docs/streaming.md``; torch imported inside the functions).

A streamed model is a *skeleton*: the module tree with every parameter on the meta device,
the mapped checkpoint attached (``library/capture/streaming.py`` ``attach_checkpoint``). It costs
seconds and no weight bytes to build; the stages that run it bind the weights one hiera module
at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import AUTO, WEIGHTS_LOAD, WEIGHTS_STREAM
from hyperexport.base.contracts.weight_index import WeightIndex, read_weight_index
from hyperexport.base.errors import CorruptRecordError, RecipeError
from hyperexport.library.export_budget import BASELINE_BYTES, EXPORT_OVERHEAD, streaming_need
from hyperexport.library.meminfo import available_memory
from hyperexport.product.config.weights_source import WeightsSource, refusal, weights_source

log = logging.getLogger(__name__)


def streaming_source(
    weights: str,
    model: Mapping[str, Any],
    checkpoint: Path | None,
    recipe_file: str,
    task: str,
    available: int | None = None,
    *,
    fallback: bool = False,
) -> tuple[WeightsSource, WeightIndex] | None:
    """The source to stream from, or None to load the model whole.

    ``stream`` streams (validation refused what cannot); ``load`` loads; ``auto`` streams when
    the checkpoint's bytes, with the export's overhead, exceed the available memory (unknown
    memory: load). A build that streams is refused before anything runs when even streaming
    cannot fit (:func:`~hyperexport.library.export_budget.streaming_need`).

    Raises:
        RecipeError: ``weights`` names a checkpoint whose headers are malformed, or a streamed
            build that needs more memory than is available.
    """
    if weights == WEIGHTS_LOAD:
        return None
    source = weights_source(model, checkpoint, recipe_file, task, fallback)
    refused = refusal(weights, source)
    if refused is not None:
        raise RecipeError(recipe_file, "weights", refused)
    if not isinstance(source, WeightsSource):
        log.debug("weights: %s loads the model (%s)", AUTO, source)
        return None
    try:
        index = read_weight_index(source.folder, files=source.files)
    except CorruptRecordError as e:
        raise RecipeError(recipe_file, "weights", str(e)) from e
    free = available_memory() if available is None else available
    if weights != WEIGHTS_STREAM:
        need = int(index.nbytes() * (1 + EXPORT_OVERHEAD)) + BASELINE_BYTES
        stream = free is not None and need > free
        log.info(
            "weights: %s %s (loading needs about %.1f GiB, %s available)",
            AUTO,
            WEIGHTS_STREAM if stream else WEIGHTS_LOAD,
            need / 2**30,
            "unknown" if free is None else f"{free / 2**30:.1f} GiB",
        )
        if not stream:
            return None
    streamed = streaming_need(index, model.get("dtype"))
    log.info(
        "weights: %s needs about %.1f GiB (largest layer %s)",
        WEIGHTS_STREAM,
        streamed.total / 2**30,
        streamed.block,
    )
    if free is not None and streamed.total > free:
        raise RecipeError(recipe_file, "weights", streamed.refusal(free))
    return source, index


def load_streamed(
    source: WeightsSource, index: WeightIndex, model_cfg: Mapping[str, Any], recipe_file: str
) -> Any:
    """The skeleton of the recipe's model with its mapped checkpoint attached.

    Raises:
        RecipeError: ``weights``, naming the tensor, when the checkpoint and the model differ
            (a tensor missing, extra or of another shape); or the model's own refusals.
    """
    from hyperexport.library.capture.streaming import (
        MappedCheckpoint,
        StreamedWeights,
        StreamingError,
        attach_checkpoint,
        parameters_on_meta,
    )
    from hyperexport.product.from_recipe.instantiate import instantiate_model

    if source.pretrained:
        from hyperexport.library.models.pretrained import pretrained_skeleton

        arguments = {k: v for k, v in model_cfg.items() if not k.startswith("_")}
        try:
            model = pretrained_skeleton(**arguments)
        except RecipeError as e:
            raise RecipeError(recipe_file, e.field, e.reason) from e
    else:
        with parameters_on_meta():
            model = instantiate_model(model_cfg, recipe_file)
    checkpoint = MappedCheckpoint(source.folder, index)
    try:
        StreamedWeights(model, checkpoint, ())  # refuses a checkpoint that is not the model's
    except StreamingError as e:
        raise RecipeError(recipe_file, "weights", str(e)) from e
    attach_checkpoint(model, checkpoint)
    log.info(
        "weights: %s from %s (%d tensors, %.2f GiB mapped, none loaded)",
        WEIGHTS_STREAM,
        source.folder,
        len(index.tensors),
        index.nbytes() / 2**30,
    )
    return model.eval()
