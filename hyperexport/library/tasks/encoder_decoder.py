"""The encoder-decoder tasks in the trace and export stages (:class:`EncoderDecoderModel`, their
:class:`~hyperexport.library.tasks.task.TaskModel`): each graph's model and inputs.

:func:`graph_scope` turns the recipe's ``*ForConditionalGeneration`` into the module of one graph
(:class:`~hyperexport.library.tasks.steps.TextEncoderStep` or :class:`DecoderStep`, the latter with the
decoder layers swapped for ``Seq2SeqCacheLayer``, restored on exit) and the recipe slice into
explicit ``inputs`` (Optimum's names; batch, lengths and past length dynamic), ``hiera`` (the
encoder's layer class and ``CrossKV`` in the encoder graph, ``Seq2SeqKVStep`` in the decoder
graph) and ``dynamic: none``. The rest of each stage runs unchanged on the result, once per graph.

The decoder is traced with batch 2, 3 new tokens, a past of 3 and an encoder length of 5
(torch.export specialises sizes 0 and 1, so the first step's empty past is not traced); the
check's second shape is batch 3, 1 new token, a past of 6 and an encoder length of 7. The decode
then starts from a past of 0.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.input_specs import input_spec
from hyperexport.base.contracts.names import AUTO, SEQ2SEQ_GRAPHS, SPEECH_RECOGNITION
from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.kv import KINDS, kv_input, past_name
from hyperexport.library.tasks.task import Scoped

#: The graphs, in the order they run.
ENCODER, DECODER = SEQ2SEQ_GRAPHS
#: Import paths of the units that become functions: each decoder layer's step (past and cross
#: KV explicit) and each decoder layer's cross-KV projection in the encoder graph.
KV_STEP = "hyperexport.transformers.seq2seq_layers.Seq2SeqKVStep"
CROSS_KV = "hyperexport.transformers.seq2seq_layers.CrossKV"

log = logging.getLogger(__name__)

#: (batch, new tokens, past length, encoder length) of the traced step and of the second shape.
TRACED = (2, 3, 3, 5)
PROBE = (3, 1, 6, 7)


def require_seq2seq(model: Any, task: str, recipe_file: str) -> dict[str, Any]:
    """The model's config as data; a RecipeError (field ``model``) if the task does not fit it."""
    from transformers.models.auto import modeling_auto

    mapping = (
        modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES
        if task == SPEECH_RECOGNITION
        else modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    )
    name = type(model).__name__
    config = getattr(model, "config", None)
    if name not in set(mapping.values()) or config is None:
        known = (
            "AutoModelForSpeechSeq2Seq" if task == SPEECH_RECOGNITION else "AutoModelForSeq2SeqLM"
        )
        raise RecipeError(
            recipe_file,
            "model",
            f"task {task} needs an encoder-decoder *ForConditionalGeneration model, got {name} "
            f"(a checkpoint loads one with model.auto_class: {known})",
        )
    data: dict[str, Any] = config.to_dict()
    return data


def kv_shape(model: Any) -> tuple[int, int, int, str]:
    """``(decoder layers, heads, head size, dtype)`` of the cross-attention KV, as computed."""
    import torch

    from hyperexport.library.tasks.steps import _cross_modules

    cross = _cross_modules(model)
    parameter = next(model.parameters())
    probe = torch.zeros((1, 2, int(model.config.d_model)), dtype=parameter.dtype)
    with torch.no_grad():
        key, _ = cross[0](probe)
    return len(cross), int(key.shape[1]), int(key.shape[3]), str(key.dtype).removeprefix("torch.")


def encoder_inputs(config: Mapping[str, Any], task: str) -> dict[str, dict[str, Any]]:
    """The encoder graph's input specs."""
    batch, _, _, length = TRACED
    pbatch, _, _, plength = PROBE
    if task == SPEECH_RECOGNITION:
        bins, frames = int(config["num_mel_bins"]), 2 * int(config["max_source_positions"])
        return {
            "input_features": input_spec(
                [batch, bins, frames], [pbatch, bins, frames], "float32", -1.0, 1.0, 0, {0: "batch"}
            )
        }
    vocab = int(config["vocab_size"])
    axes = {0: "batch", 1: "encoder_sequence_length"}
    return {
        "input_ids": input_spec([batch, length], [pbatch, plength], "int64", 0, vocab, 0, axes),
        "attention_mask": input_spec([batch, length], [pbatch, plength], "int64", 1, 2, 0, axes),
    }


