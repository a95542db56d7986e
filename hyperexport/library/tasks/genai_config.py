"""``genai_config.json`` for onnxruntime-genai, built from a checkpoint's config as data: the
trace writes it beside the model (with the checkpoint's tokenizer files), and the check builds
it again to judge the published one.

No torch and no onnxruntime-genai: the config is a mapping (``config.json`` or
``PretrainedConfig.to_dict()``), and the result is JSON. The decoder's input and output names
are the ones :class:`~hyperexport.library.tasks.steps.CausalLMStep` exports, which are those of
onnxruntime-genai's own model builder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import MODEL_FILE, QUANTIZED_MODEL_FILE, TOKENIZER_FILES
from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.registry import GENAI_CONFIG, GENERATION_REFERENCE_JSON

log = logging.getLogger(__name__)

#: transformers ``model_type`` -> onnxruntime-genai ``model.type``, for the decoder-only types
#: onnxruntime-genai runs with the layout exported here (tried with 0.18.0: llama, mistral,
#: qwen2, qwen3, phi3, gemma2). Any other type is refused (exit 2, naming it).
GENAI_MODEL_TYPES: Mapping[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
}


#: Not a checkpoint key: set (True) in the config handed to :func:`build_genai_config` when the
#: model's pasts are onnxruntime-genai's shared buffers (``rewrite.fuse: onnxruntime``,
#: ``passes/share_kv_buffer.py``); absent otherwise, so nothing else changes.
SHARE_BUFFER = "past_present_share_buffer"


#: Every key of a checkpoint's config that :func:`build_genai_config` reads: the trace records
#: them beside the reference decode (:func:`genai_source`), and the check builds
#: ``genai_config.json`` again from them to judge the published one.
GENAI_SOURCE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    SHARE_BUFFER,
)


def genai_source(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``config`` that ``genai_config.json`` is built from (as data, JSON-ready)."""
    return {key: config[key] for key in GENAI_SOURCE_KEYS if key in config}


def genai_model_type(config: Mapping[str, Any], recipe_file: str = "") -> str:
    """onnxruntime-genai's ``model.type`` for a checkpoint config; a RecipeError for others."""
    model_type = str(config.get("model_type") or "")
    if model_type not in GENAI_MODEL_TYPES:
        raise RecipeError(
            recipe_file,
            "task",
            f"text-generation: onnxruntime-genai has no model type for {model_type!r} "
            f"(known: {', '.join(sorted(GENAI_MODEL_TYPES))})",
        )
    return GENAI_MODEL_TYPES[model_type]


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _ids(value: Any) -> int | list[int] | None:
    if isinstance(value, list):
        return [int(v) for v in value] if len(value) > 1 else _first_id(value)
    return None if value is None else int(value)


