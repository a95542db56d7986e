"""The model factory for transformers checkpoints: ``model: {_target_: hyperexport.models.pretrained, path: ...}``.

``path`` is a plain string argument so that the build keys hash the files under it (config and
weights). Everything read from the checkpoint directory before transformers loads it is read as
data (JSON), never imported.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import CHECKPOINT_CONFIG
from hyperexport.base.errors import RecipeError
from hyperexport.base.versions import dtype_keyword

log = logging.getLogger(__name__)

#: Weight file patterns transformers loads from a checkpoint directory.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")

#: Floating dtypes a checkpoint may be loaded in.
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def pretrained(
    path: str,
    auto_class: str = "AutoModel",
    dtype: str = "float32",
    revision: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Any:
    """Load a transformers checkpoint (a local directory, or a hub id where the network allows).

    Args:
        path: A checkpoint directory (``config.json`` plus weight files), or a hub id.
        auto_class: The transformers auto class to load with (``AutoModelForCausalLM``, ...).
        dtype: ``float32``, ``float16`` or ``bfloat16``.
        revision: The hub revision (branch, tag or commit) to pin; hub ids only.
        trust_remote_code: Allow a checkpoint that ships its own model code to run it. Off
            unless the recipe sets it.
        attn_implementation: transformers' attention implementation (None: its default).

    Returns:
        The model in eval mode, with ``use_cache`` off (caches are not example outputs), in
        its sub-configs too.

    Raises:
        RecipeError: Naming the ``model.*`` field and what was found. The recipe file is filled
            in by the model loader.
    """
    if dtype not in FLOAT_DTYPES:
        raise RecipeError("", "model.dtype", f"must be one of {FLOAT_DTYPES}, got {dtype!r}")
    local = _local_checkpoint(path, revision, trust_remote_code)
    auto = _auto_class(auto_class)
    import torch

    kwargs: dict[str, Any] = {
        dtype_keyword(): getattr(torch, dtype),
        "trust_remote_code": bool(trust_remote_code),
    }
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if local:
        kwargs["local_files_only"] = True
    elif revision is not None:
        kwargs["revision"] = revision
    log.info("Loading %s from %s (%s)", auto_class, path, dtype)
    try:
        model = auto.from_pretrained(path, **kwargs)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            fits = _fitting_auto_classes(_local_config(path)) if local else ""
            raise RecipeError(
                "",
                "model.auto_class",
                f"{auto_class} does not fit this checkpoint: {_first(e)}{fits}",
            ) from e
        raise RecipeError("", "model.path", f"{path}: {_first(e)}") from e
    except OSError as e:
        raise RecipeError("", "model.path", f"{path}: {_first(e)}") from e
    for config in _configs(model.config):
        if hasattr(config, "use_cache"):
            config.use_cache = False
    return model.eval()


def pretrained_skeleton(
    path: str,
    auto_class: str = "AutoModel",
    dtype: str = "float32",
    revision: str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Any:
    """The model :func:`pretrained` loads, built from the checkpoint's ``config.json`` alone,
    with every parameter on the meta device (buffers real) and no weight read.

    Takes :func:`pretrained`'s arguments; ``path`` must be a local folder. A streamed build
    binds the weights from the checkpoint's safetensors files (``capture/streaming.py``).

    Raises:
        RecipeError: As :func:`pretrained`.
    """
    from hyperexport.library.capture.streaming import parameters_on_meta

    if dtype not in FLOAT_DTYPES:
        raise RecipeError("", "model.dtype", f"must be one of {FLOAT_DTYPES}, got {dtype!r}")
    if not _local_checkpoint(path, revision, trust_remote_code):
        raise RecipeError("", "model.path", f"{path}: streamed weights need a local folder")
    auto = _auto_class(auto_class)
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        path, trust_remote_code=bool(trust_remote_code), local_files_only=True
    )
    kwargs: dict[str, Any] = {
        dtype_keyword(): getattr(torch, dtype),
        "trust_remote_code": bool(trust_remote_code),
    }
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    log.info("Building %s from %s's config (%s, parameters on meta)", auto_class, path, dtype)
    try:
        with parameters_on_meta():
            model = auto.from_config(config, **kwargs)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise RecipeError(
                "",
                "model.auto_class",
                f"{auto_class} does not fit this checkpoint: {_first(e)}"
                f"{_fitting_auto_classes(config)}",
            ) from e
        raise RecipeError("", "model.path", f"{path}: {_first(e)}") from e
    for sub in _configs(model.config):
        if hasattr(sub, "use_cache"):
            sub.use_cache = False
    return model.eval()


def _configs(config: Any) -> list[Any]:
    """A config and its sub-configs (a vision-language model's ``text_config`` holds the
    ``use_cache`` its language model reads)."""
    subs = [getattr(config, f"{k}_config", None) for k in ("text", "vision", "audio", "decoder")]
    return [config] + [s for s in subs if s is not None]


def _local_config(path: str) -> Any:
    """The transformers config of the local checkpoint folder ``path``."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