def decoder_inputs(config: Mapping[str, Any], model: Any, task: str) -> dict[str, dict[str, Any]]:
    """The decoder graph's input specs (self KV of the past, cross KV of the encoder)."""
    layers, heads, head_size, dtype = kv_shape(model)
    batch, new, past, length = TRACED
    pbatch, pnew, ppast, plength = PROBE
    vocab = int(config["vocab_size"])
    specs = {
        "input_ids": input_spec(
            [batch, new], [pbatch, pnew], "int64", 0, vocab, 0, {0: "batch", 1: "sequence_length"}
        )
    }
    if task != SPEECH_RECOGNITION:
        specs["encoder_attention_mask"] = input_spec(
            [batch, length],
            [pbatch, plength],
            "int64",
            1,
            2,
            0,
            {0: "batch", 1: "encoder_sequence_length"},
        )
    if task == SPEECH_RECOGNITION:  # the encoder's length is fixed by the features' frames
        length = plength = int(config["max_source_positions"])
    for layer in range(layers):
        for n, kind in enumerate(KINDS):
            specs[past_name(layer, kind, DECODER)] = kv_input(
                (batch, heads, past, head_size),
                (pbatch, ppast),
                dtype,
                1 + 4 * layer + n,
                {0: "batch", 2: "past_sequence_length"},
            )
            cross_axes = (
                {0: "batch"}
                if task == SPEECH_RECOGNITION
                else {
                    0: "batch",
                    2: "encoder_sequence_length",
                }
            )
            specs[past_name(layer, kind, ENCODER)] = kv_input(
                (batch, heads, length, head_size),
                (pbatch, plength),
                dtype,
                3 + 4 * layer + n,
                cross_axes,
            )
    return specs


def _class_path(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def graph_hiera(model: Any, graph: str) -> list[str]:
    """The graph's function classes: the encoder's layer class(es) and ``CrossKV``, or the step."""
    from hyperexport.library.transformers.seq2seq_layers import stack_layers

    if graph == DECODER:
        return [KV_STEP]
    layers = stack_layers(model.get_encoder())
    return [*dict.fromkeys(_class_path(layer) for layer in layers), CROSS_KV]


def graph_params(
    params: Mapping[str, Any], model: Any, graph: str, recipe_file: str
) -> dict[str, Any]:
    """The recipe slice of one graph: explicit inputs and hiera, ``dynamic: none``."""
    task = str(params["task"])
    config = require_seq2seq(model, task, recipe_file)
    out = dict(params)
    if "hiera" in params:
        if params["hiera"] != AUTO:
            raise RecipeError(
                recipe_file,
                "hiera",
                f"task {task} makes the encoder and decoder layers functions itself: "
                "set hiera: auto",
            )
        out["hiera"] = graph_hiera(model, graph)
    if "inputs" in params:
        if params["inputs"] != AUTO:
            log.info("task %s: the graphs' inputs replace the recipe's inputs", task)
        out["inputs"] = (
            encoder_inputs(config, task)
            if graph == ENCODER
            else decoder_inputs(config, model, task)
        )
    if "dynamic" in params:
        out["dynamic"] = "none"
    return out


@contextlib.contextmanager
def graph_scope(
    model: Any, params: Mapping[str, Any], recipe_file: str, graph: str
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(graph module, graph params)`` for the duration of the block; layers are put back."""
    from hyperexport.library.tasks.steps import DecoderStep, SpeechEncoderStep, TextEncoderStep
    from hyperexport.library.transformers.seq2seq_layers import explicit_seq2seq_layers

    task = str(params["task"])
    graph_slice = graph_params(params, model, graph, recipe_file)
    if graph == ENCODER:
        encoder = SpeechEncoderStep if task == SPEECH_RECOGNITION else TextEncoderStep
        yield encoder(model).eval(), graph_slice
        return
    step = DecoderStep(model, encoder_mask=task != SPEECH_RECOGNITION).eval()
    with explicit_seq2seq_layers(model):
        yield step, graph_slice


def reference_prompts(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[Any]:
    """The encoder inputs the reference decodes: each ``generation.prompts`` entry (text), or
    seeded random features per prompt (speech: the prompt's first id is the seed)."""
    import numpy as np

    prompts = [list(map(int, p)) for p in params["generation"]["prompts"]]
    if str(params["task"]) == SPEECH_RECOGNITION:
        bins, frames = int(config["num_mel_bins"]), 2 * int(config["max_source_positions"])
        return [
            {
                "input_features": np.random.default_rng(p[0])
                .uniform(-1.0, 1.0, size=(1, bins, frames))
                .astype(np.float32)
            }
            for p in prompts
        ]
    return [
        {
            "input_ids": np.asarray([p], dtype=np.int64),
            "attention_mask": np.ones((1, len(p)), dtype=np.int64),
        }
        for p in prompts
    ]


class EncoderDecoderModel:
    """The encoder-decoder tasks' :class:`~hyperexport.library.tasks.task.TaskModel`: an encoder and a
    decoder graph, judged by a greedy decode through both in ONNX Runtime."""

    def record(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, out_dir: Path
    ) -> None:
        """The trace's first step: transformers' greedy decode of the recipe's prompts."""
        from hyperexport.library.tasks.reference import record_encoder_decoder

        config = require_seq2seq(model, str(params["task"]), recipe_file)
        vocab = int(config["vocab_size"])
        for i, prompt in enumerate(params["generation"]["prompts"]):
            if any(t >= vocab for t in prompt):
                raise RecipeError(
                    recipe_file,
                    f"generation.prompts[{i}]",
                    f"token ids must be < vocab_size {vocab}",
                )
        prompts = reference_prompts(params, config)
        record_encoder_decoder(model, prompts, int(params["generation"]["max_new_tokens"]), out_dir)

    def scope(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, graph: str
    ) -> contextlib.AbstractContextManager[Scoped]:
        """The module and slice of ``graph`` (:func:`graph_scope`)."""
        return graph_scope(model, params, recipe_file, graph)
