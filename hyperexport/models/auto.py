"""``hiera: auto`` and ``inputs: auto``: resolved on the live model, inside the trace and export stages.

Recipe validation never imports torch, so ``auto`` stays ``auto`` in the recipe (and in the stage
keys); :func:`resolve_auto` replaces it with explicit values right after a stage has loaded the
model, and records what it chose and why (``auto.json``, published beside the model).

* ``hiera: auto`` picks the model's main repeated stack: the classes of the members of
  ``nn.ModuleList`` s that actually run in forward, the class with the most calls winning.
  transformers' ``_no_split_modules`` is only a hint (it is not a list of repeated blocks: BERT
  declares none, ViT lists its embeddings, Whisper a decoder layer that never runs in its
  encoder): among running candidates, a hinted class wins, then the most calls, then the outer
  one.
* ``inputs: auto`` derives example inputs from the model's main input (``main_input_name``)
  and its config: token ids within the vocabulary plus an all-ones attention mask for text,
  ``pixel_values`` at the config's image size for vision, ``input_values`` for wav2vec2-style
  audio, ``input_features`` at the fixed length Whisper's encoder requires. ``dynamic: auto``
  makes batch and sequence (audio: samples) dynamic; image sizes stay static (see
  :func:`auto_inputs`). Traced sizes are at least 2 so that torch.export does not specialise
  them.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.contracts.names import AUTO as AUTO
from hyperexport.contracts.names import AUTO_FILE as AUTO_FILE
from hyperexport.errors import RecipeError

log = logging.getLogger(__name__)


#: Traced sizes (>= 2, so that the dynamo path keeps them symbolic) and the second (check) sizes.
BATCH, CHECK_BATCH = 2, 3
SEQUENCE, CHECK_SEQUENCE = 16, 9
AUDIO_SAMPLES, CHECK_AUDIO_SAMPLES = 4000, 3200
DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class AutoResolution:
    """What ``auto`` became, and why.

    Attributes:
        hiera: The classes chosen (qualified names), or None when the recipe named them.
        hiera_reason: Why those classes (calls, container, hint).
        inputs: The input specs made (recipe ``inputs`` form), or None when the recipe gave them.
        inputs_reason: Which config fields and main input they came from.
    """

    hiera: tuple[str, ...] | None
    hiera_reason: str
    inputs: Mapping[str, Mapping[str, Any]] | None
    inputs_reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "hiera": list(self.hiera) if self.hiera is not None else None,
            "hiera_reason": self.hiera_reason,
            "inputs": {k: dict(v) for k, v in self.inputs.items()} if self.inputs else None,
            "inputs_reason": self.inputs_reason,
        }


def is_auto(value: Any) -> bool:
    """Whether a recipe value is the string ``auto``."""
    return isinstance(value, str) and value == AUTO


def resolve_auto(
    params: Mapping[str, Any], model: Any, recipe_file: str, out_dir: Path | None = None
) -> dict[str, Any]:
    """``params`` with ``inputs: auto`` and ``hiera: auto`` replaced by explicit values.

    Args:
        params: A stage's recipe slice (``inputs``, ``hiera``, optionally ``dynamic``/``method``).
        model: The live model.
        recipe_file: For error messages.
        out_dir: Where to write ``auto.json`` (the resolution), if anything was ``auto``.

    Raises:
        RecipeError: Naming ``inputs`` or ``hiera`` and what was found.
    """
    out = dict(params)
    want_inputs, want_hiera = is_auto(params.get("inputs")), is_auto(params.get("hiera"))
    if not (want_inputs or want_hiera):
        return out
    dynamic = is_auto(params.get("dynamic"))
    try:
        inputs, in_reason = (
            auto_inputs(model, dynamic=dynamic) if want_inputs else (None, "given by the recipe")
        )
        if inputs is not None:
            out["inputs"] = inputs
        classes, hiera_reason = (
            auto_hiera(model, out["inputs"], str(params.get("method") or "forward"))
            if want_hiera
            else (None, "given by the recipe")
        )
    except RecipeError as e:
        raise RecipeError(recipe_file, e.field, e.reason) from e
    if classes is not None:
        out["hiera"] = list(classes)
    resolution = AutoResolution(classes, hiera_reason, inputs, in_reason)
    for line in (f"hiera: {hiera_reason}", f"inputs: {in_reason}"):
        log.info("auto %s", line)
    if out_dir is not None:
        from hyperexport.atomic import atomic_write_text

        text = json.dumps(resolution.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_text(out_dir / AUTO_FILE, text)
    return out


# --------------------------------------------------------------------------------------------
# inputs: auto
# --------------------------------------------------------------------------------------------
def _config_value(config: Any, name: str, field: str = "inputs") -> Any:
    value = getattr(config, name, None)
    if value is None:
        for sub in ("text_config", "vision_config", "audio_config"):
            value = getattr(getattr(config, sub, None), name, None)
            if value is not None:
                break
    if value is None:
        raise RecipeError("", field, f"auto needs config.{name}; {type(config).__name__} has none")
    return value


def _float_dtype(model: Any) -> str:
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return str(torch.get_default_dtype()).removeprefix("torch.")


def _spec(
    shape: list[int],
    dtype: str,
    low: float,
    high: float,
    dynamic: Mapping[int, str],
    check: list[int],
) -> dict[str, Any]:
    return {
        "shape": shape,
        "dtype": dtype,
        "low": low,
        "high": high,
        "seed": 0,
        "dynamic": dict(dynamic),
        "check_shape": check if dynamic else None,
    }


def auto_inputs(model: Any, *, dynamic: bool) -> tuple[dict[str, dict[str, Any]], str]:
    """Example input specs for ``model`` from its main input and config; and why.

    Raises:
        RecipeError: ``inputs``: the model has no config, or its config lacks a field needed.
    """
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    if config is None or main is None:
        raise RecipeError(
            "",
            "inputs",
            f"auto needs a transformers model (config and main_input_name); "
            f"{type(model).__name__} has {'no config' if config is None else 'no main_input_name'}",
        )
    cls = type(config).__name__
    if main == "input_ids":
        vocab = int(_config_value(config, "vocab_size"))
        seq = min(SEQUENCE, int(getattr(config, "max_position_embeddings", None) or SEQUENCE))
        dims = {0: "batch", 1: "sequence"} if dynamic else {}
        check = [CHECK_BATCH, min(CHECK_SEQUENCE, seq - 1)]
        specs = {"input_ids": _spec([BATCH, seq], "int64", 0, vocab, dims, check)}
        reason = f"input_ids in [0, {vocab}) from {cls}.vocab_size"
        if "attention_mask" in _forward_parameters(model):
            specs["attention_mask"] = _spec([BATCH, seq], "int64", 1, 2, dims, check)
            reason += ", an all-ones attention_mask"
    elif main == "pixel_values":
        channels = int(_config_value(config, "num_channels"))
        size = getattr(config, "image_size", None)
        if isinstance(size, (list, tuple)):
            size = int(size[0])
        if size is None:
            size = DEFAULT_IMAGE_SIZE
            log.warning("inputs: auto: %s has no image_size; using %d", cls, size)
        # The image size stays static: a strided model's inner sizes are derived from it (H/2,
        # H/4), and a function's dynamic dims can only equal dims of its inputs today.
        dims = {0: "batch"} if dynamic else {}
        check = [CHECK_BATCH, channels, size, size]
        dtype = _float_dtype(model)
        specs = {
            "pixel_values": _spec([BATCH, channels, size, size], dtype, -1.0, 1.0, dims, check)
        }
        reason = f"pixel_values {channels}x{size}x{size} from {cls}.num_channels/image_size"
    elif main == "input_values":
        dims = {0: "batch", 1: "samples"} if dynamic else {}
        specs = {
            "input_values": _spec(
                [BATCH, AUDIO_SAMPLES],
                _float_dtype(model),
                -1.0,
                1.0,
                dims,
                [CHECK_BATCH, CHECK_AUDIO_SAMPLES],
            )
        }
        reason = f"input_values of {AUDIO_SAMPLES} samples (raw audio, {cls})"
    elif main == "input_features":
        mels = int(_config_value(config, "num_mel_bins"))
        frames = 2 * int(_config_value(config, "max_source_positions"))
        dims = {0: "batch"} if dynamic else {}
        specs = {
            "input_features": _spec(
                [BATCH, mels, frames],
                _float_dtype(model),
                -1.0,
                1.0,
                dims,
                [CHECK_BATCH, mels, frames],
            )
        }
        reason = (
            f"input_features {mels}x{frames} from {cls}.num_mel_bins and 2 x max_source_positions "
            "(the encoder requires this length: no dynamic sequence)"
        )
    else:
        raise RecipeError(
            "",
            "inputs",
            f"auto cannot derive inputs for main input {main!r} of {type(model).__name__}",
        )
    if dynamic:
        reason += "; dynamic: " + ", ".join(
            sorted({d for s in specs.values() for d in s["dynamic"].values()})
        )
    return specs, reason


def _forward_parameters(model: Any) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


# --------------------------------------------------------------------------------------------
# hiera: auto
# --------------------------------------------------------------------------------------------
@dataclass
class _Candidate:
    cls: type
    calls: int = 0
    parameters: int = 0
    depth: int = 10**6
    lists: tuple[str, ...] = ()


def auto_hiera(
    model: Any, input_specs: Mapping[str, Mapping[str, Any]], method: str = "forward"
) -> tuple[tuple[str, ...], str]:
    """The classes of the model's main repeated stack, found by running it once; and why.

    Raises:
        RecipeError: ``hiera``: no ``nn.ModuleList`` member runs in forward.
    """
    import torch

    from hyperexport.models.inputs import make_inputs

    members: dict[int, tuple[str, torch.nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            for i, child in enumerate(module):
                members.setdefault(id(child), (f"{name}.{i}" if name else str(i), child))
    ran: dict[int, int] = {}
    handles = [
        child.register_forward_pre_hook(
            lambda m, args, key=key: ran.__setitem__(key, ran.get(key, 0) + 1)
        )
        for key, (_, child) in members.items()
        if not type(child).__module__.startswith("torch.")
    ]
    try:
        with torch.no_grad():
            getattr(model, method)(**make_inputs(input_specs))
    finally:
        for h in handles:
            h.remove()
    candidates: dict[type, _Candidate] = {}
    for key, calls in ran.items():
        path, child = members[key]
        c = candidates.setdefault(type(child), _Candidate(type(child)))
        c.calls += calls
        c.parameters = max(c.parameters, sum(p.numel() for p in child.parameters()))
        c.depth = min(c.depth, path.count("."))
        container = path.rsplit(".", 1)[0]
        if container not in c.lists:
            c.lists += (container,)
    if not candidates:
        raise RecipeError(
            "",
            "hiera",
            f"auto found no repeated blocks in {type(model).__name__}: no nn.ModuleList member "
            "runs in forward; name the classes in hiera",
        )
    hints = set(getattr(model, "_no_split_modules", None) or ())
    ranked = sorted(
        candidates.values(),
        key=lambda c: (c.cls.__name__ in hints, c.calls, c.parameters, -c.depth),
        reverse=True,
    )
    best = ranked[0]
    # Other classes that share the winner's lists (a stack mixing two layer kinds) come along.
    chosen = [best.cls] + [c.cls for c in ranked[1:] if set(c.lists) & set(best.lists)]
    names = tuple(f"{c.__module__}.{c.__qualname__}" for c in chosen)
    why = "listed in _no_split_modules, " if best.cls.__name__ in hints else ""
    reason = (
        f"{', '.join(c.__name__ for c in chosen)}: {why}{best.calls} calls from "
        f"nn.ModuleList {', '.join(repr(x) for x in best.lists)}"
    )
    others = [f"{c.cls.__name__} ({c.calls} calls)" for c in ranked if c.cls not in chosen]
    if others:
        reason += f"; not chosen: {', '.join(others)}"
    ignored = sorted(hints - {c.cls.__name__ for c in ranked})
    if ignored:
        reason += f"; hints that never run from a ModuleList: {', '.join(ignored)}"
    return names, reason