def _fitting_auto_classes(config: Any) -> str:
    """``"; auto classes that fit: AutoModel, ..."``: the transformers auto model classes whose
    mapping holds ``config``'s class (empty when none does)."""
    import transformers

    fitting = [
        name
        for name in sorted(dir(transformers))
        if name.startswith("AutoModel")
        and (mapping := getattr(getattr(transformers, name, None), "_model_mapping", None))
        is not None
        and type(config) in mapping
    ]
    return f"; auto classes that fit: {', '.join(fitting)}" if fitting else ""


def _first(error: BaseException) -> str:
    """The first line of an error message (transformers' messages run over many lines)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _auto_class(name: str) -> Any:
    import transformers

    auto = getattr(transformers, name, None) if name.startswith("Auto") else None
    if auto is None or not hasattr(auto, "from_pretrained"):
        known = sorted(n for n in dir(transformers) if n.startswith("AutoModel"))
        from hyperexport.base.errors import did_you_mean

        raise RecipeError(
            "",
            "model.auto_class",
            f"{name!r} is not a transformers auto model class{did_you_mean(name, known)}",
        )
    return auto


def _local_checkpoint(path: str, revision: str | None, trust_remote_code: bool) -> bool:
    """Check ``path`` before transformers does; True for a local directory, False for a hub id."""
    where = Path(path).expanduser()
    if where.is_dir():
        if revision is not None:
            raise RecipeError(
                "", "model.revision", f"pins a hub revision, but {path} is a local directory"
            )
        config = read_checkpoint_config(where)
        if config.get("auto_map") and not trust_remote_code:
            raise RecipeError(
                "",
                "model.trust_remote_code",
                f"{path} ships its own model code (config.json auto_map: "
                f"{sorted(config['auto_map'])}); set model.trust_remote_code: true to run it",
            )
        if not any(next(where.glob(p), None) for p in WEIGHT_PATTERNS):
            raise RecipeError(
                "",
                "model.path",
                f"{path} has config.json but no weight files (*.safetensors, *.bin)",
            )
        return True
    if where.exists():
        raise RecipeError("", "model.path", f"{path} is a file, not a checkpoint directory")
    if path.startswith(("/", ".", "~")) or not _HUB_ID.fullmatch(path):
        raise RecipeError("", "model.path", f"{path} does not exist (and is not a hub id)")
    return False


def read_checkpoint_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory as data; a RecipeError when it is not one."""
    file = directory / CHECKPOINT_CONFIG
    if not file.is_file():
        found = sorted(p.name for p in directory.iterdir())[:5]
        raise RecipeError(
            "",
            "model.path",
            f"{directory} is not a checkpoint: no config.json (found {found or 'nothing'})",
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RecipeError("", "model.path", f"{file} is not readable JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        keys = sorted(data)[:6] if isinstance(data, dict) else type(data).__name__
        raise RecipeError("", "model.path", f"{file} has no 'model_type' (found keys {keys})")
    return data
