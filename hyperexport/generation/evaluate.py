"""The evaluate stage's part for ``task: text-generation``: decode the exported model (no torch).

Reads the trace's reference record (prompts, steps, pad id) and ``genai_config.json``, runs
:func:`~hyperexport.generation.runtime.genai_decode` per prompt and, when the reference has a
padded batch, :func:`~hyperexport.generation.runtime.ort_padded_decode`; writes
``generation.json`` (tokens) and ``generation.npz`` (per-step logits, the reference's keys).
No tolerance is read here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hyperexport.atomic import atomic_write_bytes
from hyperexport.contracts.names import MODEL_FILE
from hyperexport.generation.arrays import write_npz
from hyperexport.generation.names import GENAI_CONFIG, GENERATED_JSON, GENERATED_NPZ, REFERENCE_JSON
from hyperexport.generation.reference import left_padded

log = logging.getLogger(__name__)


def evaluate_generation(trace_dir: Path, model_dir: Path, out_dir: Path) -> None:
    """Decode the reference's prompts with the exported model; write what came out."""
    import numpy as np

    from hyperexport.generation.runtime import genai_decode, genai_folder, ort_padded_decode

    reference = json.loads((trace_dir / REFERENCE_JSON).read_text(encoding="utf-8"))
    genai = json.loads((trace_dir / GENAI_CONFIG).read_text(encoding="utf-8"))
    steps = int(reference["max_new_tokens"])
    arrays: dict[str, np.ndarray] = {}
    single: list[list[int]] = []
    with genai_folder(model_dir, trace_dir / GENAI_CONFIG, out_dir) as folder:
        for i, prompt in enumerate(reference["prompts"]):
            tokens, logits = genai_decode(folder, prompt, steps)
            single.append(tokens)
            arrays[f"single.{i}"] = logits
    batch: list[list[int]] = []
    if reference["batch"]:
        eos = genai["model"].get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        ids, mask = left_padded(reference["prompts"], int(reference["pad_token_id"]))
        batch, logits = ort_padded_decode(
            model_dir / MODEL_FILE, ids, mask, steps, eos_ids, int(reference["pad_token_id"])
        )
        arrays["batch"] = logits
    log.info("decode in onnxruntime-genai (greedy): %s", single)
    record = {
        "runtime": "onnxruntime-genai",
        "batch_runtime": "onnxruntime",
        "single": single,
        "batch": batch,
    }
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENERATED_JSON, text.encode("utf-8"))
    write_npz(out_dir / GENERATED_NPZ, arrays)
