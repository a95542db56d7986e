"""``task: text-generation`` in the trace and export stages (:class:`CausalLMModel`, the task's
:class:`~hyperexport.library.tasks.task.TaskModel`): the step model and its inputs.

:func:`generation_task` turns the recipe's ``*ForCausalLM`` into
:class:`~hyperexport.library.tasks.steps.CausalLMStep` with its
decoder layers swapped for :class:`~hyperexport.library.transformers.kv_layers.KVCacheLayer` (restored
on exit), and the recipe slice into explicit ``inputs`` (onnxruntime-genai's names, batch,
sequence, total and past length dynamic), ``hiera`` (``KVStep``, plus any explicit classes, which
nest inside it) and ``dynamic: none``. The rest of each stage runs unchanged on the result.

The traced step has batch 2, 4 new tokens and a past of 3 (torch.export specialises sizes 0 and
1, so the first step's empty past is not traced); the second shape the check compares at is
batch 3, 1 new token and a past of 5. The onnxruntime-genai decode then starts with a past of 0.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.input_specs import input_spec
from hyperexport.base.contracts.names import HYPEREXPORT_ATTENTION, ONNXRUNTIME_FUSION
from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.genai_config import SHARE_BUFFER, context_length, kv_shape
from hyperexport.library.tasks.kv import KINDS, kv_input, past_name
from hyperexport.library.tasks.task import Scoped

#: The import path of the unit that becomes one function per decoder-layer structure.
KV_STEP = "hyperexport.transformers.kv_layers.KVStep"

log = logging.getLogger(__name__)

#: (batch, new tokens, past length) of the traced step and of the check's second shape.
TRACED = (2, 4, 3)
PROBE = (3, 1, 5)


def require_causal_lm(model: Any, recipe_file: str) -> dict[str, Any]:
    """The model's config as data; a RecipeError (field ``model``) if it is not a causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = type(model).__name__
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    config = getattr(model, "config", None)
    if name not in causal or config is None:
        hint = " (a checkpoint loads one with model.auto_class: AutoModelForCausalLM)"
        raise RecipeError(
            recipe_file,
            "model",
            f"task text-generation needs a *ForCausalLM model, got {name}{hint}",
        )
    data: dict[str, Any] = config.to_dict()
    return data


def step_inputs(config: Mapping[str, Any], dtype: str) -> dict[str, dict[str, Any]]:
    """Input specs (the recipe's ``inputs`` shape) of the step model, named as genai names them.

    ``dtype`` is the past KV's: the model's floating dtype as loaded (the config may still say
    the checkpoint's).
    """
    layers, kv_heads, head_size = kv_shape(config)
    batch, new, past = TRACED
    pbatch, pnew, ppast = PROBE
    vocab = int(config["vocab_size"])

    specs = {
        "input_ids": input_spec(
            [batch, new], [pbatch, pnew], "int64", 0, vocab, 0, {0: "batch", 1: "sequence_length"}
        ),
        "attention_mask": input_spec(
            [batch, past + new],
            [pbatch, ppast + pnew],
            "int64",
            1,
            2,
            0,
            {0: "batch", 1: "total_sequence_length"},
        ),
        "position_ids": input_spec(
            [batch, new],
            [pbatch, pnew],
            "int64",
            0,
            past + new,
            0,
            {0: "batch", 1: "sequence_length"},
        ),
    }
    for layer in range(layers):
        for n, kind in enumerate(KINDS):
            specs[past_name(layer, kind)] = kv_input(
                (batch, kv_heads, past, head_size),
                (pbatch, ppast),
                dtype,
                1 + 2 * layer + n,
                {0: "batch", 2: "past_sequence_length"},
            )
    return specs


def check_prompts(params: Mapping[str, Any], config: Mapping[str, Any], recipe_file: str) -> None:
    """Each prompt plus the tokens to generate fits the context; ids are in the vocabulary."""
    g = params["generation"]
    context = context_length(config)
    vocab = int(config["vocab_size"])
    for i, prompt in enumerate(g["prompts"]):
        total = len(prompt) + int(g["max_new_tokens"])
        if total > context:
            raise RecipeError(
                recipe_file,
                f"generation.prompts[{i}]",
                f"{len(prompt)} tokens + generation.max_new_tokens {g['max_new_tokens']} = {total} "
                f"exceed the model's context length {context}",
            )
        if any(t >= vocab for t in prompt):
            raise RecipeError(
                recipe_file, f"generation.prompts[{i}]", f"token ids must be < vocab_size {vocab}"
            )


def step_params(params: Mapping[str, Any], config: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The recipe slice with explicit step inputs, ``KVStep`` hiera and ``dynamic: none``."""
    out = dict(params)
    if "inputs" in params:
        if params["inputs"] != "auto":
            log.info("task text-generation: the step model's inputs replace the recipe's inputs")
        out["inputs"] = step_inputs(config, dtype)
    if "hiera" in params:
        extra = [] if params["hiera"] == "auto" else [h for h in params["hiera"] if h != KV_STEP]
        out["hiera"] = [KV_STEP, *extra]
    if "dynamic" in params:
        out["dynamic"] = "none"
    return out


@contextlib.contextmanager
def generation_task(
    model: Any, params: Mapping[str, Any], recipe_file: str
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(step model, step params)`` for the duration of the block; the layers are put back."""
    from hyperexport.library.tasks.steps import CausalLMStep
    from hyperexport.library.transformers.kv_layers import explicit_kv_layers

    config = require_causal_lm(model, recipe_file)
    step = CausalLMStep(model).eval()
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    with explicit_kv_layers(model):
        yield step, step_params(params, config, dtype)


def shares_kv_buffer(params: Mapping[str, Any]) -> bool:
    """Whether the rewrite makes the step's pasts onnxruntime-genai's shared buffers, which the
    trace reads for ``genai_config.json``'s ``past_present_share_buffer``: with ``rewrite.fuse:
    onnxruntime`` and each attention call exported as one node (``attention.implementation:
    hyperexport``), which the fusion makes a GroupQueryAttention over the past and
    ``passes/share_kv_buffer.py`` gives the buffers (or the rewrite fails, saying why). Without
    such nodes the attention stays plain ops over concatenated pasts, not shared."""
    fused = (params.get("rewrite") or {}).get("fuse") == ONNXRUNTIME_FUSION
    nodes = (params.get("attention") or {}).get("implementation") == HYPEREXPORT_ATTENTION
    return bool(fused and nodes)


class CausalLMModel:
    """``task: text-generation``'s :class:`~hyperexport.library.tasks.task.TaskModel`: one graph, the
    step model, judged by a decode in onnxruntime-genai."""

    def record(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, out_dir: Path
    ) -> None:
        """The prompts checked against the model's context, ``genai_config.json`` and the
        tokenizer files written, and the reference decode, on the model as loaded."""
        from hyperexport.library.tasks.genai_config import write_genai_files
        from hyperexport.library.tasks.reference import record_causal_lm

        config = require_causal_lm(model, recipe_file)
        check_prompts(params, config, recipe_file)
        if shares_kv_buffer(params):
            config = {**config, SHARE_BUFFER: True}
        write_genai_files(config, params["model"], out_dir, recipe_file)
        record_causal_lm(model, config, params["generation"], out_dir)

    @contextlib.contextmanager
    def scope(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, graph: str
    ) -> Iterator[Scoped]:
        """The step model and the step params (:func:`generation_task`)."""
        with generation_task(model, params, recipe_file) as scoped:
            yield scoped
