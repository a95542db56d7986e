"""The check of ``genai_config.json`` (``task: text-generation``; no torch, no ONNX library).

The published file is what onnxruntime-genai reads beside the model: the decode in the evaluate
stage ran with it, but a field the decode does not reach (``context_length`` longer than the
prompts, a search default) would pass that unseen. So it is also built again from the model
config the reference decode was made with (``generation_reference.json``'s ``config``, the keys
:func:`~hyperexport.generation.genai_config.build_genai_config` reads) and must equal it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hyperexport.contracts.names import MODEL_FILE
from hyperexport.generation.genai_config import build_genai_config
from hyperexport.generation.names import GENAI_CONFIG, REFERENCE_JSON

#: Differences named before the rest are counted.
_MAX_NAMED = 3


def genai_config_problems(trace_dir: Path) -> list[str]:
    """What differs between the trace's ``genai_config.json`` and the one its reference's model
    config gives (empty: they are equal), one line per field."""
    reference = json.loads((trace_dir / REFERENCE_JSON).read_text(encoding="utf-8"))
    source = reference.get("config")
    if not isinstance(source, dict):
        return [f"{REFERENCE_JSON} records no model config to judge {GENAI_CONFIG} against"]
    expected = build_genai_config(source, model_file=MODEL_FILE)
    published = json.loads((trace_dir / GENAI_CONFIG).read_text(encoding="utf-8"))
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