def context_length(config: Mapping[str, Any]) -> int:
    """The longest sequence the checkpoint takes (``max_position_embeddings``)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if config.get(key):
            return int(config[key])
    raise ValueError("the config names no context length (max_position_embeddings)")


def kv_shape(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(layers, kv heads, head size)`` of a decoder config."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_size = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return int(config["num_hidden_layers"]), kv_heads, head_size


def build_genai_config(
    config: Mapping[str, Any],
    *,
    model_file: str,
    max_length: int | None = None,
    recipe_file: str = "",
) -> dict[str, Any]:
    """The ``genai_config.json`` of a model exported with :class:`CausalLMStep`'s names.

    Args:
        config: The checkpoint's config as data (``model_type``, heads, layers, token ids).
        model_file: The ONNX file name in the output folder.
        max_length: The search default ``max_length`` (default: the context length).
        recipe_file: For messages.

    Raises:
        RecipeError: The model type is not one onnxruntime-genai runs (field ``task``).
    """
    model_type = genai_model_type(config, recipe_file)
    layers, kv_heads, head_size = kv_shape(config)
    context = context_length(config)
    eos = _ids(config.get("eos_token_id"))
    bos = _first_id(config.get("bos_token_id"))
    pad = _first_id(config.get("pad_token_id"))
    if pad is None:
        pad = _first_id(config.get("eos_token_id")) or 0
    model: dict[str, Any] = {
        "type": model_type,
        "context_length": context,
        "vocab_size": int(config["vocab_size"]),
        "pad_token_id": pad,
        "decoder": {
            "filename": model_file,
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "head_size": head_size,
            "hidden_size": int(config["hidden_size"]),
            "num_attention_heads": int(config["num_attention_heads"]),
            "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers,
            "inputs": {
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "position_ids": "position_ids",
                "past_key_names": "past_key_values.%d.key",
                "past_value_names": "past_key_values.%d.value",
            },
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value",
            },
        },
    }
    if eos is not None:
        model["eos_token_id"] = eos
    if bos is not None:
        model["bos_token_id"] = bos
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": int(max_length or context),
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        # One buffer per past and present, max_length long, written in place.
        "past_present_share_buffer": bool(config.get(SHARE_BUFFER, False)),
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    return {"model": model, "search": search}


def write_genai_files(
    config: Mapping[str, Any],
    model_params: Mapping[str, Any],
    out_dir: Path,
    recipe_file: str = "",
) -> list[str]:
    """Write ``genai_config.json`` and copy the checkpoint's tokenizer files; return their names.

    The tokenizer files are copied from ``model.path`` when it is a local directory that has
    them (they are in the build key already: the model fingerprint hashes the files under
    ``model.path``, and the trace's outputs are stored by digest).
    """
    # From the recorded keys only: the check builds it again from the same record.
    genai = build_genai_config(genai_source(config), model_file=MODEL_FILE, recipe_file=recipe_file)
    text = json.dumps(genai, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENAI_CONFIG, text.encode("utf-8"))
    written = [GENAI_CONFIG]
    path = model_params.get("path")
    if isinstance(path, str) and Path(path).expanduser().is_dir():
        source = Path(path).expanduser()
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                atomic_write_bytes(out_dir / name, (source / name).read_bytes())
                written.append(name)
    log.info("onnxruntime-genai files: %s", written)
    return written


def _recorded_source(trace_dir: Path) -> dict[str, Any] | None:
    """The model config keys the trace recorded beside the reference decode (None: none)."""
    reference = json.loads((trace_dir / GENERATION_REFERENCE_JSON).read_text(encoding="utf-8"))
    source = reference.get("config")
    return source if isinstance(source, dict) else None


def recorded_context_length(trace_dir: Path) -> int:
    """The context length of the model config the trace recorded for ``task: text-generation``
    (read as data); 0 when the trace recorded none (another task)."""
    if not (trace_dir / GENERATION_REFERENCE_JSON).is_file():
        return 0
    source = _recorded_source(trace_dir)
    return context_length(source) if source is not None else 0


def write_quantized_genai_config(trace_dir: Path, out_dir: Path) -> None:
    """The quantize stage's ``genai_config.json``: the trace's, built from the same recorded
    model config, naming ``model.quantized.onnx``. Published in place of the trace's, so that
    onnxruntime-genai runs the quantized model of the folder (the float ``model.onnx`` stays
    beside it: ``og.Config.overlay`` of ``decoder.filename`` runs it)."""
    source = _recorded_source(trace_dir)
    if source is None:
        raise ValueError(f"{GENERATION_REFERENCE_JSON} records no model config")
    genai = build_genai_config(source, model_file=QUANTIZED_MODEL_FILE)
    text = json.dumps(genai, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENAI_CONFIG, text.encode("utf-8"))


#: Differences named before the rest are counted.
_MAX_NAMED = 3


def genai_config_problems(trace_dir: Path, quantize_dir: Path | None = None) -> list[str]:
    """What differs between the published ``genai_config.json`` and the one its reference's
    model config gives (empty: they are equal), one line per field. Published is the quantize
    stage's (naming ``model.quantized.onnx``) when ``quantize_dir`` holds one, else the trace's.

    The published file is what onnxruntime-genai reads beside the model: the decode in the
    evaluate stage ran with it, but a field the decode does not reach (``context_length``
    longer than the prompts, a search default) would pass that unseen. So it is also built
    again from the model config the reference decode was made with
    (``generation_reference.json``'s ``config``, the keys :func:`build_genai_config` reads) and
    must equal it.
    """
    source = _recorded_source(trace_dir)
    if source is None:
        return [
            f"{GENERATION_REFERENCE_JSON} records no model config to judge {GENAI_CONFIG} against"
        ]
    folder, model_file = trace_dir, MODEL_FILE
    if quantize_dir is not None and (quantize_dir / GENAI_CONFIG).is_file():
        folder, model_file = quantize_dir, QUANTIZED_MODEL_FILE
    expected = build_genai_config(source, model_file=model_file)
    published = json.loads((folder / GENAI_CONFIG).read_text(encoding="utf-8"))
    found = [
        f"{GENAI_CONFIG}: {path} is {_show(have)}, the model's config gives {_show(want)}"
        for path, have, want in _differences(published, expected)
    ]
    if len(found) > _MAX_NAMED:
        found = [*found[:_MAX_NAMED], f"{GENAI_CONFIG}: +{len(found) - _MAX_NAMED} more fields"]
    return found


_ABSENT = object()


def _differences(have: Any, want: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(dotted path, have, want)`` of every leaf that differs; absent is :data:`_ABSENT`."""
    if isinstance(have, dict) and isinstance(want, dict):
        for key in sorted(set(have) | set(want)):
            yield from _differences(
                have.get(key, _ABSENT), want.get(key, _ABSENT), f"{path}.{key}" if path else key
            )
    elif have != want or type(have) is not type(want):
        yield path or "the file", have, want


def _show(value: Any) -> str:
    return "absent" if value is _ABSENT else json.dumps(value)
