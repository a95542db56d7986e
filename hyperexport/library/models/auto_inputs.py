"""``inputs: auto``: every example input a transformers model's forward needs, from its config.

The main input (``main_input_name``) comes first: token ids within the vocabulary (plus an
all-ones ``attention_mask``) for text, ``pixel_values`` at the configured image size for vision,
``input_values`` (raw samples) for wav2vec2-style speech, ``input_features`` at the fixed length
Whisper's encoder requires. Then the inputs the forward needs beside it:

* ``decoder_input_ids`` for an encoder-decoder (``config.is_encoder_decoder``: T5, BART,
  Whisper, Marian), with their own dynamic ``decoder_sequence``;
* ``pixel_values`` for a two-tower model whose forward takes both modalities (CLIP, SigLIP),
  sized from its ``vision_config``;
* for a LLaVA-style vision-language model (an ``image_token_id`` and a vision tower): the
  image plus ``input_ids`` made of exactly as many image tokens as the vision tower yields
  features, so both the vision tower and the text model run (the sequence stays static: the
  count of image tokens must match the image).

What cannot be made from the config (Qwen2-VL's ``image_grid_thw``, an unknown main input) is
refused with one line naming the model class and the input to set in the recipe; so is a model
whose forward still fails on the inputs made (see :func:`dry_run`), instead of a transformers
error from inside the trace. ``dynamic: auto`` makes batch and sequence (audio: samples) dynamic;
image sizes stay static. Traced sizes are at least 2 so that torch.export does not specialise
them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from hyperexport.base.contracts.input_specs import input_spec
from hyperexport.base.errors import RecipeError

log = logging.getLogger(__name__)

#: Traced sizes (>= 2, so that the dynamo path keeps them symbolic) and the second (check) sizes.
BATCH, CHECK_BATCH = 2, 3
SEQUENCE, CHECK_SEQUENCE = 16, 9
DECODER_SEQUENCE, CHECK_DECODER_SEQUENCE = 8, 5
AUDIO_SAMPLES, CHECK_AUDIO_SAMPLES = 4000, 3200
DEFAULT_IMAGE_SIZE = 224

#: Forward inputs ``auto`` cannot make from a config, and what they are: the recipe must set them.
NOT_DERIVABLE = {
    "image_grid_thw": (
        "the (t, h, w) patch grid of each image, which pixel_values (as patches) and the image "
        "tokens in input_ids must follow",
        ("input_ids", "pixel_values", "image_grid_thw"),
    ),
}

#: Forward parameters that are not example inputs (caches, flags, labels, alternatives to ids).
_NOT_INPUTS = {
    "self",
    "kwargs",
    "args",
    "labels",
    "return_loss",
    "return_dict",
    "use_cache",
    "cache",
    "past_key_values",
    "encoder_outputs",
    "output_attentions",
    "output_hidden_states",
    "interpolate_pos_encoding",
    "logits_to_keep",
    "vision_feature_layer",
    "vision_feature_select_strategy",
    "cache_position",
}


def auto_inputs(model: Any, *, dynamic: bool) -> tuple[dict[str, dict[str, Any]], str]:
    """Example input specs (recipe ``inputs`` form) for every input ``model``'s forward needs.

    Args:
        model: A transformers model (``config`` and ``main_input_name``).
        dynamic: Whether ``dynamic: auto`` is set (batch and sequence axes symbolic).

    Returns:
        The specs and one line saying where each came from.

    Raises:
        RecipeError: ``inputs``: naming the model class and the input to set in the recipe.
    """
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    name = type(model).__name__
    if config is None or main is None:
        raise RecipeError(
            "",
            "inputs",
            f"auto needs a transformers model (config and main_input_name); {name} has "
            f"{'no config' if config is None else 'no main_input_name'}: set inputs in the recipe",
        )
    params = forward_parameters(model)
    missing = sorted(p for p in NOT_DERIVABLE if p in params)
    if missing:
        what, together = NOT_DERIVABLE[missing[0]]
        raise RecipeError(
            "",
            "inputs",
            f"auto cannot make {missing[0]} for {name} ({what}): set inputs in the recipe "
            f"({', '.join(together)})",
        )
    maker = _MAIN.get(main)
    if maker is None:
        raise RecipeError(
            "",
            "inputs",
            f"auto cannot make {name}'s main input {main!r}: set inputs.{main} in the recipe",
        )
    specs, reasons = maker(model, config, dynamic)
    if main != "pixel_values" and "pixel_values" in params and _has_vision(config):
        image, image_reasons = _pixel_values(model, config, dynamic)
        specs.update(image)
        reasons += image_reasons
        token = _image_token(config)
        if token is not None and "input_ids" in specs:
            specs["input_ids"], tokens = _image_tokens(config, token, specs["input_ids"], dynamic)
            if "attention_mask" in specs:
                specs["attention_mask"] = {**specs["input_ids"], "low": 1, "high": 2}
            reasons.append(tokens)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        decoder, decoder_reasons = _decoder_input_ids(config, dynamic)
        specs.update(decoder)
        reasons += decoder_reasons
    reason = "; ".join(reasons)
    if dynamic:
        axes = sorted({d for s in specs.values() for d in s["dynamic"].values()})
        reason += "; dynamic: " + (", ".join(axes) if axes else "none")
    return specs, reason


def dry_run(model: Any, specs: Mapping[str, Mapping[str, Any]], method: str = "forward") -> None:
    """Run ``model`` once on ``specs``; a forward that fails on them is refused as a recipe error.

    The error names the model class, the inputs given, the first line of the model's own message
    and the forward's other inputs (one of which the recipe must set), so a missing input never
    surfaces as a transformers error from inside the trace.

    Raises:
        RecipeError: ``inputs``.
    """
    import torch

    from hyperexport.library.models.inputs import make_inputs

    try:
        with torch.no_grad():
            getattr(model, method)(**make_inputs(specs))
    except (ValueError, TypeError, RuntimeError, AttributeError, IndexError, KeyError) as e:
        raise forward_refused(model, specs, e) from e


def forward_refused(
    model: Any, specs: Mapping[str, Mapping[str, Any]], error: BaseException
) -> RecipeError:
    """The one-line ``inputs`` error for a forward that raised ``error`` on ``specs``."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    others = _candidates(forward_parameters(model), set(specs))
    hint = f"; set the input it needs in the recipe (it also takes {', '.join(others)})"
    return RecipeError(
        "",
        "inputs",
        f"{type(model).__name__}.forward fails on {sorted(specs)}: {type(error).__name__}: "
        f"{first}{hint if others else '; set inputs in the recipe'}",
    )


