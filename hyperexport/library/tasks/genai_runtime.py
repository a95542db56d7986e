"""The decode of ``task: text-generation``'s model in onnxruntime-genai, one prompt at a time on
the folder as published: what a user of the folder runs (evaluate stage, torch-free)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.base.contracts.names import MODEL_FILE
from hyperexport.engine.files import clone_or_copy
from hyperexport.library.check.ort_session import IN_PLACE_ENTRIES, data_files, weights_in_place
from hyperexport.library.tasks.registry import GENAI_CONFIG

log = logging.getLogger(__name__)


@contextlib.contextmanager
def genai_model(
    model_dir: Path, genai_config: Path, scratch: Path, model_file: str = MODEL_FILE
) -> Iterator[Any]:
    """onnxruntime-genai's model (``og.Model``) of ``model_file`` as published: loaded once,
    for every decode of the block. A load creates the ONNX Runtime session: at the 1B shape in
    fp32, each prompt's decode took 22 s when it loaded its own (cProfile), and evaluate went
    from 137 to 95 s with one load per folder (bench/README.md).

    onnxruntime-genai takes a folder holding ``genai_config.json`` and refuses a model path
    outside it; :func:`_genai_folder` gives it ``model_dir`` itself. Large float weights are read
    in place (``check/ort_session.py`` ``weights_in_place``), through an overlay of the session
    options: the published ``genai_config.json`` is left as it is.
    """
    import onnxruntime_genai as og

    with _genai_folder(model_dir, genai_config, scratch, model_file) as folder:
        config = og.Config(str(folder))
        if weights_in_place(folder / model_file):
            options = {"model": {"decoder": {"session_options": dict(IN_PLACE_ENTRIES)}}}
            config.overlay(json.dumps(options))
        yield og.Model(config)


@contextlib.contextmanager
def _genai_folder(
    model_dir: Path, genai_config: Path, scratch: Path, model_file: str
) -> Iterator[Path]:
    """A folder with ``model_file``, its data files and ``genai_config``'s bytes as
    ``genai_config.json``, for the block.

    ``model_dir`` itself where it can be: its model and data are regular files, and it holds
    ``genai_config``'s bytes already (the quantize stage's folder) or no ``genai_config.json``
    (the rewrite's), in which case the config is written there for the block and removed after.
    The model and data files are not touched (their inode, size and times stay as they were, so
    the build keeps trusting its held copy of the data: ``engine/workspace.py``). At the 1B shape
    that saves evaluate copying 6.7 GB (the float and the quantized weights) on a disk without
    reflinks.

    Otherwise (a symlinked file, another ``genai_config.json`` there, a folder that cannot be
    written) the files are cloned into a folder under ``scratch``, removed on exit, and the
    fallback is logged at WARNING with its cause: a reflink where the filesystem has them, else a
    copy of the weights (for a large model, evaluate needs that much disk for the duration). Not
    hard links: a link changes the input's ctime, and the build then no longer trusts its held
    copy. Nor symlinks: ONNX Runtime refuses external data that leaves the model's folder.
    """
    names = [model_file, *(p.name for p in data_files(model_dir / model_file))]
    wanted = genai_config.read_bytes()
    placed = model_dir / GENAI_CONFIG
    linked = [name for name in names if (model_dir / name).is_symlink()]
    reason: str
    if linked:
        reason = f"{linked[0]} is a symbolic link, which ONNX Runtime refuses for external data"
    elif placed.exists():
        if placed.read_bytes() == wanted:
            yield model_dir
            return
        reason = f"another {GENAI_CONFIG} is there"
    else:
        try:
            with open(placed, "xb") as fh:
                fh.write(wanted)
        except OSError as e:
            reason = f"{GENAI_CONFIG} cannot be written there ({e})"
        else:
            try:
                yield model_dir
            finally:
                placed.unlink(missing_ok=True)
            return
    log.warning(
        "onnxruntime-genai: %s in %s; loading a copy of the model from %s instead",
        reason,
        model_dir,
        scratch,
    )
    folder = Path(tempfile.mkdtemp(prefix="genai-", dir=scratch))
    try:
        for name in names:
            clone_or_copy((model_dir / name).resolve(), folder / name)
        shutil.copyfile(genai_config, folder / GENAI_CONFIG)
        yield folder
    finally:
        shutil.rmtree(folder)


def _generator(model: Any, prompt: Sequence[int], max_length: int) -> Any:
    """A greedy generator of one sequence of at most ``max_length`` tokens, fed ``prompt``."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], dtype=np.int64))
    return generator


def genai_decode(model: Any, prompt: Sequence[int], steps: int) -> tuple[list[int], np.ndarray]:
    """onnxruntime-genai's greedy decode of ``steps`` tokens with ``model`` (:func:`genai_model`):
    ``(tokens, logits per step)``."""
    generator = _generator(model, prompt, len(prompt) + steps)
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


def genai_forced(model: Any, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """onnxruntime-genai's logits at each step of ``prompt`` followed by ``tokens`` (fed, not
    chosen): ``(len(tokens), vocab)``, the logits from which step ``i`` chose ``tokens[i]``."""
    generator = _generator(model, prompt, len(prompt) + len(tokens))
    logits: list[np.ndarray] = []
    for i, token in enumerate(tokens):
        logits.append(np.array(generator.get_logits(), dtype=np.float32).reshape(-1))
        if i + 1 < len(tokens):
            generator.append_tokens(np.asarray([[token]], dtype=np.int64))
    return np.stack(logits) if logits else np.zeros((0, 0), dtype=np.float32)
