"""The decode of the exported model, torch-free (evaluate stage).

* :func:`genai_decode`: onnxruntime-genai's greedy search on the output folder, one prompt at a
  time: what a user of the folder runs.
* :func:`ort_padded_decode`: a greedy loop in ONNX Runtime over the prompts as one left-padded
  batch, with the attention mask and position ids transformers' ``generate`` builds. Not
  onnxruntime-genai: its 0.18.0 ``append_tokens`` gives a padded row an all-ones mask and
  positions counted from the first pad (measured), so a padded batch there is not
  transformers' padded batch.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from hyperexport.contracts.names import MODEL_FILE
from hyperexport.generation.names import GENAI_CONFIG

log = logging.getLogger(__name__)


@contextlib.contextmanager
def genai_folder(model_dir: Path, genai_config: Path, scratch: Path) -> Iterator[Path]:
    """A folder holding the model, its data file and ``genai_config.json``, as published.

    onnxruntime-genai takes a folder and refuses a model path outside it, so the files are
    copied into a folder under ``scratch``, removed on exit (a copy of the weights: for a large
    model, evaluate needs that much disk for the duration). Not hard links: a link changes the input's ctime, and the
    build then no longer trusts its held copy of the data file (``engine/workspace.py``).
    Symlinks neither: ONNX Runtime refuses external data that leaves the model's folder.
    """
    folder = Path(tempfile.mkdtemp(prefix="genai-", dir=scratch))
    try:
        data = sorted(p.name for p in model_dir.iterdir() if p.name.startswith(MODEL_FILE + "."))
        names = [MODEL_FILE, *data]
        for name in names:
            shutil.copyfile((model_dir / name).resolve(), folder / name)
        shutil.copyfile(genai_config, folder / GENAI_CONFIG)
        yield folder
    finally:
        shutil.rmtree(folder)


def genai_decode(folder: Path, prompt: Sequence[int], steps: int) -> tuple[list[int], np.ndarray]:
    """onnxruntime-genai's greedy decode of ``steps`` tokens: ``(tokens, logits per step)``."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps, do_sample=False, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], dtype=np.int64))
    logits: list[np.ndarray] = []
    while not generator.is_done() and len(logits) < steps:
        logits.append(np.array(generator.get_logits(), dtype=np.float32).reshape(-1))
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)][len(prompt) :]
    if len(tokens) == len(logits) - 1:
        # The search stopped at an end-of-sequence id, which onnxruntime-genai 0.18 leaves out
        # of the sequence (transformers keeps it): greedy chose it from the last logits.
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, np.stack(logits)


def _empty_past(session: object, batch: int) -> dict[str, np.ndarray]:
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    past: dict[str, np.ndarray] = {}
    for value in session.get_inputs():  # type: ignore[attr-defined]
        if value.name.startswith("past_key_values."):
            _, heads, _, size = value.shape
            past[value.name] = np.zeros((batch, heads, 0, size), dtype=types[value.type])
    return past


def ort_padded_decode(
    model_file: Path,
    ids: np.ndarray,
    mask: np.ndarray,
    steps: int,
    eos: Sequence[int],
    pad: int,
) -> tuple[list[list[int]], np.ndarray]:
    """Greedy decode of a left-padded batch in ONNX Runtime: ``(tokens per row, logits)``.

    Positions and mask follow transformers: ``position_ids = cumsum(mask) - 1`` (1 at pads), the
    mask grows by one 1 per step, and a row that produced an end-of-sequence id gets ``pad``.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    batch = ids.shape[0]
    past = _empty_past(session, batch)
    positions = np.where(mask == 0, 1, np.cumsum(mask, axis=1) - 1).astype(np.int64)
    step_ids = ids
    done = np.zeros(batch, dtype=bool)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logits: list[np.ndarray] = []
    for _ in range(steps):
        feeds = {"input_ids": step_ids, "attention_mask": mask, "position_ids": positions, **past}
        result = dict(zip(outputs, session.run(None, feeds)))
        last = result["logits"][:, -1, :].astype(np.float32)
        logits.append(last)
        chosen = np.where(done, pad, last.argmax(axis=-1)).astype(np.int64)
        for row, token in enumerate(chosen):
            tokens[row].append(int(token))
        done |= np.isin(chosen, list(eos))
        past = {
            name.replace("present.", "past_key_values.", 1): value
            for name, value in result.items()
            if name.startswith("present.")
        }
        step_ids = chosen[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=mask.dtype)], axis=1)
        positions = positions[:, -1:] + 1
        if done.all():
            break
    return tokens, np.stack(logits)