def forward_parameters(model: Any) -> set[str]:
    """The names of ``model.forward``'s parameters (empty when it has no signature)."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _candidates(params: set[str], given: set[str]) -> list[str]:
    return sorted(
        p for p in params - given - _NOT_INPUTS if not p.endswith(("_embeds", "_embeddings"))
    )


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------
def _spec(
    shape: list[int],
    dtype: str,
    low: float,
    high: float,
    dynamic: Mapping[int, str],
    check: list[int],
) -> dict[str, Any]:
    """A seed-0 inputs entry; ``check`` is its second shape, kept only with dynamic axes."""
    return input_spec(shape, check if dynamic else None, dtype, low, high, 0, dict(dynamic))


def _section(config: Any, kind: str) -> Any:
    """``config.<kind>_config`` of a composite (CLIP, LLaVA) config, else the config itself."""
    return getattr(config, f"{kind}_config", None) or config


def _config_value(config: Any, name: str, kind: str | None = None) -> Any:
    """``name`` from the ``kind`` section, the config itself, or a sub-config, in that order."""
    places = [_section(config, kind)] if kind else []
    places += [config] + [getattr(config, f"{k}_config", None) for k in ("text", "vision", "audio")]
    for place in places:
        value = getattr(place, name, None)
        if value is not None:
            return value
    raise RecipeError("", "inputs", f"auto needs config.{name}; {type(config).__name__} has none")


def _float_dtype(model: Any) -> str:
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return str(torch.get_default_dtype()).removeprefix("torch.")


_Made = tuple[dict[str, dict[str, Any]], list[str]]


def _input_ids(model: Any, config: Any, dynamic: bool) -> _Made:
    text = _section(config, "text")
    vocab = int(_config_value(config, "vocab_size", "text"))
    seq = min(SEQUENCE, int(getattr(text, "max_position_embeddings", None) or SEQUENCE))
    dims = {0: "batch", 1: "sequence"} if dynamic else {}
    check = [CHECK_BATCH, min(CHECK_SEQUENCE, seq - 1)]
    specs = {"input_ids": _spec([BATCH, seq], "int64", 0, vocab, dims, check)}
    reason = f"input_ids in [0, {vocab}) from {type(text).__name__}.vocab_size"
    if "attention_mask" in forward_parameters(model):
        specs["attention_mask"] = _spec([BATCH, seq], "int64", 1, 2, dims, check)
        reason += ", an all-ones attention_mask"
    return specs, [reason]


def _has_vision(config: Any) -> bool:
    vision = _section(config, "vision")
    return getattr(vision, "num_channels", None) is not None


def _pixel_values(model: Any, config: Any, dynamic: bool) -> _Made:
    vision = _section(config, "vision")
    cls = type(vision).__name__
    channels = int(_config_value(config, "num_channels", "vision"))
    size = getattr(vision, "image_size", None)
    if isinstance(size, (list, tuple)):
        size = int(size[0])
    if size is None:
        size = DEFAULT_IMAGE_SIZE
        log.warning("inputs: auto: %s has no image_size; using %d", cls, size)
    # The image size stays static: a strided model's inner sizes are derived from it (H/2,
    # H/4), and a function's dynamic dims can only equal dims of its inputs today.
    dims = {0: "batch"} if dynamic else {}
    shape = [BATCH, channels, int(size), int(size)]
    check = [CHECK_BATCH, channels, int(size), int(size)]
    specs = {"pixel_values": _spec(shape, _float_dtype(model), -1.0, 1.0, dims, check)}
    return specs, [f"pixel_values {channels}x{size}x{size} from {cls}.num_channels/image_size"]


def _input_values(model: Any, config: Any, dynamic: bool) -> _Made:
    dims = {0: "batch", 1: "samples"} if dynamic else {}
    check = [CHECK_BATCH, CHECK_AUDIO_SAMPLES]
    shape = [BATCH, AUDIO_SAMPLES]
    specs = {"input_values": _spec(shape, _float_dtype(model), -1.0, 1.0, dims, check)}
    return specs, [f"input_values of {AUDIO_SAMPLES} samples (raw audio, {type(config).__name__})"]


def _input_features(model: Any, config: Any, dynamic: bool) -> _Made:
    mels = int(_config_value(config, "num_mel_bins", "audio"))
    frames = 2 * int(_config_value(config, "max_source_positions", "audio"))
    dims = {0: "batch"} if dynamic else {}
    shape, check = [BATCH, mels, frames], [CHECK_BATCH, mels, frames]
    specs = {"input_features": _spec(shape, _float_dtype(model), -1.0, 1.0, dims, check)}
    return specs, [
        f"input_features {mels}x{frames} from {type(config).__name__}.num_mel_bins and "
        "2 x max_source_positions (the encoder requires this length: no dynamic sequence)"
    ]


_MAIN = {
    "input_ids": _input_ids,
    "pixel_values": _pixel_values,
    "input_values": _input_values,
    "input_features": _input_features,
}


def _decoder_input_ids(config: Any, dynamic: bool) -> _Made:
    vocab = getattr(config, "decoder_vocab_size", None) or _config_value(config, "vocab_size")
    longest = getattr(config, "max_target_positions", None) or getattr(
        config, "max_position_embeddings", None
    )
    seq = min(DECODER_SEQUENCE, int(longest or DECODER_SEQUENCE))
    dims = {0: "batch", 1: "decoder_sequence"} if dynamic else {}
    check = [CHECK_BATCH, min(CHECK_DECODER_SEQUENCE, seq - 1)]
    specs = {"decoder_input_ids": _spec([BATCH, seq], "int64", 0, int(vocab), dims, check)}
    return specs, [
        f"decoder_input_ids in [0, {vocab}) ({type(config).__name__} is an encoder-decoder)"
    ]


def _image_token(config: Any) -> int | None:
    for field in ("image_token_id", "image_token_index"):
        value = getattr(config, field, None)
        if isinstance(value, int):
            return value
    return None


def _image_tokens(
    config: Any, token: int, ids: Mapping[str, Any], dynamic: bool
) -> tuple[dict[str, Any], str]:
    """``input_ids`` of exactly as many image tokens as the vision tower yields features."""
    vision = _section(config, "vision")
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if not (isinstance(size, int) and isinstance(patch, int)):
        raise RecipeError(
            "",
            "inputs",
            f"auto cannot count the image tokens of {type(config).__name__} (no integer "
            "vision image_size/patch_size): set inputs.input_ids and inputs.pixel_values",
        )
    count = (size // patch) ** 2
    if getattr(config, "vision_feature_select_strategy", "default") == "full":
        count += 1
    dims = {0: "batch"} if dynamic else {}
    check = [CHECK_BATCH, count]
    spec = _spec([int(ids["shape"][0]), count], "int64", token, token + 1, dims, check)
    why = (
        f"input_ids: {count} image tokens ({token}), one per feature of the "
        f"{size}x{size} image in {patch}x{patch} patches (static sequence)"
    )
    return spec, why
