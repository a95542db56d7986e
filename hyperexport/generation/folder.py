"""What the trace stage writes beside the model for onnxruntime-genai: config and tokenizer."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_bytes
from hyperexport.contracts.names import MODEL_FILE
from hyperexport.generation.genai_config import build_genai_config, genai_source
from hyperexport.generation.names import GENAI_CONFIG, TOKENIZER_FILES

log = logging.getLogger(__name__)


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
